//! A prompt with media (images), family-neutral: what the turn's prefill
//! feeds the model ([`PromptMedia`]) and the prompt's *identity* in the
//! session layer ([`media_keys`]).
//!
//! The session layer (live session, bank, checkpoints) matches prompts by
//! their token lists. With media the token ids alone are not the prompt
//! (the same placeholders stand for any image), so the turn's `prompt` is a
//! list of *keys*: every text token is its own id, every token of an
//! image's span is a key above the vocabulary derived from the image's
//! SHA-256 and the token's place in the span. The same text with a
//! different image (or the images swapped) then differs from the span's
//! first token, and every cache keeps matching by tokens alone. The model
//! never sees a key: the prefill reads the real ids and the image rows from
//! [`PromptMedia`].

use std::cell::RefCell;

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};
use crate::model::MediaChunk;

/// Keys start here: above every vocabulary, so a key never equals a token.
pub const KEY_BASE: u32 = 0x8000_0000;

/// One image's place in the prompt: its span of tokens (the family's start
/// marker and placeholders) and the SHA-256 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedSpan {
    pub first: usize,
    pub len: usize,
    pub sha256: [u8; 32],
}

/// The prompt's identity: `tokens` with every token of each span replaced by
/// `KEY_BASE | h` where `h` is 31 bits of SHA-256(image SHA-256 ‖ place in
/// the span). A cached state is reused past a span's first `k` tokens only
/// when all `k` keys match (31 bits each), so a different image is taken for
/// the same one with probability at most 2^-31k; keying the start marker
/// (whose row does not depend on the image) makes any reuse that covers an
/// image row match at least 62 bits.
pub fn media_keys(tokens: &[u32], spans: &[KeyedSpan]) -> Result<Vec<u32>> {
    let mut keys = tokens.to_vec();
    let mut at = 0;
    for s in spans {
        if s.first < at || s.first + s.len > tokens.len() {
            return Err(EngineError::State(format!(
                "image span {}..{} overlaps another or passes the prompt's {} tokens",
                s.first,
                s.first + s.len,
                tokens.len()
            )));
        }
        for (j, k) in keys[s.first..s.first + s.len].iter_mut().enumerate() {
            let d = Sha256::new()
                .chain_update(s.sha256)
                .chain_update((j as u64).to_le_bytes())
                .finalize();
            *k = KEY_BASE | (u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & !KEY_BASE);
        }
        at = s.first + s.len;
    }
    Ok(keys)
}

/// Computes one image's rows (`[n, width]`, host values) on demand.
pub type Encode<'a> = dyn Fn(usize) -> Result<Vec<f32>> + 'a;

/// What the model reads for a prompt with media. Image rows are computed
/// when a prefill chunk first needs them (a turn that reuses a prefix never
/// encodes the images inside it) and kept for the rest of the turn.
pub struct PromptMedia<'a> {
    /// The real ids of every prompt token (the turn's `prompt` holds keys).
    pub tokens: Vec<u32>,
    /// Every prompt token's `(t, h, w)` position.
    pub positions: Vec<[u32; 3]>,
    /// Values per image row.
    pub width: usize,
    /// `(first token index, rows)` of each image, in prompt order.
    pub spans: Vec<(usize, usize)>,
    encode: &'a Encode<'a>,
    rows: RefCell<Vec<Option<Vec<f32>>>>,
}

impl<'a> PromptMedia<'a> {
    /// `encode(i)` gives image `i`'s rows.
    pub fn new(
        tokens: Vec<u32>,
        positions: Vec<[u32; 3]>,
        width: usize,
        spans: Vec<(usize, usize)>,
        encode: &'a Encode<'a>,
    ) -> Self {
        let rows = RefCell::new(vec![None; spans.len()]);
        Self {
            tokens,
            positions,
            width,
            spans,
            encode,
            rows,
        }
    }

    /// Images encoded so far.
    pub fn encoded(&self) -> usize {
        self.rows.borrow().iter().filter(|r| r.is_some()).count()
    }

    /// The real ids, image rows (`(index in the chunk, rows)`) and positions
    /// of prompt tokens `start .. start + n`.
    #[allow(clippy::type_complexity)]
    pub fn chunk(
        &self,
        start: usize,
        n: usize,
    ) -> Result<(&[u32], Vec<(usize, Vec<f32>)>, &[[u32; 3]])> {
        let end = start + n;
        if end > self.tokens.len() || end > self.positions.len() {
            return Err(EngineError::State(format!(
                "prompt media covers {} tokens, the chunk ends at {end}",
                self.tokens.len()
            )));
        }
        let w = self.width;
        let mut out = Vec::new();
        for (i, &(a, len)) in self.spans.iter().enumerate() {
            let (lo, hi) = (a.max(start), (a + len).min(end));
            if lo >= hi {
                continue;
            }
            let mut rows = self.rows.borrow_mut();
            if rows[i].is_none() {
                let r = (self.encode)(i)?;
                if r.len() != len * w {
                    return Err(EngineError::State(format!(
                        "image {i}: {} values for {len} rows of {w}",
                        r.len()
                    )));
                }
                rows[i] = Some(r);
            }
            let r = rows[i].as_ref().expect("encoded above");
            out.push((lo - start, r[(lo - a) * w..(hi - a) * w].to_vec()));
        }
        Ok((&self.tokens[start..end], out, &self.positions[start..end]))
    }

    /// Run `f` on the chunk's real ids and [`MediaChunk`], or on the chunk
    /// itself without media.
    pub(crate) fn run<T>(
        media: Option<&Self>,
        start: usize,
        piece: &[u32],
        f: impl FnOnce(&[u32], &MediaChunk<'_>) -> Result<T>,
    ) -> Result<T> {
        match media {
            None => f(piece, &MediaChunk::default()),
            Some(m) => {
                let (ids, owned, positions) = m.chunk(start, piece.len())?;
                let spans: Vec<(usize, &[f32])> =
                    owned.iter().map(|(i, r)| (*i, r.as_slice())).collect();
                f(
                    ids,
                    &MediaChunk {
                        spans: &spans,
                        positions,
                    },
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_from_the_span_and_only_there() {
        let toks = [1, 2, 9, 8, 8, 7, 3];
        let span = |b: u8| KeyedSpan {
            first: 2,
            len: 4,
            sha256: [b; 32],
        };
        let a = media_keys(&toks, &[span(1)]).unwrap();
        let b = media_keys(&toks, &[span(2)]).unwrap();
        assert_eq!(a, media_keys(&toks, &[span(1)]).unwrap());
        assert_eq!((&a[..2], a[6]), (&toks[..2], 3));
        assert!(a[2..6].iter().all(|&k| k >= KEY_BASE));
        assert!(a[2..6].iter().zip(&b[2..6]).all(|(x, y)| x != y));
        // The same image at another place in its span keys differently.
        assert_ne!(a[3], a[4]);
        assert!(media_keys(&toks, &[span(1), span(1)]).is_err());
    }

    #[test]
    fn chunks_cut_images_anywhere_and_encode_once() {
        let calls = std::cell::Cell::new(0);
        let encode = |i: usize| {
            calls.set(calls.get() + 1);
            assert_eq!(i, 0);
            Ok(vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5])
        };
        let positions = vec![[0; 3], [1, 1, 1], [1, 1, 2], [1, 1, 3], [4; 3]];
        let m = PromptMedia::new(vec![1, 5, 5, 5, 2], positions, 2, vec![(1, 3)], &encode);
        assert!(m.chunk(0, 1).unwrap().1.is_empty());
        assert_eq!(m.encoded(), 0);
        let (ids, spans, pos) = m.chunk(2, 3).unwrap();
        assert_eq!(ids, [5, 5, 2]);
        assert_eq!(spans, vec![(0, vec![2.0, 2.5, 3.0, 3.5])]);
        assert_eq!(pos.len(), 3);
        assert_eq!(m.chunk(0, 2).unwrap().1, vec![(1, vec![1.0, 1.5])]);
        assert_eq!(calls.get(), 1);
        assert!(m.chunk(3, 3).is_err());
    }
}
