//! Which device holds which routed experts (expert parallel).
//!
//! Every MoE layer's stack of `E` experts is cut into contiguous ranges, one
//! per device, in device order: device 0 (the home, which also holds the
//! dense part, attention and caches) takes the first range. Sizes follow
//! the devices' shares by largest remainder, ties to the lower device, so
//! a plan is a pure function of `(E, shares)` and every layer of one width
//! splits the same way.

use std::ops::Range;

use crate::error::{EngineError, Result};

/// How a device group divides each stack of routed experts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertSplit {
    /// One share per device, device 0 first; a device's part of every
    /// stack is proportional to its share.
    shares: Vec<u64>,
}

impl ExpertSplit {
    /// `devices` equal shares.
    pub fn even(devices: usize) -> Result<Self> {
        Self::weighted(vec![1; devices])
    }

    /// Shares given per device (device 0 first). At least one device, and
    /// at least one positive share.
    pub fn weighted(shares: Vec<u64>) -> Result<Self> {
        if shares.is_empty() || shares.iter().all(|&s| s == 0) {
            return Err(EngineError::Device(format!(
                "an expert split needs a device with a positive share (got {shares:?})"
            )));
        }
        Ok(Self { shares })
    }

    /// Shares that even out memory: every device should end with the same
    /// bytes, the home also holding `home_bytes` (dense weights, caches)
    /// beside its experts, out of `expert_bytes` for all routed experts of
    /// the model. Where the home's fixed part already exceeds an even
    /// share, it takes no experts. Shares are in bytes.
    pub fn balanced_memory(devices: usize, home_bytes: u64, expert_bytes: u64) -> Result<Self> {
        if devices == 0 {
            return Err(EngineError::Device("an expert split needs a device".into()));
        }
        let n = devices as u64;
        let total = home_bytes.saturating_add(expert_bytes);
        let per_device = total / n;
        let home = per_device.saturating_sub(home_bytes);
        let rest = expert_bytes.saturating_sub(home);
        let mut shares = vec![home];
        if devices > 1 {
            // The others split what the home leaves, evenly.
            shares.extend(std::iter::repeat_n(rest / (n - 1), devices - 1));
            if shares[1..].iter().all(|&s| s == 0) {
                shares[1..].iter_mut().for_each(|s| *s = 1);
            }
        } else {
            shares[0] = 1;
        }
        Self::weighted(shares)
    }

    /// The devices of the group.
    pub fn devices(&self) -> usize {
        self.shares.len()
    }

    /// The experts of device `d` for a stack of `experts`, as contiguous
    /// ranges covering `0..experts` in device order (some may be empty).
    /// Largest remainder: each device gets `⌊E·s_d / S⌋`, then the experts
    /// left go one each to the largest remainders, ties to the lower device.
    pub fn ranges(&self, experts: usize) -> Vec<Range<usize>> {
        let total: u128 = self.shares.iter().map(|&s| s as u128).sum();
        let e = experts as u128;
        let mut counts: Vec<usize> = self
            .shares
            .iter()
            .map(|&s| (e * s as u128 / total) as usize)
            .collect();
        let left = experts - counts.iter().sum::<usize>();
        let mut by_remainder: Vec<usize> = (0..self.shares.len()).collect();
        by_remainder.sort_by(|&a, &b| {
            let ra = e * self.shares[a] as u128 % total;
            let rb = e * self.shares[b] as u128 % total;
            rb.cmp(&ra).then(a.cmp(&b))
        });
        for &d in by_remainder.iter().take(left) {
            counts[d] += 1;
        }
        let mut first = 0;
        counts
            .into_iter()
            .map(|c| {
                let r = first..first + c;
                first += c;
                r
            })
            .collect()
    }

    /// The device holding expert `e` of a stack of `experts`.
    pub fn owner(&self, experts: usize, e: usize) -> Option<usize> {
        self.ranges(experts).iter().position(|r| r.contains(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(r: &[Range<usize>]) -> Vec<usize> {
        r.iter().map(|r| r.len()).collect()
    }

    #[test]
    fn ranges_cover_every_expert_once_in_device_order() {
        for devices in 1..=8 {
            let split = ExpertSplit::even(devices).unwrap();
            for experts in [0, 1, 7, 8, 64, 129, 256] {
                let r = split.ranges(experts);
                assert_eq!(r.len(), devices);
                assert_eq!(r[0].start, 0);
                assert_eq!(r.last().unwrap().end, experts);
                for w in r.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "contiguous");
                }
                let s = sizes(&r);
                let (lo, hi) = (s.iter().min().unwrap(), s.iter().max().unwrap());
                assert!(hi - lo <= 1, "{devices} devices, {experts}: {s:?}");
                for e in 0..experts {
                    let d = split.owner(experts, e).unwrap();
                    assert!(r[d].contains(&e));
                }
            }
        }
    }

    #[test]
    fn remainders_go_to_the_lower_devices() {
        // DeepSeek-V4-Flash's 256 experts over 3 devices.
        let r = ExpertSplit::even(3).unwrap().ranges(256);
        assert_eq!(r, vec![0..86, 86..171, 171..256]);
        // Weighted 1 : 2 : 2 over 10.
        let r = ExpertSplit::weighted(vec![1, 2, 2]).unwrap().ranges(10);
        assert_eq!(sizes(&r), vec![2, 4, 4]);
        // 1 : 1 : 1 over 4: one left, to device 0.
        assert_eq!(
            sizes(&ExpertSplit::even(3).unwrap().ranges(4)),
            vec![2, 1, 1]
        );
    }

    #[test]
    fn a_zero_share_takes_no_experts() {
        let r = ExpertSplit::weighted(vec![0, 1, 1]).unwrap().ranges(256);
        assert_eq!(r, vec![0..0, 0..128, 128..256]);
        assert!(ExpertSplit::weighted(vec![0, 0]).is_err());
        assert!(ExpertSplit::weighted(vec![]).is_err());
        assert!(ExpertSplit::even(0).is_err());
    }

    #[test]
    fn memory_balance_gives_the_home_fewer_experts() {
        // ds4's q4 DeepSeek-V4-Flash, roughly: 153 GB, of which about 9 GB
        // is not routed experts (attention, shared experts, embeddings).
        let (dense, experts) = (9_000_000_000u64, 144_000_000_000u64);
        let split = ExpertSplit::balanced_memory(2, dense, experts).unwrap();
        let r = split.ranges(256);
        let per_expert = experts / 256;
        let home = dense + r[0].len() as u64 * per_expert;
        let other = r[1].len() as u64 * per_expert;
        assert!(r[0].len() < r[1].len(), "{r:?}");
        // Within one expert of even.
        assert!(home.abs_diff(other) <= 2 * per_expert, "{home} vs {other}");
        // A home whose dense part exceeds an even share takes no experts.
        let r = ExpertSplit::balanced_memory(2, 100, 10).unwrap().ranges(8);
        assert_eq!(r, vec![0..0, 0..8]);
        // One device holds everything.
        let r = ExpertSplit::balanced_memory(1, 100, 10).unwrap().ranges(8);
        assert_eq!(r, vec![0..8]);
    }
}
