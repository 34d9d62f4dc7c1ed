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
//! * A DeepSeek-V4 GGUF in ds4's layout: the engine binds it under the
//!   upstream names (`layers.0.ffn.experts.3.w1.weight`), mapped back with
//!   the family's own tables (`LAYER_MAP`, `EXPERT_MAP`) to ds4's names and
//!   stacks (`blk.0.ffn_gate_exps.weight`, expert 3).
//! * qwen4_exp / glm5_next: their Hugging Face names.
//!
//! Only block tensors are kept, as llama-imatrix keeps `blk.*` (the output
//! head is left out unless asked: its `--process-output`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use ds4_engine::families::deepseek_v4::gguf::{EXPERT_MAP, LAYER_MAP};
use ds4_engine::load::ModelFormat;

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

/// An upstream DeepSeek-V4 block name as ds4's: the tensor, and the
/// expert of a routed projection's stack.
fn ds4_name(upstream: &str) -> Option<(String, Option<usize>)> {
    let (l, rest) = upstream.strip_prefix("layers.")?.split_once('.')?;
    let find = |map: &[(&str, &str)], n: &str| {
        map.iter()
            .find(|(u, _)| *u == n)
            .map(|(_, g)| g.to_string())
    };
    if let Some(x) = rest.strip_prefix("ffn.experts.") {
        let (e, proj) = x.split_once('.')?;
        return Some((
            format!("blk.{l}.{}", find(EXPERT_MAP, proj)?),
            Some(e.parse().ok()?),
        ));
    }
    Some((format!("blk.{l}.{}", find(LAYER_MAP, rest)?), None))
}

/// Entries by upstream names → by ds4's names, experts stacked (`dims`:
/// a stack's `[E, out, in]` in the file).
fn ds4_entries(
    by_source: &BTreeMap<String, Entry>,
    dims: impl Fn(&str) -> Option<Vec<usize>>,
) -> Result<BTreeMap<String, Entry>> {
    let mut out: BTreeMap<String, Entry> = BTreeMap::new();
    for (name, e) in by_source {
        let Some((ds4, expert)) = ds4_name(name) else {
            continue;
        };
        let Some(x) = expert else {
            out.insert(ds4, e.clone());
            continue;
        };
        let (n_exp, cols) = match dims(&ds4).as_deref() {
            Some(&[n, _, c]) => (n, c),
            _ => bail!("`{ds4}` is not an expert stack in the file"),
        };
        if x >= n_exp || e.counts.len() != 1 || e.sums.len() != cols {
            bail!("`{name}`: expert {x} of {n_exp} with rows of {cols} does not fit `{ds4}`");
        }
        let stack = out.entry(ds4).or_insert_with(|| Entry {
            sums: vec![0.0; n_exp * cols],
            counts: vec![0.0; n_exp],
        });
        stack.sums[x * cols..(x + 1) * cols].copy_from_slice(&e.sums);
        stack.counts[x] = e.counts[0];
    }
    Ok(out)
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
    let ds4;
    let by_source = if src.format == ModelFormat::Gguf && main.layout == Layout::Ds4 {
        ds4 = ds4_entries(by_source, |n| src.tensors.get(n).map(|t| t.dims.clone()))?;
        &ds4
    } else {
        by_source
    };
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
             family and format; one is `{}`)",
            model.display(),
            by_source.len(),
            by_source.keys().next().map_or("", String::as_str)
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
    fn ds4_gguf_names_come_back_from_upstream_names() {
        assert_eq!(
            ds4_name("layers.2.ffn.experts.5.w2.weight"),
            Some(("blk.2.ffn_down_exps.weight".into(), Some(5)))
        );
        assert_eq!(
            ds4_name("layers.0.attn.wq_a.weight"),
            Some(("blk.0.attn_q_a.weight".into(), None))
        );
        assert_eq!(ds4_name("head.weight"), None);
        let mut src = BTreeMap::new();
        let e = |s: f32, c: f32| Entry {
            sums: vec![s, s],
            counts: vec![c],
        };
        src.insert("layers.1.ffn.experts.2.w1.weight".to_string(), e(3.0, 4.0));
        src.insert("layers.1.ffn.experts.0.w1.weight".to_string(), e(1.0, 2.0));
        let m = ds4_entries(&src, |_| Some(vec![3, 8, 2])).unwrap();
        let s = &m["blk.1.ffn_gate_exps.weight"];
        assert_eq!(s.sums, [1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
        assert_eq!(s.counts, [2.0, 0.0, 4.0]);
        assert!(ds4_entries(&src, |_| Some(vec![2, 8, 2])).is_err());
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
