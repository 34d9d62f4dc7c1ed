//! The kernel against f64 softmax attention, against the per-query order
//! it replaced, across chunkings and kernel sets.

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

/// Two keys to a 512-bit register (`pairs.rs`): every ISA the machine runs
/// gives `dot4`'s bits, for f32 and f16 keys, whole and partial chunks.
#[test]
fn paired_key_dots_are_the_four_key_dots() {
    let mut isas = vec![Isa::Portable, Isa::Avx2];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        isas.push(Isa::Avx512);
    }
    for d in [64, 67, 128, 20, 5] {
        let a = random(d, 17);
        let keys: Vec<Vec<f32>> = (0..4).map(|i| random(d + 3, 18 + i)).collect();
        let halves: Vec<Vec<half::f16>> = keys
            .iter()
            .map(|k| k.iter().map(|&x| half::f16::from_f32(x)).collect())
            .collect();
        let want = dot4(&a, [&keys[0], &keys[1], &keys[2], &keys[3]]);
        let want_h = dot4(&a, [&halves[0], &halves[1], &halves[2], &halves[3]]);
        for &isa in &isas {
            let got = dot4_on(isa, &a, [&keys[0], &keys[1], &keys[2], &keys[3]]);
            let got_h = dot4_on(isa, &a, [&halves[0], &halves[1], &halves[2], &halves[3]]);
            for i in 0..4 {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "{isa:?} d={d} f32 key {i}"
                );
                assert_eq!(
                    got_h[i].to_bits(),
                    want_h[i].to_bits(),
                    "{isa:?} d={d} f16 key {i}"
                );
            }
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

/// The kernel sets this machine can run.
fn kernel_sets() -> Vec<Isa> {
    let mut out = vec![Isa::Portable];
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        out.push(Isa::Avx2);
        if std::arch::is_x86_feature_detected!("avx512f") {
            out.push(Isa::Avx512);
        }
    }
    out
}

/// The per-query loop this kernel replaced, kept as the statement of the
/// order: scores by `dot` in key order, max, `f32::exp`, the sum in key
/// order, `acc += p·v` in key order, `acc · (1/sum)`.
fn per_query(q: &[f32], k: &[f32], v: &[f32], visible: usize, d: usize) -> Vec<f32> {
    let s: Vec<f32> = (0..visible).map(|j| dot(q, &k[j * d..][..d])).collect();
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let p: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
    let mut sum = 0f32;
    for &x in &p {
        sum += x;
    }
    let mut acc = vec![0f32; d];
    for (j, &pj) in p.iter().enumerate() {
        for (a, &x) in acc.iter_mut().zip(&v[j * d..][..d]) {
            *a += pj * x;
        }
    }
    let inv = 1.0 / sum;
    acc.iter().map(|a| a * inv).collect()
}

/// A sequence of `total` positions for `kvh` kv heads of `group` query
/// heads each, run as the windows `splits` with kernel set `isa`; returns
/// each (head, member, position) output row.
struct Case {
    kvh: usize,
    group: usize,
    d: usize,
    total: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Case {
    fn new(kvh: usize, group: usize, d: usize, total: usize, scale: f32) -> Case {
        let mut q = random(kvh * group * total * d, 11);
        q.iter_mut().for_each(|x| *x *= scale);
        Case {
            kvh,
            group,
            d,
            total,
            q,
            k: random(kvh * total * d, 12),
            v: random(kvh * total * d, 13),
        }
    }

    fn query(&self, h: usize, g: usize, pos: usize) -> &[f32] {
        &self.q[((h * self.group + g) * self.total + pos) * self.d..][..self.d]
    }

    fn run(&self, isa: Isa, splits: &[(usize, usize)]) -> Vec<Vec<f32>> {
        self.run_over(isa, Plan::Auto, splits, &self.k, &self.v)
    }

    /// [`Case::run`] with the plan named, over an f32 or (`half`) f16 cache.
    fn run_planned(
        &self,
        isa: Isa,
        plan: Plan,
        splits: &[(usize, usize)],
        half: bool,
    ) -> Vec<Vec<f32>> {
        if half {
            let h = |x: &[f32]| -> Vec<half::f16> {
                x.iter().map(|&x| half::f16::from_f32(x)).collect()
            };
            self.run_over(isa, plan, splits, &h(&self.k), &h(&self.v))
        } else {
            self.run_over(isa, plan, splits, &self.k, &self.v)
        }
    }

    /// [`Case::run`] over an f16 cache: the keys and values rounded.
    fn run_f16(&self, isa: Isa, splits: &[(usize, usize)]) -> Vec<Vec<f32>> {
        let half =
            |x: &[f32]| -> Vec<half::f16> { x.iter().map(|&x| half::f16::from_f32(x)).collect() };
        self.run_over(isa, Plan::Auto, splits, &half(&self.k), &half(&self.v))
    }

    /// This case with its keys and values rounded to f16 and widened back.
    fn rounded(&self) -> Case {
        let r = |x: &[f32]| -> Vec<f32> {
            x.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
        };
        Case {
            kvh: self.kvh,
            group: self.group,
            d: self.d,
            total: self.total,
            q: self.q.clone(),
            k: r(&self.k),
            v: r(&self.v),
        }
    }

    fn run_over<E: KvElem>(
        &self,
        isa: Isa,
        plan: Plan,
        splits: &[(usize, usize)],
        kc: &[E],
        vc: &[E],
    ) -> Vec<Vec<f32>> {
        let (kvh, group, d, total) = (self.kvh, self.group, self.d, self.total);
        let mut out = vec![vec![0f32; d]; kvh * group * total];
        for &(offset, t) in splits {
            let mut qw = Vec::new();
            for h in 0..kvh {
                for g in 0..group {
                    for i in 0..t {
                        qw.extend_from_slice(self.query(h, g, offset + i));
                    }
                }
            }
            let rows = group * t;
            // Only the keys that exist so far, as the cache holds them.
            let keys = offset + t;
            let k: Vec<&[E]> = (0..kvh).map(|h| &kc[h * total * d..][..keys * d]).collect();
            let v: Vec<&[E]> = (0..kvh).map(|h| &vc[h * total * d..][..keys * d]).collect();
            let mut y = vec![0f32; kvh * rows * d];
            causal_attention_planned(
                isa,
                plan,
                &View {
                    heads: qw.chunks(rows * d).collect(),
                    stride: d,
                },
                &View {
                    heads: k,
                    stride: d,
                },
                &View {
                    heads: v,
                    stride: d,
                },
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
                        out[(h * group + g) * total + offset + i] = y[row * d..][..d].to_vec();
                    }
                }
            }
        }
        out
    }
}

/// Windows over 1100 keys (69 key blocks, many tiles): one forward, uneven
/// prefill chunks, single steps, a verify-sized window, every kernel set.
/// Every row equals the per-query order bit for bit.
#[test]
fn long_rows_match_the_per_query_order_for_every_chunking_and_kernel_set() {
    let case = Case::new(2, 3, 64, 1100, 0.5);
    let per_query_rows: Vec<Vec<f32>> = (0..case.kvh)
        .flat_map(|h| (0..case.group).map(move |g| (h, g)))
        .flat_map(|(h, g)| (0..case.total).map(move |pos| (h, g, pos)))
        .map(|(h, g, pos)| {
            per_query(
                case.query(h, g, pos),
                &case.k[h * case.total * case.d..],
                &case.v[h * case.total * case.d..],
                pos + 1,
                case.d,
            )
        })
        .collect();
    let chunkings: [&[(usize, usize)]; 3] = [
        &[(0, 1100)],
        &[(0, 37), (37, 1), (38, 500), (538, 2), (540, 560)],
        &[(0, 1000), (1000, 1), (1001, 1), (1002, 5), (1007, 93)],
    ];
    for isa in kernel_sets() {
        for splits in chunkings {
            let got = case.run(isa, splits);
            for (i, (a, b)) in got.iter().zip(&per_query_rows).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{isa:?} {splits:?}: row {i} differs from the per-query order"
                );
            }
        }
    }
}

/// Odd head sizes (tails of the 8-lane dot, of the 16-lane and 8-lane
/// weighted sums) and a group of one, still the per-query order.
#[test]
fn odd_head_sizes_keep_the_per_query_order() {
    for (d, group) in [(20, 1), (5, 2), (72, 4)] {
        let case = Case::new(1, group, d, 90, 1.0);
        for isa in kernel_sets() {
            let got = case.run(isa, &[(0, 40), (40, 1), (41, 49)]);
            for g in 0..group {
                for pos in 0..case.total {
                    let want = per_query(case.query(0, g, pos), &case.k, &case.v, pos + 1, d);
                    let row = &got[g * case.total + pos];
                    let same = row
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{isa:?} d={d} group={group} pos {pos}");
                }
            }
        }
    }
}

/// The split plan (keys and dimensions across threads) and the tiles give
/// every row the same bits: decode steps and verify windows deep into a
/// long cache, a prefill chunk, odd head sizes (the weighted sum's column
/// tails inside a column chunk), f32 and f16 caches, every kernel set.
/// Both equal the per-query order, which the tests above pin.
#[test]
fn both_plans_keep_the_per_query_order() {
    let windows: &[(usize, usize)] = &[(0, 700), (700, 1), (701, 2), (703, 4), (707, 313)];
    for (kvh, group, d) in [(3, 3, 64), (2, 2, 72), (1, 3, 20), (2, 1, 128)] {
        let case = Case::new(kvh, group, d, 1020, 0.7);
        for isa in kernel_sets() {
            for half in [false, true] {
                let tiles = case.run_planned(isa, Plan::Tiles, windows, half);
                let split = case.run_planned(isa, Plan::Split, windows, half);
                for (i, (a, b)) in tiles.iter().zip(&split).enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{isa:?} d={d} group={group} f16={half}: row {i} differs"
                    );
                }
            }
        }
        // The f32 split rows are also the per-query order itself.
        let split = case.run_planned(kernel_sets()[0], Plan::Split, windows, false);
        for h in 0..kvh {
            for g in 0..group {
                for pos in [0, 699, 700, 702, 706, 1019] {
                    let want = per_query(
                        case.query(h, g, pos),
                        &case.k[h * case.total * d..],
                        &case.v[h * case.total * d..],
                        pos + 1,
                        d,
                    );
                    let row = &split[(h * group + g) * case.total + pos];
                    let same = row
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "split d={d}: ({h}, {g}, {pos}) differs from the per-query order"
                    );
                }
            }
        }
    }
}

/// Long rows against f64 softmax attention. Stated bound: for `n` keys,
/// `|y − y₆₄| ≤ (2n + d + 8)·2⁻²⁴·max|v|` (each score's dot: `d`
/// roundings; `exp`: ≤ 1 ulp; the sum and the weighted sum: `n` roundings
/// each, relative to a sum of positive terms; the final scaling: 2). With
/// sharp softmaxes (`scale` 4: scores up to ~±30) and flat ones.
#[test]
fn long_rows_match_f64_attention_within_the_stated_bound() {
    for scale in [0.25, 4.0] {
        let case = Case::new(1, 3, 64, 2500, scale);
        let got = case.run(block_matmul_isa(), &[(0, 2000), (2000, 500)]);
        let mut worst = 0f64;
        for g in 0..3 {
            for pos in [0, 15, 16, 17, 999, 1999, 2000, 2499] {
                let want = reference(case.query(0, g, pos), &case.k, &case.v, pos + 1, 64);
                let bound = (2.0 * (pos + 1) as f64 + 64.0 + 8.0) * 2f64.powi(-24);
                for (a, b) in got[g * case.total + pos].iter().zip(&want) {
                    let err = (*a as f64 - b).abs();
                    worst = worst.max(err);
                    assert!(
                        err <= bound,
                        "scale {scale} pos {pos}: {a} vs {b} (bound {bound:e})"
                    );
                }
            }
        }
        // Far inside the worst case in practice.
        assert!(worst < 2e-6, "scale {scale}: worst error {worst:e}");
    }
}

fn block_matmul_isa() -> Isa {
    super::super::block_matmul::isa()
}

/// An f16 cache: over 1100 keys (many key blocks and tiles), one forward,
/// uneven chunks, single steps and a verify-sized window under every kernel
/// set give, bit for bit, the f32 kernel's rows over the same keys and
/// values rounded to f16 and widened (widening is exact, and the order of
/// operations is the f32 one).
#[test]
fn f16_rows_equal_the_f32_kernel_over_the_widened_rows() {
    for (d, group) in [(64, 3), (20, 1), (72, 2)] {
        let case = Case::new(2, group, d, 1100, 0.5);
        let widened = case.rounded();
        let chunkings: [&[(usize, usize)]; 3] = [
            &[(0, 1100)],
            &[(0, 37), (37, 1), (38, 500), (538, 2), (540, 560)],
            &[(0, 1000), (1000, 1), (1001, 1), (1002, 5), (1007, 93)],
        ];
        let want = widened.run(Isa::Portable, chunkings[0]);
        for isa in kernel_sets() {
            for splits in chunkings {
                let got = case.run_f16(isa, splits);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{isa:?} d={d} {splits:?}: row {i} differs");
                }
            }
        }
    }
}

/// An f16 cache on long rows (2500 keys, 157 key blocks) against f64
/// softmax attention over the f16-rounded keys and values: the f32 bound
/// of [`long_rows_match_f64_attention_within_the_stated_bound`], since the
/// kernel reads the rounded values exactly. Against the unrounded f32 rows
/// the rounding itself adds at most `2⁻¹¹` relative per key and value
/// element (checked loosely: ≤ 4e-3 here, values in ±1).
#[test]
fn f16_long_rows_match_f64_attention_within_the_stated_bound() {
    for scale in [0.25, 4.0] {
        let case = Case::new(1, 3, 64, 2500, scale);
        let rounded = case.rounded();
        for isa in kernel_sets() {
            let got = case.run_f16(isa, &[(0, 2000), (2000, 1), (2001, 499)]);
            let mut worst = 0f64;
            for g in 0..3 {
                for pos in [0, 15, 16, 17, 999, 1999, 2000, 2499] {
                    let row = &got[g * case.total + pos];
                    let want =
                        reference(case.query(0, g, pos), &rounded.k, &rounded.v, pos + 1, 64);
                    let exact = reference(case.query(0, g, pos), &case.k, &case.v, pos + 1, 64);
                    let bound = (2.0 * (pos + 1) as f64 + 64.0 + 8.0) * 2f64.powi(-24);
                    for ((a, b), c) in row.iter().zip(&want).zip(&exact) {
                        let err = (*a as f64 - b).abs();
                        worst = worst.max(err);
                        assert!(err <= bound, "{isa:?} scale {scale} pos {pos}: {a} vs {b}");
                        assert!(
                            (*a as f64 - c).abs() <= 4e-3,
                            "{isa:?} pos {pos}: {a} vs {c}"
                        );
                    }
                }
            }
            assert!(worst < 2e-6, "{isa:?} scale {scale}: worst error {worst:e}");
        }
    }
}

/// Continuous batching: sessions of one model at different depths and
/// window sizes (decode rows, short verify windows, a prefill chunk that
/// wants transposed keys, a step over more than `SPLIT_FROM_KEYS` keys)
/// through one [`batch::causal_attention_batch_planned`] give, bit for
/// bit, each session's [`causal_attention_planned`] alone, f32 and f16,
/// under every kernel set; the short windows did share one dispatch.
#[test]
fn a_batch_of_sessions_equals_each_session_alone() {
    let (kvh, group, d) = (3, 3, 64);
    let windows: &[(usize, usize)] = &[(0, 1), (130, 1), (191, 2), (7, 40), (600, 1), (64, 1)];
    let caches: Vec<(Vec<f32>, Vec<f32>)> = windows
        .iter()
        .enumerate()
        .map(|(i, &(offset, t))| {
            let n = kvh * (offset + t) * d;
            (random(n, 11 + i as u64), random(n, 101 + i as u64))
        })
        .collect();
    let queries: Vec<Vec<f32>> = windows
        .iter()
        .enumerate()
        .map(|(i, &(_, t))| random(kvh * group * t * d, 1001 + i as u64))
        .collect();
    let halves: Vec<(Vec<half::f16>, Vec<half::f16>)> = caches
        .iter()
        .map(|(k, v)| {
            let h = |x: &Vec<f32>| x.iter().map(|&x| half::f16::from_f32(x)).collect();
            (h(k), h(v))
        })
        .collect();
    let rows: usize = windows.iter().map(|&(_, t)| t).sum();
    let width = kvh * group * d;
    // Session i's rows start at `first[i]` of the shared output, in the
    // layout `causal_over` uses.
    let first: Vec<usize> = windows
        .iter()
        .scan(0, |at, &(_, t)| {
            let f = *at;
            *at += t;
            Some(f)
        })
        .collect();
    let out_rows: Vec<_> = windows
        .iter()
        .zip(&first)
        .map(|(&(_, t), &f)| {
            move |h: usize, r: usize| ((f + r % t) * kvh * group + h * group + r / t) * d
        })
        .collect();
    fn heads<E>(x: &[E], kvh: usize) -> View<'_, E> {
        let n = x.len() / kvh;
        View {
            heads: x.chunks(n).collect(),
            stride: 64,
        }
    }
    fn run<E: KvElem>(
        isa: Isa,
        together: bool,
        windows: &[(usize, usize)],
        queries: &[Vec<f32>],
        caches: &[(Vec<E>, Vec<E>)],
        out_rows: &[impl Fn(usize, usize) -> usize + Sync],
        len: usize,
    ) -> (Vec<f32>, usize) {
        let (kvh, group, d) = (3, 3, 64);
        let sessions: Vec<batch::Session<'_, E>> = windows
            .iter()
            .enumerate()
            .map(|(i, &(offset, t))| batch::Session {
                q: heads(&queries[i], kvh),
                k: heads(&caches[i].0, kvh),
                v: heads(&caches[i].1, kvh),
                t,
                offset,
                out_row: &out_rows[i],
            })
            .collect();
        let mut y = vec![0f32; len];
        let mut shared = 0;
        if together {
            shared = batch::causal_attention_batch_planned(
                isa,
                Plan::Auto,
                2,
                kvh,
                group,
                d,
                &sessions,
                &mut y,
            );
        } else {
            for s in &sessions {
                causal_attention_planned(
                    isa,
                    Plan::Auto,
                    &s.q,
                    &s.k,
                    &s.v,
                    kvh,
                    group * s.t,
                    s.t,
                    s.offset,
                    d,
                    &mut y,
                    s.out_row,
                );
            }
        }
        (y, shared)
    }
    for isa in kernel_sets() {
        let len = rows * width;
        let (alone, _) = run(isa, false, windows, &queries, &caches, &out_rows, len);
        let (batched, shared) = run(isa, true, windows, &queries, &caches, &out_rows, len);
        assert_eq!(shared, 5, "{isa:?}: the short windows share one dispatch");
        assert!(
            alone
                .iter()
                .zip(&batched)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{isa:?} f32"
        );
        let (alone, _) = run(isa, false, windows, &queries, &halves, &out_rows, len);
        let (batched, shared) = run(isa, true, windows, &queries, &halves, &out_rows, len);
        assert_eq!(shared, 5);
        assert!(
            alone
                .iter()
                .zip(&batched)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{isa:?} f16"
        );
        // A lone decode row runs as it always did.
        let (_, shared) = run(isa, true, &windows[..1], &queries, &caches, &out_rows, len);
        assert_eq!(shared, 0);
    }
}
