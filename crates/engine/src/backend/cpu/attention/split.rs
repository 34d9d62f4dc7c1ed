//! Attention for few query rows over many keys (decode steps and verify
//! windows at depth), split across threads by keys and by dimensions
//! instead of by query rows, in the per-query order of the module docs.
//!
//! A decode step has one query row per query head: with tiles, either each
//! group member reads its kv head's whole cache (a group of three reads it
//! three times: ~270 MB per token at 4K keys on the default model), or the
//! group shares one tile per kv head and three tiles keep two threads
//! unevenly busy. Here the three phases run as three parallel passes, each
//! over items that read a disjoint part of the cache once for every row of
//! the kv head:
//!
//! 1. scores by (kv head, [`KEY_CHUNK`] keys): each key is read once and
//!    dotted with every row's query (`dot`'s order, as in the tiles);
//! 2. per row: the maximum, `exp(s − m)` and the sum in key order from
//!    `+0`, exactly the tile's sequence;
//! 3. weighted sums by (kv head, [`COL_CHUNK`] dimensions): each value
//!    element is read once for every row, keys in order from `+0`, then
//!    `· (1/Σ)`.
//!
//! No partial softmax is merged (that would change the order); only which
//! thread computes an element changes, so every row has the bits the tiles
//! give it.

use super::exp::exp_slice;
use super::lanes;
use super::tile::{BLOCK, max_of, prefetch_rows, weighted_keys_all_rows_see};
use super::{Isa, KvElem, SendPtr, View, dot, dot4};

/// Keys per scoring item: 256 keys of `d = 64` f16 are 32 KiB, read once
/// and dotted with every row while they sit in L1.
const KEY_CHUNK: usize = 256;
/// Keys ahead of the scores whose rows a scoring item asks memory for
/// (16 KiB at `d = 64` f32): at 4K keys the scores waited on the cache's
/// reads, which the hardware prefetcher alone did not keep ahead of.
const AHEAD: usize = 64;
/// Dimensions per weighted-sum item: at `d = 64` an f16 value row is two
/// 64-byte lines, so an item reads whole lines and two items share a head.
const COL_CHUNK: usize = 32;

/// The arguments of [`super::causal_attention_with`], computed by keys and
/// dimensions. Row `r` of kv head `h` sees keys `0 ..= offset + r % t`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run<E: KvElem>(
    isa: Isa,
    q: &View<'_>,
    k: &View<'_, E>,
    v: &View<'_, E>,
    kvh: usize,
    rows: usize,
    t: usize,
    offset: usize,
    d: usize,
    y: &mut [f32],
    out_row: &(dyn Fn(usize, usize) -> usize + Sync),
) {
    let total = offset + t;
    let visible = |r: usize| offset + r % t + 1;
    let width = total.div_ceil(BLOCK) * BLOCK;
    let pool = candle_core::utils::barrier_pool();

    // 1. Scores: `scores[(h·rows + r)·width + j]`.
    let mut scores = vec![0f32; kvh * rows * width];
    let chunks = total.div_ceil(KEY_CHUNK);
    let s_ptr = SendPtr(scores.as_mut_ptr());
    pool.execute_chunked(kvh * chunks, |range| {
        let s_ptr = &s_ptr;
        for item in range {
            let (h, c) = (item / chunks, item % chunks);
            let keys = c * KEY_CHUNK..((c + 1) * KEY_CHUNK).min(total);
            let kh = &k.heads[h][..total * d];
            // SAFETY: item (h, c) alone writes columns `keys` of head h's
            // score rows; the buffer holds `kvh·rows·width` values.
            let head = unsafe {
                std::slice::from_raw_parts_mut(s_ptr.0.add(h * rows * width), rows * width)
            };
            let mut j = keys.start;
            while j + 4 <= keys.end {
                if let Some(ahead) = kh.get((j + AHEAD) * d..(j + AHEAD + 4) * d) {
                    prefetch_rows(ahead);
                }
                let ks: [&[E]; 4] = std::array::from_fn(|i| &kh[(j + i) * d..][..d]);
                for r in 0..rows {
                    if j < visible(r) {
                        let s = dot4(q.row(h, r, d), ks);
                        head[r * width + j..][..4].copy_from_slice(&s);
                    }
                }
                j += 4;
            }
            for j in j..keys.end {
                for r in 0..rows {
                    if j < visible(r) {
                        head[r * width + j] = dot(q.row(h, r, d), &kh[j * d..][..d]);
                    }
                }
            }
        }
    });
    // A quad of keys is scored for every row that sees its first key; the
    // scores past a row's last key are discarded here, as the tiles never
    // compute them.

    // 2. Maxima, exponentials, sums in key order.
    let mut sums = vec![0f32; kvh * rows];
    let sum_ptr = SendPtr(sums.as_mut_ptr());
    pool.execute_chunked(kvh * rows, |range| {
        let (s_ptr, sum_ptr) = (&s_ptr, &sum_ptr);
        for hr in range {
            let seen = visible(hr % rows);
            // SAFETY: row `hr` of the scores and `sums[hr]` belong to this
            // item alone.
            let (s, sum) = unsafe {
                (
                    std::slice::from_raw_parts_mut(s_ptr.0.add(hr * width), width),
                    &mut *sum_ptr.0.add(hr),
                )
            };
            let max = max_of(&s[..seen]);
            for x in &mut s[..seen] {
                *x -= max;
            }
            let whole = seen.div_ceil(BLOCK) * BLOCK;
            s[seen..whole].fill(0.0);
            exp_slice(isa, &mut s[..whole]);
            let mut total = 0f32;
            for &p in &s[..seen] {
                total += p;
            }
            *sum = total;
        }
    });

    // 3. Weighted sums by (kv head, column chunk), then `· (1/Σ)`.
    let col_chunks = d.div_ceil(COL_CHUNK);
    let least = visible(0).min(visible(t - 1));
    let y_ptr = SendPtr(y.as_mut_ptr());
    let y_len = y.len();
    let (scores, sums) = (&scores, &sums);
    pool.execute_chunked(kvh * col_chunks, |range| {
        let y_ptr = &y_ptr;
        let mut acc = vec![0f32; rows * d];
        for item in range {
            let (h, c) = (item / col_chunks, item % col_chunks);
            let cols = c * COL_CHUNK..((c + 1) * COL_CHUNK).min(d);
            let p = &scores[h * rows * width..][..rows * width];
            let values = &v.heads[h][..total * d];
            acc.fill(0.0);
            weighted_keys_all_rows_see(
                isa,
                p,
                width,
                values,
                d,
                cols.clone(),
                least,
                rows,
                &mut acc,
            );
            for r in 0..rows {
                let a = &mut acc[r * d..][..d];
                lanes::weighted::<1, E>(
                    isa,
                    &p[r * width..],
                    width,
                    values,
                    d,
                    cols.clone(),
                    least..visible(r),
                    a,
                );
                let at = out_row(h, r);
                assert!(at + d <= y_len, "attention output row out of bounds");
                let inv = 1.0 / sums[h * rows + r];
                for e in cols.clone() {
                    // SAFETY: in bounds (checked above); item (h, c) alone
                    // writes columns `cols` of head h's output rows.
                    unsafe { *y_ptr.0.add(at + e) = a[e] * inv };
                }
            }
        }
    });
}
