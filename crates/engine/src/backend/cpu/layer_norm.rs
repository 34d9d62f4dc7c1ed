//! LayerNorm with a bias on the CPU (GLM-5's indexer key norm): per row,
//! the mean and the biased variance summed in order, then the affine map.
//! Each row depends on itself only.

/// `x: [rows, width]` → `(x − mean)·(1/sqrt(var + eps))·w + b` per row.
pub fn layer_norm(x: &[f32], width: usize, w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let n = width as f32;
    let mut out = vec![0f32; x.len()];
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let mean = row.iter().fold(0f32, |a, &v| a + v) / n;
        let var = row.iter().fold(0f32, |a, &v| a + (v - mean) * (v - mean)) / n;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, d) in dst.iter_mut().enumerate() {
            *d = (row[i] - mean) * inv * w[i] + b[i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against an f64 reference, and rows are independent of each other.
    #[test]
    fn layer_norm_matches_f64_and_is_row_independent() {
        let width = 7;
        let x: Vec<f32> = (0..3 * width)
            .map(|i| ((i as f32) * 0.77).sin() * 3.0 + 0.5)
            .collect();
        let w: Vec<f32> = (0..width).map(|i| 0.8 + 0.05 * i as f32).collect();
        let b: Vec<f32> = (0..width).map(|i| 0.1 - 0.03 * i as f32).collect();
        let out = layer_norm(&x, width, &w, &b, 1e-6);
        for (r, row) in x.chunks_exact(width).enumerate() {
            let m = row.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
            let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / width as f64;
            for i in 0..width {
                let want = (row[i] as f64 - m) / (var + 1e-6).sqrt() * w[i] as f64 + b[i] as f64;
                assert!((out[r * width + i] as f64 - want).abs() < 1e-5);
            }
            let alone = layer_norm(row, width, &w, &b, 1e-6);
            assert_eq!(alone, out[r * width..(r + 1) * width]);
        }
    }
}
