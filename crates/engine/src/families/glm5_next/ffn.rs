//! GLM-5's feed-forward blocks: `dense` (a clamped SwiGLU of
//! `intermediate_size`) and `sparse` (`Glm5NextTextMoE`).
//!
//! ```text
//! s      = sigmoid(W_gate·x)                        fp32, [E]
//! choice = s + e_score_correction_bias              selects only
//! groups = top topk_group of n_group by (sum of each group's two best choices); others −∞
//! top    = top-k(choice) ;  w = s[top] / (Σ s[top] + 1e-20) · routed_scaling_factor
//! out    = Σ_k w_k·expert_k(x) + shared(x)          every SwiGLU clamped at swiglu_limit
//! ```
//!
//! The router, the experts and the clamped SwiGLU are shared layers
//! ([`crate::layers::moe`], [`crate::layers::mlp`]); GLM brings its router
//! policy (sigmoid, group limit, bias) and the ungated shared expert.

use super::config::{Glm5NextConfig, MlpKind};
use crate::backend::{Backend, RouterSpec, Scoring};
use crate::error::Result;
use crate::layers::linear::BindLinear;
use crate::layers::mlp::FusedSwiGlu;
use crate::layers::moe::{Experts, ScoredRouter};
use crate::load::binder::Binder;

#[derive(Debug)]
pub enum Ffn<B: Backend> {
    Dense(FusedSwiGlu<B>),
    Sparse {
        router: ScoredRouter<B>,
        experts: Experts<B>,
        shared: FusedSwiGlu<B>,
    },
}

const MLP_NAMES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

impl<B: Backend> Ffn<B> {
    /// Bound under `w`'s scope (`…mlp`).
    pub fn load(w: &mut Binder<'_, B>, cfg: &Glm5NextConfig, kind: MlpKind) -> Result<Self> {
        let h = cfg.hidden_size;
        let limit = Some(cfg.swiglu_limit as f32);
        Ok(match kind {
            MlpKind::Dense => Ffn::Dense(FusedSwiGlu::load(
                w,
                MLP_NAMES,
                h,
                cfg.intermediate_size,
                limit,
            )?),
            MlpKind::Sparse => {
                let e = cfg.n_routed_experts;
                let spec = RouterSpec {
                    scoring: Scoring::Sigmoid,
                    experts: e,
                    k: cfg.num_experts_per_tok,
                    groups: Some((cfg.n_group, cfg.topk_group)),
                    renormalise: cfg.norm_topk_prob,
                    scale: cfg.routed_scaling_factor as f32,
                };
                let router = ScoredRouter::new(
                    w.linear("gate", e, h)?,
                    Some(w.vector("gate.e_score_correction_bias", &[e])?),
                    spec,
                )?;
                let shared_inter = cfg.moe_intermediate_size * cfg.n_shared_experts;
                Ffn::Sparse {
                    router,
                    experts: Experts::load(w, e, h, cfg.moe_intermediate_size)?
                        .with_limit(cfg.swiglu_limit as f32),
                    shared: FusedSwiGlu::load(
                        &mut w.pp("shared_experts"),
                        MLP_NAMES,
                        h,
                        shared_inter,
                        limit,
                    )?,
                }
            }
        })
    }

    /// `x: [rows, H]` → `[rows, H]`, and the routing of a sparse block.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
    ) -> Result<(B::Buf, Option<B::Routing>)> {
        match self {
            Ffn::Dense(mlp) => Ok((mlp.forward(ops, x, rows)?, None)),
            Ffn::Sparse {
                router,
                experts,
                shared,
            } => {
                let routing = router.route(ops, x, rows, None)?;
                let routed = experts.forward(ops, x, rows, &routing)?;
                let y = ops.add(&routed, &shared.forward(ops, x, rows)?)?;
                Ok((y, Some(routing)))
            }
        }
    }
}
