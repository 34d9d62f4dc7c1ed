//! Causal attention whose result for a query does not depend on how the
//! sequence was split into forwards.
//!
//! A warm turn (earlier tokens from the cache, the rest prefilled) must give
//! bit-identical logits to a cold turn that prefills everything at once.
//! Batched matmuls cannot promise that: the reduction order of a GEMM
//! depends on the matrix shapes, so the same query row summed inside a
//! 40-row chunk and as a single decode row can differ in the last bit, and
//! a greedy near tie then flips. Here every query row is computed in one
//! fixed order whatever the chunk:
//!
//! 1. scores `s_j = q·k_j` for the visible keys, each the fixed-order dot
//!    below (8 FMA lanes over `⌊d/8⌋` blocks, `((l0+l4)+(l1+l5))+((l2+l6)+
//!    (l3+l7))`, then the tail FMAs);
//! 2. `m = max s_j`; `p_j = exp(s_j − m)` (glibc's `expf`, see [`exp`]);
//!    `Σ p_j` summed in key order from `+0`;
//! 3. `acc_e = Σ p_j·v_je` in key order from `+0` (a product, then a sum:
//!    no FMA), and the output `acc_e · (1/Σ)`.
//!
//! The linear layers around it use [`super::block_matmul`], which is
//! row-independent in the same way.
//!
//! Speed comes from computing many queries at once without touching that
//! order ([`tile`]): the queries of a *tile* (a few consecutive positions of
//! every query head that shares a kv head) read each key and value once,
//! the scores of 16 keys are 16 lanes (keys transposed in blocks of 16, so
//! lane `j` runs key `j`'s own 8 partial sums), `exp` runs 8 or 16 lanes,
//! the tile's row sums are interleaved, and the weighted sums keep 16 (or 8)
//! dimensions of several rows in registers while the keys go by in order.
//! Only which element is computed when changes; every element's own
//! sequence of operations is the one above, so the AVX-512 and AVX2 kernel
//! sets and the portable code give the same bits, and so does any tiling.
//!
//! Inputs (f32, strided [`View`]s): per kv head `h`, query rows `r = g·t +
//! i` (group member `g` at window position `i`, already scaled by `1/√d`)
//! and keys/values `0 .. offset + t` (the cache, token-major in
//! `CpuOps`). Query `i` sees keys `0 ..= offset + i`.

mod exp;
mod lanes;
mod tile;

use super::SendPtr;
use super::block_matmul::Isa;
use tile::{Keys, Tile, TileRow};

/// Rows of `d` values per head: row `b` of head `a` starts at
/// `heads[a][b·stride]` (each head's rows contiguous in its own buffer).
pub struct View<'a> {
    pub heads: Vec<&'a [f32]>,
    pub stride: usize,
}

impl View<'_> {
    #[inline]
    fn row(&self, a: usize, b: usize, d: usize) -> &[f32] {
        &self.heads[a][b * self.stride..][..d]
    }
}

/// Keys per transposed block (the score lanes of one pass).
const BLOCK: usize = tile::BLOCK;
/// Query rows a tile aims for: enough to reuse each key block from L1
/// many times, few enough that the tile's score rows stay in L2 at 8K keys.
const TILE_ROWS: usize = 16;
/// Below this many query rows per kv head (decode steps, short verify
/// windows) keys are read in place rather than transposed first: the
/// transposition would cost as much as the attention.
const TRANSPOSE_FROM_ROWS: usize = 8;

/// Causal attention of `rows = group·t` query rows per kv head.
///
/// `q[h, r]` is the query of group member `r / t` at window position
/// `r % t` for kv head `h`; `k[h, j]`, `v[h, j]` for `j < offset + t`. The
/// output row `(h, r)` is written at `y[out_row(h, r) ..]` (the caller
/// chooses the layout).
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    q: &View<'_>,
    k: &View<'_>,
    v: &View<'_>,
    kvh: usize,
    rows: usize,
    t: usize,
    offset: usize,
    d: usize,
    y: &mut [f32],
    out_row: &(dyn Fn(usize, usize) -> usize + Sync),
) {
    causal_attention_with(
        super::block_matmul::isa(),
        q,
        k,
        v,
        kvh,
        rows,
        t,
        offset,
        d,
        y,
        out_row,
    )
}

/// [`causal_attention`] with the kernel set named (tests run every set).
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_attention_with(
    isa: Isa,
    q: &View<'_>,
    k: &View<'_>,
    v: &View<'_>,
    kvh: usize,
    rows: usize,
    t: usize,
    offset: usize,
    d: usize,
    y: &mut [f32],
    out_row: &(dyn Fn(usize, usize) -> usize + Sync),
) {
    if t == 0 || rows == 0 || kvh == 0 {
        return;
    }
    // This head's visible keys and values are contiguous rows of `d` (a
    // stride of `d` is what every caller passes).
    assert!(
        k.stride == d && v.stride == d,
        "attention: rows must be packed"
    );
    let total = offset + t;
    let group = rows / t;
    let pool = candle_core::utils::barrier_pool();
    let threads = candle_core::utils::get_num_threads().max(1);

    let transposed = rows >= TRANSPOSE_FROM_ROWS;
    let blocks = total.div_ceil(BLOCK);
    let mut kt = Vec::new();
    if transposed {
        kt = vec![0f32; kvh * blocks * BLOCK * d];
        let kt_ptr = SendPtr(kt.as_mut_ptr());
        pool.execute_chunked(kvh * blocks, |range| {
            let kt_ptr = &kt_ptr;
            for item in range {
                let (h, b) = (item / blocks, item % blocks);
                let at = (h * blocks + b) * BLOCK * d;
                // SAFETY: each (head, block) owns its `BLOCK·d` values.
                let out = unsafe { std::slice::from_raw_parts_mut(kt_ptr.0.add(at), BLOCK * d) };
                tile::transpose_block(&k.heads[h][..total * d], b, d, out);
            }
        });
    }

    // Tiles: `span` consecutive positions of `members` group members of one
    // kv head. Few tiles (decode steps) split the group so both threads
    // work; otherwise a tile takes the whole group, which shares its keys.
    let mut members = group;
    let mut span = (TILE_ROWS / group).clamp(1, t);
    if kvh * t.div_ceil(span) < 4 * threads {
        members = 1;
        span = TILE_ROWS.min(t);
    }
    let member_blocks = group.div_ceil(members);
    let position_blocks = t.div_ceil(span);
    let per_head = member_blocks * position_blocks;

    let y_ptr = SendPtr(y.as_mut_ptr());
    let y_len = y.len();
    pool.execute_chunked(kvh * per_head, |range| {
        let y_ptr = &y_ptr;
        let mut scratch = tile::Scratch::default();
        for item in range {
            let h = item / per_head;
            let (mb, pb) = ((item % per_head) / position_blocks, item % position_blocks);
            let positions = pb * span..((pb + 1) * span).min(t);
            let mut tile_rows = Vec::with_capacity(members * span);
            for g in mb * members..((mb + 1) * members).min(group) {
                for i in positions.clone() {
                    let r = g * t + i;
                    let at = out_row(h, r);
                    assert!(at + d <= y_len, "attention output row out of bounds");
                    tile_rows.push(TileRow {
                        q: q.row(h, r, d),
                        visible: offset + i + 1,
                        // SAFETY: in bounds (checked above); each (h, r)
                        // is in one tile and owns its row of y.
                        out: unsafe { std::slice::from_raw_parts_mut(y_ptr.0.add(at), d) },
                    });
                }
            }
            let keys = if transposed {
                Keys::Transposed(&kt[h * blocks * BLOCK * d..][..blocks * BLOCK * d])
            } else {
                Keys::Rows(&k.heads[h][..total * d])
            };
            tile::run(
                isa,
                &mut Tile {
                    rows: tile_rows,
                    keys,
                    values: &v.heads[h][..total * d],
                    d,
                },
                &mut scratch,
            );
        }
    });
}

#[inline]
fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dots(a, b) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        b.map(|b| dot(a, b))
    }
}

/// A fixed-order dot product: 8 interleaved partial sums `l[i % 8]` (one
/// FMA each), added as `((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7))`, then the
/// tail. The same for every call whatever the batch.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dots(a, [b])[0] }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        let mut lanes = [0f32; 8];
        let chunks = a.len() / 8;
        for c in 0..chunks {
            for l in 0..8 {
                lanes[l] = a[c * 8 + l].mul_add(b[c * 8 + l], lanes[l]);
            }
        }
        let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for i in chunks * 8..a.len() {
            s = a[i].mul_add(b[i], s);
        }
        s
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    /// `dot` of `a` with each of `b` (all at least `a.len()` long).
    // Inlined into the per-query loop (a call per key costs ~4% of a
    // prefill).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dots<const N: usize>(a: &[f32], b: [&[f32]; N]) -> [f32; N] {
        let n = a.len();
        assert!(b.iter().all(|b| b.len() >= n));
        let chunks = n / 8;
        let mut acc = [_mm256_setzero_ps(); N];
        for c in 0..chunks {
            // SAFETY: c * 8 + 8 <= n <= every length.
            unsafe {
                let av = _mm256_loadu_ps(a.as_ptr().add(c * 8));
                for (acc, b) in acc.iter_mut().zip(&b) {
                    *acc = _mm256_fmadd_ps(av, _mm256_loadu_ps(b.as_ptr().add(c * 8)), *acc);
                }
            }
        }
        std::array::from_fn(|i| {
            let v = acc[i];
            // [l0+l4, l1+l5, l2+l6, l3+l7], then (s0+s1) + (s2+s3).
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let h = _mm_hadd_ps(s, s);
            let mut total = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            for e in chunks * 8..n {
                total = a[e].mul_add(b[i][e], total);
            }
            total
        })
    }
}

#[cfg(test)]
mod tests;
