//! Stored weights from safetensors checkpoints, kept in their file's type:
//! BF16 / F16 as 16-bit views of the map; FP8 E4M3 with block scales
//! (`<name>_scale_inv` f32, DeepSeek-V3 and GLM FP8 releases, or
//! `<prefix>.scale` E8M0, DeepSeek-V4); DeepSeek-V4's routed experts as
//! E2M1 pairs in `I8` (or `F4`) bytes with an E8M0 `.scale` per 32 inputs.
//! Scale grids are converted to f32 once (exactly: E8M0 is a power of two);
//! the values are never copied.

use std::sync::Arc;

use safetensors::Dtype;

use super::safetensors::{SafetensorsDir, StEntry};
use crate::backend::HostWeight;
use crate::error::{EngineError, Result};
use crate::quant::{QuantTensor, ScaleGrid, WeightBytes, WeightType, dequant};

/// FP8 checkpoints scale 128×128 blocks (`weight_block_size`).
const FP8_BLOCK: usize = 128;
/// MXFP4: one scale per 32 inputs of a row.
const FP4_BLOCK: usize = 32;

/// Where a weight's scales are, if it has a companion.
fn scale_name(dir: &SafetensorsDir, name: &str) -> Option<String> {
    let inv = format!("{name}_scale_inv");
    if dir.has(&inv) {
        return Some(inv);
    }
    let prefix = name.strip_suffix(".weight")?;
    let scale = format!("{prefix}.scale");
    dir.has(&scale).then_some(scale)
}

fn tensor_err(dir: &SafetensorsDir, name: &str, message: String) -> EngineError {
    EngineError::Tensor {
        path: dir.file_of(name),
        tensor: name.to_string(),
        message,
    }
}

/// Read `name` with logical row-major `shape`: f32 as an f32 tensor (what
/// the f32 path always did), everything else as a [`QuantTensor`] view.
pub fn read(dir: &mut SafetensorsDir, name: &str, shape: &[usize]) -> Result<HostWeight> {
    let Some((entry, _, _)) = dir.raw_entry(name) else {
        // The f32 reader names the missing tensor and its expected shape.
        return dir
            .tensor(name, shape, &candle_core::Device::Cpu)
            .map(HostWeight::F32);
    };
    let dtype = entry.dtype;
    match dtype {
        Dtype::F32 => dir
            .tensor(name, shape, &candle_core::Device::Cpu)
            .map(HostWeight::F32),
        Dtype::BF16 | Dtype::F16 => {
            let ty = if dtype == Dtype::BF16 {
                WeightType::BF16
            } else {
                WeightType::F16
            };
            check_shape(dir, name, shape, shape)?;
            let t = view(dir, name, ty, shape, None)?;
            dir.take(name);
            Ok(HostWeight::Quant(Arc::new(t)))
        }
        Dtype::F8_E4M3 => {
            check_shape(dir, name, shape, shape)?;
            let scales = grid(dir, name, shape, (FP8_BLOCK, FP8_BLOCK))?;
            let t = view(dir, name, WeightType::FP8_E4M3, shape, Some(scales))?;
            dir.take(name);
            Ok(HostWeight::Quant(Arc::new(t)))
        }
        Dtype::I8 | Dtype::F4 => {
            let cols = shape.last().copied().unwrap_or(0);
            let mut stored = shape.to_vec();
            if dtype == Dtype::I8 {
                // Two values per byte: the file's last dim is half the
                // logical one.
                if let Some(last) = stored.last_mut() {
                    *last = cols / 2;
                }
            }
            if !cols.is_multiple_of(FP4_BLOCK) {
                return Err(tensor_err(
                    dir,
                    name,
                    format!("FP4 rows of {cols} values are not whole blocks of {FP4_BLOCK}"),
                ));
            }
            check_shape(dir, name, shape, &stored)?;
            let scales = grid(dir, name, shape, (1, FP4_BLOCK))?;
            let t = view(dir, name, WeightType::FP4_E2M1, shape, Some(scales))?;
            dir.take(name);
            Ok(HostWeight::Quant(Arc::new(t)))
        }
        other => Err(tensor_err(
            dir,
            name,
            format!(
                "stored as {other:?}; weights are read as F32, BF16, F16, F8_E4M3 (with block scales) or FP4 (I8 / F4 with E8M0 scales)"
            ),
        )),
    }
}

fn check_shape(
    dir: &SafetensorsDir,
    name: &str,
    logical: &[usize],
    stored: &[usize],
) -> Result<()> {
    let (entry, _, _) = dir.raw_entry(name).expect("caller found it");
    if entry.shape != stored {
        let what = if logical == stored {
            format!("expected {logical:?}")
        } else {
            format!("expected {stored:?} (packed FP4 for {logical:?})")
        };
        return Err(tensor_err(
            dir,
            name,
            format!("wrong shape: {what}, found {:?}", entry.shape),
        ));
    }
    Ok(())
}

/// A view of `name`'s bytes as `ty` with logical `shape`.
fn view(
    dir: &SafetensorsDir,
    name: &str,
    ty: WeightType,
    shape: &[usize],
    scales: Option<ScaleGrid>,
) -> Result<QuantTensor> {
    let (entry, _, map): (&StEntry, _, _) = dir.raw_entry(name).expect("caller found it");
    let bytes = WeightBytes::range(
        map.clone() as Arc<dyn crate::quant::bytes::WeightOwner>,
        SafetensorsDir::range_of(entry),
    )
    .expect("the reader checked the range");
    QuantTensor::new(ty, shape.to_vec(), bytes, scales)
        .map_err(|e| tensor_err(dir, name, e.to_string()))
}

/// The scale companion of `name`, as f32 blocks of `block` over the logical
/// `shape` (leading dims of a 3-D stack count as rows).
fn grid(
    dir: &mut SafetensorsDir,
    name: &str,
    shape: &[usize],
    block: (usize, usize),
) -> Result<ScaleGrid> {
    let Some(sname) = scale_name(dir, name) else {
        return Err(tensor_err(
            dir,
            name,
            format!(
                "a scaled type needs its scales: neither `{name}_scale_inv` nor `{}.scale` is in the checkpoint",
                name.strip_suffix(".weight").unwrap_or(name)
            ),
        ));
    };
    let cols = shape.last().copied().unwrap_or(1);
    let rows: usize = shape.iter().rev().skip(1).product();
    let want = [rows.div_ceil(block.0), cols.div_ceil(block.1)];
    let (entry, _, map) = dir.raw_entry(&sname).expect("found above");
    let bytes = &map[SafetensorsDir::range_of(entry)];
    let values: Vec<f32> = match entry.dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F8_E8M0 => bytes.iter().map(|&e| dequant::e8m0_to_f32(e)).collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        other => {
            return Err(tensor_err(
                dir,
                &sname,
                format!("scales stored as {other:?}; expected F32 or F8_E8M0"),
            ));
        }
    };
    if let Some(bad) = values.iter().position(|v| !(v.is_finite() && *v > 0.0)) {
        return Err(tensor_err(
            dir,
            &sname,
            format!(
                "scale {bad} is {} (scales are positive and finite; E8M0 255 is NaN)",
                values[bad]
            ),
        ));
    }
    let found: usize = entry.shape.iter().product();
    if found != want[0] * want[1] || entry.shape.last() != Some(&want[1]) {
        return Err(tensor_err(
            dir,
            &sname,
            format!(
                "scale shape {:?} does not match the weight `{name}` {shape:?} in blocks of {}×{} (expected {want:?})",
                entry.shape, block.0, block.1
            ),
        ));
    }
    dir.take(&sname);
    Ok(ScaleGrid {
        values: values.into(),
        block_rows: block.0,
        block_cols: block.1,
    })
}

/// `name` as a view of its bytes in any float element type (F32, BF16,
/// F16), for host tables gathered row by row; marked used.
pub fn view_any(dir: &mut SafetensorsDir, name: &str, shape: &[usize]) -> Result<QuantTensor> {
    let Some((entry, _, _)) = dir.raw_entry(name) else {
        return Err(tensor_err(
            dir,
            name,
            format!("missing from every safetensors file (expected shape {shape:?})"),
        ));
    };
    let ty = match entry.dtype {
        Dtype::F32 => WeightType::F32,
        Dtype::BF16 => WeightType::BF16,
        Dtype::F16 => WeightType::F16,
        other => {
            return Err(tensor_err(
                dir,
                name,
                format!("stored as {other:?}; a host table is F32, BF16 or F16"),
            ));
        }
    };
    check_shape(dir, name, shape, shape)?;
    let t = view(dir, name, ty, shape, None)?;
    dir.take(name);
    Ok(t)
}
