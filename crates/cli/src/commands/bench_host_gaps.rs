//! The CUDA host profile's table in the benches' `REPORT` lines
//! (`DS4_CUDA_HOST_PROFILE=1`): where a host-bound step's time goes between
//! driver calls, per step (or per batch of `bench --streams`).

use ds4_engine::backend::cuda::GapRow;
use ds4_engine::families::LoadedModel;

/// The gaps between driver calls per `unit` (a step, a batch) over `n` of
/// them, by the driver call that ended each gap, largest first, then the
/// largest by transition (the call before the gap and the one after);
/// empty when nothing was profiled.
pub fn host_gaps_report(rows: &[GapRow], n: u64, unit: &str) -> String {
    use std::fmt::Write as _;
    let n = n.max(1) as f64;
    let per = |ns: u64| ns as f64 / 1e6 / n;
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let (calls, pairs): (Vec<&GapRow>, Vec<&GapRow>) = rows.iter().partition(|r| r.after.is_none());
    let (gap, call): (u64, u64) = calls
        .iter()
        .fold((0, 0), |(g, c), r| (g + r.gap_ns, c + r.call_ns));
    let _ = writeln!(
        out,
        "REPORT {unit}_host_gaps gap_ms={:.3} driver_ms={:.3} (per {unit}; by the driver call after the gap)",
        per(gap),
        per(call)
    );
    for r in calls.iter().take(24) {
        let _ = writeln!(
            out,
            "REPORT host_gap name={} calls={:.1} gap_ms={:.3} driver_ms={:.3} gap_us_per_call={:.2}",
            r.name,
            r.calls as f64 / n,
            per(r.gap_ns),
            per(r.call_ns),
            r.gap_ns as f64 / 1e3 / r.calls.max(1) as f64
        );
    }
    for r in pairs.iter().take(16) {
        let _ = writeln!(
            out,
            "REPORT host_gap_after after={} name={} calls={:.1} gap_ms={:.3} gap_us_per_call={:.2}",
            r.after.as_deref().unwrap_or("-"),
            r.name,
            r.calls as f64 / n,
            per(r.gap_ns),
            r.gap_ns as f64 / 1e3 / r.calls.max(1) as f64
        );
    }
    out
}

/// `bench --streams`' probe for a model on a GPU: `None` starts a decode
/// phase (the profile so far dropped), `Some(batches)` ends it and prints
/// its table per batch to stderr (stdout holds the CSV).
pub fn streams_probe(loaded: &LoadedModel) -> impl Fn(Option<u64>) + '_ {
    move |phase| {
        let Some(ops) = loaded.cuda_ops() else { return };
        let gaps = ops.host_gaps();
        if let Some(batches) = phase {
            eprint!("{}", host_gaps_report(&gaps, batches, "batch"));
        }
    }
}
