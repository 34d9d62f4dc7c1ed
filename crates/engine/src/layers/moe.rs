//! Mixture-of-experts mechanics shared by families: the routed experts
//! ([`Experts`]) and routers that choose them. Experts do not own their
//! router (the caller computes the routing), so each family brings its own
//! routing policy to the same expert execution: softmax top-k
//! ([`SoftmaxRouter`], Qwen); scored routers ([`ScoredRouter`]:
//! sqrt-softplus with a correction bias and hash routing by token id for
//! DeepSeek-V4, sigmoid with group-limited top-k for GLM-5).
//!
//! Experts load from either layout found in the wild: per expert
//! (`experts.{e}.{gate,up,down}_proj.weight`, what `save_pretrained` writes)
//! or fused 3-D (`experts.gate_up_proj [E, 2I, H]`, rows `[gate | up]`, and
//! `experts.down_proj [E, H, I]`, transformers' runtime layout); both are
//! kept fused.

use crate::backend::{Backend, HostWeight, RouterSpec};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::Binder;

/// Per-expert weights (in order) as one `[E, out, in]` stack: stored
/// tensors of one type joined as views, anything else stacked in f32.
fn stack<B: Backend>(
    w: &Binder<'_, B>,
    name: &str,
    parts: Vec<HostWeight>,
    dims: [usize; 3],
) -> Result<HostWeight> {
    let joined = w.join_rows(&[name], parts, dims[2])?;
    match joined {
        HostWeight::Quant(q) => {
            let mut q = (*q).clone();
            q.dims = dims.to_vec();
            Ok(HostWeight::Quant(std::sync::Arc::new(q)))
        }
        // f32 parts, or experts whose projections were stored in different
        // types (no release does this): one f32 stack.
        other => Ok(HostWeight::F32(other.to_f32()?.reshape(dims.to_vec())?)),
    }
}

/// Routed SwiGLU experts: `expert_e(x) = down_e(silu(gate_e·x) ⊙ up_e·x)`.
#[derive(Debug)]
pub struct Experts<B: Backend> {
    /// `[E, 2I, H]` and `[E, H, I]`.
    gate_up: B::Experts,
    down: B::Experts,
    pub n_experts: usize,
    pub inter: usize,
    /// SwiGLU clamp (`swiglu_limit`), `None` for the plain form.
    pub limit: Option<f32>,
}

impl<B: Backend> Experts<B> {
    /// Bound under `w`'s scope (`…mlp.`), from `experts.*` in either layout.
    pub fn load(w: &mut Binder<'_, B>, n_experts: usize, h: usize, inter: usize) -> Result<Self> {
        Self::load_named(
            w,
            n_experts,
            h,
            inter,
            ["gate_proj", "up_proj", "down_proj"],
        )
    }

    /// Like [`Self::load`], the per-expert matrices named `names` = `[gate,
    /// up, down]` (DeepSeek's upstream checkpoints: `w1`, `w3`, `w2`).
    pub fn load_named(
        w: &mut Binder<'_, B>,
        n_experts: usize,
        h: usize,
        inter: usize,
        names: [&str; 3],
    ) -> Result<Self> {
        let (gu, dn) = if w.has("experts.gate_up_proj") {
            // As read: a quantized or synthetic stack stays so.
            (
                w.raw("experts.gate_up_proj", &[n_experts, 2 * inter, h])?,
                w.raw("experts.down_proj", &[n_experts, h, inter])?,
            )
        } else {
            // Per expert, as read: stored types (FP4 experts, views of a
            // GGUF stack) stay stored and are joined without a copy.
            let mut gus = Vec::with_capacity(2 * n_experts);
            let mut dns = Vec::with_capacity(n_experts);
            for e in 0..n_experts {
                let mut x = w.pp(&format!("experts.{e}"));
                gus.push(x.raw(&format!("{}.weight", names[0]), &[inter, h])?);
                gus.push(x.raw(&format!("{}.weight", names[1]), &[inter, h])?);
                dns.push(x.raw(&format!("{}.weight", names[2]), &[h, inter])?);
            }
            let gu = stack(w, names[0], gus, [n_experts, 2 * inter, h])?;
            let dn = stack(w, names[2], dns, [n_experts, h, inter])?;
            (gu, dn)
        };
        // The tensors each stack is made of, for a product observer
        // (`crate::observe`; nothing is built when none is installed).
        let fused = w.has("experts.gate_up_proj");
        let prefix = w.name("experts.");
        let prefix = prefix.as_str();
        let stack_names = |parts: &[(&str, usize)], out: usize, inp: usize| {
            if fused {
                return vec![(format!("{prefix}{}", parts[0].0), vec![n_experts, out, inp])];
            }
            (0..n_experts)
                .flat_map(|e| {
                    parts
                        .iter()
                        .map(move |&(p, rows)| (format!("{prefix}{e}.{p}.weight"), vec![rows, inp]))
                })
                .collect()
        };
        let ops = w.ops();
        crate::observe::name_next(&|| {
            let parts = [(names[0], inter), (names[1], inter)];
            stack_names(
                if fused {
                    &[("gate_up_proj", 0)]
                } else {
                    &parts
                },
                2 * inter,
                h,
            )
        });
        let gate_up = ops.experts(gu, n_experts, 2 * inter, h)?;
        crate::observe::name_next(&|| {
            let parts = [(names[2], h)];
            stack_names(if fused { &[("down_proj", 0)] } else { &parts }, h, inter)
        });
        Ok(Self {
            gate_up,
            down: ops.experts(dn, n_experts, h, inter)?,
            n_experts,
            inter,
            limit: None,
        })
    }

    /// The clamped SwiGLU `silu(min(g, L))·clamp(u, ±L)` (DeepSeek, GLM).
    pub fn with_limit(mut self, limit: f32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// `x: [rows, H]` → `Σ_k w_k·expert_k(x)`, `[rows, H]` (slots summed in
    /// routing order).
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        routing: &B::Routing,
    ) -> Result<B::Buf> {
        ops.experts_swiglu(x, rows, routing, &self.gate_up, &self.down, self.limit)
    }

    /// [`Self::forward`] plus `shared [rows, H]` gated by `sigmoid(gate)`
    /// per row ([`Backend::experts_swiglu_gated`]).
    pub fn forward_gated(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        routing: &B::Routing,
        shared: &B::Buf,
        gate: &B::Buf,
    ) -> Result<B::Buf> {
        ops.experts_swiglu_gated(
            x,
            rows,
            routing,
            &self.gate_up,
            &self.down,
            self.limit,
            shared,
            gate,
        )
    }
}

/// Softmax router: `p = softmax(W_gate·x)`, the top `k` experts (ties to
/// the lower index), weights renormalised over the top `k` when asked.
#[derive(Debug)]
pub struct SoftmaxRouter<B: Backend> {
    gate: Linear<B>,
    n_experts: usize,
    top_k: usize,
    renormalise: bool,
}

impl<B: Backend> SoftmaxRouter<B> {
    /// `gate.weight` `[E, H]` under `w`'s scope.
    pub fn load(
        w: &mut Binder<'_, B>,
        n_experts: usize,
        h: usize,
        top_k: usize,
        renormalise: bool,
    ) -> Result<Self> {
        Ok(Self {
            gate: w.linear("gate", n_experts, h)?,
            n_experts,
            top_k,
            renormalise,
        })
    }

    pub fn route(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Routing> {
        let logits = self.gate.forward(ops, x, rows)?;
        self.route_logits(ops, &logits, rows)
    }

    /// The gate `[E, H]` (for a caller that computes the logits together
    /// with other products of the same input).
    pub fn gate(&self) -> &Linear<B> {
        &self.gate
    }

    /// [`Self::route`] from the gate's logits `[rows, E]`.
    pub fn route_logits(&self, ops: &B, logits: &B::Buf, rows: usize) -> Result<B::Routing> {
        ops.route_softmax_topk(logits, rows, self.n_experts, self.top_k, self.renormalise)
    }
}

/// A scored router: `s = score(W_gate·x)`, selection by `s + bias` (the
/// bias only selects) with an optional group limit, or by token id (hash
/// routing); weights `s` of the chosen experts, renormalised and scaled.
#[derive(Debug)]
pub struct ScoredRouter<B: Backend> {
    gate: Linear<B>,
    bias: Option<B::Buf>,
    pub spec: RouterSpec,
}

impl<B: Backend> ScoredRouter<B> {
    /// From bound parts (`gate` `[E, H]`, the correction bias `[E]`).
    pub fn new(gate: Linear<B>, bias: Option<B::Buf>, spec: RouterSpec) -> Result<Self> {
        if gate.out_dim() != spec.experts {
            return Err(crate::error::EngineError::State(format!(
                "router gate of {} outputs for {} experts",
                gate.out_dim(),
                spec.experts
            )));
        }
        Ok(Self { gate, bias, spec })
    }

    /// `fixed`: the experts of each row by token id (`[rows, k]`, hash
    /// routing), else selection by score.
    pub fn route(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        fixed: Option<&[u32]>,
    ) -> Result<B::Routing> {
        let logits = self.gate.forward(ops, x, rows)?;
        ops.route_scored(&logits, rows, self.bias.as_ref(), fixed, &self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CpuOps, HostWeight, Scoring};

    /// The scored router through its layer: an identity gate passes the
    /// inputs as logits, so the selection and weights are the op's.
    #[test]
    fn scored_router_routes_through_the_op() {
        let ops = CpuOps;
        let eye = candle_core::Tensor::eye(4, candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap();
        let gate = Linear::new(ops.matrix(HostWeight::F32(eye), 4, 4).unwrap(), 4, 4).unwrap();
        let spec = RouterSpec {
            scoring: Scoring::Sigmoid,
            experts: 4,
            k: 2,
            groups: Some((2, 1)),
            renormalise: true,
            scale: 2.5,
        };
        let r = ScoredRouter::new(gate, Some(vec![0.0, 0.0, 0.0, 0.5]), spec).unwrap();
        let x = vec![0.1, 2.0, 0.3, 0.2];
        let (experts, weights) = ops
            .routing_to_host(&r.route(&ops, &x, 1, None).unwrap())
            .unwrap();
        // The bias lifts group 1 (experts 2, 3) over group 0 although
        // expert 1 scores best; within it 3 (biased) then 2. The weights use
        // the unbiased scores.
        assert_eq!(experts, vec![3, 2]);
        let s = |v: f32| 1.0 / (1.0 + (-v).exp());
        assert!((weights[0] - s(0.2) / (s(0.2) + s(0.3)) * 2.5).abs() < 1e-6);
        assert!((weights.iter().sum::<f32>() - 2.5).abs() < 1e-5);
        let (experts, _) = ops
            .routing_to_host(&r.route(&ops, &x, 1, Some(&[1, 0])).unwrap())
            .unwrap();
        assert_eq!(experts, vec![1, 0]);
    }
}
