//! M-RoPE positions for a prompt that mixes text and images, as
//! transformers' `Qwen4ExpModel.get_rope_index`: text tokens take the next
//! position on all three axes; an image whose placeholders start at running
//! position `p` takes `(p + t, p + row, p + col)` over its merged grid
//! (row-major), and the running position then advances by `max(rows,
//! cols)`, not by the placeholder count. The *delta* (`max position + 1 −
//! length`) shifts every position after the prompt, so a decode step at
//! token index `i` is at `i + delta` on all three axes.

/// One image in a prompt: the token index of its first placeholder and its
/// patch grid `(t, h, w)` (before merging).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSpan {
    pub first: usize,
    pub grid_thw: [usize; 3],
}

impl ImageSpan {
    /// Placeholder tokens: `t · (h/m) · (w/m)`.
    pub fn tokens(&self, merge: usize) -> usize {
        self.grid_thw[0] * (self.grid_thw[1] / merge) * (self.grid_thw[2] / merge)
    }
}

/// Why a prompt's image spans cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpanError {
    #[error("image {index} starts at token {first}, inside or before the previous image")]
    Overlap { index: usize, first: usize },
    #[error("image {index} ends at token {end}, past the prompt's {len} tokens")]
    PastEnd {
        index: usize,
        end: usize,
        len: usize,
    },
    #[error("image {index}: grid {grid:?} is not divisible by the merge size {merge}")]
    Grid {
        index: usize,
        grid: [usize; 3],
        merge: usize,
    },
}

/// `(t, h, w)` positions of every token of a `len`-token prompt and the
/// delta. `images` are in prompt order.
pub fn mrope_positions(
    len: usize,
    images: &[ImageSpan],
    merge: usize,
) -> Result<(Vec<[i64; 3]>, i64), SpanError> {
    let mut out = Vec::with_capacity(len);
    let mut pos: i64 = 0;
    for (index, img) in images.iter().enumerate() {
        let [t, gh, gw] = img.grid_thw;
        if merge == 0 || !gh.is_multiple_of(merge) || !gw.is_multiple_of(merge) {
            return Err(SpanError::Grid {
                index,
                grid: img.grid_thw,
                merge,
            });
        }
        if img.first < out.len() {
            return Err(SpanError::Overlap {
                index,
                first: img.first,
            });
        }
        let end = img.first + img.tokens(merge);
        if end > len {
            return Err(SpanError::PastEnd { index, end, len });
        }
        while out.len() < img.first {
            out.push([pos; 3]);
            pos += 1;
        }
        let (rows, cols) = (gh / merge, gw / merge);
        for ti in 0..t {
            for r in 0..rows {
                for c in 0..cols {
                    out.push([pos + ti as i64, pos + r as i64, pos + c as i64]);
                }
            }
        }
        pos += rows.max(cols) as i64;
    }
    while out.len() < len {
        out.push([pos; 3]);
        pos += 1;
    }
    let max = out
        .iter()
        .flat_map(|p| p.iter().copied())
        .max()
        .map_or(0, |m| m + 1);
    Ok((out, max - len as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_is_plain_and_has_no_delta() {
        let (p, d) = mrope_positions(4, &[], 2).unwrap();
        assert_eq!(p, vec![[0; 3], [1; 3], [2; 3], [3; 3]]);
        assert_eq!(d, 0);
    }

    #[test]
    fn a_wide_image_advances_by_its_longer_side() {
        // 2 text, an image of 1x2 merged rows x 4 merged cols, 1 text.
        let img = ImageSpan {
            first: 2,
            grid_thw: [1, 2, 8],
        };
        let (p, d) = mrope_positions(7, &[img], 2).unwrap();
        assert_eq!(&p[2..6], &[[2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 2, 5]]);
        assert_eq!(p[6], [6; 3]);
        assert_eq!(d, 0);
        assert!(mrope_positions(5, &[img], 2).is_err());
    }
}
