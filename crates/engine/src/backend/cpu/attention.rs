//! Causal attention whose result for a query does not depend on how the
//! sequence was split into forwards.
//!
//! A warm turn (earlier tokens from the cache, the rest prefilled) must give
//! bit-identical logits to a cold turn that prefills everything at once.
//! Batched matmuls cannot promise that: the reduction order of a GEMM
//! depends on the matrix shapes, so the same query row summed inside a
//! 40-row chunk and as a single decode row can differ in the last bit, and
//! a greedy near tie then flips. Here every query row is computed by the
//! same sequential code whatever the chunk: scores `q·k_j` for the visible
//! keys in order, a max-subtracted softmax summed in order, and the weighted
//! sum of values in order. The linear layers around it use
//! [`super::block_matmul`], which is row-independent in the same way.
//!
//! Inputs (f32, strided [`View`]s): per kv head `h`, query rows `r = g·t +
//! i` (group member `g` at window position `i`, already scaled by `1/√d`)
//! and keys/values `0 .. offset + t` (the cache, token-major in
//! `CpuOps`). Query `i` sees keys `0 ..= offset + i`.

use super::SendPtr;

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
    let total = offset + t;
    let y_ptr = SendPtr(y.as_mut_ptr());
    let y_len = y.len();
    let pool = candle_core::utils::barrier_pool();
    // One work item per (kv head, query row); each writes its own row of y.
    pool.execute_chunked(kvh * rows, |range| {
        let y_ptr = &y_ptr;
        let mut scores = vec![0f32; total];
        let mut acc = vec![0f32; d];
        for item in range {
            let (h, r) = (item / rows, item % rows);
            let visible = offset + r % t + 1;
            let qr = q.row(h, r, d);
            // This head's visible keys and values, contiguous rows of `d`
            // (a stride of `d` is what every caller passes).
            debug_assert!(k.stride == d && v.stride == d);
            let kh = &k.heads[h][..visible * d];
            let vh = &v.heads[h][..visible * d];
            // Four keys at a time: independent sums hide the FMA
            // latency; each key's sum is still `dot`'s.
            let mut quads = kh.chunks_exact(4 * d);
            for (four, s) in (&mut quads).zip(scores.chunks_exact_mut(4)) {
                let (k0, rest) = four.split_at(d);
                let (k1, rest) = rest.split_at(d);
                let (k2, k3) = rest.split_at(d);
                s.copy_from_slice(&dot4(qr, [k0, k1, k2, k3]));
            }
            let done = visible / 4 * 4;
            for (key, s) in quads
                .remainder()
                .chunks_exact(d)
                .zip(&mut scores[done..visible])
            {
                *s = dot(qr, key);
            }
            let max = scores[..visible]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            // The exponentials first, then their sum in key order (the same
            // sequence of additions as summing inside the loop, but the
            // running sum is not carried across the calls to `exp`).
            for s in &mut scores[..visible] {
                *s = (*s - max).exp();
            }
            let mut sum = 0f32;
            for &s in &scores[..visible] {
                sum += s;
            }
            acc.fill(0.0);
            for (&p, vj) in scores[..visible].iter().zip(vh.chunks_exact(d)) {
                for (a, &x) in acc.iter_mut().zip(vj) {
                    *a += p * x;
                }
            }
            let inv = 1.0 / sum;
            let at = out_row(h, r);
            assert!(at + d <= y_len, "attention output row out of bounds");
            // SAFETY: in bounds (checked above); each (h, r) owns its row.
            let out = unsafe { std::slice::from_raw_parts_mut(y_ptr.0.add(at), d) };
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = a * inv;
            }
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
mod tests {
    use super::*;

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Softmax attention in f64 for one query row.
    fn reference(q: &[f32], k: &[f32], v: &[f32], visible: usize, d: usize) -> Vec<f64> {
        let s: Vec<f64> = (0..visible)
            .map(|j| (0..d).map(|e| q[e] as f64 * k[j * d + e] as f64).sum())
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = p.iter().sum();
        (0..d)
            .map(|e| {
                (0..visible)
                    .map(|j| p[j] * v[j * d + e] as f64)
                    .sum::<f64>()
                    / z
            })
            .collect()
    }

    #[test]
    fn four_key_dot_is_bit_identical_to_single_dots() {
        for d in [64, 20, 5] {
            // The tree the docs promise, written out in scalar code.
            let tree = |a: &[f32], b: &[f32]| {
                let mut l = [0f32; 8];
                let chunks = a.len() / 8;
                for c in 0..chunks {
                    for i in 0..8 {
                        l[i] = a[c * 8 + i].mul_add(b[c * 8 + i], l[i]);
                    }
                }
                let mut s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
                for i in chunks * 8..a.len() {
                    s = a[i].mul_add(b[i], s);
                }
                s
            };
            let a = random(d, 7);
            let keys: Vec<Vec<f32>> = (0..4).map(|i| random(d, 8 + i)).collect();
            let four = dot4(&a, [&keys[0], &keys[1], &keys[2], &keys[3]]);
            for (i, key) in keys.iter().enumerate() {
                assert_eq!(four[i].to_bits(), dot(&a, key).to_bits(), "d={d} key {i}");
                assert_eq!(four[i].to_bits(), tree(&a, key).to_bits(), "d={d} key {i}");
            }
        }
    }

    #[test]
    fn matches_f64_softmax_attention_and_ignores_chunking() {
        let (kvh, group, d, total) = (2, 3, 16, 11);
        let kd = random(kvh * total * d, 1);
        let vd = random(kvh * total * d, 2);
        // Per (head, group member, position) query vectors.
        let qd = random(kvh * group * total * d, 3);
        let query = |h: usize, g: usize, pos: usize| {
            let at = ((h * group + g) * total + pos) * d;
            &qd[at..at + d]
        };
        // Run the sequence as windows [0..4), [4..5), [5..11) and as one.
        let run = |splits: &[(usize, usize)]| -> Vec<Vec<f32>> {
            let mut out = vec![vec![0f32; d]; kvh * group * total];
            for &(offset, t) in splits {
                let mut qw = Vec::new();
                for h in 0..kvh {
                    for g in 0..group {
                        for i in 0..t {
                            qw.extend_from_slice(query(h, g, offset + i));
                        }
                    }
                }
                let rows = group * t;
                fn view(data: &[f32], rows_per_head: usize, d: usize) -> View<'_> {
                    View {
                        heads: data.chunks(rows_per_head * d).collect(),
                        stride: d,
                    }
                }
                let mut y = vec![0f32; kvh * rows * d];
                causal_attention(
                    &view(&qw, rows, d),
                    &view(&kd, total, d),
                    &view(&vd, total, d),
                    kvh,
                    rows,
                    t,
                    offset,
                    d,
                    &mut y,
                    &|h, r| (h * rows + r) * d,
                );
                for h in 0..kvh {
                    for g in 0..group {
                        for i in 0..t {
                            let row = (h * group + g) * t + i;
                            out[(h * group + g) * total + offset + i] =
                                y[row * d..(row + 1) * d].to_vec();
                        }
                    }
                }
            }
            out
        };
        let whole = run(&[(0, total)]);
        let split = run(&[(0, 4), (4, 1), (5, 6)]);
        assert_eq!(whole, split, "chunking must not change a single bit");
        for h in 0..kvh {
            for g in 0..group {
                for pos in 0..total {
                    let want = reference(
                        query(h, g, pos),
                        &kd[h * total * d..],
                        &vd[h * total * d..],
                        pos + 1,
                        d,
                    );
                    let got = &whole[(h * group + g) * total + pos];
                    for (a, b) in got.iter().zip(&want) {
                        assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
                    }
                }
            }
        }
    }
}
