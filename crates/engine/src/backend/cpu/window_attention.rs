//! Shared-K=V attention over a sliding window plus compressed entries, with
//! per-head sinks (DeepSeek-V4), on the CPU. Each (query, head) reads only
//! its own keys: the window is a contiguous run of cached rows and the
//! entries are a short list, so no masked score tensor is built.

/// One query's keys: its window `[lo, hi)` (rows of `window`) and the
/// entries it sees.
pub struct QueryKeys<'a> {
    pub lo: usize,
    pub hi: usize,
    pub entries: EntryList<'a>,
}

/// The compressed entries a query sees.
pub enum EntryList<'a> {
    /// Entries `0 .. n`.
    Prefix(usize),
    /// These entries, ascending.
    Listed(&'a [u32]),
}

/// `q: [heads·dim]` → `out: [heads·dim]` for one query; see
/// [`crate::backend::Backend::attention_window`].
#[allow(clippy::too_many_arguments)]
pub fn attend_one(
    q: &[f32],
    window: &[f32],
    entries: &[f32],
    keys: &QueryKeys<'_>,
    dim: usize,
    sinks: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let scale = 1.0 / (dim as f32).sqrt();
    let key = |j: usize| -> &[f32] {
        let w = keys.hi - keys.lo;
        if j < w {
            &window[(keys.lo + j) * dim..][..dim]
        } else {
            let e = match keys.entries {
                EntryList::Prefix(_) => j - w,
                EntryList::Listed(l) => l[j - w] as usize,
            };
            &entries[e * dim..][..dim]
        }
    };
    let n = keys.hi - keys.lo
        + match keys.entries {
            EntryList::Prefix(n) => n,
            EntryList::Listed(l) => l.len(),
        };
    for (h, (qh, oh)) in q
        .chunks_exact(dim)
        .zip(out.chunks_exact_mut(dim))
        .enumerate()
    {
        scores.clear();
        let mut max = sinks[h];
        for j in 0..n {
            let s = qh.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f32>() * scale;
            max = max.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        sum += (sinks[h] - max).exp();
        oh.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let p = p / sum;
            for (o, v) in oh.iter_mut().zip(key(j)) {
                *o += p * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against an f64 softmax with the sink column dropped.
    #[test]
    fn window_and_entries_match_f64_with_sink() {
        let dim = 4;
        let f = |i: usize| ((i as f32) * 0.77).sin();
        let window: Vec<f32> = (0..5 * dim).map(f).collect();
        let entries: Vec<f32> = (0..3 * dim).map(|i| f(i + 40)).collect();
        let q: Vec<f32> = (0..2 * dim).map(|i| f(i + 90) * 3.0).collect();
        let sinks = [0.3, -0.7];
        let listed = [0u32, 2];
        let keys = QueryKeys {
            lo: 2,
            hi: 5,
            entries: EntryList::Listed(&listed),
        };
        let mut out = vec![0.0; 2 * dim];
        attend_one(
            &q,
            &window,
            &entries,
            &keys,
            dim,
            &sinks,
            &mut Vec::new(),
            &mut out,
        );
        let rows: Vec<&[f32]> = (2..5)
            .map(|r| &window[r * dim..][..dim])
            .chain(listed.iter().map(|&e| &entries[e as usize * dim..][..dim]))
            .collect();
        for h in 0..2 {
            let qh = &q[h * dim..][..dim];
            let s: Vec<f64> = rows
                .iter()
                .map(|k| {
                    qh.iter()
                        .zip(*k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / 2.0
                })
                .collect();
            let m = s.iter().cloned().fold(sinks[h] as f64, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum::<f64>() + (sinks[h] as f64 - m).exp();
            for c in 0..dim {
                let want: f64 = s
                    .iter()
                    .zip(&rows)
                    .map(|(x, k)| (x - m).exp() / z * k[c] as f64)
                    .sum();
                assert!((out[h * dim + c] as f64 - want).abs() < 1e-6);
            }
        }
    }
}
