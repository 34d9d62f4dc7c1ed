//! One tile of query rows (all of one kv head) through the three phases of
//! the module docs, each row in its own fixed order.
//!
//! The inner loops are in [`super::lanes`] (16 lanes and two rows per key
//! block with AVX-512, 8 lanes and one row with AVX2, plain Rust
//! otherwise). Lanes are independent elements (different keys, different
//! dimensions), so the width decides only which elements share an
//! instruction, never the order of any element's own operations.

use super::exp::exp_slice;
use super::lanes;
use super::{Isa, KvElem};

/// Keys per transposed block: `kt[block][e][lane]` is key `16·block + lane`,
/// dimension `e`.
pub(super) const BLOCK: usize = 16;
/// Keys per pass of the weighted sum: their values (32 KiB at `d = 64`)
/// stay in L1 while each group of output dimensions goes by.
const VALUE_CHUNK: usize = 128;

/// How a tile reads its kv head's keys.
pub(super) enum Keys<'a, E> {
    /// Blocks of [`BLOCK`] keys transposed to `[e][lane]`, zero-padded
    /// (f32 whatever the cache holds: the transposition widens).
    Transposed(&'a [f32]),
    /// Token-major rows of `d` (few queries: no transposition).
    Rows(&'a [E]),
}

/// One query row: its query, how many keys it sees, where its output goes.
pub(super) struct TileRow<'a> {
    pub q: &'a [f32],
    pub visible: usize,
    pub out: &'a mut [f32],
}

pub(super) struct Tile<'a, E> {
    pub rows: Vec<TileRow<'a>>,
    pub keys: Keys<'a, E>,
    pub values: &'a [E],
    pub d: usize,
}

/// Per-thread buffers, reused across the tiles a worker takes.
#[derive(Default)]
pub(super) struct Scratch {
    scores: Vec<f32>,
    acc: Vec<f32>,
    sums: Vec<f32>,
}

/// Key `b·BLOCK + lane` of `k` (token-major rows of `d`) to
/// `out[e·BLOCK + lane]` (widened to f32, exactly); lanes past the last
/// key stay zero.
pub(super) fn transpose_block<E: KvElem>(k: &[E], b: usize, d: usize, out: &mut [f32]) {
    let keys = k.len() / d;
    for lane in 0..BLOCK.min(keys.saturating_sub(b * BLOCK)) {
        let key = &k[(b * BLOCK + lane) * d..][..d];
        for (e, &x) in key.iter().enumerate() {
            out[e * BLOCK + lane] = x.widen();
        }
    }
}

/// Every row of `tile`, written to its `out`.
pub(super) fn run<E: KvElem>(isa: Isa, tile: &mut Tile<'_, E>, scratch: &mut Scratch) {
    match isa {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: `Isa::Avx512` is only chosen when the CPU has AVX-512F.
        Isa::Avx512 => unsafe { run_avx512(tile, scratch) },
        _ => body::<1, E>(isa, tile, scratch),
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
#[target_feature(enable = "avx512f")]
fn run_avx512<E: KvElem>(tile: &mut Tile<'_, E>, scratch: &mut Scratch) {
    body::<2, E>(Isa::Avx512, tile, scratch)
}

/// The three phases for every row of the tile; `QB` rows share each
/// transposed key block.
#[inline(always)]
fn body<const QB: usize, E: KvElem>(isa: Isa, tile: &mut Tile<'_, E>, scratch: &mut Scratch) {
    let d = tile.d;
    let n = tile.rows.len();
    if n == 0 {
        return;
    }
    let most = tile.rows.iter().map(|r| r.visible).max().unwrap_or(0);
    let least = tile.rows.iter().map(|r| r.visible).min().unwrap_or(0);
    // Score rows padded to whole blocks, so `exp` runs whole vectors.
    let width = most.div_ceil(BLOCK) * BLOCK;
    scratch.scores.clear();
    scratch.scores.resize(n * width, 0.0);
    let scores = &mut scratch.scores;

    // 1. Scores.
    match tile.keys {
        Keys::Transposed(kt) => {
            for b in 0..width / BLOCK {
                let block = &kt[b * BLOCK * d..][..BLOCK * d];
                let mut r = 0;
                while r + QB <= n {
                    let qs: [&[f32]; QB] = std::array::from_fn(|i| tile.rows[r + i].q);
                    let s: [[f32; BLOCK]; QB] = lanes::scores::<QB>(isa, qs, block, d);
                    for (i, s) in s.iter().enumerate() {
                        scores[(r + i) * width + b * BLOCK..][..BLOCK].copy_from_slice(s);
                    }
                    r += QB;
                }
                for r in r..n {
                    let s = lanes::scores::<1>(isa, [tile.rows[r].q], block, d);
                    scores[r * width + b * BLOCK..][..BLOCK].copy_from_slice(&s[0]);
                }
            }
        }
        Keys::Rows(k) => {
            // Four keys at a time, every row per key quad: each key is read
            // once for the tile, and each score is still `dot`'s.
            let quads = most / 4;
            let values = tile.values;
            for j4 in 0..quads {
                // The values phase 3 reads: asked for now, so their lines
                // come from memory while the scores are computed (a decode
                // step's keys and values are read once, from DRAM: without
                // this, the two passes wait for memory one after the other).
                prefetch_rows(&values[j4 * 4 * d..][..4 * d]);
                let ks = &k[j4 * 4 * d..][..4 * d];
                let (k0, rest) = ks.split_at(d);
                let (k1, rest) = rest.split_at(d);
                let (k2, k3) = rest.split_at(d);
                for (r, row) in tile.rows.iter().enumerate() {
                    if j4 * 4 < row.visible {
                        let s = super::dot4_on(isa, row.q, [k0, k1, k2, k3]);
                        scores[r * width + j4 * 4..][..4].copy_from_slice(&s);
                    }
                }
            }
            for (r, row) in tile.rows.iter().enumerate() {
                for j in quads * 4..row.visible {
                    scores[r * width + j] = super::dot(row.q, &k[j * d..][..d]);
                }
            }
        }
    }

    // 2. Max, exponentials, and the sums in key order.
    for (r, row) in tile.rows.iter().enumerate() {
        let s = &mut scores[r * width..][..width];
        let visible = row.visible;
        let max = max_of(&s[..visible]);
        for x in &mut s[..visible] {
            *x -= max;
        }
        // Lanes past the row's keys: exp(0), never read.
        let whole = visible.div_ceil(BLOCK) * BLOCK;
        s[visible..whole].fill(0.0);
        exp_slice(isa, &mut s[..whole]);
    }
    scratch.sums.clear();
    scratch.sums.resize(n, 0.0);
    let sums = &mut scratch.sums;
    // The keys every row sees: one addition chain per row, interleaved.
    sums_keys_all_rows_see(scores, width, least, sums);
    for (r, row) in tile.rows.iter().enumerate() {
        for j in least..row.visible {
            sums[r] += scores[r * width + j];
        }
    }

    // 3. Weighted sums of values, in key order per row.
    scratch.acc.clear();
    scratch.acc.resize(n * d, 0.0);
    let acc = &mut scratch.acc;
    let values = tile.values;
    weighted_keys_all_rows_see(isa, scores, width, values, d, 0..d, least, n, acc);
    for (r, row) in tile.rows.iter_mut().enumerate() {
        let a = &mut acc[r * d..][..d];
        lanes::weighted::<1, E>(
            isa,
            &scores[r * width..],
            width,
            values,
            d,
            0..d,
            least..row.visible,
            a,
        );
        let inv = 1.0 / sums[r];
        for (o, a) in row.out.iter_mut().zip(a.iter()) {
            *o = a * inv;
        }
    }
}

/// Ask for every cache line of `x` into L2 (a hint: no value changes).
#[inline(always)]
pub(super) fn prefetch_rows<E>(x: &[E]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(x);
        let p = x.as_ptr().cast::<i8>();
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch of an address inside `x` (never faults,
            // reads nothing into the program's state).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.add(at))
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Rows a pass over the keys takes when `left` rows remain: the register
/// groups of 8, 4, 2 or 1 both key-order passes below use.
#[inline(always)]
fn rows_per_pass(left: usize) -> usize {
    match left {
        8.. => 8,
        4..=7 => 4,
        2 | 3 => 2,
        _ => 1,
    }
}

/// `sums[r] += Σ_{j < least} p[r·width + j]` for every row, each row one
/// addition chain in key order. Rows go in groups of 8, 4, 2 or 1 whose
/// chains are interleaved in registers (a chain kept in memory cost a
/// store and a reload per addition: an eighth of a prefill tile's time).
#[inline(always)]
fn sums_keys_all_rows_see(p: &[f32], width: usize, least: usize, sums: &mut [f32]) {
    let n = sums.len();
    let mut r = 0;
    while r < n {
        let step = rows_per_pass(n - r);
        let (p, s) = (&p[r * width..], &mut sums[r..r + step]);
        match step {
            8 => interleaved_chains::<8>(p, width, least, s),
            4 => interleaved_chains::<4>(p, width, least, s),
            2 => interleaved_chains::<2>(p, width, least, s),
            _ => interleaved_chains::<1>(p, width, least, s),
        }
        r += step;
    }
}

#[inline(always)]
fn interleaved_chains<const R: usize>(p: &[f32], width: usize, least: usize, sums: &mut [f32]) {
    let rows: [&[f32]; R] = std::array::from_fn(|i| &p[i * width..][..least]);
    let mut acc: [f32; R] = std::array::from_fn(|i| sums[i]);
    for j in 0..least {
        for (a, row) in acc.iter_mut().zip(&rows) {
            *a += row[j];
        }
    }
    sums[..R].copy_from_slice(&acc);
}

/// `max` of a row, NaNs ignored as `f32::max` ignores them. Lanes keep
/// their own maxima; the result is the same value whatever the grouping
/// (a maximum is exact), and a `±0` tie gives the same `s − max` anyway.
#[inline(always)]
pub(super) fn max_of(s: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = s.chunks_exact(16);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            if x > *m {
                *m = x;
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        if x > max {
            max = x;
        }
    }
    max
}

/// `acc[r] += p_r · v` over the keys `0..least` every row sees, for rows
/// `0..n` (row `r`'s probabilities at `p[r·width..]`, its sums at
/// `acc[r·d..]`), columns `cols`: [`VALUE_CHUNK`] keys at a time so their
/// values stay in L1, rows in register groups of 8, 4, 2 or 1. Each
/// element still adds its keys in order (the chunks and groups only decide
/// which elements share a pass).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn weighted_keys_all_rows_see<E: KvElem>(
    isa: Isa,
    p: &[f32],
    width: usize,
    values: &[E],
    d: usize,
    cols: std::ops::Range<usize>,
    least: usize,
    n: usize,
    acc: &mut [f32],
) {
    let mut from = 0;
    while from < least {
        let to = (from + VALUE_CHUNK).min(least);
        let mut r = 0;
        while r < n {
            macro_rules! pass {
                ($qb:literal) => {
                    lanes::weighted::<$qb, E>(
                        isa,
                        &p[r * width..],
                        width,
                        values,
                        d,
                        cols.clone(),
                        from..to,
                        &mut acc[r * d..][..$qb * d],
                    )
                };
            }
            let step = rows_per_pass(n - r);
            match step {
                8 => pass!(8),
                4 => pass!(4),
                2 => pass!(2),
                _ => pass!(1),
            }
            r += step;
        }
        from = to;
    }
}
