//! The accumulator behind `ds4server imatrix`: a product observer
//! (`ds4_engine::observe`) that sums, per weight and input column, the
//! squares of the activation rows entering its products, as llama.cpp's
//! `IMatrixCollector::collect_imatrix` (`tools/imatrix/imatrix.cpp`) does:
//!
//! * a dense product adds every row, `in_sum2[j] += x[j]²` in row order in
//!   f32, and counts its rows; like llama-imatrix, a product of fewer than
//!   16 rows is skipped (its "small batches" rule);
//! * an expert stack adds, per expert, the rows routed to it (one per
//!   routed token and slot) and counts them per expert;
//! * a non-finite sum stops the run (llama-imatrix exits there too).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use anyhow::{Result, bail};
use ds4_engine::observe::{Placement, ProductObserver, Tag};

/// Products of fewer rows are not collected (llama-imatrix:
/// `src1->ne[1] < 16`), for dense weights only.
pub const MIN_DENSE_ROWS: usize = 16;

#[derive(Debug, Clone, Default)]
struct Acc {
    sums: Vec<f32>,
    rows: u64,
}

/// Sums per (weight, expert).
#[derive(Debug, Default)]
pub struct Collector {
    acc: Mutex<HashMap<(Tag, Option<usize>), Acc>>,
}

impl ProductObserver for Collector {
    fn rows(&self, tag: Tag, expert: Option<usize>, x: &[f32], rows: usize) {
        if rows == 0 || (expert.is_none() && rows < MIN_DENSE_ROWS) {
            return;
        }
        let n = x.len() / rows;
        let mut acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
        let a = acc.entry((tag, expert)).or_default();
        if a.sums.len() != n {
            // First call (a weight's width never changes).
            a.sums = vec![0.0; n];
        }
        for row in x.chunks_exact(n) {
            for (s, &v) in a.sums.iter_mut().zip(row) {
                *s += v * v;
            }
        }
        a.rows += rows as u64;
    }
}

/// One importance-matrix entry as llama-imatrix stores it: `counts` per
/// matrix (one for a dense weight, one per expert for a stack) and
/// `sums` of `counts.len() × n_in` values.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub sums: Vec<f32>,
    pub counts: Vec<f32>,
}

impl Collector {
    /// The name of a weight whose sums are not finite, if any.
    pub fn non_finite(&self, placements: &[Placement]) -> Option<String> {
        let acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
        acc.iter()
            .find(|(_, a)| a.sums.iter().any(|v| !v.is_finite()))
            .map(|((tag, _), _)| {
                placements
                    .get(*tag as usize)
                    .map_or_else(|| format!("weight #{tag}"), |p| p.names.join(" + "))
            })
    }

    /// The entries by the tensors the engine bound (its own names: GGUF
    /// names for llama GGUFs, Hugging Face names for directories): a fused
    /// weight gives each of its tensors the same sums; a stack of one
    /// `[E, out, in]` tensor gives one entry of `E` counts; a stack of
    /// per-expert tensors gives each its expert's sums and count.
    pub fn entries(&self, placements: &[Placement]) -> Result<BTreeMap<String, Entry>> {
        let acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = BTreeMap::new();
        for (tag, p) in placements.iter().enumerate() {
            let tag = tag as Tag;
            let get = |e: Option<usize>| acc.get(&(tag, e));
            match p.experts {
                None => {
                    let Some(a) = get(None) else { continue };
                    for n in &p.names {
                        insert(&mut out, n, a.sums.clone(), vec![a.rows as f32])?;
                    }
                }
                Some(e_count) if p.names.len() == 1 => {
                    // One entry over every expert; an expert never routed to
                    // keeps zeros and count 0 (the loader reads those as 1).
                    let mut sums = vec![0.0; e_count * p.inp];
                    let mut counts = vec![0.0; e_count];
                    for e in 0..e_count {
                        if let Some(a) = get(Some(e)) {
                            sums[e * p.inp..(e + 1) * p.inp].copy_from_slice(&a.sums);
                            counts[e] = a.rows as f32;
                        }
                    }
                    if counts.iter().any(|&c| c > 0.0) {
                        insert(&mut out, &p.names[0], sums, counts)?;
                    }
                }
                Some(e_count) => {
                    let m = p.names.len() / e_count.max(1);
                    for e in 0..e_count {
                        let Some(a) = get(Some(e)) else { continue };
                        for n in &p.names[e * m..(e + 1) * m] {
                            insert(&mut out, n, a.sums.clone(), vec![a.rows as f32])?;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Adds an entry; a tensor bound twice (a weight placed in two layers)
/// has its sums and counts added, as llama-imatrix's map by name does.
fn insert(
    out: &mut BTreeMap<String, Entry>,
    name: &str,
    sums: Vec<f32>,
    counts: Vec<f32>,
) -> Result<()> {
    match out.get_mut(name) {
        None => {
            out.insert(name.to_string(), Entry { sums, counts });
        }
        Some(e) if e.sums.len() == sums.len() && e.counts.len() == counts.len() => {
            e.sums.iter_mut().zip(&sums).for_each(|(a, b)| *a += b);
            e.counts.iter_mut().zip(&counts).for_each(|(a, b)| *a += b);
        }
        Some(e) => bail!(
            "`{name}` was used with {} and {} inputs",
            e.sums.len(),
            sums.len()
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(names: &[&str], experts: Option<usize>, inp: usize) -> Placement {
        Placement {
            names: names.iter().map(|s| s.to_string()).collect(),
            experts,
            out: 4,
            inp,
        }
    }

    #[test]
    fn dense_rows_are_squared_and_counted_small_products_skipped() {
        let c = Collector::default();
        let x: Vec<f32> = (0..32)
            .map(|i| if i % 2 == 0 { 1.0 } else { -2.0 })
            .collect();
        c.rows(0, None, &x, 16);
        c.rows(0, None, &x[..4], 2); // < 16 rows: skipped
        let e = c.entries(&[placement(&["a", "b"], None, 2)]).unwrap();
        assert_eq!(e["a"].sums, [16.0, 64.0]);
        assert_eq!(e["a"].counts, [16.0]);
        assert_eq!(e["a"], e["b"]);
    }

    #[test]
    fn stacks_count_per_expert() {
        let c = Collector::default();
        c.rows(0, Some(1), &[1.0, 2.0, 3.0, 4.0], 2);
        c.rows(1, Some(0), &[3.0, 1.0], 1);
        let e = c
            .entries(&[
                placement(&["stack"], Some(3), 2),
                placement(&["e0.g", "e0.u", "e1.g", "e1.u"], Some(2), 2),
            ])
            .unwrap();
        assert_eq!(e["stack"].sums, [0.0, 0.0, 10.0, 20.0, 0.0, 0.0]);
        assert_eq!(e["stack"].counts, [0.0, 2.0, 0.0]);
        assert_eq!(e["e0.u"].sums, [9.0, 1.0]);
        assert_eq!(e["e0.u"].counts, [1.0]);
        assert!(!e.contains_key("e1.g"));
    }

    #[test]
    fn non_finite_sums_name_the_weight() {
        let c = Collector::default();
        c.rows(0, None, &[f32::INFINITY; 16], 16);
        assert_eq!(
            c.non_finite(&[placement(&["blk.0.attn_q.weight"], None, 1)])
                .as_deref(),
            Some("blk.0.attn_q.weight")
        );
    }
}
