//! One tile of query rows (all of one kv head) through the three phases of
//! the module docs, each row in its own fixed order.
//!
//! The arithmetic is written once, as per-lane code over fixed-size arrays,
//! and compiled twice: inside an AVX-512 function (16-lane score blocks and
//! weighted sums, two rows per key block) and at the AVX2 baseline (8 lanes,
//! one row). Lanes are independent elements (different keys, different
//! dimensions), so the width decides only which elements share an
//! instruction, never the order of any element's own operations.

use super::Isa;
use super::exp::exp_slice;

/// Keys per transposed block: `kt[block][e][lane]` is key `16·block + lane`,
/// dimension `e`.
pub(super) const BLOCK: usize = 16;
/// Keys per pass of the weighted sum: their values (32 KiB at `d = 64`)
/// stay in L1 while each group of output dimensions goes by.
const VALUE_CHUNK: usize = 128;

/// How a tile reads its kv head's keys.
pub(super) enum Keys<'a> {
    /// Blocks of [`BLOCK`] keys transposed to `[e][lane]`, zero-padded.
    Transposed(&'a [f32]),
    /// Token-major rows of `d` (few queries: no transposition).
    Rows(&'a [f32]),
}

/// One query row: its query, how many keys it sees, where its output goes.
pub(super) struct TileRow<'a> {
    pub q: &'a [f32],
    pub visible: usize,
    pub out: &'a mut [f32],
}

pub(super) struct Tile<'a> {
    pub rows: Vec<TileRow<'a>>,
    pub keys: Keys<'a>,
    pub values: &'a [f32],
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
/// `out[e·BLOCK + lane]`; lanes past the last key stay zero.
pub(super) fn transpose_block(k: &[f32], b: usize, d: usize, out: &mut [f32]) {
    let keys = k.len() / d;
    for lane in 0..BLOCK.min(keys.saturating_sub(b * BLOCK)) {
        let key = &k[(b * BLOCK + lane) * d..][..d];
        for (e, &x) in key.iter().enumerate() {
            out[e * BLOCK + lane] = x;
        }
    }
}

/// Every row of `tile`, written to its `out`.
pub(super) fn run(isa: Isa, tile: &mut Tile<'_>, scratch: &mut Scratch) {
    match isa {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        // SAFETY: `Isa::Avx512` is only chosen when the CPU has AVX-512F.
        Isa::Avx512 => unsafe { run_avx512(tile, scratch) },
        _ => body::<1, 8, 8>(isa, tile, scratch),
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[target_feature(enable = "avx512f")]
fn run_avx512(tile: &mut Tile<'_>, scratch: &mut Scratch) {
    body::<2, 16, 16>(Isa::Avx512, tile, scratch)
}

/// The three phases for every row of the tile. `QB` rows share each
/// transposed key block, `KW` score lanes (≤ [`BLOCK`]) per pass, `VW`
/// output dimensions per weighted-sum pass.
#[inline(always)]
fn body<const QB: usize, const KW: usize, const VW: usize>(
    isa: Isa,
    tile: &mut Tile<'_>,
    scratch: &mut Scratch,
) {
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
                for half in (0..BLOCK).step_by(KW) {
                    let mut r = 0;
                    while r + QB <= n {
                        let qs: [&[f32]; QB] = std::array::from_fn(|i| tile.rows[r + i].q);
                        let s: [[f32; KW]; QB] = block_scores::<QB, KW>(qs, block, half, d);
                        for (i, s) in s.iter().enumerate() {
                            scores[(r + i) * width + b * BLOCK + half..][..KW].copy_from_slice(s);
                        }
                        r += QB;
                    }
                    for r in r..n {
                        let s = block_scores::<1, KW>([tile.rows[r].q], block, half, d);
                        scores[r * width + b * BLOCK + half..][..KW].copy_from_slice(&s[0]);
                    }
                }
            }
        }
        Keys::Rows(k) => {
            // Four keys at a time, every row per key quad: each key is read
            // once for the tile, and each score is still `dot`'s.
            let quads = most / 4;
            for j4 in 0..quads {
                let ks = &k[j4 * 4 * d..][..4 * d];
                let (k0, rest) = ks.split_at(d);
                let (k1, rest) = rest.split_at(d);
                let (k2, k3) = rest.split_at(d);
                for (r, row) in tile.rows.iter().enumerate() {
                    if j4 * 4 < row.visible {
                        let s = super::dot4(row.q, [k0, k1, k2, k3]);
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
    for j in 0..least {
        for (r, sum) in sums.iter_mut().enumerate() {
            *sum += scores[r * width + j];
        }
    }
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
    let mut from = 0;
    while from < least {
        let to = (from + VALUE_CHUNK).min(least);
        let mut r = 0;
        while r < n {
            let rows = (n - r).min(8);
            macro_rules! pass {
                ($qb:literal) => {
                    weighted_rows::<$qb, VW>(
                        &scores[r * width..],
                        width,
                        values,
                        d,
                        from..to,
                        &mut acc[r * d..][..$qb * d],
                    )
                };
            }
            let step = match rows {
                8 => 8,
                4..=7 => 4,
                2 | 3 => 2,
                _ => 1,
            };
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
    for (r, row) in tile.rows.iter_mut().enumerate() {
        let a = &mut acc[r * d..][..d];
        weighted_rows::<1, VW>(
            &scores[r * width..],
            width,
            values,
            d,
            least..row.visible,
            a,
        );
        let inv = 1.0 / sums[r];
        for (o, a) in row.out.iter_mut().zip(a.iter()) {
            *o = a * inv;
        }
    }
}

/// `max` of a row, NaNs ignored as `f32::max` ignores them. Lanes keep
/// their own maxima; the result is the same value whatever the grouping
/// (a maximum is exact), and a `±0` tie gives the same `s − max` anyway.
#[inline(always)]
fn max_of(s: &[f32]) -> f32 {
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

/// Scores of `QB` queries against lanes `half .. half + KW` of one
/// transposed block: lane `j` accumulates `q[c·8+l]·k_j[c·8+l]` into its
/// partial sum `l` by FMA for `c` in order, then the tree and the tail.
#[inline(always)]
fn block_scores<const QB: usize, const KW: usize>(
    qs: [&[f32]; QB],
    block: &[f32],
    half: usize,
    d: usize,
) -> [[f32; KW]; QB] {
    let chunks = d / 8;
    assert!(block.len() >= BLOCK * d && half + KW <= BLOCK);
    assert!(qs.iter().all(|q| q.len() >= d));
    let mut acc = [[[0f32; KW]; 8]; QB];
    for c in 0..chunks {
        for l in 0..8 {
            let e = c * 8 + l;
            let keys: &[f32; KW] = block[e * BLOCK + half..][..KW].try_into().unwrap();
            for (acc, q) in acc.iter_mut().zip(&qs) {
                let qe = q[e];
                for (a, &k) in acc[l].iter_mut().zip(keys) {
                    *a = qe.mul_add(k, *a);
                }
            }
        }
    }
    let mut out = [[0f32; KW]; QB];
    for ((out, acc), q) in out.iter_mut().zip(&acc).zip(&qs) {
        for (j, o) in out.iter_mut().enumerate() {
            let l = |i: usize| acc[i][j];
            let mut s = ((l(0) + l(4)) + (l(1) + l(5))) + ((l(2) + l(6)) + (l(3) + l(7)));
            for e in chunks * 8..d {
                s = q[e].mul_add(block[e * BLOCK + half + j], s);
            }
            *o = s;
        }
    }
    out
}

/// `acc[b] += p_bj · v_j` for keys `keys` in order, for `QB` consecutive
/// score rows (`p` row `b` at `p[b·width ..]`), `VW` dimensions at a time
/// held in registers (the dimensions past the last whole group one by one).
/// A product and then a sum: no FMA, as the scalar code always did.
#[inline(always)]
fn weighted_rows<const QB: usize, const VW: usize>(
    p: &[f32],
    width: usize,
    values: &[f32],
    d: usize,
    keys: std::ops::Range<usize>,
    acc: &mut [f32],
) {
    if keys.is_empty() {
        return;
    }
    assert!(p.len() >= (QB - 1) * width + keys.end && acc.len() >= QB * d);
    assert!(values.len() >= keys.end * d);
    let whole = d / VW * VW;
    for e0 in (0..whole).step_by(VW) {
        let mut a: [[f32; VW]; QB] =
            std::array::from_fn(|b| acc[b * d + e0..][..VW].try_into().unwrap());
        for j in keys.clone() {
            let v: &[f32; VW] = values[j * d + e0..][..VW].try_into().unwrap();
            for (b, a) in a.iter_mut().enumerate() {
                let pj = p[b * width + j];
                for (a, &x) in a.iter_mut().zip(v) {
                    *a += pj * x;
                }
            }
        }
        for (b, a) in a.iter().enumerate() {
            acc[b * d + e0..][..VW].copy_from_slice(a);
        }
    }
    for e in whole..d {
        for b in 0..QB {
            let mut a = acc[b * d + e];
            for j in keys.clone() {
                a += p[b * width + j] * values[j * d + e];
            }
            acc[b * d + e] = a;
        }
    }
}
