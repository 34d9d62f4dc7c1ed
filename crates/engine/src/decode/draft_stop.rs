//! When a cycle stops drafting ([`crate::MtpContract::min_draft_confidence`]).
//!
//! A verify row costs a fraction of an AR step (0.15 to 0.35 on the CPUs
//! measured in `bench/README.md`); a draft the trunk will likely reject is
//! not worth it. At a greedy position the draft is accepted only if it is
//! the trunk's argmax, and the head's own confidence predicts that well:
//! on the default model's held-out prompts, greedy first drafts whose head
//! row gives the top token less than 0.3 (a quarter of them) were accepted
//! 43% of the time, the rest 80% (`bench/README.md`). A sampled
//! draft is accepted with probability Σ min(p, q), which stays high for a
//! flat head row that matches a flat trunk row, so the stop applies only
//! at greedy positions (measured: at temperature 0.7 it cost speed).
//!
//! The decision reads only the head's row (the prefix and the drafts so
//! far), never the trunk's rows or the request's stream, so the emitted
//! tokens stay exactly AR's; and a greedy position takes no draw, so a
//! sampled turn's draws are those of full-depth drafting.

/// The probability of the top token of a head row under a softmax at
/// temperature 1: `1 / Σ exp(l − max)` over the finite logits, in f64 and
/// ascending id order (so every machine decides alike). A row without a
/// finite maximum or with NaN gives NaN, which never stops drafting: the
/// law then reports the row as it would without a threshold.
pub(crate) fn top_probability(row: &[f32]) -> f64 {
    // Whole-row passes in fixed-width chunks the compiler vectorizes: a
    // head row is 49,152 entries of which 8,192 are finite, and this runs
    // before every greedy draft. The sum keeps ascending id order.
    const LANES: usize = 16;
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_nan = [false; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            lane_nan[l] |= c[l].is_nan();
            if c[l] > lane_max[l] {
                lane_max[l] = c[l];
            }
        }
    }
    let mut nan = lane_nan.iter().any(|&n| n);
    let mut max = f32::NEG_INFINITY;
    for &v in lane_max.iter().chain(chunks.remainder()) {
        nan |= v.is_nan();
        if v > max {
            max = v;
        }
    }
    if nan || !max.is_finite() {
        return f64::NAN;
    }
    let m = f64::from(max);
    let mut z = 0.0f64;
    for c in row.chunks(LANES) {
        if c.iter()
            .fold(true, |all, &v| all & (v == f32::NEG_INFINITY))
        {
            continue;
        }
        for &v in c {
            if v > f32::NEG_INFINITY {
                z += (f64::from(v) - m).exp();
            }
        }
    }
    1.0 / z
}

/// Whether a cycle stops before drafting from `row` (`threshold` as in
/// [`crate::MtpContract::min_draft_confidence`]).
pub(crate) fn stops_before(row: &[f32], threshold: f32) -> bool {
    top_probability(row) < f64::from(threshold)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_probability_is_the_softmax_maximum() {
        // Two equal logits and one far below: just under 1/2 each.
        let p = top_probability(&[0.0, 0.0, -30.0]);
        assert!((p - 0.5).abs() < 1e-12 && p < 0.5);
        // -inf entries (a vocabulary subset) add nothing.
        let sub = top_probability(&[1.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
        assert_eq!(sub, top_probability(&[1.0, 0.0]));
        assert!((sub - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    }

    /// The chunked passes give the plain loops' value bit for bit.
    #[test]
    fn equals_the_plain_loops() {
        let plain = |row: &[f32]| {
            let mut max = f32::NEG_INFINITY;
            for &v in row {
                if v.is_nan() {
                    return f64::NAN;
                }
                max = max.max(v);
            }
            if !max.is_finite() {
                return f64::NAN;
            }
            let m = f64::from(max);
            let z: f64 = row
                .iter()
                .filter(|&&v| v > f32::NEG_INFINITY)
                .fold(0.0, |z, &v| z + (f64::from(v) - m).exp());
            1.0 / z
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for len in [1, 15, 16, 17, 100, 1000, 49_152] {
            for kept in [1.0, 0.5, 1.0 / 6.0, 0.01] {
                let row: Vec<f32> = (0..len)
                    .map(|_| match next() < kept {
                        true => ((next() - 0.5) * 30.0) as f32,
                        false => f32::NEG_INFINITY,
                    })
                    .collect();
                let (a, b) = (top_probability(&row), plain(&row));
                assert!(
                    a.to_bits() == b.to_bits(),
                    "len {len}, kept {kept}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn invalid_rows_never_stop_drafting() {
        for row in [
            vec![0.0, f32::NAN],
            vec![f32::NEG_INFINITY; 3],
            vec![f32::INFINITY, 0.0],
            vec![],
        ] {
            assert!(top_probability(&row).is_nan(), "{row:?}");
            assert!(!stops_before(&row, 0.9), "{row:?}");
        }
    }

    #[test]
    fn the_threshold_compares_the_top_probability() {
        let row = [0.0, 0.0, 0.0, 0.0]; // top probability 1/4
        assert!(stops_before(&row, 0.3));
        assert!(!stops_before(&row, 0.2));
        assert!(!stops_before(&[5.0, 0.0], 0.99));
    }
}
