//! Token masks: the set of tokens a constraint (a JSON schema, a grammar, a
//! forced tool call) allows at one position. The loops ask the observer for
//! a position's mask ([`super::TurnObserver::allowed_after`]) and apply it
//! to the logits row *before* the sampling law: a masked token gets logit
//! `-inf`, i.e. probability 0, and the law's own renormalisation does the
//! rest. The laws in `ds4-sampling` are not changed and never see a mask.

/// The tokens allowed at one position, as a bit set over token ids (bit `t`
/// of word `t / 32`). Ids at or past [`TokenMask::len`] are not allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` ids from 32-bit words, bit `t % 32` of word `t /
    /// 32` allowing `t` (llguidance's `SimpleVob` layout). Missing words
    /// allow nothing; bits at or past `len` are ignored.
    pub fn from_words(mut words: Vec<u32>, len: usize) -> Self {
        words.resize(len.div_ceil(32), 0);
        if !len.is_multiple_of(32)
            && let Some(last) = words.last_mut()
        {
            *last &= (1u32 << (len % 32)) - 1;
        }
        Self { words, len }
    }

    /// A mask over `len` ids allowing exactly `tokens` (ids past `len` are
    /// dropped).
    pub fn from_tokens(len: usize, tokens: impl IntoIterator<Item = u32>) -> Self {
        let mut words = vec![0u32; len.div_ceil(32)];
        for t in tokens {
            if (t as usize) < len {
                words[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Self { words, len }
    }

    /// A mask that allows nothing: the position admits no token.
    pub fn none(len: usize) -> Self {
        Self::from_tokens(len, [])
    }

    /// The number of ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        t < self.len && self.words[t / 32] & (1 << (t % 32)) != 0
    }

    /// Whether no id is allowed.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The number of allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// `row` with every token the mask does not allow set to `-inf`; `None`
    /// when no entry of the row is allowed (the position admits no token).
    pub fn apply(&self, row: &[f32]) -> Option<Vec<f32>> {
        let mut out = vec![f32::NEG_INFINITY; row.len()];
        let mut any = false;
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let t = w * 32 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(&v) = row.get(t) {
                    out[t] = v;
                    any = true;
                }
            }
        }
        any.then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_keeps_exactly_the_allowed_entries() {
        let m = TokenMask::from_tokens(40, [1, 33, 39, 77]);
        assert_eq!(m.count(), 3);
        assert!(m.allows(33) && !m.allows(32) && !m.allows(77));
        let row: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let out = m.apply(&row).unwrap();
        for (i, v) in out.iter().enumerate() {
            if [1, 33, 39].contains(&i) {
                assert_eq!(*v, i as f32);
            } else {
                assert_eq!(*v, f32::NEG_INFINITY, "{i}");
            }
        }
        // A row shorter than the mask: only its own entries count.
        assert_eq!(m.apply(&row[..2]).unwrap(), vec![f32::NEG_INFINITY, 1.0]);
        assert!(m.apply(&row[..1]).is_none());
        assert!(TokenMask::none(40).apply(&row).is_none());
        assert!(TokenMask::none(40).is_empty());
    }

    #[test]
    fn words_past_the_length_are_ignored() {
        let m = TokenMask::from_words(vec![u32::MAX, u32::MAX], 35);
        assert_eq!(m.count(), 35);
        assert!(m.allows(34) && !m.allows(35));
        let short = TokenMask::from_words(vec![1], 64);
        assert_eq!(short.count(), 1);
        assert!(!short.allows(40));
    }
}
