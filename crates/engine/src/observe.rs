//! Product observation: a process-wide hook told the activation rows that
//! enter each weight product on the CPU backend, with the names of the
//! tensors the weight was bound from. It is what `ds4server imatrix`
//! collects (llama.cpp's `llama-imatrix` gets the same rows from ggml's
//! eval callback, `cb_eval`).
//!
//! A process that installs no observer runs exactly as before: placement
//! returns every matrix unwrapped and no product reaches the hook, so
//! kernels, bits and speed are unchanged (the only added work is one
//! `OnceLock` read per placement, at load). With an observer installed
//! (before the model loads), every matrix and expert stack whose tensors
//! are known is placed wrapped (`CpuMatrix::Observed`,
//! `CpuExperts::Observed`); its products report their input rows, then run
//! the same kernel on the same rows. A wrapped matrix leaves
//! `matmul_many`'s one-dispatch path for the part-by-part one, which has
//! the same bits by the op's contract.
//!
//! Naming. The binder records each tensor it reads (`read`). A dense
//! matrix `[out, in]` is named by the latest unclaimed reads of shape
//! `[r_i, in]` with `Σ r_i = out` (its own tensor, or the parts a fused
//! gate/up joined, which a loader may place after other weights), and
//! claims them; an expert stack by the names its loader gives
//! (`name_next`: one `[E, out, in]` tensor, or `E·m` per-expert tensors,
//! whose reads it claims). A matrix derived from tensors of other shapes
//! (an absorbed MLA projection, a split grouped output) matches nothing
//! and is not observed.

use std::sync::{Arc, Mutex, OnceLock};

/// Which placed weight a product used: an index into [`placements`].
pub type Tag = u32;

/// Told the input rows of every product of an observed weight.
pub trait ProductObserver: Send + Sync {
    /// `x: [rows, in]` entered a product with weight `tag`; for an expert
    /// stack, `expert` is the expert and `x` the rows routed to it (one per
    /// routed token and slot, in token order).
    fn rows(&self, tag: Tag, expert: Option<usize>, x: &[f32], rows: usize);
}

/// One observed weight as placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The tensors the weight was bound from, in row order: one, the parts
    /// of a fused matrix, or for an expert stack either one `[E, out, in]`
    /// tensor or `E·m` per-expert tensors (expert `e`'s at `e·m ..`).
    pub names: Vec<String>,
    /// `Some(E)` for an expert stack.
    pub experts: Option<usize>,
    pub out: usize,
    pub inp: usize,
}

/// [`install`] was called twice.
#[derive(Debug, thiserror::Error)]
#[error("a product observer is already installed in this process")]
pub struct AlreadyInstalled;

struct Hook {
    observer: Arc<dyn ProductObserver>,
    naming: Mutex<Naming>,
}

#[derive(Default)]
struct Naming {
    /// Tensors read and not yet claimed by a placement: name and dims.
    pending: Vec<(String, Vec<usize>)>,
    /// The tensors of the next expert stack ([`name_next`]).
    next_stack: Option<Vec<(String, Vec<usize>)>>,
    placements: Vec<Placement>,
}

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs `observer` for the rest of the process; weights placed from
/// now on are observed.
pub fn install(observer: Arc<dyn ProductObserver>) -> Result<(), AlreadyInstalled> {
    HOOK.set(Hook {
        observer,
        naming: Mutex::new(Naming::default()),
    })
    .map_err(|_| AlreadyInstalled)
}

/// Every observed weight placed so far; a [`Tag`] is an index into it.
pub fn placements() -> Vec<Placement> {
    HOOK.get()
        .map(|h| lock(h).placements.clone())
        .unwrap_or_default()
}

fn lock(h: &Hook) -> std::sync::MutexGuard<'_, Naming> {
    // A panic while naming leaves nothing half-written that matters here.
    h.naming.lock().unwrap_or_else(|e| e.into_inner())
}

/// The installed observer, if any.
#[inline]
pub(crate) fn observer() -> Option<&'static dyn ProductObserver> {
    HOOK.get().map(|h| &*h.observer)
}

/// The binder read tensor `name` of shape `dims`.
pub(crate) fn read(name: &str, dims: &[usize]) {
    if let Some(h) = HOOK.get() {
        lock(h).pending.push((name.to_string(), dims.to_vec()));
    }
}

/// The tensors the next expert stack is made of; their reads are claimed.
pub(crate) fn name_next(names: &dyn Fn() -> Vec<(String, Vec<usize>)>) {
    if let Some(h) = HOOK.get() {
        let names = names();
        let mut n = lock(h);
        let set: std::collections::HashSet<&str> = names.iter().map(|(s, _)| s.as_str()).collect();
        n.pending.retain(|(p, _)| !set.contains(p.as_str()));
        n.next_stack = Some(names);
    }
}

/// A weight `[out, in]` (`experts: Some(E)`: a stack `[E, out, in]`) is
/// being placed: its tag when its tensors are known.
pub(crate) fn place(out: usize, inp: usize, experts: Option<usize>) -> Option<Tag> {
    let h = HOOK.get()?;
    let mut n = lock(h);
    let names = match experts {
        None => {
            let picked = dense_reads(&n.pending, out, inp)?;
            let names = picked.iter().map(|&i| n.pending[i].0.clone()).collect();
            for &i in picked.iter().rev() {
                n.pending.remove(i);
            }
            names
        }
        Some(e) => stack_names(&n.next_stack.take()?, e, out, inp)?,
    };
    let tag = Tag::try_from(n.placements.len()).ok()?;
    n.placements.push(Placement {
        names,
        experts,
        out,
        inp,
    });
    Some(tag)
}

/// The indices (ascending) of the latest reads `[r_i, inp]` with
/// `Σ r_i = out`; reads of other shapes in between are passed over.
fn dense_reads(pending: &[(String, Vec<usize>)], out: usize, inp: usize) -> Option<Vec<usize>> {
    let mut rows = 0;
    let mut picked = Vec::new();
    for (at, (_, dims)) in pending.iter().enumerate().rev() {
        if let [r, i] = dims[..]
            && i == inp
        {
            if rows + r > out {
                return None;
            }
            rows += r;
            picked.push(at);
            if rows == out {
                picked.reverse();
                return Some(picked);
            }
        }
    }
    None
}

/// One `[e, out, inp]` tensor, or `e·m` tensors `[r_i, inp]` with
/// `Σ r_i = e·out`.
fn stack_names(
    pending: &[(String, Vec<usize>)],
    e: usize,
    out: usize,
    inp: usize,
) -> Option<Vec<String>> {
    if let [(name, dims)] = pending
        && dims[..] == [e, out, inp]
    {
        return Some(vec![name.clone()]);
    }
    let rows: usize = pending
        .iter()
        .map(|(_, d)| match d[..] {
            [r, i] if i == inp => Some(r),
            _ => None,
        })
        .sum::<Option<usize>>()?;
    (e > 0 && !pending.is_empty() && pending.len().is_multiple_of(e) && rows == e * out)
        .then(|| pending.iter().map(|(n, _)| n.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(entries: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
        entries
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_vec()))
            .collect()
    }

    #[test]
    fn a_matrix_is_named_by_its_latest_reads() {
        let reads = p(&[
            ("gate", &[4, 8]),
            ("up", &[4, 8]),
            ("norm", &[8]),
            ("o", &[8, 4]),
        ]);
        assert_eq!(dense_reads(&reads, 8, 8).unwrap(), [0, 1]);
        assert_eq!(dense_reads(&reads, 4, 8).unwrap(), [1]);
        assert_eq!(dense_reads(&reads, 8, 4).unwrap(), [3]);
        // A derived matrix of another shape matches nothing.
        assert_eq!(dense_reads(&reads, 3, 8), None);
        assert_eq!(dense_reads(&reads, 12, 8), None);
        assert_eq!(dense_reads(&[], 4, 8), None);
    }

    #[test]
    fn a_stack_is_one_3d_tensor_or_whole_experts() {
        let one = p(&[("experts.gate_up_proj", &[2, 6, 4])]);
        assert_eq!(
            stack_names(&one, 2, 6, 4).unwrap(),
            ["experts.gate_up_proj"]
        );
        assert_eq!(stack_names(&one, 3, 6, 4), None);
        let per = p(&[
            ("g0", &[3, 4]),
            ("u0", &[3, 4]),
            ("g1", &[3, 4]),
            ("u1", &[3, 4]),
        ]);
        assert_eq!(stack_names(&per, 2, 6, 4).unwrap().len(), 4);
        assert_eq!(stack_names(&per, 2, 5, 4), None);
        assert_eq!(stack_names(&per[..3], 2, 6, 4), None);
    }
}
