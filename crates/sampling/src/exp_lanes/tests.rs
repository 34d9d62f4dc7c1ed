use super::*;

/// xorshift64*: a fixed, dependency-free stream of test arguments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Arguments at and around every boundary of glibc's `exp`: zero, the
/// `2^-54` and `512` edges of the table path, the subnormal range
/// (`x < -708.39`), the underflow to zero (`x < -745.13`), infinities, NaN.
fn specials() -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NAN,
        -708.39,
        -708.4,
        -709.0,
        -744.0,
        -745.13,
        -745.14,
        -746.0,
        -1100.0,
        -1e300,
        f64::MIN,
        709.0,
        -1.0,
        -0.5,
    ];
    for edge in [2f64.powi(-54), 512.0, 1024.0, 708.39, 745.13, 1e-300, 1.0] {
        for s in [1.0, -1.0] {
            let e = s * edge;
            v.extend([e, e.next_up(), e.next_down()]);
        }
    }
    v
}

/// `count` arguments: uniform over `[-800, 16]`, uniform over the bit
/// patterns of negative doubles of magnitude `[2^-60, 2^11)`, and a dense
/// run just below zero (where a row's near-maximum logits land).
fn sample(count: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed);
    let mut v = specials();
    let lo = (-(2f64.powi(-60))).to_bits();
    let hi = (-(2f64.powi(11))).to_bits();
    for i in 0..count {
        v.push(match i % 3 {
            0 => -800.0 + 816.0 * rng.unit(),
            1 => f64::from_bits(lo + rng.next() % (hi - lo)),
            _ => -8.0 * rng.unit(),
        });
    }
    v
}

/// Every implementation compiled and runnable here, each against the
/// scalar definition, bit for bit.
fn check<L: Copy + Into<f64> + std::fmt::Debug>(l: &[L], t: f64, m: f64) {
    let mut want = vec![0.0; l.len()];
    let want_z = scalar(l, t, m, &mut want, 0.0);
    // Z is the plain sequential sum of every weight, zeros included.
    let mut z = 0.0f64;
    for w in &want {
        z += w;
    }
    assert_eq!(z.to_bits(), want_z.to_bits(), "scalar Z");
    let mut got = Vec::new();
    let got_z = scaled_exp(l, t, m, &mut got, &mut Sparse::default());
    assert_bits(l, &want, &got, "dispatch");
    assert_eq!(want_z.to_bits(), got_z.to_bits(), "dispatch Z");
    let mut got = vec![f64::NAN; l.len()];
    let got_z = dense(l, t, m, &mut got);
    assert_bits(l, &want, &got, "dense");
    assert_eq!(want_z.to_bits(), got_z.to_bits(), "dense Z");
    #[cfg(all(
        target_arch = "x86_64",
        target_env = "gnu",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        let mut got = vec![f64::NAN; l.len()];
        // SAFETY: the cfg guarantees AVX2 and FMA.
        let got_z = unsafe { lanes_avx2(l, t, m, &mut got) };
        assert_bits(l, &want, &got, "avx2");
        assert_eq!(want_z.to_bits(), got_z.to_bits(), "avx2 Z");
        if std::arch::is_x86_feature_detected!("avx512f") {
            let mut got = vec![f64::NAN; l.len()];
            // SAFETY: AVX-512F was just detected.
            let got_z = unsafe { lanes_avx512(l, t, m, &mut got) };
            assert_bits(l, &want, &got, "avx512");
            assert_eq!(want_z.to_bits(), got_z.to_bits(), "avx512 Z");
        }
    }
}

fn assert_bits<L: std::fmt::Debug>(l: &[L], want: &[f64], got: &[f64], what: &str) {
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(
            w.to_bits(),
            g.to_bits(),
            "{what}: weight({:?}) at {i}",
            l[i]
        );
    }
}

#[test]
fn lanes_equal_libm_on_a_dense_sample() {
    let xs = sample(600_000, 0x9e37_79b9_7f4a_7c15);
    // T = 1, m = 0: the lanes see the arguments themselves.
    check(&xs, 1.0, 0.0);
    // The division and shift of a real row.
    check(&xs, 0.7, 3.25);
    check(&xs, 1e-3, -2.0);
}

#[test]
fn lanes_equal_libm_on_f32_rows_with_neg_inf_runs() {
    let mut rng = Rng(7);
    let mut row: Vec<f32> = (0..49_157)
        .map(|_| (rng.unit() * 40.0 - 20.0) as f32)
        .collect();
    // A head's draft row: -inf outside its subset, in runs and singly,
    // including whole aligned chunks and chunks with one finite entry.
    for (i, x) in row.iter_mut().enumerate() {
        if (i / 64) % 3 == 1 || i % 7 == 3 || (4096..4104).contains(&i) || i == 5000 {
            *x = f32::NEG_INFINITY;
        }
    }
    row[6000..6008].fill(f32::NEG_INFINITY);
    row[6003] = 1.5;
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for t in [0.7, 1.0, 1.3, 0.05] {
        check(&row, t, f64::from(max) / t);
    }
    // Every remainder length, so the scalar tail is exercised.
    for n in 0..=19 {
        check(&row[..n], 0.7, f64::from(max) / 0.7);
    }
}

#[test]
fn a_sparse_row_is_compacted_with_the_same_weights() {
    let mut rng = Rng(11);
    // One finite entry in six, as in a head's subset row, plus a dense
    // stretch and an all-(-inf) stretch; then one finite entry in total.
    let mut row: Vec<f32> = (0..49_152)
        .map(|i| match i {
            _ if (10_000..10_100).contains(&i) => (rng.unit() * 30.0 - 20.0) as f32,
            _ if (20_000..30_000).contains(&i) => f32::NEG_INFINITY,
            _ if rng.next().is_multiple_of(6) => (rng.unit() * 30.0 - 20.0) as f32,
            _ => f32::NEG_INFINITY,
        })
        .collect();
    row[49_151] = 10.0;
    check(&row, 0.7, 10.0 / 0.7);
    let mut lone = vec![f32::NEG_INFINITY; 1000];
    lone[999] = 2.0;
    check(&lone, 0.7, 2.0 / 0.7);
    // The sparse scratch is reused across rows of different shapes.
    let mut sparse = Sparse::default();
    for r in [&row[..], &lone[..], &row[..77]] {
        let mut want = vec![0.0; r.len()];
        let want_z = scalar(r, 0.9, 1.0, &mut want, 0.0);
        let mut got = Vec::new();
        let got_z = scaled_exp(r, 0.9, 1.0, &mut got, &mut sparse);
        assert_bits(r, &want, &got, "reused scratch");
        assert_eq!(want_z.to_bits(), got_z.to_bits(), "reused scratch Z");
    }
}

#[test]
fn the_model_states_the_table_path() {
    let xs = sample(300_000, 42);
    let mut covered = 0;
    for x in xs {
        if let Some(y) = model(x) {
            covered += 1;
            assert_eq!(y.to_bits(), x.exp().to_bits(), "model exp({x:e})");
        }
    }
    assert!(covered > 250_000, "the sample must exercise the table path");
}

#[test]
#[ignore = "2^32 random arguments: minutes"]
fn lanes_equal_libm_on_four_billion_arguments() {
    for seed in 1..=1024u64 {
        let xs = sample(1 << 22, seed);
        check(&xs, 1.0, 0.0);
    }
}
