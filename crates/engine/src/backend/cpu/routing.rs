//! Router selection on the CPU: scores from logits, the top-k experts per
//! token (ties to the lower index), and their weights.

use crate::backend::{RouterSpec, Scoring};

/// Descending by value, equal values keep the lower index first.
fn top(values: &[f32], candidates: impl Iterator<Item = usize>, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = candidates.collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// `[rows, E]` logits → `[rows, k]` experts and weights (see
/// [`crate::backend::Backend::route_scored`]).
pub fn route_scored(
    logits: &[f32],
    bias: Option<&[f32]>,
    fixed: Option<&[u32]>,
    spec: &RouterSpec,
) -> (Vec<usize>, Vec<f32>) {
    let (e, k) = (spec.experts, spec.k);
    let mut experts = Vec::with_capacity(logits.len() / e * k);
    let mut weights = Vec::with_capacity(experts.capacity());
    for (r, row) in logits.chunks_exact(e).enumerate() {
        let scores: Vec<f32> = row
            .iter()
            .map(|&x| match spec.scoring {
                // torch's softplus (linear above 20), then the square root.
                Scoring::SqrtSoftplus => (if x > 20.0 { x } else { x.exp().ln_1p() }).sqrt(),
                Scoring::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            })
            .collect();
        let idx: Vec<usize> = match fixed {
            // Hash routing: the experts come from the token id.
            Some(ids) => ids[r * k..(r + 1) * k]
                .iter()
                .map(|&i| i as usize)
                .collect(),
            None => {
                let mut choice: Vec<f32> = match bias {
                    Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                    None => scores.clone(),
                };
                if let Some((groups, keep)) = spec.groups {
                    // Group score: the sum of the group's two best choices;
                    // experts of the groups not kept are masked to −∞ (a
                    // biased choice may be negative: masking to 0 would let
                    // a dropped group's expert beat it, unlike GLM-5).
                    let per = e / groups;
                    let group_scores: Vec<f32> = (0..groups)
                        .map(|g| {
                            let best = top(&choice, g * per..(g + 1) * per, 2);
                            best.iter().fold(0f32, |a, &i| a + choice[i])
                        })
                        .collect();
                    let kept = top(&group_scores, 0..groups, keep);
                    for (j, c) in choice.iter_mut().enumerate() {
                        if !kept.contains(&(j / per)) {
                            *c = f32::NEG_INFINITY;
                        }
                    }
                }
                top(&choice, 0..e, k)
            }
        };
        let picked: Vec<f32> = idx.iter().map(|&i| scores[i]).collect();
        let denom = if spec.renormalise {
            picked.iter().fold(0f32, |a, &s| a + s) + 1e-20
        } else {
            1.0
        };
        for (&i, &s) in idx.iter().zip(&picked) {
            experts.push(i);
            weights.push(s / denom * spec.scale);
        }
    }
    (experts, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scoring: Scoring, k: usize) -> RouterSpec {
        RouterSpec {
            scoring,
            experts: 4,
            k,
            groups: None,
            renormalise: true,
            scale: 1.5,
        }
    }

    #[test]
    fn sqrt_softplus_bias_selects_and_weights_renormalise() {
        let logits = [0.2f32, 1.0, -0.5, 0.9];
        // The bias moves expert 2 ahead in selection only.
        let bias = [0.0f32, 0.0, 2.0, 0.0];
        let (e, w) = route_scored(&logits, Some(&bias), None, &spec(Scoring::SqrtSoftplus, 2));
        assert_eq!(e, vec![2, 1]);
        let s = |x: f32| x.exp().ln_1p().sqrt();
        let sum = s(-0.5) + s(1.0) + 1e-20;
        assert_eq!(w, vec![s(-0.5) / sum * 1.5, s(1.0) / sum * 1.5]);
        // Hash routing takes the experts from the token, weights from scores.
        let (e, w) = route_scored(
            &logits,
            None,
            Some(&[3, 0]),
            &spec(Scoring::SqrtSoftplus, 2),
        );
        assert_eq!(e, vec![3, 0]);
        let sum = s(0.9) + s(0.2) + 1e-20;
        assert_eq!(w, vec![s(0.9) / sum * 1.5, s(0.2) / sum * 1.5]);
    }

    #[test]
    fn sigmoid_group_limited_keeps_the_best_groups_and_breaks_ties_low() {
        let mut sp = spec(Scoring::Sigmoid, 2);
        sp.experts = 6;
        sp.groups = Some((3, 1));
        // Group 1 (experts 2, 3) has the best top-2 sum although expert 0
        // alone is the best expert.
        let logits = [3.0f32, -3.0, 1.5, 1.4, 0.0, 0.0];
        let (e, _) = route_scored(&logits, None, None, &sp);
        assert_eq!(e, vec![2, 3]);
        // Exact ties go to the lower index.
        sp.groups = None;
        let (e, _) = route_scored(&[0.5, 0.5, 0.5, 0.1, 0.1, 0.1], None, None, &sp);
        assert_eq!(e, vec![0, 1]);
    }

    /// A kept group whose biased choices are negative still supplies the
    /// experts: the dropped groups are −∞, not 0 (GLM-5's router).
    #[test]
    fn dropped_groups_lose_to_negative_choices() {
        let mut sp = spec(Scoring::Sigmoid, 2);
        sp.experts = 4;
        sp.groups = Some((2, 1));
        // Group 0 (experts 0, 1) has choices ≈ −0.3 and −0.5, group 1
        // ≈ −0.9 and −0.95: group 0 is kept, and both its experts are
        // chosen although the masked experts would score 0.
        let logits = [0.0f32, 0.0, 0.0, 0.0];
        let bias = [-0.8f32, -1.0, -1.4, -1.45];
        let (e, _) = route_scored(&logits, Some(&bias), None, &sp);
        assert_eq!(e, vec![0, 1]);
    }
}
