//! Kimi delta attention (KDA): the linear-attention layer of GLM-5 (and
//! Kimi Linear), built on the shared [`crate::layers::delta_rule`]. `H`
//! heads of `d`, `C = H·d`, batch 1.
//!
//! ```text
//! u_t   = [q_proj | k_proj | v_proj]·x_t              [3C]  (the conv window stores raw u)
//! c_t   = silu( Σ_{k<K} w[:,k]·u_{t−K+1+k} )           depthwise causal conv, zero left pad
//! q,k,v = split(c_t) ;  q = l2n(q)·d^−½ ;  k = l2n(k)  l2n(x) = x / sqrt(Σx² + 1e-6)
//! f     = f_b(f_a·x) ;  g = kda_gate(f)                per channel: lb·σ(e^A·(f+dt)) or −e^A·softplus(f+dt)
//! β     = σ(b_proj·x)                                  [H]
//! S     ← diag(e^g)·S ;  S ← S + k ⊗ β(v − kᵀS) ;  o = qᵀS          S [H, d, d] fp32
//! y     = o_proj( o_norm.w · rms(o) · σ(g_b(g_a·x)) )  per head
//! ```
//!
//! transformers runs the chunked form (chunk 64) for prefill and the
//! recurrence for single tokens; they agree to fp32 rounding. Here the
//! recurrence serves every row count, so a token's bits do not depend on
//! the chunk, step or verify window it ran in.
//!
//! Weights bind from either leaf layout found in the wild: the upstream
//! names `save_pretrained` writes (`q_conv1d`/`k_conv1d`/`v_conv1d`,
//! `f_a_proj`, `dt_bias`, `A_log` beside the projections) or transformers'
//! internal ones (one fused `conv1d`, `forget_gate.*`).

use crate::backend::{Backend, GateAct, ScanDims};
use crate::error::Result;
use crate::layers::delta_rule::{DeltaCache, DeltaReplay, DeltaShape, ScanInputs};
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::Binder;

/// A KDA layer's geometry and gate form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaSpec {
    pub heads: usize,
    pub head_dim: usize,
    pub kernel: usize,
    /// `Some(lb)`: the bounded sigmoid gate; `None`: the softplus gate.
    pub lower_bound: Option<f32>,
    /// Epsilon of the gated output norm.
    pub eps: f32,
}

#[derive(Debug)]
pub struct Kda<B: Backend> {
    /// `[3C, D]`: q, k, v stacked.
    qkv: Linear<B>,
    /// `[3C, K]`.
    conv_w: B::Buf,
    f_a: Linear<B>,
    f_b: Linear<B>,
    /// `exp(A_log)`, `[H]`.
    a: B::Buf,
    dt_bias: B::Buf,
    b_proj: Linear<B>,
    g_a: Linear<B>,
    g_b: Linear<B>,
    o_norm: B::Buf,
    o_proj: Linear<B>,
    shape: DeltaShape,
    spec: KdaSpec,
}

impl<B: Backend> Kda<B> {
    /// Bound under `w`'s scope (`…self_attn`) for inputs of width `h`.
    pub fn load(w: &mut Binder<'_, B>, h: usize, spec: KdaSpec) -> Result<Self> {
        let (heads, d, k) = (spec.heads, spec.head_dim, spec.kernel);
        let c = heads * d;
        let qkv = w.fused_rows(
            &["q_proj.weight", "k_proj.weight", "v_proj.weight"],
            &[c, c, c],
            h,
        )?;
        let conv_w = if w.has("conv1d.weight") {
            w.vector("conv1d.weight", &[3 * c, 1, k])?
        } else {
            let mut all = Vec::with_capacity(3 * c * k);
            for name in ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"] {
                all.extend(w.host(name, &[c, 1, k])?);
            }
            w.ops().upload(&all)?
        };
        let internal = w.has("forget_gate.f_a_proj.weight");
        let mut g = if internal {
            w.pp("forget_gate")
        } else {
            w.pp("")
        };
        let a: Vec<f32> = g.host("A_log", &[heads])?.iter().map(|v| v.exp()).collect();
        let gate = (
            g.linear("f_a_proj", d, h)?,
            g.linear("f_b_proj", c, d)?,
            g.vector("dt_bias", &[c])?,
            g.ops().upload(&a)?,
        );
        Ok(Self {
            qkv: w.linear_from(qkv, 3 * c, h)?,
            conv_w,
            f_a: gate.0,
            f_b: gate.1,
            dt_bias: gate.2,
            a: gate.3,
            b_proj: w.linear("b_proj", heads, h)?,
            g_a: w.linear("g_a_proj", d, h)?,
            g_b: w.linear("g_b_proj", c, d)?,
            o_norm: w.vector("o_norm.weight", &[d])?,
            o_proj: w.linear("o_proj", h, c)?,
            shape: DeltaShape {
                dims: ScanDims {
                    hk: heads,
                    hv: heads,
                    dk: d,
                    dv: d,
                },
                channels: 3 * c,
                kernel: k,
            },
            spec,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<DeltaCache<B>> {
        self.shape.new_cache(ops)
    }

    /// Everything per row before the recurrence: `[u, g, β, z]` (the raw
    /// `q|k|v` projection, the decay, β and the output gate's input). A
    /// batched forward runs it once over several sessions' rows.
    pub fn project(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<[B::Buf; 4]> {
        let d = self.spec.head_dim;
        let u = self.qkv.forward(ops, x, rows)?;
        let f = self
            .f_b
            .forward(ops, &self.f_a.forward(ops, x, rows)?, rows)?;
        let g = ops.kda_gate(&f, &self.a, &self.dt_bias, d, self.spec.lower_bound)?;
        let beta = ops.sigmoid(&self.b_proj.forward(ops, x, rows)?)?;
        let z = self
            .g_b
            .forward(ops, &self.g_a.forward(ops, x, rows)?, rows)?;
        Ok([u, g, beta, z])
    }

    /// The part on one session's state: the conv over its rows of `u`, the
    /// q / k norms and the recurrence with its `g`, `β`, advancing `cache`
    /// (recording with `capture` what [`DeltaReplay::replay`] needs to
    /// rebuild the cache after any prefix of the rows); → `o`. A layer runs
    /// [`Self::project`], this, then [`Self::output`].
    #[allow(clippy::too_many_arguments)]
    pub fn recur(
        &self,
        ops: &B,
        u: B::Buf,
        g: B::Buf,
        beta: B::Buf,
        rows: usize,
        cache: &mut DeltaCache<B>,
        capture: Option<&mut Option<DeltaReplay<B>>>,
    ) -> Result<B::Buf> {
        let before = capture.is_some().then(|| cache.clone());
        let inputs = self.scan_inputs(ops, &u, g, beta, rows, cache)?;
        let o = self.shape.scan(ops, &inputs, cache)?;
        if let (Some(cap), Some(before)) = (capture, before) {
            *cap = Some(self.shape.replay(before, u, inputs));
        }
        Ok(o)
    }

    /// [`Kda::recur`]'s inputs: the conv over the session's rows of `u`
    /// (advancing its window) and the q / k norms, with its `g`, `β`.
    pub fn scan_inputs(
        &self,
        ops: &B,
        u: &B::Buf,
        g: B::Buf,
        beta: B::Buf,
        rows: usize,
        cache: &mut DeltaCache<B>,
    ) -> Result<ScanInputs<B>> {
        let d = self.spec.head_dim;
        let c = self.spec.heads * d;
        let conv = self.shape.conv(ops, u, cache, &self.conv_w)?;
        let mut parts = ops.split_cols(&conv, rows, &[c, c, c], 1)?;
        let (v, mut k, mut q) = (pop(&mut parts)?, pop(&mut parts)?, pop(&mut parts)?);
        ops.l2_norm_heads(&mut q, d, (d as f32).powf(-0.5))?;
        ops.l2_norm_heads(&mut k, d, 1.0)?;
        Ok(ScanInputs { q, k, v, g, beta })
    }

    /// The shape of the layer's scan (for several sessions' scans at once,
    /// [`DeltaShape::scan_parts`]).
    pub fn shape(&self) -> &DeltaShape {
        &self.shape
    }

    /// The per-row output: the gated norm of `o` by `z`, then `o_proj`.
    pub fn output(&self, ops: &B, o: &B::Buf, z: &B::Buf, rows: usize) -> Result<B::Buf> {
        let y = ops.gated_rms_norm(o, z, &self.o_norm, self.spec.eps, GateAct::Sigmoid)?;
        self.o_proj.forward(ops, &y, rows)
    }
}

fn pop<T>(v: &mut Vec<T>) -> Result<T> {
    v.pop().ok_or_else(|| {
        crate::error::EngineError::State("split_cols returned fewer parts than asked".into())
    })
}
