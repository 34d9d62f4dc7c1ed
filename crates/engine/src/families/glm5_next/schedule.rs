//! GLM-5's per-layer schedules from `config.json`, as
//! `Glm5NextTextConfig.__post_init__` derives them: `layer_types` (legacy
//! names remapped, default KDA for `i % 4 ≠ 3`), `mlp_layer_types` (default
//! three dense layers, then sparse) and `indexer_types` (else
//! `index_topk_pattern`, else the `index_topk_freq` /
//! `index_skip_topk_offset` schedule), with the shared-indexer adjacency
//! rule transformers only enforces at run time.

use serde_json::Value as Json;

use super::config::{IndexerKind, LayerKind, MlpKind};
use super::fields::FieldsExt;
use crate::error::Result;
use crate::load::config_fields::Fields;

/// `layer_types` with the legacy names, or the default (KDA for `i%4 ≠ 3`).
pub(super) fn layer_kinds(f: &Fields<'_>, n: usize) -> Result<Vec<LayerKind>> {
    let Some(names) = f.opt_strings("layer_types")? else {
        return Ok((0..n)
            .map(|i| {
                if i % 4 != 3 {
                    LayerKind::Kda
                } else {
                    LayerKind::Mla
                }
            })
            .collect());
    };
    if names.len() != n {
        return Err(f.err(
            "layer_types",
            format!("{} entries for num_hidden_layers = {n}", names.len()),
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| match name.as_str() {
            "linear_attention" | "mamba" => Ok(LayerKind::Kda),
            "indexed_attention" | "full_attention" | "attention" | "deepseek_sparse_attention" => {
                Ok(LayerKind::Mla)
            }
            other => Err(f.err(
                &format!("layer_types[{i}]"),
                format!("`{other}` is not a GLM-5 layer (linear_attention, indexed_attention)"),
            )),
        })
        .collect()
}

/// `mlp_layer_types`, or three dense layers then sparse ones.
pub(super) fn mlp_kinds(f: &Fields<'_>, n: usize) -> Result<Vec<MlpKind>> {
    let Some(names) = f.opt_strings("mlp_layer_types")? else {
        return Ok((0..n)
            .map(|i| {
                if i < 3 {
                    MlpKind::Dense
                } else {
                    MlpKind::Sparse
                }
            })
            .collect());
    };
    if names.len() != n {
        return Err(f.err(
            "mlp_layer_types",
            format!("{} entries for num_hidden_layers = {n}", names.len()),
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| match name.as_str() {
            "dense" => Ok(MlpKind::Dense),
            "sparse" => Ok(MlpKind::Sparse),
            other => Err(f.err(
                &format!("mlp_layer_types[{i}]"),
                format!("`{other}` is not dense or sparse"),
            )),
        })
        .collect()
}

/// `indexer_types`, else `index_topk_pattern` (`"FSSF…"` or a list), else
/// the `index_topk_freq` / `index_skip_topk_offset` schedule. A shared MLA
/// layer must directly follow a full MLA layer: transformers passes the
/// selection only from a full layer to the next one and raises otherwise.
pub(super) fn indexer_kinds(
    f: &Fields<'_>,
    n: usize,
    layers: &[LayerKind],
) -> Result<Vec<IndexerKind>> {
    let (field, names): (&str, Vec<String>) = if let Some(v) = f.opt_strings("indexer_types")? {
        ("indexer_types", v)
    } else if let Some(p) = f.get("index_topk_pattern") {
        let names = match p {
            Json::String(s) => s
                .chars()
                .enumerate()
                .map(|(i, c)| match c {
                    'F' => Ok("full".to_string()),
                    'S' => Ok("shared".to_string()),
                    other => Err(f.err(
                        "index_topk_pattern",
                        format!("character {i} is `{other}`, expected F or S"),
                    )),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => f.opt_strings("index_topk_pattern")?.unwrap_or_default(),
        };
        ("index_topk_pattern", names)
    } else {
        let freq = f.usize_or("index_topk_freq", 1)?.max(1);
        let offset = f.usize_or("index_skip_topk_offset", 2)?;
        let names = (0..n)
            .map(|i| {
                let full = (i + 1).saturating_sub(offset).is_multiple_of(freq);
                if full { "full" } else { "shared" }.to_string()
            })
            .collect();
        ("index_topk_freq", names)
    };
    // transformers indexes the list by layer: a longer list is legal.
    if names.len() < n {
        return Err(f.err(
            field,
            format!("{} entries for num_hidden_layers = {n}", names.len()),
        ));
    }
    let kinds = names[..n]
        .iter()
        .enumerate()
        .map(|(i, name)| match name.as_str() {
            "full" => Ok(IndexerKind::Full),
            "shared" => Ok(IndexerKind::Shared),
            other => Err(f.err(
                &format!("{field}[{i}]"),
                format!("`{other}` is not full or shared"),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    for (i, kind) in kinds.iter().enumerate() {
        if layers[i] != LayerKind::Mla || *kind != IndexerKind::Shared {
            continue;
        }
        let ok = i > 0 && layers[i - 1] == LayerKind::Mla && kinds[i - 1] == IndexerKind::Full;
        if !ok {
            return Err(f.err(
                &format!("{field}[{i}]"),
                "a shared indexer layer must directly follow a full indexed_attention layer \
                 (it reuses that layer's top-k selection)",
            ));
        }
    }
    Ok(kinds)
}
