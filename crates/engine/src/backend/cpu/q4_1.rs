//! Matrix product with Q4_1 weights: `y[m, n] = x[m, k] · W[n, k]ᵀ`.
//!
//! candle has no SIMD `vec_dot` for Q4_1 (it runs the scalar reference even
//! with AVX2), and the default model is Q4_1, so this op replaces candle's
//! quantized matmul for that type on the CPU.
//!
//! Like llama.cpp, the activations are quantized per 32-value block to 8-bit
//! integers (`x ≈ d·q`) so the inner product is an integer dot product:
//! with a weight block `w = dw·u + mw` (`u` in 0..15),
//! `Σ w·x = dw·dx·Σ u·q + mw·(dx·Σ q)`. Unlike llama.cpp and candle, the
//! activation scale `dx` and the block sum `dx·Σq` stay in f32 instead of
//! being rounded to f16 — slightly more accurate, and no conversions in the
//! inner loop.
//!
//! Weight bytes are read straight from the GGUF tensor (20-byte blocks:
//! `d: f16, m: f16, qs: [u8; 16]`, low nibbles = values 0..16, high nibbles =
//! values 16..32). Work is split over output columns on candle's persistent
//! CPU pool, so this op uses the same threads as every other candle op.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;
/// Bytes per Q4_1 block.
pub const BLOCK_BYTES: usize = 20;

/// A Q4_1 weight matrix `[n, k]`.
#[derive(Debug, Clone)]
pub struct Q41Matrix {
    data: Arc<[u8]>,
    n: usize,
    k: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Q41Error {
    #[error("Q4_1 rows of {k} values are not a multiple of {BLOCK}")]
    RowLength { k: usize },
    #[error("Q4_1 data holds {got} bytes, a [{n}, {k}] matrix needs {want}")]
    DataLength {
        n: usize,
        k: usize,
        got: usize,
        want: usize,
    },
}

impl Q41Matrix {
    /// `data`: `n` rows of `k / 32` blocks each, as stored in GGUF.
    pub fn new(data: Arc<[u8]>, n: usize, k: usize) -> Result<Self, Q41Error> {
        if !k.is_multiple_of(BLOCK) {
            return Err(Q41Error::RowLength { k });
        }
        let want = n * (k / BLOCK) * BLOCK_BYTES;
        if data.len() != want {
            return Err(Q41Error::DataLength {
                n,
                k,
                got: data.len(),
                want,
            });
        }
        Ok(Self { data, n, k })
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn blocks_per_row(&self) -> usize {
        self.k / BLOCK
    }

    fn row(&self, j: usize) -> &[u8] {
        let len = self.blocks_per_row() * BLOCK_BYTES;
        &self.data[j * len..(j + 1) * len]
    }

    /// `y[m, n] = x[m, k] · Wᵀ` on plain slices (row-major).
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "x must be [m, k]");
        assert_eq!(y.len(), m * self.n, "y must be [m, n]");
        let xq = QuantizedRows::new(x, m, self.k);
        let y_ptr = SendPtr(y.as_mut_ptr());
        let pool = candle_core::utils::barrier_pool();
        // Columns are independent; each work item owns a range of columns,
        // so no two workers write the same element of `y`.
        pool.execute_chunked(self.n.div_ceil(COLUMN_GRAIN), |range| {
            let start = range.start * COLUMN_GRAIN;
            let end = (range.end * COLUMN_GRAIN).min(self.n);
            let y_ptr = &y_ptr;
            for j in start..end {
                let w = self.row(j);
                let mut r = 0;
                while r + ROW_TILE <= m {
                    let dots = dot_tile::<ROW_TILE>(w, &xq, r);
                    for (t, d) in dots.iter().enumerate() {
                        // SAFETY: (r + t, j) is in bounds and written only here.
                        unsafe { *y_ptr.0.add((r + t) * self.n + j) = *d };
                    }
                    r += ROW_TILE;
                }
                while r < m {
                    let d = dot_tile::<1>(w, &xq, r)[0];
                    // SAFETY: as above.
                    unsafe { *y_ptr.0.add(r * self.n + j) = d };
                    r += 1;
                }
            }
        });
    }
}

/// Columns per work item: enough to amortise the pool's cursor, few enough
/// to balance two cores on a 576-column matrix.
const COLUMN_GRAIN: usize = 16;
/// Activation rows that share one decoded weight block during prefill.
const ROW_TILE: usize = 4;

struct SendPtr(*mut f32);
// SAFETY: workers write disjoint elements (see `matmul`).
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// Activations quantized per block: `x ≈ scale·q`, plus `scale·Σq` per block.
struct QuantizedRows {
    q: Vec<i8>,
    scale: Vec<f32>,
    scaled_sum: Vec<f32>,
    blocks: usize,
}

impl QuantizedRows {
    fn new(x: &[f32], m: usize, k: usize) -> Self {
        let blocks = k / BLOCK;
        let mut q = vec![0i8; m * k];
        let mut scale = vec![0f32; m * blocks];
        let mut scaled_sum = vec![0f32; m * blocks];
        for (b, (xs, qs)) in x
            .chunks_exact(BLOCK)
            .zip(q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            let mut sum = 0i32;
            for (v, out) in xs.iter().zip(qs.iter_mut()) {
                *out = (v * inv).round() as i8;
                sum += *out as i32;
            }
            scale[b] = d;
            scaled_sum[b] = d * sum as f32;
        }
        Self {
            q,
            scale,
            scaled_sum,
            blocks,
        }
    }

    fn block(&self, row: usize, b: usize) -> (&[i8], f32, f32) {
        let i = row * self.blocks + b;
        (
            &self.q[i * BLOCK..(i + 1) * BLOCK],
            self.scale[i],
            self.scaled_sum[i],
        )
    }
}

fn block_scales(block: &[u8]) -> (f32, f32) {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
    (d, m)
}

/// Dot products of one weight row with activation rows `r..r+T`.
#[inline]
fn dot_tile<const T: usize>(w: &[u8], xq: &QuantizedRows, r: usize) -> [f32; T] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dot_tile::<T>(w, xq, r) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        scalar_dot_tile::<T>(w, xq, r)
    }
}

/// The reference: same arithmetic, no SIMD (other targets, and tests).
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
fn scalar_dot_tile<const T: usize>(w: &[u8], xq: &QuantizedRows, r: usize) -> [f32; T] {
    let mut out = [0f32; T];
    for (b, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
        let (dw, mw) = block_scales(block);
        let qs = &block[4..];
        for (t, o) in out.iter_mut().enumerate() {
            let (q, dx, sx) = xq.block(r + t, b);
            let mut sumi = 0i32;
            for i in 0..BLOCK / 2 {
                sumi += (qs[i] & 0x0F) as i32 * q[i] as i32;
                sumi += (qs[i] >> 4) as i32 * q[i + BLOCK / 2] as i32;
            }
            *o += dw * dx * sumi as f32 + mw * sx;
        }
    }
    out
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, BLOCK_BYTES, QuantizedRows, block_scales};

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// `u` (32 unsigned nibbles) · `q` (32 signed bytes) → 8 i32 partial sums as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_dot(u: __m256i, q: *const i8) -> __m256 {
        let qv = unsafe { _mm256_loadu_si256(q as *const __m256i) };
        // maddubs: unsigned × signed bytes → pairwise-summed i16 (no
        // overflow: 15·127·2 < 32767), then pairs of i16 → i32.
        let prod16 = _mm256_maddubs_epi16(u, qv);
        let prod32 = _mm256_madd_epi16(prod16, _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(prod32)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_tile<const T: usize>(
        w: &[u8],
        xq: &QuantizedRows,
        r: usize,
    ) -> [f32; T] {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut offset = [0f32; T];
        let low = _mm256_set1_epi8(0x0F);
        for (b, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
            let (dw, mw) = block_scales(block);
            // 16 bytes of nibbles → 32 bytes: values 0..16 in the low
            // lane (low nibbles), 16..32 in the high lane (high nibbles).
            let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(4) as *const __m128i) };
            let u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
            for t in 0..T {
                let (q, dx, sx) = xq.block(r + t, b);
                debug_assert_eq!(q.len(), BLOCK);
                let sums = unsafe { block_dot(u, q.as_ptr()) };
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), sums, acc[t]);
                offset[t] += mw * sx;
            }
        }
        let mut out = [0f32; T];
        for t in 0..T {
            out[t] = hsum(acc[t]) + offset[t];
        }
        out
    }
}

/// The candle op: `x [.., k]` (f32, contiguous) → `y [.., n]`.
impl CustomOp1 for Q41Matrix {
    fn name(&self) -> &'static str {
        "q4_1-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("q4_1-matmul expects f32 activations");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("q4_1-matmul expects contiguous activations");
        };
        let dims = layout.shape().dims();
        let Some((&k, outer)) = dims.split_last() else {
            candle_core::bail!("q4_1-matmul expects at least one dimension");
        };
        if k != self.k {
            candle_core::bail!(
                "q4_1-matmul: activations have {k} columns, weights {}",
                self.k
            );
        }
        let m: usize = outer.iter().product();
        let mut y = vec![0f32; m * self.n];
        self.matmul(&data[start..end], m, &mut y);
        let mut out_dims = outer.to_vec();
        out_dims.push(self.n);
        Ok((CpuStorage::F32(y), Shape::from(out_dims)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    use super::*;

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn quantized(n: usize, k: usize, seed: u64) -> (QTensor, Q41Matrix) {
        let w = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let bytes: Arc<[u8]> = q.data().unwrap().into_owned().into();
        let ours = Q41Matrix::new(bytes, n, k).unwrap();
        (q, ours)
    }

    #[test]
    fn simd_equals_the_scalar_reference() {
        let (n, k) = (37, 160);
        let (_, w) = quantized(n, k, 1);
        for m in [1, 3, 4, 9] {
            let x = random(m * k, 2 + m as u64);
            let xq = QuantizedRows::new(&x, m, k);
            let mut y = vec![0f32; m * n];
            w.matmul(&x, m, &mut y);
            for r in 0..m {
                for j in 0..n {
                    let want = scalar_dot_tile::<1>(w.row(j), &xq, r)[0];
                    let got = y[r * n + j];
                    // Only the order of the f32 additions differs.
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "m={m} ({r},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn equals_dequantized_weights_times_quantized_activations() {
        let (n, k, m) = (64, 256, 5);
        let (q, w) = quantized(n, k, 3);
        let dense: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let x = random(m * k, 4);
        let xq = QuantizedRows::new(&x, m, k);
        let mut got = vec![0f32; m * n];
        w.matmul(&x, m, &mut got);
        for r in 0..m {
            for j in 0..n {
                // Exact product of what the kernel sees, in f64: dequantized
                // weights times the rounded activations `scale·q`.
                let mut exact = 0f64;
                // Hard bound of the activation rounding: |x - scale·q| <= scale/2.
                let mut rounding = 0f64;
                for i in 0..k {
                    let (qb, d, _) = xq.block(r, i / BLOCK);
                    let wv = dense[j * k + i] as f64;
                    exact += wv * (d as f64 * qb[i % BLOCK] as f64);
                    rounding += wv.abs() * d as f64 / 2.0;
                }
                let g = got[r * n + j] as f64;
                // f32 accumulation over 8 blocks of 32 products.
                assert!((g - exact).abs() < 1e-4, "({r},{j}): {g} vs {exact}");
                let unrounded: f64 = (0..k)
                    .map(|i| dense[j * k + i] as f64 * x[r * k + i] as f64)
                    .sum();
                assert!((g - unrounded).abs() <= rounding + 1e-4);
            }
        }
        // candle's own scalar Q4_1 matmul differs only by rounding its
        // activation scales to f16 (we keep f32): within 0.1 % of the range.
        let xt = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
        let candle: Vec<f32> = QMatMul::from_qtensor(q)
            .unwrap()
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = candle.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (g, c) in got.iter().zip(&candle) {
            assert!((g - c).abs() < 2e-3 * scale, "{g} vs candle {c}");
        }
    }

    #[test]
    fn custom_op_keeps_leading_dims() {
        let (n, k) = (8, 64);
        let (_, w) = quantized(n, k, 5);
        let x = Tensor::from_vec(random(2 * 3 * k, 6), (2, 3, k), &Device::Cpu).unwrap();
        let y = x.apply_op1_no_bwd(&w).unwrap();
        assert_eq!(y.dims(), &[2, 3, n]);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(
            Q41Matrix::new(Arc::from(vec![0u8; 20]), 1, 30),
            Err(Q41Error::RowLength { .. })
        ));
        assert!(matches!(
            Q41Matrix::new(Arc::from(vec![0u8; 19]), 1, 32),
            Err(Q41Error::DataLength { .. })
        ));
    }
}
