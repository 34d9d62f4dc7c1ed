//! Where the host's time between driver calls goes (`DS4_CUDA_HOST_PROFILE=1`).
//!
//! A decode step that is bound by the host spends its time in two places:
//! inside the driver (launches, copies, graph launches) and in the Rust code
//! between driver calls (the model's layers, buffer bookkeeping). This
//! attributes every gap between the end of one driver call and the start of
//! the next to the call that ends it (named by its kernel or kind), so a
//! report can say which op's host-side preparation costs what. The same
//! gaps are also counted per transition (the call before the gap and the
//! call after it): a gap before an upload says little when several ops
//! upload, the pair says whose host code it was. Off unless asked for: two
//! clock reads and a lock per driver call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// One driver call's name and the totals counted for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GapRow {
    pub name: String,
    /// The driver call before the gap, on transition rows (`None`: the
    /// row counts every gap before `name`).
    pub after: Option<String>,
    pub calls: u64,
    /// Host time from the previous driver call's end to this call's start.
    pub gap_ns: u64,
    /// Host time inside this driver call.
    pub call_ns: u64,
}

/// The names of the driver calls that are not kernel launches (the rest
/// are kernel names).
pub const HTOD_COPY: &str = "htod copy";
pub const HTOD_WRITE: &str = "htod write";
pub const DTOH_COPY: &str = "dtoh copy";
pub const DTOD_COPY: &str = "dtod copy";
pub const SYNCHRONIZE: &str = "synchronize";
pub const GRAPH_LAUNCH: &str = "graph launch";

impl GapRow {
    /// Whether this row counts kernel launches (not copies, waits or graph
    /// launches).
    pub fn is_kernel(&self) -> bool {
        ![
            HTOD_COPY,
            HTOD_WRITE,
            DTOH_COPY,
            DTOD_COPY,
            SYNCHRONIZE,
            GRAPH_LAUNCH,
        ]
        .contains(&self.name.as_str())
    }

    /// Whether this row counts host-to-device copies.
    pub fn is_upload(&self) -> bool {
        [HTOD_COPY, HTOD_WRITE].contains(&self.name.as_str())
    }
}

#[derive(Default)]
struct Totals {
    last_end: Option<Instant>,
    last_name: Option<&'static str>,
    rows: HashMap<&'static str, (u64, u64, u64)>,
    pairs: HashMap<(&'static str, &'static str), (u64, u64, u64)>,
}

/// The profile: `None` inside when profiling is off.
pub(super) struct HostGaps(Option<Mutex<Totals>>);

impl HostGaps {
    pub fn new(on: bool) -> Self {
        Self(on.then(|| Mutex::new(Totals::default())))
    }

    /// Run the driver call `f` named `name`, counting the gap before it and
    /// its own time when profiling.
    pub fn call<R>(&self, name: &'static str, f: impl FnOnce() -> R) -> R {
        let Some(m) = &self.0 else { return f() };
        let start = Instant::now();
        let r = f();
        let end = Instant::now();
        if let Ok(mut t) = m.lock() {
            let gap = t.last_end.map_or(std::time::Duration::ZERO, |l| {
                start.saturating_duration_since(l)
            });
            let (gap, call) = (gap.as_nanos() as u64, (end - start).as_nanos() as u64);
            let e = t.rows.entry(name).or_default();
            *e = (e.0 + 1, e.1 + gap, e.2 + call);
            if let Some(prev) = t.last_name {
                let e = t.pairs.entry((prev, name)).or_default();
                *e = (e.0 + 1, e.1 + gap, e.2 + call);
            }
            t.last_end = Some(end);
            t.last_name = Some(name);
        }
        r
    }

    /// The totals so far, largest gap first: per driver call, then per
    /// transition ([`GapRow::after`] set); and start counting afresh (the
    /// next call's gap is not counted: it spans the caller's own work
    /// between reports).
    pub fn take(&self) -> Vec<GapRow> {
        let Some(m) = &self.0 else {
            return Vec::new();
        };
        let Ok(mut t) = m.lock() else {
            return Vec::new();
        };
        let mut rows: Vec<GapRow> = t
            .rows
            .drain()
            .map(|(name, (calls, gap_ns, call_ns))| GapRow {
                name: name.to_string(),
                after: None,
                calls,
                gap_ns,
                call_ns,
            })
            .collect();
        let mut pairs: Vec<GapRow> = t
            .pairs
            .drain()
            .map(|((after, name), (calls, gap_ns, call_ns))| GapRow {
                name: name.to_string(),
                after: Some(after.to_string()),
                calls,
                gap_ns,
                call_ns,
            })
            .collect();
        t.last_end = None;
        t.last_name = None;
        let order = |a: &GapRow, b: &GapRow| {
            (b.gap_ns.cmp(&a.gap_ns))
                .then(a.name.cmp(&b.name))
                .then(a.after.cmp(&b.after))
        };
        rows.sort_by(order);
        pairs.sort_by(order);
        rows.extend(pairs);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_counted_per_name_only_when_on() {
        let off = HostGaps::new(false);
        assert_eq!(off.call("a", || 7), 7);
        assert!(off.take().is_empty());

        let on = HostGaps::new(true);
        on.call("a", || ());
        std::thread::sleep(std::time::Duration::from_millis(5));
        on.call("b", || ());
        on.call("a", || ());
        let all = on.take();
        let rows: Vec<_> = all.iter().filter(|r| r.after.is_none()).cloned().collect();
        assert_eq!(rows.len(), 2);
        // The sleep is the gap before "b", the largest.
        assert_eq!(rows[0].name, "b");
        assert!(rows[0].gap_ns >= 5_000_000, "{rows:?}");
        assert_eq!(rows[1].calls, 2);
        // Per transition: a → b (the sleep), b → a; the first call has no
        // call before it.
        let pairs: Vec<_> = all[2..]
            .iter()
            .map(|r| (r.after.as_deref(), r.name.as_str(), r.calls))
            .collect();
        assert_eq!(pairs, [(Some("a"), "b", 1), (Some("b"), "a", 1)]);
        assert!(all[2].gap_ns >= 5_000_000);
        assert!(rows.iter().all(GapRow::is_kernel));
        on.call(HTOD_WRITE, || ());
        on.call(GRAPH_LAUNCH, || ());
        let rows = on.take();
        assert!(rows.iter().all(|r| !r.is_kernel()));
        assert_eq!(
            rows.iter()
                .filter(|r| r.is_upload() && r.after.is_none())
                .count(),
            1
        );
        // Taken: counting starts afresh, the first gap is not counted.
        on.call("c", || ());
        let rows = on.take();
        assert_eq!((rows[0].name.as_str(), rows[0].gap_ns), ("c", 0));
        assert_eq!(rows.len(), 1, "no transition into the first call");
    }
}
