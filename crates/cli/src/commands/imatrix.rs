//! llama.cpp's importance matrix files (`llama-imatrix`), both forms its
//! `common_imatrix_load` reads (`common/imatrix-loader.cpp`), normalised
//! as `tools/quantize/quantize.cpp` `load_imatrix` does:
//!
//! * GGUF: per weight `<name>.in_sum2` and `<name>.counts` (both F32), the
//!   keys `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`
//!   required; the values are `in_sum2[j·n + i] / counts[j]` (1 where a
//!   count is 0), `j` the expert of a 3-D stack;
//! * legacy binary: `i32 n_entries`, then per entry `i32 len, name, i32
//!   ncall, i32 nval, f32 values[nval]`, then optionally `i32 chunks, i32
//!   len, dataset`; the values are `values / ncall` when `ncall > 0`.
//!
//! Entries are named by the GGUF tensor they weight (`blk.0.attn_q.weight`);
//! an expert stack's entry holds `n_in · n_expert` values, expert `e`'s
//! slice at `e · n_in` (llama-quant.cpp checks `ne[0] · ne[2]`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ds4_gguf::{Gguf, Value};

/// A loaded importance matrix.
#[derive(Debug)]
pub struct Imatrix {
    pub path: PathBuf,
    pub entries: BTreeMap<String, Vec<f32>>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
}

impl Imatrix {
    pub fn load(path: &Path) -> Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
        if bytes.starts_with(b"GGUF") {
            Self::from_gguf(path)
        } else {
            Self::from_legacy(path, &bytes)
        }
    }

    /// The importance of `name`'s expert `expert` (of `n_experts`) for rows
    /// of `n_in` values; `None` when the file has no entry. A wrong length
    /// is an error naming the tensor.
    pub fn weights(
        &self,
        name: &str,
        n_in: usize,
        expert: usize,
        n_experts: usize,
    ) -> Result<Option<&[f32]>> {
        let Some(v) = self.entries.get(name) else {
            return Ok(None);
        };
        if v.len() != n_in * n_experts {
            bail!(
                "{}: entry `{name}` has {} values, the tensor needs {n_in} × {n_experts} experts",
                self.path.display(),
                v.len()
            );
        }
        Ok(Some(&v[expert * n_in..(expert + 1) * n_in]))
    }

    fn from_gguf(path: &Path) -> Result<Self> {
        let g = Gguf::open(path)?;
        let bad =
            |m: String| anyhow::anyhow!("{}: not a llama.cpp imatrix GGUF: {m}", path.display());
        let datasets = match g.metadata.get("imatrix.datasets") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => return Err(bad("missing imatrix.datasets".into())),
        };
        let chunk_count = match g.metadata.get("imatrix.chunk_count") {
            Some(Value::U32(c)) => *c,
            _ => return Err(bad("missing imatrix.chunk_count".into())),
        };
        if !g.metadata.contains_key("imatrix.chunk_size") {
            return Err(bad("missing imatrix.chunk_size".into()));
        }
        let f32s = |name: &str| -> Result<Vec<f32>> {
            let info = &g.tensors[name];
            if info.ggml_type != 0 {
                return Err(bad(format!("tensor `{name}` is not F32")));
            }
            Ok(g.bytes(info)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let mut entries = BTreeMap::new();
        for name in &g.order {
            let Some(weight) = name.strip_suffix(".in_sum2") else {
                continue;
            };
            let counts_name = format!("{weight}.counts");
            if !g.tensors.contains_key(&counts_name) {
                return Err(bad(format!("`{name}` has no `{counts_name}`")));
            }
            let sums = f32s(name)?;
            let counts: Vec<f32> = f32s(&counts_name)?.into_iter().map(|c| c.round()).collect();
            if counts.is_empty() || sums.len() % counts.len() != 0 {
                return Err(bad(format!(
                    "`{name}` has {} values for {} counts",
                    sums.len(),
                    counts.len()
                )));
            }
            let n = sums.len() / counts.len();
            let values = sums
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let c = counts[k / n];
                    if c > 0.0 { s / c } else { 1.0 }
                })
                .collect();
            entries.insert(weight.to_string(), values);
        }
        if let Some(name) = g.order.iter().find(|n| {
            n.strip_suffix(".counts")
                .is_some_and(|w| !entries.contains_key(w))
        }) {
            return Err(bad(format!("`{name}` has no matching .in_sum2")));
        }
        if entries.is_empty() {
            return Err(bad("no entries".into()));
        }
        Ok(Self {
            path: path.to_path_buf(),
            entries,
            datasets,
            chunk_count,
        })
    }

    fn from_legacy(path: &Path, b: &[u8]) -> Result<Self> {
        let mut at = 0usize;
        let bad = |at: usize, m: &str| {
            anyhow::anyhow!(
                "{}: not a llama.cpp imatrix file (neither GGUF nor the legacy binary form): {m} at byte {at}",
                path.display()
            )
        };
        let i32_at = |at: &mut usize| -> Result<i32> {
            let s = b.get(*at..*at + 4).ok_or_else(|| bad(*at, "truncated"))?;
            *at += 4;
            Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        };
        let n = i32_at(&mut at)?;
        if n < 1 {
            return Err(bad(0, "no entries"));
        }
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let len = i32_at(&mut at)?;
            let len = usize::try_from(len).map_err(|_| bad(at, "negative name length"))?;
            let name = b
                .get(at..at + len)
                .ok_or_else(|| bad(at, "truncated name"))?;
            let name = String::from_utf8(name.to_vec()).map_err(|_| bad(at, "name not UTF-8"))?;
            at += len;
            let ncall = i32_at(&mut at)?;
            let nval = i32_at(&mut at)?;
            let nval = usize::try_from(nval)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(at, "entry without values"))?;
            let raw = b
                .get(at..at + 4 * nval)
                .ok_or_else(|| bad(at, "truncated values"))?;
            at += 4 * nval;
            let values = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .map(|v| if ncall > 0 { v / ncall as f32 } else { v })
                .collect();
            entries.insert(name, values);
        }
        let mut datasets = Vec::new();
        let mut chunk_count = 0;
        if at < b.len() {
            chunk_count = i32_at(&mut at)?.max(0) as u32;
            if let Ok(len) = i32_at(&mut at)
                && len > 0
                && let Some(d) = b.get(at..at + len as usize)
            {
                datasets.push(String::from_utf8_lossy(d).into_owned());
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            entries,
            datasets,
            chunk_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A legacy file as llama-imatrix's `save_imatrix_legacy` writes it.
    fn legacy(entries: &[(&str, i32, &[f32])], tail: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, v) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((v.len() as i32).to_le_bytes());
            for x in *v {
                b.extend(x.to_le_bytes());
            }
        }
        if let Some((chunks, ds)) = tail {
            b.extend(chunks.to_le_bytes());
            b.extend((ds.len() as i32).to_le_bytes());
            b.extend(ds.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_values_are_divided_by_ncall() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.dat");
        let b = legacy(
            &[
                ("blk.0.attn_q.weight", 4, &[4.0, 8.0]),
                ("blk.0.ffn_up_exps.weight", 0, &[1.0, 2.0, 3.0, 4.0]),
            ],
            Some((10, "wiki.train.raw")),
        );
        std::fs::write(&p, b).unwrap();
        let m = Imatrix::load(&p).unwrap();
        assert_eq!(m.entries["blk.0.attn_q.weight"], [1.0, 2.0]);
        assert_eq!(m.chunk_count, 10);
        assert_eq!(m.datasets, ["wiki.train.raw"]);
        // Expert 1 of 2, rows of 2.
        assert_eq!(
            m.weights("blk.0.ffn_up_exps.weight", 2, 1, 2).unwrap(),
            Some(&[3.0f32, 4.0][..])
        );
        let e = m
            .weights("blk.0.attn_q.weight", 4, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.0.attn_q.weight") && e.contains("2 values"),
            "{e}"
        );
        assert_eq!(m.weights("nope", 2, 0, 1).unwrap(), None);
    }

    #[test]
    fn truncated_legacy_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.dat");
        let mut b = legacy(&[("a.weight", 1, &[1.0, 2.0])], None);
        b.truncate(b.len() - 2);
        std::fs::write(&p, b).unwrap();
        let e = Imatrix::load(&p).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn gguf_values_are_divided_by_per_expert_counts() {
        use ds4_gguf::{GgufWriter, TensorPlan};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        let meta = vec![
            (
                "imatrix.datasets".to_string(),
                Value::Array(vec![Value::String("d.txt".into())]),
            ),
            ("imatrix.chunk_count".to_string(), Value::U32(3)),
            ("imatrix.chunk_size".to_string(), Value::U32(512)),
        ];
        let plan = |n: &str, dims: &[usize]| TensorPlan {
            name: n.into(),
            dims: dims.to_vec(),
            ggml_type: 0,
        };
        let tensors = vec![
            plan("blk.0.ffn_up_exps.weight.in_sum2", &[2, 2]),
            plan("blk.0.ffn_up_exps.weight.counts", &[2, 1]),
        ];
        let mut w = GgufWriter::new(std::fs::File::create(&p).unwrap(), &meta, &tensors).unwrap();
        for v in [[2.0f32, 4.0, 9.0, 3.0], [2.0, 0.0, 0.0, 0.0]].iter() {
            let n = if v[2] == 0.0 { 2 } else { 4 };
            let b: Vec<u8> = v[..n].iter().flat_map(|x| x.to_le_bytes()).collect();
            w.write(&b).unwrap();
        }
        w.finish().unwrap();
        let m = Imatrix::load(&p).unwrap();
        // Expert 0: sums / 2; expert 1: count 0 → ones.
        assert_eq!(m.entries["blk.0.ffn_up_exps.weight"], [1.0, 2.0, 1.0, 1.0]);
        assert_eq!(m.datasets, ["d.txt"]);
        assert_eq!(m.chunk_count, 3);
    }
}
