//! CPU kernels for the decode-sized work of this family.
//!
//! candle's generic path for a 1–8 row matmul packs operands, dispatches to
//! its thread pool and synchronises on a barrier; for decode steps and
//! verify windows that overhead dominates (perf on a 2-core box: ~20% of
//! decode time spinning in candle's barrier). [`Dense`] therefore runs
//! small row counts as single-threaded dot products straight over the
//! weight's storage, and large ones (prefill) through candle's gemm.
//! [`expert_gather`] evaluates the routed experts of a few tokens in one
//! pass over the selected experts' weight slices, instead of ~9 candle ops
//! (gather, matmuls, activation, scatter-add) per expert.
//!
//! The recurrent GDN scan (`gated_deltanet::scan`) and the QSA block
//! selection (`qsa::select_blocks`) are host kernels over flat slices too.
//! All of these are plain functions of slices: an accelerator backend
//! replaces them behind the same call sites (a candle `CustomOp` per kernel
//! with `cuda_fwd`/`metal_fwd`, keeping these as `cpu_fwd`).

use candle_core::{Device, Storage, Tensor};

use crate::error::{EngineError, Result};

/// Up to this many rows, matmuls run as host dot products.
pub const SMALL_ROWS: usize = 8;

/// `Σ a_i·b_i` with 8 independent accumulators (lets LLVM vectorise).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

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

    /// `x: [rows, in]` → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        if rows > SMALL_ROWS {
            return Ok(x.contiguous()?.matmul(&self.w.t()?)?);
        }
        let x = x.contiguous()?;
        let y = with_slice(&x, |xs| {
            with_slice(&self.w, |w| {
                let mut y = Vec::with_capacity(rows * self.out);
                for r in xs.chunks_exact(self.inp) {
                    y.extend(w.chunks_exact(self.inp).map(|wr| dot(wr, r)));
                }
                y
            })
        })??;
        Ok(Tensor::from_vec(y, (rows, self.out), &Device::Cpu)?)
    }
}

/// Routed experts of a few tokens: `out[t] = Σ_k w[t,k]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t)`.
///
/// `x: [T, H]`, `experts`/`weights`: `[T, k]`; `gate_up: [E, 2I, H]` (rows
/// `[gate | up]`), `down: [E, H, I]`; returns `[T, H]`.
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
    let mut out = vec![0f32; x.len()];
    let mut act = vec![0f32; inter];
    for (t, xt) in x.chunks_exact(h).enumerate() {
        let o = &mut out[t * h..(t + 1) * h];
        for k in 0..top_k {
            let e = experts[t * top_k + k];
            let w = weights[t * top_k + k];
            let gu = &gate_up[e * 2 * inter * h..(e + 1) * 2 * inter * h];
            for (i, a) in act.iter_mut().enumerate() {
                let g = dot(&gu[i * h..(i + 1) * h], xt);
                let u = dot(&gu[(inter + i) * h..(inter + i + 1) * h], xt);
                *a = g / (1.0 + (-g).exp()) * u;
            }
            let dn = &down[e * h * inter..(e + 1) * h * inter];
            for (j, oj) in o.iter_mut().enumerate() {
                *oj += w * dot(&dn[j * inter..(j + 1) * inter], &act);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen4_dense_small_rows_match_gemm() {
        let w = Tensor::from_vec(
            (0..37 * 19)
                .map(|i| ((i as f32) * 0.13).sin())
                .collect::<Vec<_>>(),
            (37, 19),
            &Device::Cpu,
        )
        .unwrap();
        let d = Dense::new(w.clone()).unwrap();
        for rows in [1, 3, 8, 9] {
            let x = Tensor::from_vec(
                (0..rows * 19)
                    .map(|i| ((i as f32) * 0.71).cos())
                    .collect::<Vec<_>>(),
                (rows, 19),
                &Device::Cpu,
            )
            .unwrap();
            let got = d
                .forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want = x
                .matmul(&w.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "rows {rows}: {diff}");
        }
    }
}
