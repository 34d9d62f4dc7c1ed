//! Whole-row passes of the nucleus law written so the compiler vectorizes
//! them: validation and the first maximum.
//!
//! A speculative cycle reads several full-vocabulary rows (the head's
//! draft row, every verify row, the bonus row), so these passes are a
//! visible share of a cycle next to the trunk's forward. Each function
//! returns exactly what the plain scalar loop it replaces returns (the
//! tests run both on awkward rows): validation and the maximum are exact
//! in any order.

use crate::error::SampleError;

/// Values per chunk: one AVX-512 register of f32, two AVX2 ones (the build
/// baseline is x86-64-v3; fixed-width inner loops let the compiler use
/// either without run-time dispatch).
const LANES: usize = 16;

/// IEEE bits of f32 -inf.
const NEG_INF_BITS: u32 = 0xff80_0000;

/// Step 1 of the law: reject rows with NaN, +inf, or nothing above -inf.
pub(crate) fn validate(row: &[f32]) -> Result<(), SampleError> {
    if row.is_empty() {
        return Err(SampleError::EmptyRow);
    }
    // Fast pass: is anything non-finite other than -inf, and how many -inf?
    let mut bad = [0u32; LANES];
    let mut neg_inf = [0u32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            let (b, a) = (c[l].to_bits(), c[l].to_bits() & 0x7fff_ffff);
            let is_neg_inf = u32::from(b == NEG_INF_BITS);
            bad[l] |= u32::from(a >= 0x7f80_0000) & (is_neg_inf ^ 1);
            neg_inf[l] += is_neg_inf;
        }
    }
    let mut any_bad = bad.iter().any(|&b| b != 0);
    let mut n_neg_inf: usize = neg_inf.iter().map(|&n| n as usize).sum();
    for &v in chunks.remainder() {
        any_bad |= !v.is_finite() && v.to_bits() != NEG_INF_BITS;
        n_neg_inf += usize::from(v.to_bits() == NEG_INF_BITS);
    }
    if !any_bad && n_neg_inf < row.len() {
        return Ok(());
    }
    Err(non_finite(row))
}

/// The error for a row [`validate`] refused, with exact counts.
fn non_finite(row: &[f32]) -> SampleError {
    let (mut nan, mut pos_inf, mut neg_inf) = (0usize, 0usize, 0usize);
    for &v in row {
        if v.is_nan() {
            nan += 1;
        } else if v == f32::INFINITY {
            pos_inf += 1;
        } else if v == f32::NEG_INFINITY {
            neg_inf += 1;
        }
    }
    SampleError::NonFiniteLogits {
        nan,
        pos_inf,
        neg_inf,
        len: row.len(),
    }
}

/// Index and value (widened, exactly) of the first maximum of a validated
/// row: the lowest id among the entries that compare equal to the maximum.
/// Taking the value from the row at that index keeps the sign of a zero
/// maximum the one the first such entry has, as a left-to-right scan does.
pub(crate) fn first_max(row: &[f32]) -> (u32, f64) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            if c[l] > m[l] {
                m[l] = c[l];
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in m.iter().chain(chunks.remainder()) {
        if v > max {
            max = v;
        }
    }
    // A validated row has a finite entry, so the maximum is one of them:
    // find the first chunk holding it with one comparison per chunk.
    let chunk = row
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |hit, &v| hit | (v == max)))
        .unwrap_or(0);
    let at = chunk * LANES
        + row[chunk * LANES..]
            .iter()
            .position(|&v| v == max)
            .unwrap_or(0);
    (at as u32, f64::from(row[at]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::NumpyPcg64;

    /// The scalar loops these passes replace.
    fn validate_scalar(row: &[f32]) -> Result<(), SampleError> {
        if row.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        let e = non_finite(row);
        match e {
            SampleError::NonFiniteLogits {
                nan: 0,
                pos_inf: 0,
                neg_inf,
                len,
            } if neg_inf < len => Ok(()),
            e => Err(e),
        }
    }

    fn first_max_scalar(row: &[f32]) -> (u32, f64) {
        let (mut best, mut best_v) = (0u32, f64::NEG_INFINITY);
        for (i, &x) in row.iter().enumerate() {
            let x = f64::from(x);
            if x > best_v || i == 0 {
                best = i as u32;
                best_v = x;
            }
        }
        (best, best_v)
    }

    /// Rows with ties, signed zeros, -inf runs, lengths around the chunk
    /// width, and every kind of bad entry at every kind of position.
    fn rows() -> Vec<Vec<f32>> {
        let mut rng = NumpyPcg64::from_seed(11);
        let mut out = Vec::new();
        for len in [1, 2, 15, 16, 17, 31, 33, 100, 257] {
            for case in 0..40 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        let u = rng.random();
                        match case % 5 {
                            // coarse values: many exact ties
                            0 => ((u * 4.0).floor() - 2.0) as f32,
                            1 if u < 0.5 => f32::NEG_INFINITY,
                            2 if u < 0.3 => {
                                if u < 0.15 {
                                    0.0
                                } else {
                                    -0.0
                                }
                            }
                            _ => ((u - 0.5) * 20.0) as f32,
                        }
                    })
                    .collect();
                out.push(row);
            }
        }
        let mut bad = Vec::new();
        for row in out.iter().filter(|r| r.len() > 3).take(60) {
            for (k, v) in [f32::NAN, f32::INFINITY, -f32::NAN].into_iter().enumerate() {
                let mut r = row.clone();
                let at = (k * 7 + r.len() / 2) % r.len();
                r[at] = v;
                bad.push(r);
            }
        }
        out.extend(bad);
        out.push(vec![f32::NEG_INFINITY; 40]);
        out.push(vec![-0.0, 0.0, -0.0]);
        out.push(vec![0.0, -0.0, f32::NEG_INFINITY]);
        out.push(vec![f32::NEG_INFINITY, -0.0, 0.0]);
        out
    }

    #[test]
    fn validate_equals_the_scalar_loop() {
        assert_eq!(validate(&[]), Err(SampleError::EmptyRow));
        let rows = rows();
        let refused = rows.iter().filter(|r| validate(r).is_err()).count();
        assert!(refused >= 180, "the bad rows must be refused ({refused})");
        for row in &rows {
            assert_eq!(validate(row), validate_scalar(row), "{row:?}");
        }
    }

    #[test]
    fn first_max_equals_the_scalar_loop_bit_for_bit() {
        let mut zeros = 0;
        for row in rows().iter().filter(|r| validate(r).is_ok()) {
            let (i, v) = first_max(row);
            let (j, w) = first_max_scalar(row);
            assert_eq!((i, v.to_bits()), (j, w.to_bits()), "{row:?}");
            zeros += usize::from(v == 0.0);
        }
        assert!(zeros > 0, "a zero maximum must be among the cases");
    }
}
