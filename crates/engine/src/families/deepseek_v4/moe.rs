//! DeepSeek-V4's MoE: sqrt-softplus scores, experts chosen by `score +
//! bias` (learned top-k) or by token id (`tid2eid`, hash layers), weights
//! renormalised over the chosen experts and scaled, clamped-SwiGLU routed
//! experts plus one shared expert of the same width.

use super::config::{DeepseekV4Config, MlpKind};
use crate::backend::{Backend, RouterSpec, Scoring};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::moe::{Experts, ScoredRouter};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct Moe<B: Backend> {
    router: ScoredRouter<B>,
    /// `tid2eid` `[V·k]` on hash layers.
    hash: Option<Vec<u32>>,
    experts: Experts<B>,
    /// The shared expert's `[gate | up]` and down projections.
    shared_gate_up: Linear<B>,
    shared_down: Linear<B>,
    inter: usize,
    limit: f32,
}

impl<B: Backend> Moe<B> {
    /// Bound under `w`'s scope (`…layers.L.ffn`).
    pub fn load(w: &mut Binder<'_, B>, cfg: &DeepseekV4Config, kind: MlpKind) -> Result<Self> {
        let (h, e, k, i) = (
            cfg.hidden_size,
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            cfg.moe_intermediate_size,
        );
        let spec = RouterSpec {
            scoring: if cfg.sigmoid_scoring {
                Scoring::Sigmoid
            } else {
                Scoring::SqrtSoftplus
            },
            experts: e,
            k,
            groups: None,
            // `norm_topk_prob` is ignored upstream: always renormalised.
            renormalise: true,
            scale: cfg.routed_scaling_factor,
        };
        let gate = w.linear("gate", e, h)?;
        let (bias, hash) = match kind {
            MlpKind::TopK => (Some(w.vector("gate.bias", &[e])?), None),
            MlpKind::Hash => {
                let ids = w.ids("gate.tid2eid", &[cfg.vocab_size, k])?;
                if let Some(bad) = ids.iter().find(|&&x| x as usize >= e) {
                    return Err(w.invalid(
                        "gate.tid2eid",
                        format!("routes to expert {bad}, but the layer has {e}"),
                    ));
                }
                (None, Some(ids))
            }
        };
        let shared = w.fused_rows(
            &["shared_experts.w1.weight", "shared_experts.w3.weight"],
            &[i, i],
            h,
        )?;
        Ok(Self {
            router: ScoredRouter::new(gate, bias, spec)?,
            hash,
            experts: Experts::load_named(w, e, h, i, ["w1", "w3", "w2"])?
                .with_limit(cfg.swiglu_limit),
            shared_gate_up: w.linear_from(shared, 2 * i, h)?,
            shared_down: w.linear("shared_experts.w2", h, i)?,
            inter: i,
            limit: cfg.swiglu_limit,
        })
    }

    /// `x: [rows, h]` for `tokens` (hash layers route by them) → `[rows, h]`
    /// and the routing.
    pub fn forward(&self, ops: &B, x: &B::Buf, tokens: &[u32]) -> Result<(B::Buf, B::Routing)> {
        let rows = tokens.len();
        let fixed: Option<Vec<u32>> = self.hash.as_ref().map(|t| {
            let k = self.router.spec.k;
            tokens
                .iter()
                .flat_map(|&tok| t[tok as usize * k..(tok as usize + 1) * k].iter().copied())
                .collect()
        });
        let routing = self.router.route(ops, x, rows, fixed.as_deref())?;
        let routed = self.experts.forward(ops, x, rows, &routing)?;
        let gu = self.shared_gate_up.forward(ops, x, rows)?;
        let shared =
            self.shared_down
                .forward(ops, &ops.swiglu(&gu, self.inter, Some(self.limit))?, rows)?;
        Ok((ops.add(&routed, &shared)?, routing))
    }

    pub fn is_hash(&self) -> bool {
        self.hash.is_some()
    }
}
