//! Weights on the device: matrices (f32, Q8_0 / Q4_1 repacked by field, or
//! any other stored type as stored), expert stacks, embedding tables.
//!
//! Block-quantized values are the CPU backend's: a Q4_1 weight is `u·d + m`
//! and a Q8_0 weight `q·d` with the f16 fields converted exactly (GGUF's
//! dequantization). Every other stored type (F16, BF16, Q4_0, Q5_0, Q5_1,
//! the K-quants, IQ2_XXS, MXFP4, FP8 / FP4 with their scale grids) stays in
//! its stored bytes on the device and is dequantized in registers by the
//! kernels of `stored.rs` (the values of `quant::dequant`, in the CPU
//! reference's product order); only F32 tensors are uploaded as f32.

use candle_core::Tensor;
use cudarc::driver::CudaSlice;

use super::device::{Device, Shape, args, ptr};
use super::stored::StoredWeights;
use crate::backend::{HostWeight, KernelSet};
use crate::error::{EngineError, Result};
use crate::load::synthetic::{SynthForm, SyntheticWeight};
use crate::quant::{QuantTensor, WeightType};

/// The block formats kept quantized on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Q4_1,
    Q8_0,
}

impl BlockKind {
    fn of(ty: WeightType) -> Option<Self> {
        match ty {
            WeightType::Q4_1 => Some(BlockKind::Q4_1),
            WeightType::Q8_0 => Some(BlockKind::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one GGUF block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockKind::Q4_1 => 20,
            BlockKind::Q8_0 => 34,
        }
    }

    /// Bytes of one block's quants.
    pub fn quant_bytes(self) -> usize {
        match self {
            BlockKind::Q4_1 => 16,
            BlockKind::Q8_0 => 32,
        }
    }
}

/// A weight matrix `[out, in]` on the device.
pub enum CudaMatrix {
    F32 {
        w: CudaSlice<f32>,
        out: usize,
        inp: usize,
    },
    /// Per block the f16 scale (low half) and Q4_1 minimum (high half) as
    /// one word `[out, in/32]` (one load per block), quants `[out, in/32, 16
    /// or 32]` (16-byte aligned blocks).
    Block {
        kind: BlockKind,
        dm: CudaSlice<u32>,
        quants: CudaSlice<u8>,
        out: usize,
        inp: usize,
    },
    /// A Q8_0 / Q4_1 matrix in [`CudaMatrix::Block`]'s layout, run by the
    /// fast kernel set's int8 products (`fast8.rs`): a variant of its own,
    /// so no reference-set path (the one-launch parts, grouped and gated
    /// products) ever takes it.
    Fast {
        kind: BlockKind,
        dm: CudaSlice<u32>,
        quants: CudaSlice<u8>,
        out: usize,
        inp: usize,
    },
    /// Any other stored type, as stored (`stored.rs`).
    Stored {
        w: StoredWeights,
        out: usize,
        inp: usize,
    },
}

impl std::fmt::Debug for CudaMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaMatrix::F32 { out, inp, .. } => write!(f, "CudaMatrix::F32[{out}, {inp}]"),
            CudaMatrix::Block { kind, out, inp, .. } => {
                write!(f, "CudaMatrix::{kind:?}[{out}, {inp}]")
            }
            CudaMatrix::Fast { kind, out, inp, .. } => {
                write!(f, "CudaMatrix::Fast{kind:?}[{out}, {inp}]")
            }
            CudaMatrix::Stored { w, .. } => write!(f, "CudaMatrix::Stored({w:?})"),
        }
    }
}

impl CudaMatrix {
    pub fn dims(&self) -> (usize, usize) {
        match self {
            CudaMatrix::F32 { out, inp, .. }
            | CudaMatrix::Block { out, inp, .. }
            | CudaMatrix::Fast { out, inp, .. }
            | CudaMatrix::Stored { out, inp, .. } => (*out, *inp),
        }
    }

    /// Bytes a product reads from this matrix (for bandwidth reports).
    pub fn bytes(&self) -> usize {
        match self {
            CudaMatrix::F32 { out, inp, .. } => 4 * out * inp,
            CudaMatrix::Block { kind, out, inp, .. } | CudaMatrix::Fast { kind, out, inp, .. } => {
                out * inp / 32 * kind.block_bytes()
            }
            CudaMatrix::Stored { w, .. } => w.bytes,
        }
    }
}

/// A stack of `E` matrices `[E, out, in]`: f32, Q8_0 / Q4_1 in the device
/// layout of [`CudaMatrix::Block`], or another stored type as stored
/// (expert `e`'s rows follow expert `e − 1`'s).
pub struct CudaExperts {
    pub(super) w: ExpertWeights,
    pub(super) e: usize,
    pub(super) out: usize,
    pub(super) inp: usize,
}

pub(super) enum ExpertWeights {
    F32(CudaSlice<f32>),
    Block {
        kind: BlockKind,
        dm: CudaSlice<u32>,
        quants: CudaSlice<u8>,
    },
    Stored(StoredWeights),
}

impl std::fmt::Debug for CudaExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.w {
            ExpertWeights::F32(_) => "F32".to_string(),
            ExpertWeights::Block { kind, .. } => format!("{kind:?}"),
            ExpertWeights::Stored(w) => format!("Stored({})", w.ty),
        };
        write!(
            f,
            "CudaExperts::{kind}[{}, {}, {}]",
            self.e, self.out, self.inp
        )
    }
}

impl CudaExperts {
    /// Bytes one expert's matrix occupies (what a routed product reads).
    pub fn expert_bytes(&self) -> usize {
        match &self.w {
            ExpertWeights::F32(_) => 4 * self.out * self.inp,
            ExpertWeights::Block { kind, .. } => self.out * self.inp / 32 * kind.block_bytes(),
            ExpertWeights::Stored(w) => w.bytes / self.e.max(1),
        }
    }
}

/// An embedding table `[V, width]`: f32, or stored rows (GGUF Q8_0 / Q4_1,
/// or any type of `stored.rs`) dequantized row by row on lookup.
pub enum CudaTable {
    F32 {
        w: CudaSlice<f32>,
        rows: usize,
        width: usize,
    },
    Block {
        kind: BlockKind,
        data: CudaSlice<u8>,
        rows: usize,
        width: usize,
    },
    Stored {
        w: StoredWeights,
        rows: usize,
        width: usize,
    },
}

impl std::fmt::Debug for CudaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rows, width) = self.dims();
        write!(f, "CudaTable[{rows}, {width}]")
    }
}

impl CudaTable {
    pub fn dims(&self) -> (usize, usize) {
        match self {
            CudaTable::F32 { rows, width, .. }
            | CudaTable::Block { rows, width, .. }
            | CudaTable::Stored { rows, width, .. } => (*rows, *width),
        }
    }
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// A host f32 tensor's values, row-major.
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn dims_of(w: &HostWeight) -> Vec<usize> {
    w.dims()
}

/// The GGUF bytes of `q` as a block format the kernels read, if it is one.
fn block_data(q: &QuantTensor, out: usize, inp: usize) -> Result<Option<(BlockKind, Vec<u8>)>> {
    let Some(kind) = BlockKind::of(q.ty) else {
        return Ok(None);
    };
    if !inp.is_multiple_of(32) {
        return Err(shape_err(
            "matrix",
            format!("{kind:?} rows of {inp} values are not whole blocks"),
        ));
    }
    let data: Vec<u8> = q
        .parts
        .iter()
        .flat_map(|p| p.data.as_slice())
        .copied()
        .collect();
    let want = out * inp / 32 * kind.block_bytes();
    if data.len() != want {
        return Err(shape_err(
            "matrix",
            format!(
                "{kind:?} data of {} bytes, [{out}, {inp}] needs {want}",
                data.len()
            ),
        ));
    }
    Ok(Some((kind, data)))
}

/// Split GGUF blocks into the device layout: a word of (scale, minimum)
/// f16 bits per block, and the quants. Q8_0 quants stay in order; Q4_1's
/// become one little-endian word per block quarter ([`q4_1_quarters`]).
/// A Q4_1 block's 16 GGUF quant bytes (element e < 16 in the low nibble of
/// byte e, element e ≥ 16 in the high nibble of byte e − 16) as four words,
/// one per quarter of the block, element 8q + i in bits 4i of word q: the
/// word one lane of a block-format product loads (`matmul.cu`, `dequant8`,
/// which turns a nibble into a float with one mask-and-OR when it sits at
/// bit 0, 4 or 8 of the word or of the word shifted by 12 or 24).
/// `synthetic.cu` writes the same layout on the device.
pub(super) fn q4_1_quarters(g: &[u8; 16]) -> [u32; 4] {
    std::array::from_fn(|q| {
        let (bytes, shift) = (&g[8 * (q % 2)..8 * (q % 2) + 8], 4 * (q / 2));
        bytes.iter().enumerate().fold(0u32, |w, (i, &b)| {
            w | (u32::from((b >> shift) & 0xf) << (4 * i))
        })
    })
}

pub(super) fn repack(kind: BlockKind, data: &[u8]) -> (Vec<u32>, Vec<u8>) {
    let bb = kind.block_bytes();
    let blocks = data.len() / bb;
    let mut dm = Vec::with_capacity(blocks);
    let mut quants = Vec::with_capacity(blocks * kind.quant_bytes());
    for b in data.chunks_exact(bb) {
        let d = u16::from_le_bytes([b[0], b[1]]) as u32;
        match kind {
            BlockKind::Q4_1 => {
                let m = u16::from_le_bytes([b[2], b[3]]) as u32;
                dm.push(d | (m << 16));
                let g: [u8; 16] = b[4..20]
                    .try_into()
                    .expect("a Q4_1 block has 16 quant bytes");
                for w in q4_1_quarters(&g) {
                    quants.extend_from_slice(&w.to_le_bytes());
                }
            }
            BlockKind::Q8_0 => {
                dm.push(d);
                quants.extend_from_slice(&b[2..34]);
            }
        }
    }
    (dm, quants)
}

pub(super) fn matrix(dev: &Device, w: HostWeight, out: usize, inp: usize) -> Result<CudaMatrix> {
    let dims = dims_of(&w);
    if dims != [out, inp] {
        return Err(shape_err(
            "matrix",
            format!("{dims:?} is not [{out}, {inp}]"),
        ));
    }
    let t = match w {
        HostWeight::F32(t) => t,
        // Row blocks of different types: joined in f32 for now (only small
        // fused attention / shared-expert weights of mixed quantizations).
        w @ HostWeight::Rows(_) => w.to_f32()?,
        HostWeight::Quant(q) => match block_data(&q, out, inp)? {
            Some((kind, data)) => return block_matrix(dev, kind, &data, out, inp),
            None => match StoredWeights::upload(dev, &q)? {
                Some(w) => return Ok(CudaMatrix::Stored { w, out, inp }),
                None => HostWeight::Quant(q).to_f32()?,
            },
        },
        HostWeight::Synthetic(s) => match synthetic_blocks(dev, &s)? {
            Some((kind, dm, quants)) => return Ok(block_form(dev, kind, dm, quants, out, inp)),
            None => s.to_f32()?,
        },
    };
    Ok(CudaMatrix::F32 {
        w: dev.upload_weight(&host_f32(&t)?)?,
        out,
        inp,
    })
}

/// A matrix from GGUF block bytes (`[out, in/32]` blocks).
pub(super) fn block_matrix(
    dev: &Device,
    kind: BlockKind,
    data: &[u8],
    out: usize,
    inp: usize,
) -> Result<CudaMatrix> {
    let (dm, quants) = repack(kind, data);
    Ok(block_form(
        dev,
        kind,
        dev.upload_weight(&dm)?,
        dev.upload_weight(&quants)?,
        out,
        inp,
    ))
}

/// A block matrix for the kernel set `dev` runs: the reference set's
/// f32-activation products, or the fast set's int8 ones (same layout).
fn block_form(
    dev: &Device,
    kind: BlockKind,
    dm: CudaSlice<u32>,
    quants: CudaSlice<u8>,
    out: usize,
    inp: usize,
) -> CudaMatrix {
    match dev.kernel_set() {
        KernelSet::Reference => CudaMatrix::Block {
            kind,
            dm,
            quants,
            out,
            inp,
        },
        KernelSet::Fast => CudaMatrix::Fast {
            kind,
            dm,
            quants,
            out,
            inp,
        },
    }
}

pub(super) fn experts(
    dev: &Device,
    w: HostWeight,
    e: usize,
    out: usize,
    inp: usize,
) -> Result<CudaExperts> {
    let dims = dims_of(&w);
    if dims != [e, out, inp] {
        return Err(shape_err(
            "experts",
            format!("{dims:?} is not [{e}, {out}, {inp}]"),
        ));
    }
    let block = |kind, dm, quants| CudaExperts {
        w: ExpertWeights::Block { kind, dm, quants },
        e,
        out,
        inp,
    };
    let t = match w {
        HostWeight::F32(t) => t,
        w @ HostWeight::Rows(_) => w.to_f32()?,
        HostWeight::Quant(q) => match block_data(&q, e * out, inp)? {
            Some((kind, data)) => {
                let (dm, quants) = repack(kind, &data);
                return Ok(block(
                    kind,
                    dev.upload_weight(&dm)?,
                    dev.upload_weight(&quants)?,
                ));
            }
            None => match StoredWeights::upload(dev, &q)? {
                Some(w) => {
                    return Ok(CudaExperts {
                        w: ExpertWeights::Stored(w),
                        e,
                        out,
                        inp,
                    });
                }
                None => HostWeight::Quant(q).to_f32()?,
            },
        },
        HostWeight::Synthetic(s) => match synthetic_blocks(dev, &s)? {
            Some((kind, dm, quants)) => return Ok(block(kind, dm, quants)),
            None => s.to_f32()?,
        },
    };
    Ok(CudaExperts {
        w: ExpertWeights::F32(dev.upload_weight(&host_f32(&t)?)?),
        e,
        out,
        inp,
    })
}

/// A synthetic Q4_1 weight generated on the device in the block layout
/// (`kernels/synthetic.cu`: the hash of [`crate::load::synthetic`], so the
/// bytes are the host's); `None` for an f32 one.
#[allow(clippy::type_complexity)]
fn synthetic_blocks(
    dev: &Device,
    s: &SyntheticWeight,
) -> Result<Option<(BlockKind, CudaSlice<u32>, CudaSlice<u8>)>> {
    let SynthForm::Q4_1 { d, m } = s.form else {
        return Ok(None);
    };
    let blocks = s.elements() / 32;
    let dm = dev.alloc_weight::<u32>(blocks)?;
    let quants = dev.alloc_weight::<u8>(blocks * 16)?;
    if blocks > 0 {
        dev.launch(
            "synth_q4_1",
            Shape::elements(blocks),
            args![
                ptr(&dm),
                ptr(&quants),
                blocks,
                s.seed,
                d as u32 | (m as u32) << 16
            ],
        )?;
    }
    Ok(Some((BlockKind::Q4_1, dm, quants)))
}

pub(super) fn table(dev: &Device, w: HostWeight, rows: usize, width: usize) -> Result<CudaTable> {
    let dims = dims_of(&w);
    if dims != [rows, width] {
        return Err(shape_err(
            "table",
            format!("{dims:?} is not [{rows}, {width}]"),
        ));
    }
    let w = w.on_host()?;
    let t = match w {
        HostWeight::F32(t) => t,
        w @ HostWeight::Rows(_) => w.to_f32()?,
        HostWeight::Synthetic(s) => s.to_f32()?,
        HostWeight::Quant(q) => match block_data(&q, rows, width)? {
            Some((kind, data)) => {
                return Ok(CudaTable::Block {
                    kind,
                    data: dev.upload_weight(&data)?,
                    rows,
                    width,
                });
            }
            None => match StoredWeights::upload(dev, &q)? {
                Some(w) => return Ok(CudaTable::Stored { w, rows, width }),
                None => HostWeight::Quant(q).to_f32()?,
            },
        },
    };
    Ok(CudaTable::F32 {
        w: dev.upload_weight(&host_f32(&t)?)?,
        rows,
        width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nibble `dequant8` reads for element 8q + i of a block from the
    /// quarter words, as `matmul.cu` reads it: at bit 0, 4 or 8 of the word
    /// or of the word shifted by 12 or 24.
    fn kernel_nibble(words: &[u32; 4], e: usize) -> u32 {
        let (q, i) = (e / 8, e % 8);
        let v = words[q] >> (12 * (i / 3));
        (v >> (4 * (i % 3))) & 0xf
    }

    #[test]
    fn q4_1_quarter_words_hold_every_gguf_nibble() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..64 {
            let g: [u8; 16] = std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            });
            let words = q4_1_quarters(&g);
            for e in 0..32 {
                let gguf = if e < 16 { g[e] & 0xf } else { g[e - 16] >> 4 };
                assert_eq!(
                    kernel_nibble(&words, e),
                    u32::from(gguf),
                    "element {e} of {g:?}"
                );
            }
        }
        // Through `repack`: the scale word, then the four words little-endian.
        let mut block = vec![0x34, 0x12, 0x78, 0x56];
        block.extend((0u8..16).map(|b| b.wrapping_mul(37)));
        let (dm, quants) = repack(BlockKind::Q4_1, &block);
        assert_eq!(dm, [0x5678_1234]);
        let g: [u8; 16] = block[4..].try_into().unwrap();
        let le: Vec<u8> = q4_1_quarters(&g)
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(quants, le);
    }
}
