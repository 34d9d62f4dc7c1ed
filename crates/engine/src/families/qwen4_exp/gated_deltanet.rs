//! Gated DeltaNet (`linear_attn`), batch 1.
//!
//! Dimensions: `Kd = Hk·dk`, `Vd = Hv·dv`, `Cc = 2Kd + Vd`, `r = Hv/Hk`.
//!
//! ```text
//! u_t   = in_proj_qkv·x_t                          [Cc]   (the conv window stores raw u)
//! c_t   = silu( Σ_{k<K} w[:,k]·u_{t−K+1+k} )       depthwise causal conv, zero left pad
//! q,k,v = split(c_t)                               v-head j reads q/k head ⌊j/r⌋
//! q     = l2n(q)·dk^−½ ;  k = l2n(k)               l2n(x) = x·rsqrt(Σx² + 1e-6)
//! β     = sigmoid(in_proj_b·x) ;  g = −exp(A_log)·softplus(in_proj_a·x + dt_bias)
//! S     ← S·exp(g) ;  S ← S + k ⊗ β(v − kᵀS) ;  o = qᵀS         S [Hv, dk, dv] fp32
//! y     = out_proj · ( w·rms(o) ⊙ act(z) ),  z = in_proj_z·x
//! ```
//!
//! The conv, the recurrence, its cache and the verify-window replay are the
//! shared [`crate::layers::delta_rule`]. transformers uses a chunked
//! (UT-transform) form for T > 1; it equals the recurrence up to fp32
//! summation order (~1e-6); the recurrence keeps every row's bits
//! independent of the chunking.

use super::config::{GateAct, Qwen4ExpConfig};
use crate::backend::{Backend, Epilogue, ScanDims, Unary};
use crate::error::Result;
use crate::layers::delta_rule::{DeltaCache, DeltaReplay, DeltaShape, ScanInputs};
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct GatedDeltaNet<B: Backend> {
    in_qkv: Linear<B>,
    in_z: Linear<B>,
    in_b: Linear<B>,
    in_a: Linear<B>,
    /// `[Cc, K]`.
    conv_w: B::Buf,
    /// `−exp(A_log)`, `[Hv]`.
    neg_a: B::Buf,
    dt_bias: B::Buf,
    norm_w: B::Buf,
    out: Linear<B>,
    shape: DeltaShape,
    act: GateAct,
    eps: f32,
}

impl<B: Backend> GatedDeltaNet<B> {
    /// Bound under `w`'s scope (`…linear_attn`).
    pub fn load(cfg: &Qwen4ExpConfig, w: &mut Binder<'_, B>) -> Result<Self> {
        let (h, hk, hv) = (
            cfg.hidden_size,
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
        );
        let (dk, dv, kernel) = (
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            cfg.linear_conv_kernel,
        );
        let (act, eps) = (cfg.output_gate, cfg.rms_norm_eps);
        let cc = 2 * hk * dk + hv * dv;
        let a_log = w.host("A_log", &[hv])?;
        let neg_a: Vec<f32> = a_log.iter().map(|a| -a.exp()).collect();
        Ok(Self {
            in_qkv: w.linear("in_proj_qkv", cc, h)?,
            in_z: w.linear("in_proj_z", hv * dv, h)?,
            in_b: w.linear("in_proj_b", hv, h)?,
            in_a: w.linear("in_proj_a", hv, h)?,
            conv_w: w.vector("conv1d.weight", &[cc, 1, kernel])?,
            neg_a: w.ops().upload(&neg_a)?,
            dt_bias: w.vector("dt_bias", &[hv])?,
            norm_w: w.vector("norm.weight", &[dv])?,
            out: w.linear("out_proj", h, hv * dv)?,
            shape: DeltaShape {
                dims: ScanDims { hk, hv, dk, dv },
                channels: cc,
                kernel,
            },
            act,
            eps: eps as f32,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<DeltaCache<B>> {
        self.shape.new_cache(ops)
    }

    /// `x: [T, H]` → `[T, H]`, advancing `cache`. With `capture`, records
    /// what [`DeltaReplay::replay`] needs to rebuild the cache after any
    /// prefix of rows.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut DeltaCache<B>,
        capture: Option<&mut Option<DeltaReplay<B>>>,
    ) -> Result<B::Buf> {
        let [u, z, beta, a] = self.project(ops, x, rows)?;
        let o = self.recur(ops, u, beta, &a, cache, capture)?;
        self.output(ops, &o, &z, rows)
    }

    /// The row-wise projections of `x`: `[u, z, β, a]` (a batched forward
    /// runs them once over every session's rows).
    pub(super) fn project(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<[B::Buf; 4]> {
        // Every projection of `x` as one call (one launch for a decode row).
        Linear::forward_many(
            ops,
            x,
            rows,
            [
                (&self.in_qkv, Epilogue::Chain(&[])),
                (&self.in_z, Epilogue::Chain(&[])),
                (&self.in_b, Epilogue::Chain(&[Unary::Sigmoid])),
                (&self.in_a, Epilogue::Chain(&[])),
            ],
        )
    }

    /// The part on one session's state: the conv and the recurrence over
    /// its rows of `u`, `β`, `a`, advancing `cache`; → `o`.
    pub(super) fn recur(
        &self,
        ops: &B,
        u: B::Buf,
        beta: B::Buf,
        a: &B::Buf,
        cache: &mut DeltaCache<B>,
        capture: Option<&mut Option<DeltaReplay<B>>>,
    ) -> Result<B::Buf> {
        let before = capture.is_some().then(|| cache.clone());
        let inputs = self.scan_inputs(ops, &u, beta, a, cache)?;
        let o = self.shape.scan(ops, &inputs, cache)?;
        if let (Some(cap), Some(before)) = (capture, before) {
            *cap = Some(self.shape.replay(before, u, inputs));
        }
        Ok(o)
    }

    /// [`GatedDeltaNet::recur`]'s inputs: the conv (advancing the window),
    /// the q / k / v split, the q and k head norms and the decays — one op
    /// (one launch for a decode step).
    pub(super) fn scan_inputs(
        &self,
        ops: &B,
        u: &B::Buf,
        beta: B::Buf,
        a: &B::Buf,
        cache: &mut DeltaCache<B>,
    ) -> Result<ScanInputs<B>> {
        let d = self.shape.dims;
        let [q, k, v, g] = ops.delta_inputs(
            d,
            u,
            &mut cache.conv,
            &self.conv_w,
            self.shape.kernel,
            (d.dk as f32).powf(-0.5),
            a,
            &self.neg_a,
            &self.dt_bias,
        )?;
        Ok(ScanInputs { q, k, v, g, beta })
    }

    /// The shape of the layer's scan (for several sessions' scans at once,
    /// [`DeltaShape::scan_parts`]).
    pub(super) fn shape(&self) -> &DeltaShape {
        &self.shape
    }

    /// The row-wise output: gated norm of `o` by `z`, then `out_proj`.
    pub(super) fn output(&self, ops: &B, o: &B::Buf, z: &B::Buf, rows: usize) -> Result<B::Buf> {
        let y = ops.gated_rms_norm(o, z, &self.norm_w, self.eps, self.act)?;
        self.out.forward(ops, &y, rows)
    }
}
