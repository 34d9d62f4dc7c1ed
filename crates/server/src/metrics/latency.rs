//! The time-shaped metrics: a Prometheus histogram of seconds (time to
//! first token, queue wait) and the tokens emitted over the last seconds
//! (a live tokens/s for every running turn together).

/// Seconds into buckets (Prometheus histogram, cumulative on render).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    pub(super) counts: [u64; BUCKETS.len()],
    pub(super) count: u64,
    pub(super) sum: f64,
}

/// Upper bounds in seconds (a request's wait and its first token: from
/// milliseconds on an idle server to minutes behind a long queue).
pub const BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl Histogram {
    pub(super) fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    /// The observations' mean (0 with none).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Tokens emitted per second over the last [`RECENT_SECONDS`] seconds.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// (unix second, tokens emitted in it), oldest first.
    seconds: std::collections::VecDeque<(u64, u64)>,
}

const RECENT_SECONDS: u64 = 10;

impl Recent {
    pub(super) fn add(&mut self, now: u64) {
        match self.seconds.back_mut() {
            Some((s, n)) if *s == now => *n += 1,
            _ => self.seconds.push_back((now, 1)),
        }
        self.trim(now);
    }

    fn trim(&mut self, now: u64) {
        while self
            .seconds
            .front()
            .is_some_and(|(s, _)| *s + RECENT_SECONDS <= now)
        {
            self.seconds.pop_front();
        }
    }

    pub(super) fn rate(&mut self, now: u64) -> f64 {
        self.trim(now);
        self.seconds.iter().map(|(_, n)| n).sum::<u64>() as f64 / RECENT_SECONDS as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_mean() {
        let mut h = Histogram::default();
        for s in [0.01, 0.3, 0.3, 500.0] {
            h.observe(s);
        }
        assert_eq!(h.count(), 4);
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[3], 2);
        // Past the last bound: only in the count (the +Inf bucket).
        assert_eq!(h.counts.iter().sum::<u64>(), 3);
        assert!((h.mean() - 500.61 / 4.0).abs() < 1e-9);
    }

    #[test]
    fn recent_rate_forgets_old_seconds() {
        let mut r = Recent::default();
        for _ in 0..30 {
            r.add(100);
        }
        r.add(105);
        assert_eq!(r.rate(105), 3.1);
        assert_eq!(r.rate(110), 0.1);
        assert_eq!(r.rate(115), 0.0);
    }
}
