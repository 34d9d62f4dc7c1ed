//! Matrix product with block-quantized GGUF weights and f32 activations:
//! `y[m, n] = x[m, k] · W[n, k]ᵀ`, for W in Q4_1 or Q8_0 blocks.
//!
//! candle's quantized matmul rounds the activations to 8 bits per 32-value
//! block (as llama.cpp does) and has no SIMD path at all for Q4_1, the
//! default model's type. Rounding activations is what made greedy decoding
//! drift from the transformers reference on near ties (SmolLM2 has a few
//! very large activation channels, so a block holding one gets a coarse
//! scale). This kernel keeps the activations in f32: it decodes each weight
//! block exactly as dequantization does (`d·u + m` for Q4_1, `d·q` for
//! Q8_0) and multiplies in f32, so the result equals dequantized weights
//! times the activations up to the order of f32 additions. Decoding stays
//! memory-bound (the weights are read once per token either way); prefill
//! decodes four weight rows into an L1-resident buffer and reuses them for
//! every activation row.
//!
//! Weight bytes are taken straight from the GGUF tensor. Work is split over
//! groups of output columns on candle's persistent CPU pool, so this op uses
//! the same threads as every other candle op.

use std::cell::RefCell;
use std::sync::Arc;

use super::SendPtr;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use half::f16;

/// Values per block (both formats).
pub const BLOCK: usize = 32;

/// The block formats this kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// 20 bytes: `d: f16, m: f16, qs: [u8; 16]`; value `i` is `d·u_i + m`
    /// with `u_i` the low nibble of `qs[i]` for `i < 16`, else the high
    /// nibble of `qs[i - 16]`.
    Q4_1,
    /// 34 bytes: `d: f16, qs: [i8; 32]`; value `i` is `d·qs[i]`.
    Q8_0,
}

impl BlockFormat {
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
        }
    }
}

/// A block-quantized weight matrix `[n, k]`.
#[derive(Debug, Clone)]
pub struct BlockMatrix {
    data: Arc<[u8]>,
    format: BlockFormat,
    n: usize,
    k: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockMatrixError {
    #[error("{format:?} rows of {k} values are not a multiple of {BLOCK}")]
    RowLength { format: BlockFormat, k: usize },
    #[error("{format:?} data holds {got} bytes, a [{n}, {k}] matrix needs {want}")]
    DataLength {
        format: BlockFormat,
        n: usize,
        k: usize,
        got: usize,
        want: usize,
    },
}

impl BlockMatrix {
    /// `data`: `n` rows of `k / 32` blocks each, as stored in GGUF.
    pub fn new(
        data: Arc<[u8]>,
        format: BlockFormat,
        n: usize,
        k: usize,
    ) -> Result<Self, BlockMatrixError> {
        if !k.is_multiple_of(BLOCK) {
            return Err(BlockMatrixError::RowLength { format, k });
        }
        let want = n * (k / BLOCK) * format.block_bytes();
        if data.len() != want {
            return Err(BlockMatrixError::DataLength {
                format,
                n,
                k,
                got: data.len(),
                want,
            });
        }
        Ok(Self { data, format, n, k })
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn row_bytes(&self, j: usize) -> &[u8] {
        let len = (self.k / BLOCK) * self.format.block_bytes();
        &self.data[j * len..(j + 1) * len]
    }

    /// Weight row `j` as f32, exactly as dequantization computes it.
    fn decode_row(&self, j: usize, out: &mut [f32]) {
        let bytes = self.row_bytes(j);
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        {
            // SAFETY: the cfg guarantees AVX2 and F16C at compile time.
            unsafe { avx2::decode_row(self.format, bytes, out) }
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            let step = self.format.block_bytes();
            for (block, values) in bytes.chunks_exact(step).zip(out.chunks_exact_mut(BLOCK)) {
                decode_block(self.format, block, values);
            }
        }
    }

    /// `y[m, n] = x[m, k] · Wᵀ` on plain row-major slices.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "x must be [m, k]");
        assert_eq!(y.len(), m * self.n, "y must be [m, n]");
        let k = self.k;
        let n = self.n;
        let y_ptr = SendPtr(y.as_mut_ptr());
        let groups = n.div_ceil(COLUMNS);
        let pool = candle_core::utils::barrier_pool();
        // Each work item owns a range of column groups, so no two workers
        // write the same element of `y`.
        pool.execute_chunked(groups, |range| {
            let y_ptr = &y_ptr;
            SCRATCH.with(|scratch| {
                let mut w = scratch.borrow_mut();
                if w.len() < COLUMNS * k {
                    w.resize(COLUMNS * k, 0.0);
                }
                for group in range {
                    let j0 = group * COLUMNS;
                    let cols = COLUMNS.min(n - j0);
                    for c in 0..cols {
                        self.decode_row(j0 + c, &mut w[c * k..(c + 1) * k]);
                    }
                    for r in 0..m {
                        let xr = &x[r * k..(r + 1) * k];
                        let dots = if cols == COLUMNS {
                            dot4(&w[..COLUMNS * k], xr)
                        } else {
                            let mut d = [0f32; COLUMNS];
                            for (c, out) in d.iter_mut().enumerate().take(cols) {
                                *out = dot1(&w[c * k..(c + 1) * k], xr);
                            }
                            d
                        };
                        for (c, d) in dots.iter().enumerate().take(cols) {
                            // SAFETY: (r, j0 + c) is in bounds and written only here.
                            unsafe { *y_ptr.0.add(r * n + j0 + c) = *d };
                        }
                    }
                }
            });
        });
    }
}

/// Output columns decoded together; each activation row is then read once
/// for all of them.
const COLUMNS: usize = 4;

thread_local! {
    /// Decoded weight rows (`COLUMNS × k` f32), reused across calls.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// One block to 32 f32 values. The arithmetic is the dequantization's
/// (`d * u + m`, `d * q`), so decoded values are bit-identical to it.
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "f16c"
    ),
    allow(dead_code)
)]
fn decode_block(format: BlockFormat, block: &[u8], out: &mut [f32]) {
    match format {
        BlockFormat::Q4_1 => {
            let d = f16_at(block, 0);
            let m = f16_at(block, 2);
            let qs = &block[4..20];
            for i in 0..BLOCK / 2 {
                out[i] = d * (qs[i] & 0x0F) as f32 + m;
                out[i + BLOCK / 2] = d * (qs[i] >> 4) as f32 + m;
            }
        }
        BlockFormat::Q8_0 => {
            let d = f16_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = d * (q as i8) as f32;
            }
        }
    }
}

#[inline]
fn dot1(w: &[f32], x: &[f32]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dot1(w, x) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        w.iter().zip(x).map(|(a, b)| a * b).sum()
    }
}

/// Four dot products: `w` holds four rows of `x.len()` values.
#[inline]
fn dot4(w: &[f32], x: &[f32]) -> [f32; COLUMNS] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dot4(w, x) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        let k = x.len();
        std::array::from_fn(|c| dot1(&w[c * k..(c + 1) * k], x))
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, BlockFormat, COLUMNS};

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn f16_to_f32(lo: u8, hi: u8) -> f32 {
        let bits = u16::from_le_bytes([lo, hi]) as i32;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }

    /// Vectorised `decode_block` over a whole row. Multiply and add stay
    /// separate (no FMA) so every value rounds exactly as the scalar
    /// dequantization `d * u + m` does.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn decode_row(format: BlockFormat, bytes: &[u8], out: &mut [f32]) {
        let step = format.block_bytes();
        for (block, values) in bytes.chunks_exact(step).zip(out.chunks_exact_mut(BLOCK)) {
            let o = values.as_mut_ptr();
            let d = _mm256_set1_ps(f16_to_f32(block[0], block[1]));
            match format {
                BlockFormat::Q4_1 => {
                    let m = _mm256_set1_ps(f16_to_f32(block[2], block[3]));
                    // SAFETY: a Q4_1 block is 20 bytes: 16 nibble bytes at 4.
                    let packed =
                        unsafe { _mm_loadu_si128(block.as_ptr().add(4) as *const __m128i) };
                    let mask = _mm_set1_epi8(0x0F);
                    let lo = _mm_and_si128(packed, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
                    let parts = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
                    for (i, part) in parts.into_iter().enumerate() {
                        let u = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
                        let v = _mm256_add_ps(_mm256_mul_ps(d, u), m);
                        // SAFETY: 4 × 8 values fill the 32-value block.
                        unsafe { _mm256_storeu_ps(o.add(i * 8), v) };
                    }
                }
                BlockFormat::Q8_0 => {
                    for i in 0..4 {
                        // SAFETY: a Q8_0 block is 34 bytes: 32 values at 2.
                        let q = unsafe {
                            _mm_loadl_epi64(block.as_ptr().add(2 + i * 8) as *const __m128i)
                        };
                        let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
                        // SAFETY: as above.
                        unsafe { _mm256_storeu_ps(o.add(i * 8), v) };
                    }
                }
            }
        }
    }

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

    /// `k` is a multiple of 32 (checked by `BlockMatrix::new`), so the
    /// 8-wide loops have no tail.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot1(w: &[f32], x: &[f32]) -> f32 {
        let k = x.len();
        assert!(w.len() >= k && k.is_multiple_of(8));
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < k {
            // SAFETY: i + 8 <= k <= len of both slices.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_ps(w.as_ptr().add(i)),
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                )
            };
            acc = _mm256_fmadd_ps(a, b, acc);
            i += 8;
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot4(w: &[f32], x: &[f32]) -> [f32; COLUMNS] {
        let k = x.len();
        assert!(w.len() >= COLUMNS * k && k.is_multiple_of(8));
        let mut acc = [_mm256_setzero_ps(); COLUMNS];
        let mut i = 0;
        while i < k {
            // SAFETY: i + 8 <= k, and row c spans w[c*k..(c+1)*k].
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                for (c, a) in acc.iter_mut().enumerate() {
                    let wv = _mm256_loadu_ps(w.as_ptr().add(c * k + i));
                    *a = _mm256_fmadd_ps(wv, xv, *a);
                }
            }
            i += 8;
        }
        [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
    }
}

/// The candle op: `x [.., k]` (f32, contiguous) → `y [.., n]`.
impl CustomOp1 for BlockMatrix {
    fn name(&self) -> &'static str {
        "block-quantized-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("block-quantized-matmul expects f32 activations");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("block-quantized-matmul expects contiguous activations");
        };
        let dims = layout.shape().dims();
        let Some((&k, outer)) = dims.split_last() else {
            candle_core::bail!("block-quantized-matmul expects at least one dimension");
        };
        if k != self.k {
            candle_core::bail!(
                "block-quantized-matmul: activations have {k} columns, weights {}",
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
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

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

    fn quantized(format: BlockFormat, n: usize, k: usize, seed: u64) -> (QTensor, BlockMatrix) {
        let w = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let dtype = match format {
            BlockFormat::Q4_1 => GgmlDType::Q4_1,
            BlockFormat::Q8_0 => GgmlDType::Q8_0,
        };
        let q = QTensor::quantize(&w, dtype).unwrap();
        let bytes: Arc<[u8]> = q.data().unwrap().into_owned().into();
        let ours = BlockMatrix::new(bytes, format, n, k).unwrap();
        (q, ours)
    }

    #[test]
    fn decoded_rows_are_bit_identical_to_dequantization() {
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let (n, k) = (7, 96);
            let (q, w) = quantized(format, n, k, 11);
            let dense: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let mut row = vec![0f32; k];
            for j in 0..n {
                w.decode_row(j, &mut row);
                assert_eq!(row, dense[j * k..(j + 1) * k], "{format:?} row {j}");
            }
        }
    }

    #[test]
    fn equals_dequantized_matmul_in_f64() {
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            // n = 37 leaves a partial column group; m covers decode and prefill.
            let (n, k) = (37, 256);
            let (q, w) = quantized(format, n, k, 3);
            let dense: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for m in [1, 2, 5] {
                let x = random(m * k, 4 + m as u64);
                let mut got = vec![0f32; m * n];
                w.matmul(&x, m, &mut got);
                for r in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k)
                            .map(|i| dense[j * k + i] as f64 * x[r * k + i] as f64)
                            .sum();
                        // Only f32 rounding of 256 products and their sum:
                        // |error| <= k·eps·Σ|w·x| ≈ 256 · 6e-8 · 64 ≈ 1e-3
                        // in the worst case, ~1e-5 in practice.
                        let g = got[r * n + j] as f64;
                        assert!(
                            (g - exact).abs() < 1e-4,
                            "{format:?} m={m} ({r},{j}): {g} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn custom_op_keeps_leading_dims() {
        let (n, k) = (8, 64);
        let (_, w) = quantized(BlockFormat::Q4_1, n, k, 5);
        let x = Tensor::from_vec(random(2 * 3 * k, 6), (2, 3, k), &Device::Cpu).unwrap();
        let y = x.apply_op1_no_bwd(&w).unwrap();
        assert_eq!(y.dims(), &[2, 3, n]);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(
            BlockMatrix::new(Arc::from(vec![0u8; 20]), BlockFormat::Q4_1, 1, 30),
            Err(BlockMatrixError::RowLength { .. })
        ));
        assert!(matches!(
            BlockMatrix::new(Arc::from(vec![0u8; 33]), BlockFormat::Q8_0, 1, 32),
            Err(BlockMatrixError::DataLength { .. })
        ));
    }
}
