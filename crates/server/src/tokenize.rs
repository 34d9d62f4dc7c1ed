//! Tokenizing a prompt that may be far larger than the context.
//!
//! The `tokenizers` crate keeps several records per byte and per token while
//! it encodes (alignments, offsets, token strings): a 7 MiB body cost close
//! to 1 GiB, a 7 MiB CJK body about 2 GiB, and all of it only to learn that
//! the prompt does not fit. So a text that could exceed the context (more
//! bytes than the context has tokens; a token covers at least one byte) is
//! first counted in pieces of [`PIECE`] bytes, and counting stops as soon as
//! the prompt is known not to fit. Only a text that fits is then encoded
//! whole, which keeps the token ids exactly what one encoding gives.
//!
//! Pieces end where a tokenizer's pre-split would end a word anyway (after a
//! newline, before a space that starts a word), so their counts add up to
//! the whole text's; where a piece has no such place (one long word, CJK
//! text without spaces), the cut may split what one encoding would merge, so
//! each cut is allowed [`CUT_SLACK`] tokens: the reported count is a lower
//! bound either way.

/// Bytes per counted piece: large enough that the per-call overhead does
/// not matter, small enough that a piece's encoding costs a few MiB.
pub const PIECE: usize = 64 * 1024;

/// Tokens a cut inside a word may add (a special token's text cut in two
/// becomes a handful of plain tokens).
pub const CUT_SLACK: usize = 8;

/// What counting found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The text may fit: encode it whole.
    MayFit,
    /// The text has at least this many tokens, which is `>= limit`.
    AtLeast(usize),
}

/// Count `text` piece by piece with `count`, stopping once at least `limit`
/// tokens are certain.
pub fn count_bounded<E>(
    text: &str,
    limit: usize,
    mut count: impl FnMut(&str) -> Result<usize, E>,
) -> Result<Count, E> {
    // Every token covers at least one byte (byte-level BPE, SentencePiece
    // with byte fallback), plus a possible leading-space marker.
    if text.len() < limit.saturating_sub(1) || text.len() <= PIECE {
        return Ok(Count::MayFit);
    }
    let mut counted = 0usize;
    let mut cuts = 0usize;
    let mut rest = text;
    while !rest.is_empty() {
        let (piece, next, exact) = split(rest);
        counted += count(piece)?;
        if !exact {
            cuts += 1;
        }
        let floor = counted.saturating_sub(cuts * CUT_SLACK);
        if floor >= limit {
            return Ok(Count::AtLeast(floor));
        }
        rest = next;
    }
    Ok(Count::MayFit)
}

/// The next piece of at most about [`PIECE`] bytes, the rest, and whether
/// the cut is at a word boundary.
fn split(text: &str) -> (&str, &str, bool) {
    if text.len() <= PIECE {
        return (text, "", true);
    }
    let bytes = text.as_bytes();
    let mut end = PIECE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    // Look for a boundary in the second half of the window.
    let low = PIECE / 2;
    let at = |i: usize| bytes.get(i).copied();
    let space = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_whitespace());
    for i in (low..end).rev() {
        // After a newline that a word follows.
        if at(i) == Some(b'\n') && !space(at(i + 1)) {
            return (&text[..=i], &text[i + 1..], true);
        }
    }
    for i in (low..end).rev() {
        // Before a single space that starts a word.
        if at(i) == Some(b' ') && !space(at(i - 1)) && !space(at(i + 1)) && at(i + 1).is_some() {
            return (&text[..i], &text[i..], true);
        }
    }
    (&text[..end], &text[end..], false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Result<usize, ()> {
        Ok(s.split_whitespace().count())
    }

    #[test]
    fn a_text_that_fits_is_not_counted() {
        let mut calls = 0;
        let r = count_bounded("short text", 100, |_| {
            calls += 1;
            Ok::<_, ()>(0)
        });
        assert_eq!(r, Ok(Count::MayFit));
        assert_eq!(calls, 0);
    }

    #[test]
    fn counting_stops_once_the_limit_is_passed() {
        let text = "word ".repeat(1_000_000); // 5 MB, 1M words
        let mut seen = 0;
        let r = count_bounded(&text, 20_000, |p| {
            seen += p.len();
            words(p)
        });
        let Ok(Count::AtLeast(n)) = r else {
            panic!("{r:?}")
        };
        assert!((20_000..20_000 + PIECE).contains(&n), "{n}");
        assert!(seen < 2 * 20_000 * 5 + PIECE, "read {seen} bytes");
    }

    #[test]
    fn word_boundaries_keep_the_count_exact() {
        let text = "alpha beta\ngamma ".repeat(50_000);
        let mut total = 0;
        // Above the word count, below the byte count: every piece is counted.
        let r = count_bounded(&text, 200_000, |p| {
            let n = words(p)?;
            total += n;
            Ok::<_, ()>(n)
        });
        assert_eq!(r, Ok(Count::MayFit));
        assert_eq!(total, 150_000, "no word was cut in two");
    }

    #[test]
    fn a_text_without_boundaries_is_cut_at_characters() {
        let text = "漢字".repeat(100_000); // 600 kB, no spaces
        let mut pieces = Vec::new();
        let r = count_bounded(&text, 10, |p| {
            pieces.push(p.len());
            Ok::<_, ()>(p.chars().count())
        });
        assert!(matches!(r, Ok(Count::AtLeast(n)) if n >= 10));
        assert!(pieces[0] <= PIECE && pieces[0] % 3 == 0);
    }
}
