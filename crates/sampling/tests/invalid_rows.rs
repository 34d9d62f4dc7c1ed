//! Rows a law cannot honestly sample from.
//!
//! Nucleus law: NaN, +inf and all -inf rows are a typed error at every
//! temperature (greedy included) and consume no draw; partial -inf rows are
//! legal. ds4 law: its argmax fallback answers such rows, flagged.

use ds4_sampling::{Law, SampleError, Sampler, TokenCounts};

const NEG: f32 = f32::NEG_INFINITY;

fn nucleus_at(t: f64) -> Sampler {
    let mut params = Law::Nucleus.default_params();
    params.temperature = t;
    Sampler::new(Law::Nucleus, params, 42).unwrap()
}

#[test]
fn nucleus_rejects_non_finite_rows_at_every_temperature() {
    let rows: [(Vec<f32>, (usize, usize, usize)); 5] = [
        (vec![f32::NAN; 4], (4, 0, 0)),
        (vec![0.5, f32::NAN, 1.0, 2.0], (1, 0, 0)),
        (vec![0.5, f32::INFINITY, 1.0, NEG], (0, 1, 1)),
        (vec![NEG; 5], (0, 0, 5)),
        (vec![f32::NAN, f32::INFINITY, NEG], (1, 1, 1)),
    ];
    let counts = TokenCounts::new();
    for t in [0.0, 0.6, 1.0] {
        for (row, (nan, pos_inf, neg_inf)) in &rows {
            let mut s = nucleus_at(t);
            let want = SampleError::NonFiniteLogits {
                nan: *nan,
                pos_inf: *pos_inf,
                neg_inf: *neg_inf,
                len: row.len(),
            };
            assert_eq!(s.sample(row, &counts), Err(want), "T={t} row={row:?}");
            assert_eq!(s.distribution(row, &counts), Err(want), "T={t}");
            assert_eq!(s.draws_taken(), 0, "an invalid row consumes no draw");
            assert_eq!(want.code(), "non_finite_logits");
            assert!(want.to_string().contains("not samplable"));
        }
    }
    assert_eq!(
        nucleus_at(0.6).sample(&[], &counts),
        Err(SampleError::EmptyRow)
    );
}

#[test]
fn nucleus_samples_partial_neg_inf_rows() {
    let row = [NEG, 1.0, NEG, 0.5, NEG, 0.9];
    let counts = TokenCounts::new();
    for t in [0.0, 0.6, 1.0] {
        let mut s = nucleus_at(t);
        for _ in 0..200 {
            let tok = s.sample(&row, &counts).unwrap().token;
            assert!(
                [1, 3, 5].contains(&tok),
                "T={t}: sampled a masked token {tok}"
            );
        }
        assert_eq!(s.draws_taken(), if t == 0.0 { 0 } else { 200 });
    }
    assert_eq!(nucleus_at(0.0).sample(&row, &counts).unwrap().token, 1);
}

#[test]
fn ds4_flags_its_argmax_fallback() {
    let counts = TokenCounts::new();
    for t in [0.0, 0.6, 1.0] {
        let mut params = Law::Ds4.default_params();
        params.temperature = t;
        for top_k in [0, 5] {
            params.top_k = top_k;
            let mut s = Sampler::new(Law::Ds4, params, 7).unwrap();
            // All NaN: ds4 answers id 0, which is not a sample.
            let got = s.sample(&[f32::NAN; 4], &counts).unwrap();
            assert_eq!(
                (got.token, got.argmax_fallback),
                (0, true),
                "T={t} k={top_k}"
            );
            let d = s.distribution(&[f32::NAN; 4], &counts).unwrap();
            assert!(d.argmax_fallback());
            // +inf and NaN only: the scan picks +inf, still flagged when sampling.
            let got = s.sample(&[f32::NAN, f32::INFINITY, NEG], &counts).unwrap();
            assert_eq!(got.token, 1);
            assert_eq!(got.argmax_fallback, t > 0.0, "greedy +inf is a real argmax");
            // A finite entry: a normal sample, never the fallback.
            let got = s
                .sample(&[f32::NAN, f32::INFINITY, 0.25, NEG], &counts)
                .unwrap();
            assert_eq!(
                (got.token, got.argmax_fallback),
                (if t > 0.0 { 2 } else { 1 }, false)
            );
            assert_eq!(
                s.draws_taken(),
                if t > 0.0 { 1 } else { 0 },
                "fallbacks take no draw"
            );
        }
    }
}
