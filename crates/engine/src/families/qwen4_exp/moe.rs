//! Sparse MoE with a gated shared expert (`Qwen4ExpTextSparseMoeBlock`).
//!
//! ```text
//! p      = softmax(W_gate·x)                 fp32, [T, E]
//! top    = topk(p, k); w = top / Σ top       (renormalised when norm_topk_prob)
//! expert = down( silu(gate·x) ⊙ up·x )       gate/up [I, H], down [H, I]
//! out    = Σ_k w_k·expert_k(x) + sigmoid(w_sg·x)·shared(x)
//! ```
//!
//! Experts load from either layout found in the wild: per expert
//! (`experts.{e}.{gate,up,down}_proj.weight`, what `save_pretrained` writes)
//! or fused 3-D (`experts.gate_up_proj [E, 2I, H]`, rows `[gate | up]`, and
//! `experts.down_proj [E, H, I]`, transformers' runtime layout), kept fused
//! for the host kernel [`super::kernels::expert_gather`]: tokens gathered
//! per expert, one row-independent matmul per expert and projection.

use candle_core::{D, Device, Tensor};
use candle_nn::ops::sigmoid;

use super::kernels::{Dense, expert_gather, with_slice};
use super::norms::{load, to_vec};
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

#[derive(Debug, Clone)]
pub struct Moe {
    router: Dense,
    n_experts: usize,
    /// `[E, 2I, H]` and `[E, H, I]`, contiguous: the host kernel's layout.
    fused_gate_up: Tensor,
    fused_down: Tensor,
    shared_gate_up: Dense,
    shared_down: Dense,
    shared_expert_gate: Dense,
    top_k: usize,
    norm_topk: bool,
    inter: usize,
    shared_inter: usize,
}

/// Routing decisions of one forward: `[T, k]` expert ids and weights.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

impl Moe {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        h: usize,
        n_experts: usize,
        top_k: usize,
        inter: usize,
        shared_inter: usize,
        norm_topk: bool,
    ) -> Result<Self> {
        let fused = format!("{prefix}experts.gate_up_proj");
        let (gu, dn) = if st.has(&fused) {
            (
                load(
                    st,
                    prefix,
                    "experts.gate_up_proj",
                    &[n_experts, 2 * inter, h],
                )?,
                load(st, prefix, "experts.down_proj", &[n_experts, h, inter])?,
            )
        } else {
            let mut gus = Vec::with_capacity(n_experts);
            let mut dns = Vec::with_capacity(n_experts);
            for e in 0..n_experts {
                let p = format!("{prefix}experts.{e}.");
                let g = load(st, &p, "gate_proj.weight", &[inter, h])?;
                let u = load(st, &p, "up_proj.weight", &[inter, h])?;
                gus.push(Tensor::cat(&[g, u], 0)?);
                dns.push(load(st, &p, "down_proj.weight", &[h, inter])?);
            }
            (Tensor::stack(&gus, 0)?, Tensor::stack(&dns, 0)?)
        };
        let (gu, dn) = (gu.contiguous()?, dn.contiguous()?);
        let sg = load(
            st,
            prefix,
            "shared_expert.gate_proj.weight",
            &[shared_inter, h],
        )?;
        let su = load(
            st,
            prefix,
            "shared_expert.up_proj.weight",
            &[shared_inter, h],
        )?;
        Ok(Self {
            fused_gate_up: gu,
            fused_down: dn,
            router: Dense::new(load(st, prefix, "gate.weight", &[n_experts, h])?)?,
            n_experts,
            shared_gate_up: Dense::new(Tensor::cat(&[sg, su], 0)?)?,
            shared_down: Dense::new(load(
                st,
                prefix,
                "shared_expert.down_proj.weight",
                &[h, shared_inter],
            )?)?,
            shared_expert_gate: Dense::new(load(
                st,
                prefix,
                "shared_expert_gate.weight",
                &[1, h],
            )?)?,
            top_k,
            norm_topk,
            inter,
            shared_inter,
        })
    }

    /// Softmax router, top-k, renormalisation (host, fp32).
    pub fn route(&self, x: &Tensor) -> Result<Routing> {
        let logits = to_vec(&self.router.forward(x)?)?;
        let e = self.n_experts;
        let mut r = Routing::default();
        let mut idx: Vec<usize> = Vec::with_capacity(e);
        for row in logits.chunks_exact(e) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = ex.iter().sum();
            idx.clear();
            idx.extend(0..e);
            // Descending probability; equal probabilities keep the lower id
            // first (torch.topk's CPU order for exact ties is unspecified).
            idx.sort_by(|&a, &b| ex[b].total_cmp(&ex[a]).then(a.cmp(&b)));
            let top: Vec<f32> = idx[..self.top_k].iter().map(|&i| ex[i] / sum).collect();
            let norm: f32 = if self.norm_topk {
                top.iter().sum()
            } else {
                1.0
            };
            for (k, &i) in idx[..self.top_k].iter().enumerate() {
                r.experts.push(i);
                r.weights.push(top[k] / norm);
            }
        }
        Ok(r)
    }

    /// `x: [T, H]` → `[T, H]`; also returns the routing.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Routing)> {
        let (t, h) = x.dims2()?;
        let routing = self.route(x)?;
        let x = x.contiguous()?;
        let y = with_slice(&x, |xs| {
            with_slice(&self.fused_gate_up, |gu| {
                with_slice(&self.fused_down, |dn| {
                    expert_gather(
                        xs,
                        &routing.experts,
                        &routing.weights,
                        self.top_k,
                        gu,
                        dn,
                        h,
                        self.inter,
                    )
                })
            })
        })???;
        let out = Tensor::from_vec(y, (t, h), &Device::Cpu)?;
        let gu = self.shared_gate_up.forward(&x)?;
        let act = (gu.narrow(D::Minus1, 0, self.shared_inter)?.silu()?
            * gu.narrow(D::Minus1, self.shared_inter, self.shared_inter)?)?;
        let shared = self.shared_down.forward(&act)?;
        let g = sigmoid(&self.shared_expert_gate.forward(&x)?)?;
        Ok(((out + shared.broadcast_mul(&g)?)?, routing))
    }
}
