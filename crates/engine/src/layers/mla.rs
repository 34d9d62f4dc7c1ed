//! Multi-head latent attention (MLA) over a cache of normalised latents,
//! NoPE (GLM-5: `qk_rope_head_dim = 0`), in the absorbed form. `H` heads,
//! `dn` = `qk_nope_head_dim`, `dv` = `v_head_dim`, `r` = `kv_lora_rank`.
//!
//! ```text
//! qr  = q_a_layernorm(q_a_proj·x)                 [q_lora]   (also the indexer's input)
//! q_h = (q_b_proj·qr)_h                           [dn]
//! c   = kv_a_layernorm(kv_a_proj_with_mqa·x)      [r]        the cached latent, one per token
//! [k_h | v_h] = (kv_b_proj·c)_h                   [dn | dv]  never materialised:
//! q̃_h = W_k,hᵀ·q_h                                [r]        absorbed into the query
//! o_h = W_v,h · Σ_j softmax_j(q̃_h·c_j / √dn)·c_j   over the selected tokens j
//! y   = o_proj·[o_0 | … | o_{H−1}]
//! ```
//!
//! transformers expands every cached latent into per-head keys and values
//! each step; the absorbed form is the same algebra (`q·(W_k c) = (W_kᵀq)·c`)
//! with the sums in another order (differences at f32 rounding), and the
//! cache holds only `r` values per token. Attention runs through
//! [`crate::backend::Backend::attention_gathered`] over the selection (one
//! shared latent "head", dims `r`), whose `1/√r` is turned into `1/√dn` by
//! scaling `q̃` first.

use crate::backend::{Backend, Heads};
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::load::binder::Binder;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaSpec {
    pub heads: usize,
    pub q_lora: usize,
    /// `kv_lora_rank`: the latent width.
    pub latent: usize,
    pub nope: usize,
    pub v: usize,
    pub eps: f64,
}

#[derive(Debug)]
pub struct Mla<B: Backend> {
    q_a: Linear<B>,
    q_a_norm: RmsNorm<B>,
    q_b: Linear<B>,
    kv_a: Linear<B>,
    kv_a_norm: RmsNorm<B>,
    /// Per head `W_k,hᵀ`, `[r, dn]`.
    absorb_k: Vec<Linear<B>>,
    /// Per head `W_v,h`, `[dv, r]`.
    absorb_v: Vec<Linear<B>>,
    o_proj: Linear<B>,
    pub spec: MlaSpec,
}

impl<B: Backend> Mla<B> {
    /// Bound under `w`'s scope (`…self_attn`) for inputs of width `h`
    /// (DeepSeek names: `q_a_proj`, `q_a_layernorm`, `q_b_proj`,
    /// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`).
    pub fn load(w: &mut Binder<'_, B>, h: usize, spec: MlaSpec) -> Result<Self> {
        let MlaSpec {
            heads,
            q_lora,
            latent,
            nope,
            v,
            eps,
        } = spec;
        let kv_b = w.tensor("kv_b_proj.weight", &[heads * (nope + v), latent])?;
        let mut absorb_k = Vec::with_capacity(heads);
        let mut absorb_v = Vec::with_capacity(heads);
        for hd in 0..heads {
            let first = hd * (nope + v);
            let k = kv_b.narrow(0, first, nope)?.t()?.contiguous()?;
            let vv = kv_b.narrow(0, first + nope, v)?.contiguous()?;
            absorb_k.push(w.linear_from(crate::backend::HostWeight::F32(k), latent, nope)?);
            absorb_v.push(w.linear_from(crate::backend::HostWeight::F32(vv), v, latent)?);
        }
        Ok(Self {
            q_a: w.linear("q_a_proj", q_lora, h)?,
            q_a_norm: RmsNorm::load(w, "q_a_layernorm.weight", q_lora, eps)?,
            q_b: w.linear("q_b_proj", heads * nope, q_lora)?,
            kv_a: w.linear("kv_a_proj_with_mqa", latent, h)?,
            kv_a_norm: RmsNorm::load(w, "kv_a_layernorm.weight", latent, eps)?,
            absorb_k,
            absorb_v,
            o_proj: w.linear("o_proj", h, heads * v)?,
            spec,
        })
    }

    /// `(qr, q)`: the query LoRA residual `[rows, q_lora]` (the indexer's
    /// input too) and the queries `[rows, H·dn]`.
    pub fn queries(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<(B::Buf, B::Buf)> {
        let qr = self
            .q_a_norm
            .forward(ops, &self.q_a.forward(ops, x, rows)?)?;
        let q = self.q_b.forward(ops, &qr, rows)?;
        Ok((qr, q))
    }

    /// The normalised latents of the new tokens, `[rows, r]` (what the
    /// cache appends).
    pub fn latents(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        self.kv_a_norm
            .forward(ops, &self.kv_a.forward(ops, x, rows)?)
    }

    /// Attention of the `rows` queries `q` over the cached latents `cache:
    /// [P, r]` (this forward's latents already appended), each query over
    /// its `selected` tokens; → `[rows, H_model]`.
    pub fn attend(
        &self,
        ops: &B,
        q: &B::Buf,
        rows: usize,
        cache: &B::Buf,
        selected: &B::Selection,
    ) -> Result<B::Buf> {
        let q_lat = self.absorb(ops, q, rows)?;
        let o_lat = self.attend_latent(ops, &q_lat, cache, selected)?;
        self.output(ops, &o_lat, rows)
    }

    /// The queries `[rows, H·dn]` absorbed into latent space and scaled,
    /// `[rows, H·r]` (per row: a batched forward runs it once over several
    /// sessions' rows).
    pub fn absorb(&self, ops: &B, q: &B::Buf, rows: usize) -> Result<B::Buf> {
        let MlaSpec {
            heads,
            latent,
            nope,
            ..
        } = self.spec;
        // Head h's columns through its own matrix, joined: one grouped
        // product (a device runs the heads in one launch; the bits of the
        // split, the per-head products and the join).
        if self.absorb_k.len() != heads {
            return Err(EngineError::State(
                "MLA: per-head absorptions missing".into(),
            ));
        }
        let ws: Vec<&B::Matrix> = self.absorb_k.iter().map(Linear::matrix).collect();
        let q_lat = ops.matmul_grouped(q, rows, &ws)?;
        // The op scales by 1/√r; the reference scales by 1/√dn.
        ops.affine(&q_lat, (latent as f64 / nope as f64).sqrt() as f32, 0.0)
    }

    /// One session's attention of its absorbed queries over its latents
    /// `cache` and `selected` tokens; → `[rows, H·r]`.
    pub fn attend_latent(
        &self,
        ops: &B,
        q_lat: &B::Buf,
        cache: &B::Buf,
        selected: &B::Selection,
    ) -> Result<B::Buf> {
        let MlaSpec { heads, latent, .. } = self.spec;
        ops.attention_gathered(
            q_lat,
            cache,
            cache,
            selected,
            heads,
            Heads {
                heads: 1,
                dim: latent,
            },
            None,
        )
    }

    /// Per row: the latent outputs `[rows, H·r]` through `W_v` and
    /// `o_proj`; → `[rows, H_model]`.
    pub fn output(&self, ops: &B, o_lat: &B::Buf, rows: usize) -> Result<B::Buf> {
        let heads = self.spec.heads;
        // As in `absorb`: one grouped product over the heads.
        if self.absorb_v.len() != heads {
            return Err(EngineError::State("MLA: per-head outputs missing".into()));
        }
        let ws: Vec<&B::Matrix> = self.absorb_v.iter().map(Linear::matrix).collect();
        let y = ops.matmul_grouped(o_lat, rows, &ws)?;
        self.o_proj.forward(ops, &y, rows)
    }
}
