//! CPU kernels of this family, all *row-independent*: a token's result has
//! the same bits whether it runs alone (a decode step), in a verify window
//! or in any prefill chunk, so a warm turn equals a cold one bit for bit.
//!
//! [`Dense`] runs every linear layer through [`super::matmul`] (one fixed
//! summation order per output element, tiled and threaded without changing
//! it). [`expert_gather`] evaluates the routed experts: tokens grouped per
//! expert, one tiled matmul per expert and projection, then each token's
//! experts summed in its top-k order.
//!
//! The recurrent GDN scan (`gated_deltanet::scan`), the attention over the
//! QSA-selected tokens (`gated_attention`), the QSA block selection
//! (`qsa::select_blocks`) and the norms are per-row host code (or candle
//! element-wise ops and per-row reductions) with no dependence on the row
//! count either. All of these are plain functions of slices: an
//! accelerator backend replaces them behind the same call sites (a candle
//! `CustomOp` per kernel with `cuda_fwd`/`metal_fwd`, keeping these as
//! `cpu_fwd`).

use candle_core::{Device, Storage, Tensor};

use super::matmul::matmul;
use crate::error::{EngineError, Result};

/// Borrow a contiguous f32 CPU tensor's data and run `f` on it.
pub fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(EngineError::Unsupported(
            "qwen4_exp host kernels need CPU tensors".into(),
        ));
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(EngineError::State(
            "host kernel input is not contiguous".into(),
        ));
    };
    Ok(f(&cpu.as_slice::<f32>()?[start..end]))
}

/// A bias-free linear map `y = x·wᵀ`, `w: [out, in]` f32.
#[derive(Debug, Clone)]
pub struct Dense {
    w: Tensor,
    out: usize,
    inp: usize,
}

impl Dense {
    pub fn new(w: Tensor) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        Ok(Self {
            w: w.contiguous()?,
            out,
            inp,
        })
    }

    pub fn weight(&self) -> &Tensor {
        &self.w
    }

    /// `x: [rows, in]` → `[rows, out]`, each row computed alone (see
    /// [`super::matmul`]).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        let rows = x.elem_count() / self.inp.max(1);
        if x.elem_count() != rows * self.inp {
            return Err(EngineError::State(format!(
                "dense input {:?} does not end in {} features",
                x.dims(),
                self.inp
            )));
        }
        let y = with_slice(&x, |xs| {
            with_slice(&self.w, |w| {
                let mut y = vec![0f32; rows * self.out];
                matmul(xs, rows, w, self.out, self.inp, &mut y);
                y
            })
        })??;
        Ok(Tensor::from_vec(y, (rows, self.out), &Device::Cpu)?)
    }
}

/// Routed experts: `out[t] = Σ_k w[t,k]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t)`.
///
/// `x: [T, H]`, `experts`/`weights`: `[T, k]`; `gate_up: [E, 2I, H]` (rows
/// `[gate | up]`), `down: [E, H, I]`; returns `[T, H]`. Each expert runs
/// once over the tokens routed to it; each token's `k` expert outputs are
/// then added in top-k order (`o = 0; o += w_k·y_k`), so a token's result
/// depends on its own row only.
#[allow(clippy::too_many_arguments)] // a kernel over flat slices
pub fn expert_gather(
    x: &[f32],
    experts: &[usize],
    weights: &[f32],
    top_k: usize,
    gate_up: &[f32],
    down: &[f32],
    h: usize,
    inter: usize,
) -> Vec<f32> {
    let slots = experts.len();
    debug_assert_eq!(slots * h, x.len() * top_k);
    let n_experts = gate_up.len() / (2 * inter * h).max(1);
    // ys[j]: the output of slot j = (token j / k, its (j % k)-th expert).
    let mut ys = vec![0f32; slots * h];
    let (mut idx, mut xs, mut gu, mut act, mut y) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in 0..n_experts {
        idx.clear();
        idx.extend((0..slots).filter(|&j| experts[j] == e));
        if idx.is_empty() {
            continue;
        }
        let n = idx.len();
        xs.clear();
        for &j in &idx {
            let t = j / top_k;
            xs.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        gu.resize(n * 2 * inter, 0.0);
        let gu_e = &gate_up[e * 2 * inter * h..(e + 1) * 2 * inter * h];
        matmul(&xs, n, gu_e, 2 * inter, h, &mut gu);
        act.resize(n * inter, 0.0);
        for (a, g) in act.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
            let (g, u) = g.split_at(inter);
            for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                *a = g / (1.0 + (-g).exp()) * u;
            }
        }
        y.resize(n * h, 0.0);
        matmul(
            &act,
            n,
            &down[e * h * inter..(e + 1) * h * inter],
            h,
            inter,
            &mut y,
        );
        for (&j, yr) in idx.iter().zip(y.chunks_exact(h)) {
            ys[j * h..(j + 1) * h].copy_from_slice(yr);
        }
    }
    let mut out = vec![0f32; x.len()];
    for (t, o) in out.chunks_exact_mut(h).enumerate() {
        for j in t * top_k..(t + 1) * top_k {
            let w = weights[j];
            for (o, &v) in o.iter_mut().zip(&ys[j * h..(j + 1) * h]) {
                *o += w * v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: f32) -> Vec<f32> {
        (0..len).map(|i| ((i as f32) * 0.13 + seed).sin()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// [`Dense`] agrees with candle's GEMM (different summation order:
    /// close, not equal) and gives every row the bits of that row alone,
    /// for windows of 1, 2, 3, 8, 9 and 33 rows.
    #[test]
    fn qwen4_dense_rows_match_gemm_and_are_window_independent() {
        let (out, inp) = (37, 19);
        let w = Tensor::from_vec(data(out * inp, 0.0), (out, inp), &Device::Cpu).unwrap();
        let d = Dense::new(w.clone()).unwrap();
        let total = 33;
        let xs = data(total * inp, 5.0);
        let run = |rows: &[f32]| {
            let m = rows.len() / inp;
            let x = Tensor::from_vec(rows.to_vec(), (m, inp), &Device::Cpu).unwrap();
            let got = d.forward(&x).unwrap().flatten_all().unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap().flatten_all().unwrap();
            let (got, want) = (
                got.to_vec1::<f32>().unwrap(),
                want.to_vec1::<f32>().unwrap(),
            );
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "rows {m}: {diff}");
            got
        };
        let alone: Vec<Vec<u32>> = (0..total)
            .map(|r| bits(&run(&xs[r * inp..(r + 1) * inp])))
            .collect();
        for m in [1, 2, 3, 8, 9, 33] {
            for start in [0, total - m, (total - m) / 2] {
                let y = run(&xs[start * inp..(start + m) * inp]);
                for (i, row) in y.chunks_exact(out).enumerate() {
                    assert_eq!(bits(row), alone[start + i], "window {m} at {start}");
                }
            }
        }
    }

    /// A token's routed-expert output does not depend on which other
    /// tokens share the call (and so share its experts' matmuls).
    #[test]
    fn qwen4_expert_gather_rows_are_window_independent() {
        let (e, h, inter, k, total) = (5, 24, 11, 2, 33);
        let gu = data(e * 2 * inter * h, 1.0);
        let dn = data(e * h * inter, 2.0);
        let x = data(total * h, 3.0);
        let experts: Vec<usize> = (0..total * k).map(|j| (j * 7 + j / k) % e).collect();
        let weights: Vec<f32> = (0..total * k).map(|j| 0.3 + 0.1 * (j % 5) as f32).collect();
        let call = |a: usize, b: usize| {
            expert_gather(
                &x[a * h..b * h],
                &experts[a * k..b * k],
                &weights[a * k..b * k],
                k,
                &gu,
                &dn,
                h,
                inter,
            )
        };
        let alone: Vec<Vec<u32>> = (0..total).map(|t| bits(&call(t, t + 1))).collect();
        for m in [1, 2, 3, 8, 9, 33] {
            for start in [0, total - m, (total - m) / 2] {
                let y = call(start, start + m);
                for (i, row) in y.chunks_exact(h).enumerate() {
                    assert_eq!(bits(row), alone[start + i], "window {m} at {start}");
                }
            }
        }
    }
}
