//! Several matrices times the same activation rows in one pool dispatch.
//!
//! A layer asks for small products of one input in a row (llama's q, k and
//! v; its gate and up), and each [`BlockMatrix::matmul`] is one dispatch of
//! the pool, ending at a barrier where the two threads wait for each other.
//! Here the row groups of every part form one list that the pool splits
//! once, and the activations' block sums are computed once. Each output
//! element runs the operations of [`BlockMatrix::matmul`] (which thread
//! computes a group changes no bit), so every part has the bits of its own
//! product.

use super::{BLOCK, BLOCK_SUMS, BlockMatrix, COLUMNS, block_sums, isa};
use crate::backend::cpu::SendPtr;

impl BlockMatrix {
    /// `ys[i] = x · parts[i]ᵀ`: `x` is `[m, k]`, every part `[n_i, k]` and
    /// `ys[i]` `[m, n_i]`.
    pub fn matmul_several(parts: &[&BlockMatrix], x: &[f32], m: usize, ys: &mut [&mut [f32]]) {
        assert_eq!(parts.len(), ys.len(), "one output per part");
        let Some(k) = parts.first().map(|w| w.k) else {
            return;
        };
        assert_eq!(x.len(), m * k, "x must be [m, k]");
        for (w, y) in parts.iter().zip(ys.iter()) {
            assert_eq!(w.k, k, "the parts share k");
            assert_eq!(y.len(), m * w.n, "y must be [m, n]");
        }
        let isa = isa();
        // The calling thread's buffer, as in `matmul_with`.
        let mut sums = BLOCK_SUMS.take();
        sums.clear();
        sums.resize(m * (k / BLOCK), 0.0);
        block_sums(x, &mut sums);
        // Part i's row groups follow part i - 1's in one list.
        let total = parts.iter().map(|w| w.n.div_ceil(COLUMNS)).sum();
        let ptrs: Vec<SendPtr> = ys.iter_mut().map(|y| SendPtr(y.as_mut_ptr())).collect();
        let (sx, ptrs) = (&sums, &ptrs);
        candle_core::utils::barrier_pool().execute_chunked(total, |range| {
            let mut start = 0;
            for (w, y) in parts.iter().zip(ptrs) {
                let end = start + w.n.div_ceil(COLUMNS);
                let (lo, hi) = (range.start.max(start), range.end.min(end));
                if lo < hi {
                    // SAFETY: `y` is `[m, n]` of this part and outlives the
                    // call (the pool joins before returning); work items
                    // own disjoint ranges of the list, so disjoint groups.
                    unsafe { w.run_range(isa, x, sx, m, y, lo - start..hi - start) };
                }
                start = end;
            }
        });
        BLOCK_SUMS.set(sums);
    }
}
