//! Kimi delta attention's forget gate on the CPU: a per-channel log-decay
//! from the gate projection, in one of GLM-5's two forms (transformers'
//! `Glm5NextTextForgetGate`). Per element.

/// `f: [rows, H·dim]`, `a: [H]` (`exp(A_log)`), `dt_bias: [H·dim]`.
pub fn kda_gate(f: &[f32], a: &[f32], dt_bias: &[f32], dim: usize, lower: Option<f32>) -> Vec<f32> {
    let c = dt_bias.len();
    let mut out = Vec::with_capacity(f.len());
    for row in f.chunks_exact(c) {
        for (i, &v) in row.iter().enumerate() {
            let x = v + dt_bias[i];
            let a = a[i / dim];
            out.push(match lower {
                // `lb·sigmoid(e^A·x)`: a decay in (lb, 0).
                Some(lb) => lb * (1.0 / (1.0 + (-(a * x)).exp())),
                // `−e^A·softplus(x)`, torch's `log(1 + exp(x))`, linear
                // above 20 as the reference writes it.
                None => -a * (if x > 20.0 { x } else { (1.0 + x.exp()).ln() }),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kda_gate_forms_match_their_formulas() {
        let (a, bias) = ([0.5f32, 2.0], [0.1f32, -0.2, 0.3, 0.0]);
        let f = [1.0f32, -1.0, 25.0, 0.5];
        let lb = kda_gate(&f, &a, &bias, 2, Some(-5.0));
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let want = [
            -5.0 * sig(0.5 * 1.1),
            -5.0 * sig(0.5 * -1.2),
            -5.0 * sig(2.0 * 25.3),
            -5.0 * sig(2.0 * 0.5),
        ];
        for (g, w) in lb.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6);
            assert!(*g < 0.0 && *g > -5.0 - 1e-6);
        }
        let sp = kda_gate(&f, &a, &bias, 2, None);
        let softplus = |x: f64| (1.0 + x.exp()).ln();
        let want = [
            -0.5 * softplus(1.1),
            -0.5 * softplus(-1.2),
            -2.0 * 25.3, // linear above 20
            -2.0 * softplus(0.5),
        ];
        for (g, w) in sp.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
}
