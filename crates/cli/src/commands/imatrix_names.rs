//! Importance-matrix entries renamed from the tensors the engine bound to
//! the tensors `ds4server quantize` writes for the same model, since that
//! is what `quantize --imatrix` looks up (and what llama-quantize looks up
//! in a llama.cpp file): the quantizer's own layout (`quantize_layout`)
//! says which source tensors make each output tensor.
//!
//! * A GGUF keeps its names (the default model: `blk.0.attn_q.weight`).
//! * A llama directory: llama.cpp's names (`model.layers.0.self_attn.q_proj`
//!   → `blk.0.attn_q.weight`; q/k's row permutation leaves input columns
//!   alone).
//! * A DeepSeek-V4 directory: ds4's names; the per-expert tensors of a
//!   routed projection become one `[E, out, in]` stack, whose entry holds
//!   `E` counts (an expert never routed to: zeros and count 0, which the
//!   loader reads as ones, as llama.cpp's does).
//! * qwen4_exp / glm5_next: their Hugging Face names.
//!
//! Only block tensors are kept, as llama-imatrix keeps `blk.*` (the output
//! head is left out unless asked: its `--process-output`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::imatrix_collect::Entry;
use super::quantize_layout::{self as layout, Layout, OutTensor};
use super::quantize_source::Source;

/// Whether llama-imatrix would collect a tensor of this name.
fn in_a_block(name: &str, layout: Layout) -> bool {
    match layout {
        Layout::LlamaCpp | Layout::Ds4 => name.starts_with("blk."),
        // `model.layers.N.…` (qwen4_exp, glm5_next), not the head, the
        // embedding or an MTP head the trunk never runs.
        Layout::HfNames => name.contains("layers.") && !name.starts_with("mtp"),
    }
}

/// The entry of one output tensor from the entries of its source pieces.
fn for_output(t: &OutTensor, by_source: &BTreeMap<String, Entry>) -> Result<Option<Entry>> {
    let cols = t.dims.last().copied().unwrap_or(0);
    let found: Vec<Option<&Entry>> = t.pieces.iter().map(|p| by_source.get(&p.source)).collect();
    let entry = if t.dims.len() == 3 && t.pieces.len() == t.dims[0] && t.pieces.len() > 1 {
        // One piece per expert: a stack of their entries.
        if found.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut sums = Vec::with_capacity(t.pieces.len() * cols);
        let mut counts = Vec::with_capacity(t.pieces.len());
        for f in &found {
            match f {
                Some(e) if e.counts.len() == 1 => {
                    sums.extend_from_slice(&e.sums);
                    counts.push(e.counts[0]);
                }
                Some(_) => bail!("`{}`: an expert's entry has several counts", t.name),
                None => {
                    sums.extend(std::iter::repeat_n(0.0, cols));
                    counts.push(0.0);
                }
            }
        }
        Entry { sums, counts }
    } else {
        // One tensor, or the rows of several that share the input.
        let Some(Some(e)) = found.first() else {
            return Ok(None);
        };
        (*e).clone()
    };
    if entry.sums.len() != entry.counts.len() * cols {
        bail!(
            "`{}`: {} sums for {} counts of rows of {cols}",
            t.name,
            entry.sums.len(),
            entry.counts.len()
        );
    }
    Ok(Some(entry))
}

/// `by_source` (the engine's names) renamed as `quantize` names the output
/// tensors of `model`; returns the entries and how many source entries had
/// no place (e.g. the head, left out as llama-imatrix leaves it).
pub fn output_entries(
    model: &Path,
    family: &str,
    by_source: &BTreeMap<String, Entry>,
) -> Result<BTreeMap<String, Entry>> {
    let src = Source::open(model)?;
    let files = layout::plan(&src, family)
        .with_context(|| format!("{}: the GGUF layout of its tensors", model.display()))?;
    let main = files
        .iter()
        .find(|f| f.suffix.is_none())
        .context("no main output file in the layout")?;
    let mut out = BTreeMap::new();
    for t in &main.tensors {
        if !in_a_block(&t.name, main.layout) {
            continue;
        }
        if let Some(e) = for_output(t, by_source)? {
            out.insert(t.name.clone(), e);
        }
    }
    if out.is_empty() {
        bail!(
            "{}: none of the {} weights observed in the forward is a block tensor of its \
             quantize layout (the engine's names and the file's do not correspond for this \
             family and format)",
            model.display(),
            by_source.len()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::quantize_layout::Piece;
    use crate::commands::quantize_source::Kind;

    fn t(name: &str, dims: &[usize], pieces: &[&str]) -> OutTensor {
        OutTensor {
            name: name.into(),
            dims: dims.to_vec(),
            kind: Kind::Float,
            pieces: pieces
                .iter()
                .map(|p| Piece {
                    source: p.to_string(),
                    rows: dims[dims.len() - 2],
                    permute: None,
                })
                .collect(),
        }
    }

    #[test]
    fn per_expert_pieces_become_a_stack() {
        let mut src = BTreeMap::new();
        let e = |s: &[f32], c: f32| Entry {
            sums: s.to_vec(),
            counts: vec![c],
        };
        src.insert("x.0".to_string(), e(&[1.0, 2.0], 3.0));
        src.insert("x.2".to_string(), e(&[5.0, 6.0], 1.0));
        let stack = for_output(&t("blk.0.exps", &[3, 4, 2], &["x.0", "x.1", "x.2"]), &src)
            .unwrap()
            .unwrap();
        assert_eq!(stack.sums, [1.0, 2.0, 0.0, 0.0, 5.0, 6.0]);
        assert_eq!(stack.counts, [3.0, 0.0, 1.0]);
        let dense = for_output(&t("blk.0.q", &[4, 2], &["x.2"]), &src).unwrap();
        assert_eq!(dense.unwrap().counts, [1.0]);
        assert!(
            for_output(&t("blk.0.k", &[4, 2], &["y"]), &src)
                .unwrap()
                .is_none()
        );
        // A width that disagrees with the tensor is refused.
        assert!(for_output(&t("blk.0.v", &[4, 3], &["x.0"]), &src).is_err());
    }

    #[test]
    fn only_block_tensors_are_kept() {
        assert!(in_a_block("blk.3.ffn_down.weight", Layout::LlamaCpp));
        assert!(!in_a_block("output.weight", Layout::LlamaCpp));
        assert!(in_a_block(
            "model.layers.0.mlp.gate.weight",
            Layout::HfNames
        ));
        assert!(!in_a_block("lm_head.weight", Layout::HfNames));
    }
}
