//! The CUDA devices of an expert-parallel group (`--devices`): which GPU
//! each part runs on, the home first ([`crate::backend::split`]). A
//! device may appear more than once: its parts are logical shards of one
//! GPU (the group's code path on one device).

use std::fmt;
use std::str::FromStr;

use crate::error::EngineError;

/// Parts a group holds at most.
pub const MAX_SHARDS: usize = 8;

/// CUDA ordinals, one per part of the group, the home first (a value type,
/// so [`super::Device`] stays `Copy`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Shards {
    ordinals: [u16; MAX_SHARDS],
    count: u8,
}

impl Shards {
    /// A group of `ordinals` (2..=[`MAX_SHARDS`] parts).
    pub fn new(ordinals: &[usize]) -> Result<Self, EngineError> {
        if !(2..=MAX_SHARDS).contains(&ordinals.len()) {
            return Err(EngineError::Device(format!(
                "a device group has 2 to {MAX_SHARDS} parts, not {}",
                ordinals.len()
            )));
        }
        let mut s = Shards {
            ordinals: [0; MAX_SHARDS],
            count: ordinals.len() as u8,
        };
        for (slot, &o) in s.ordinals.iter_mut().zip(ordinals) {
            *slot = u16::try_from(o)
                .map_err(|_| EngineError::Device(format!("CUDA device {o} is out of range")))?;
        }
        Ok(s)
    }

    /// The ordinal of every part, the home first.
    pub fn ordinals(&self) -> impl Iterator<Item = usize> + '_ {
        self.ordinals[..self.count as usize]
            .iter()
            .map(|&o| o as usize)
    }

    /// The parts of the group.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Never true: a group has at least two parts.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

impl fmt::Debug for Shards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// `cuda:0,cuda:1` (the form [`FromStr`] reads).
impl fmt::Display for Shards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, o) in self.ordinals().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "cuda:{o}")?;
        }
        Ok(())
    }
}

/// `cuda:0,cuda:1,…` (a bare `0,1` too): the home first.
impl FromStr for Shards {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, EngineError> {
        let ordinals = s
            .split(',')
            .map(|part| {
                let part = part.trim();
                let n = part.strip_prefix("cuda:").unwrap_or(part);
                n.parse::<usize>().map_err(|_| {
                    EngineError::Device(format!(
                        "`{part}` is not a CUDA device (write cuda:N, e.g. --devices cuda:0,cuda:1)"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Shards::new(&ordinals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_reads_and_prints_the_same() {
        let s: Shards = "cuda:0,cuda:1".parse().unwrap();
        assert_eq!(s.ordinals().collect::<Vec<_>>(), [0, 1]);
        assert_eq!(s.to_string(), "cuda:0,cuda:1");
        let bare: Shards = " 1, 0 ,1".parse().unwrap();
        assert_eq!(bare.ordinals().collect::<Vec<_>>(), [1, 0, 1]);
        assert_eq!(bare.len(), 3);
    }

    #[test]
    fn bad_lists_say_what_to_write() {
        for bad in [
            "cuda:0",
            "",
            "cpu,cuda:1",
            "cuda:0,cuda:x",
            "cuda:0,cuda:70000",
        ] {
            let e = bad.parse::<Shards>().unwrap_err().to_string();
            assert!(e.contains("device"), "{bad}: {e}");
        }
        let nine = ["0"; 9].join(",");
        assert!(nine.parse::<Shards>().is_err());
    }
}
