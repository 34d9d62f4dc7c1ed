//! Writes an importance matrix in llama.cpp's GGUF form, as
//! `IMatrixCollector::save_imatrix` (`tools/imatrix/imatrix.cpp`) writes
//! it: `general.type = "imatrix"`, `imatrix.datasets` (array of strings),
//! `imatrix.chunk_count` and `imatrix.chunk_size` (u32); per entry, in
//! name order, `<name>.in_sum2` (F32, ggml `ne = [n_in, n_mat]`, row-major
//! `[n_mat, n_in]`) and `<name>.counts` (F32, `ne = [1, n_mat]`). The file
//! is written to `OUT.partial` beside it, synced and renamed, so `OUT` is
//! complete or untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ds4_gguf::{GgufWriter, TensorPlan, Value};

use super::imatrix_collect::Entry;

/// What the header records besides the entries.
#[derive(Debug, Clone)]
pub struct Provenance {
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
}

fn partial(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Removes the partial file unless the write completed.
struct Partial(Option<PathBuf>);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Row-major dims as `gguf_write_to_file` stores a 2-D ggml tensor: with
/// `ggml_n_dims` dimensions, so an outer dimension of 1 is left out (a
/// dense weight's `in_sum2` is 1-D `[n_in]`, its `counts` `[1]`).
fn ggml_dims(dims: &[usize]) -> Vec<usize> {
    let skip = dims.iter().take_while(|&&d| d == 1).count();
    dims[skip.min(dims.len() - 1)..].to_vec()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn write(path: &Path, entries: &BTreeMap<String, Entry>, p: &Provenance) -> Result<()> {
    let metadata = vec![
        ("general.type".to_string(), Value::String("imatrix".into())),
        (
            "imatrix.datasets".to_string(),
            Value::Array(p.datasets.iter().cloned().map(Value::String).collect()),
        ),
        ("imatrix.chunk_count".to_string(), Value::U32(p.chunk_count)),
        ("imatrix.chunk_size".to_string(), Value::U32(p.chunk_size)),
    ];
    let plan = |name: String, dims: Vec<usize>| TensorPlan {
        name,
        dims,
        ggml_type: 0,
    };
    let mut tensors = Vec::with_capacity(2 * entries.len());
    for (name, e) in entries {
        let n_mat = e.counts.len();
        let n_in = e.sums.len() / n_mat.max(1);
        tensors.push(plan(format!("{name}.in_sum2"), ggml_dims(&[n_mat, n_in])));
        tensors.push(plan(format!("{name}.counts"), ggml_dims(&[n_mat, 1])));
    }
    let tmp = partial(path);
    let mut guard = Partial(Some(tmp.clone()));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
    let mut w = GgufWriter::new(std::io::BufWriter::new(file), &metadata, &tensors)
        .with_context(|| format!("{}: writing the header", tmp.display()))?;
    for e in entries.values() {
        w.write(&f32_bytes(&e.sums))?;
        w.write(&f32_bytes(&e.counts))?;
    }
    let file = w
        .finish()
        .with_context(|| format!("{}: writing", tmp.display()))?
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("{}: writing", tmp.display()))?;
    file.sync_all()
        .with_context(|| format!("{}: syncing", tmp.display()))?;
    drop(file);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    guard.0 = None;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::imatrix::Imatrix;

    #[test]
    fn the_loader_reads_back_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut entries = BTreeMap::new();
        entries.insert(
            "blk.0.attn_q.weight".to_string(),
            Entry {
                sums: vec![4.0, 8.0],
                counts: vec![2.0],
            },
        );
        entries.insert(
            "blk.0.ffn_up_exps.weight".to_string(),
            Entry {
                sums: vec![2.0, 4.0, 5.0, 5.0],
                counts: vec![2.0, 0.0],
            },
        );
        let p = Provenance {
            datasets: vec!["corpus.txt".into()],
            chunk_count: 3,
            chunk_size: 16,
        };
        write(&path, &entries, &p).unwrap();
        assert!(!partial(&path).exists());
        let m = Imatrix::load(&path).unwrap();
        assert_eq!(m.entries["blk.0.attn_q.weight"], [2.0, 4.0]);
        assert_eq!(m.entries["blk.0.ffn_up_exps.weight"], [1.0, 2.0, 1.0, 1.0]);
        assert_eq!(m.datasets, ["corpus.txt"]);
        assert_eq!(m.chunk_count, 3);
        let g = ds4_gguf::Gguf::open(&path).unwrap();
        assert!(matches!(g.metadata.get("general.type"), Some(Value::String(s)) if s == "imatrix"));
        assert_eq!(g.tensors["blk.0.ffn_up_exps.weight.in_sum2"].dims, [2, 2]);
        assert_eq!(g.tensors["blk.0.ffn_up_exps.weight.counts"].dims, [2, 1]);
        assert_eq!(g.tensors["blk.0.attn_q.weight.in_sum2"].dims, [2]);
        assert_eq!(g.tensors["blk.0.attn_q.weight.counts"].dims, [1]);
    }
}
