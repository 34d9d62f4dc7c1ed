//! Sparse MoE with a gated shared expert (`Qwen4ExpTextSparseMoeBlock`).
//!
//! ```text
//! p      = softmax(W_gate·x)                 fp32, [T, E]
//! top    = topk(p, k); w = top / Σ top       (renormalised when norm_topk_prob)
//! expert = down( silu(gate·x) ⊙ up·x )       gate/up [I, H], down [H, I]
//! out    = Σ_k w_k·expert_k(x) + sigmoid(w_sg·x)·shared(x)
//! ```
//!
//! The router and the routed experts are the shared
//! [`crate::layers::moe`] pieces; the shared expert and its gate are Qwen's.

use super::config::Qwen4ExpConfig;
use crate::backend::{Backend, Epilogue};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::moe::{Experts, SoftmaxRouter};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct Moe<B: Backend> {
    router: SoftmaxRouter<B>,
    experts: Experts<B>,
    /// `[2I_s, H]`, rows `[gate | up]`.
    shared_gate_up: Linear<B>,
    shared_down: Linear<B>,
    shared_expert_gate: Linear<B>,
}

/// Routing decisions of one forward, on the host: `[T, k]` expert ids and
/// weights (for traces and tests).
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

impl<B: Backend> Moe<B> {
    /// Bound under `w`'s scope (`…mlp`).
    pub fn load(cfg: &Qwen4ExpConfig, w: &mut Binder<'_, B>) -> Result<Self> {
        let (h, n_experts, top_k) = (cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok);
        let (inter, shared_inter, norm_topk) = (
            cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size,
            cfg.norm_topk_prob,
        );
        let experts = Experts::load(w, n_experts, h, inter)?;
        let fused = w.fused_rows(
            &[
                "shared_expert.gate_proj.weight",
                "shared_expert.up_proj.weight",
            ],
            &[shared_inter, shared_inter],
            h,
        )?;
        Ok(Self {
            router: SoftmaxRouter::load(w, n_experts, h, top_k, norm_topk)?,
            experts,
            shared_gate_up: w.linear_from(fused, 2 * shared_inter, h)?,
            shared_down: w.linear("shared_expert.down_proj", h, shared_inter)?,
            shared_expert_gate: w.linear("shared_expert_gate", 1, h)?,
        })
    }

    /// `x: [T, H]` → `[T, H]`; also returns the routing.
    pub fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<(B::Buf, B::Routing)> {
        // The three products of `x` outside the routed experts as one call
        // (one launch for a decode row): router logits, the shared
        // expert's SwiGLU, its gate logit.
        let [logits, act, g] = Linear::forward_many(
            ops,
            x,
            rows,
            [
                (self.router.gate(), Epilogue::Chain(&[])),
                (&self.shared_gate_up, Epilogue::Swiglu(None)),
                (&self.shared_expert_gate, Epilogue::Chain(&[])),
            ],
        )?;
        let routing = self.router.route_logits(ops, &logits, rows)?;
        let shared = self.shared_down.forward(ops, &act, rows)?;
        let y = self
            .experts
            .forward_gated(ops, x, rows, &routing, &shared, &g)?;
        Ok((y, routing))
    }
}
