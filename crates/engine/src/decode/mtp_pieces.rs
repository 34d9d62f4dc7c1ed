//! What the pieces of one MTP cycle cost on this machine (one AR step, a
//! verify window of k + 1 rows, one head forward), and the draft depth they
//! make fastest for a head whose greedy acceptance is known.
//!
//! Greedy MTP emits the AR tokens bit for bit at every depth, so choosing a
//! greedy depth from timings changes speed only; that is why only the
//! greedy depth is ever measured (a sampled request's tokens depend on its
//! depth through the random stream, so its depth stays a constant the same
//! on every machine). How much a window row costs against a step differs
//! by machine far more than the head's acceptance does: a 4-row window is
//! 1.18 AR steps on the 2-core EPYC of 2026-12-06 and 1.5–1.6 on that day's
//! Xeon (`bench/README.md`), which moved the fastest greedy depth from 1
//! there to 3 here.

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::model::{HiddenRows, LogitsRows, Model, ModelState};

/// Median milliseconds of the pieces of a cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct PieceCosts {
    pub ar_step: f64,
    /// `windows[k - 1]`: a verify window of k + 1 rows.
    pub windows: Vec<f64>,
    /// One head forward (one draft).
    pub draft: f64,
}

impl PieceCosts {
    /// `piece,rows,ms_per_call` lines (`bench --mtp`'s pieces table).
    pub fn csv(&self) -> String {
        let mut s = String::from("piece,rows,ms_per_call\n");
        s.push_str(&format!("ar_step,1,{:.3}\n", self.ar_step));
        for (k, w) in self.windows.iter().enumerate() {
            s.push_str(&format!("verify_window,{},{w:.3}\n", k + 2));
        }
        s.push_str(&format!("draft,1,{:.3}\n", self.draft));
        s
    }

    /// × AR the pieces allow at full depth `depth` for a head that accepts
    /// `accepted` drafts per cycle: 1 + `accepted` tokens for a window of
    /// `depth + 1` rows and `depth` drafts. 1 at depth 0 (AR itself).
    pub fn full_depth_speedup(&self, depth: usize, accepted: f64) -> f64 {
        if depth == 0 {
            return 1.0;
        }
        let cost = self.windows[depth - 1] + depth as f64 * self.draft;
        (1.0 + accepted) * self.ar_step / cost
    }

    /// The depth in `0..=accepted_per_cycle.len()` (limited by the windows
    /// timed) whose [`Self::full_depth_speedup`] is highest;
    /// `accepted_per_cycle[d - 1]` is the head's accepted drafts per cycle
    /// at depth d. A deeper depth must win by `margin` (relative) to be
    /// chosen over a shallower one: pieces are medians of a few calls, and
    /// a deeper chain costs more when the machine is busier than at
    /// calibration.
    pub fn best_depth(&self, accepted_per_cycle: &[f64], margin: f64) -> usize {
        let deepest = accepted_per_cycle.len().min(self.windows.len());
        let mut best = (0, 1.0);
        for d in 1..=deepest {
            let s = self.full_depth_speedup(d, accepted_per_cycle[d - 1]);
            if s > best.1 * (1.0 + margin) {
                best = (d, s);
            }
        }
        best.0
    }
}

/// Time the pieces of a cycle on `prompt`'s prefilled state: one AR step,
/// verify windows of 2 ..= `max_depth` + 1 rows, one head forward; each
/// `reps` times (at least once) from the same snapshot, in rounds after
/// one untimed round, the median kept.
pub fn measure_pieces<M: Model>(
    model: &M,
    prompt: &[u32],
    max_depth: usize,
    reps: usize,
) -> Result<PieceCosts> {
    if prompt.len() < 2 {
        return Err(EngineError::State(
            "timing MTP pieces needs a prompt of at least 2 tokens".into(),
        ));
    }
    let mut state = model.new_state();
    let (out, hidden) = model.forward_hidden(prompt, &mut state, LogitsRows::Last)?;
    let tok = argmax(out.last_row());
    let base = state.snapshot();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e3
    };
    // Each piece is timed on a copy of the snapshot that has taken one
    // untimed forward first: a fresh copy's caches are filled to capacity,
    // so its first append reallocates and copies every layer's KV (about
    // 0.8 ms of a 7 ms step for a short prompt on the 2-core Xeon), which a
    // session in the decode loop, growing its caches amortised, never pays.
    let warmed = || -> Result<_> {
        let mut st = base.snapshot();
        model.forward(&[tok], &mut st, LogitsRows::Last)?;
        Ok(st)
    };
    // The head's history up to the last prompt position.
    let mut history = model
        .new_mtp_history()
        .ok_or_else(|| EngineError::Unsupported("no MTP head to time".into()))?;
    let n = prompt.len() - 1;
    model.mtp_forward(&prompt[1..], &hidden.narrow(0, n)?, &mut history)?;
    let last = hidden.narrow(n, 1)?;
    // Piece p of round r: p = 0 an AR step, 1 ..= max_depth a window of
    // p + 1 rows, max_depth + 1 a draft. Rounds take every piece once, so
    // a slow phase of the machine (the first forwards after a prefill run
    // 20–40 % slower) falls on every piece alike; round 0 is not kept.
    let pieces = max_depth + 2;
    let mut times = vec![Vec::with_capacity(reps.max(1)); pieces];
    for round in 0..=reps.max(1) {
        for (p, t) in times.iter_mut().enumerate() {
            let took = if p == pieces - 1 {
                // The head's history likewise: one untimed row first.
                let mut h = history.clone();
                model.mtp_forward(&[tok], &last, &mut h)?;
                let t0 = Instant::now();
                model.mtp_forward(&[tok], &last, &mut h)?;
                t0.elapsed()
            } else {
                let mut st = warmed()?;
                let window: Vec<u32> = std::iter::repeat_n(tok, p + 1).collect();
                let t0 = Instant::now();
                if p == 0 {
                    model.forward(&window, &mut st, LogitsRows::Last)?;
                } else {
                    model.forward_window(&window, &mut st)?;
                }
                t0.elapsed()
            };
            if round > 0 {
                t.push(took.as_secs_f64());
            }
        }
    }
    let mut medians = times.into_iter().map(median);
    let ar_step = medians.next().unwrap_or_default();
    let mut rest: Vec<f64> = medians.collect();
    let draft = rest.pop().unwrap_or_default();
    Ok(PieceCosts {
        ar_step,
        windows: rest,
        draft,
    })
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(windows: &[f64]) -> PieceCosts {
        PieceCosts {
            ar_step: 3.0,
            windows: windows.to_vec(),
            draft: 0.1,
        }
    }

    /// The default head's greedy acceptance on the tuning prompts.
    const ACCEPTED: [f64; 3] = [0.674, 1.179, 1.495];

    #[test]
    fn cheap_rows_choose_the_deepest_chain() {
        // 2026-12-06's EPYC: 3.05 / 3.26 / 3.47 / 3.59 ms.
        let c = PieceCosts {
            ar_step: 3.054,
            windows: vec![3.258, 3.473, 3.589],
            draft: 0.107,
        };
        assert_eq!(c.best_depth(&ACCEPTED, 0.02), 3);
    }

    #[test]
    fn dear_rows_choose_a_shallow_chain_or_none() {
        // Each row as dear as a step: no chain pays for itself.
        assert_eq!(costs(&[6.0, 9.0, 12.0]).best_depth(&ACCEPTED, 0.02), 0);
        // Rows that get dearer with depth: depth 1 wins.
        assert_eq!(costs(&[3.3, 5.4, 7.2]).best_depth(&ACCEPTED, 0.02), 1);
    }

    #[test]
    fn a_deeper_chain_must_win_by_the_margin() {
        // Depth 2 1 % faster than depth 1: within the margin, so the
        // shallower stays.
        let s1 = costs(&[3.3]).full_depth_speedup(1, ACCEPTED[0]);
        let w2 = (1.0 + ACCEPTED[1]) * 3.0 / (1.01 * s1) - 2.0 * 0.1;
        let c = costs(&[3.3, w2, 9.0]);
        let (s1, s2) = (
            c.full_depth_speedup(1, ACCEPTED[0]),
            c.full_depth_speedup(2, ACCEPTED[1]),
        );
        assert!(s2 > s1 && s2 < s1 * 1.02, "{s1} {s2}");
        assert_eq!(c.best_depth(&ACCEPTED, 0.02), 1);
        assert_eq!(c.best_depth(&ACCEPTED, 0.0), 2);
    }

    #[test]
    fn depth_is_limited_by_the_profile_and_the_windows() {
        let c = costs(&[3.1, 3.2, 3.3]);
        assert_eq!(c.best_depth(&ACCEPTED[..2], 0.0), 2);
        let short = costs(&[3.1]);
        assert_eq!(short.best_depth(&ACCEPTED, 0.0), 1);
        assert_eq!(c.full_depth_speedup(0, 0.0), 1.0);
    }
}
