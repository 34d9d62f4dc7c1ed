//! Which kernel set a process runs: the precision of its products
//! (`shared/specs/backend.md`, rule 6).
//!
//! - [`KernelSet::Reference`]: f32 activations, every weight exactly as its
//!   format defines it. The parity checks against transformers run on it.
//! - [`KernelSet::Fast`]: each activation row is rounded to int8 with one
//!   f32 scale per 32 values before a block-quantized product, and the
//!   product runs on integer dot products ([`super::cpu::q8_matmul`]); for
//!   Q2_K–Q6_K and IQ2_XXS rows of whole 256-value super-blocks, one scale
//!   per 256 values ([`super::cpu::kq8_matmul`], ggml's Q8_K). The
//!   rounding of a row depends on that row alone, so verify == steps,
//!   warm == cold and batch invariance hold within the set exactly as in
//!   the reference.
//!
//! One process runs one set, fixed before the first weight is placed
//! (weights are laid out for their set's kernels at load): `--kernels`
//! calls [`choose`] first, else `DS4_KERNELS` decides, else the default.
//! The set is part of a backend's id, so a state or checkpoint made by one
//! set is never resumed by the other.

use std::sync::OnceLock;

/// A kernel set (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSet {
    Reference,
    Fast,
}

impl KernelSet {
    /// The default when neither `--kernels` nor `DS4_KERNELS` chooses.
    pub const DEFAULT: KernelSet = KernelSet::Reference;

    /// The name `--kernels` takes and ids show.
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Reference => "reference",
            KernelSet::Fast => "fast",
        }
    }

    /// Parse a `--kernels` / `DS4_KERNELS` value.
    pub fn parse(s: &str) -> Result<KernelSet, KernelSetError> {
        match s.trim() {
            "reference" | "ref" => Ok(KernelSet::Reference),
            "fast" => Ok(KernelSet::Fast),
            other => Err(KernelSetError::Unknown(other.to_string())),
        }
    }
}

impl std::fmt::Display for KernelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelSetError {
    #[error("unknown kernel set `{0}` (reference or fast)")]
    Unknown(String),
    #[error(
        "this process already runs the {current} kernel set (weights are laid out for it); \
         {wanted} cannot be chosen now"
    )]
    AlreadyFixed {
        current: KernelSet,
        wanted: KernelSet,
    },
}

static SET: OnceLock<KernelSet> = OnceLock::new();

/// Fix this process's kernel set. Call before loading a model; choosing
/// the set already in force is allowed, another one is an error.
pub fn choose(wanted: KernelSet) -> Result<(), KernelSetError> {
    let current = *SET.get_or_init(|| wanted);
    if current == wanted {
        Ok(())
    } else {
        Err(KernelSetError::AlreadyFixed { current, wanted })
    }
}

/// The kernel set of this process (fixed at the first call).
pub fn current() -> KernelSet {
    *SET.get_or_init(|| match std::env::var("DS4_KERNELS") {
        Ok(v) if !v.trim().is_empty() => match KernelSet::parse(&v) {
            Ok(set) => set,
            Err(e) => {
                tracing::warn!("DS4_KERNELS: {e}; running the {} set", KernelSet::DEFAULT);
                KernelSet::DEFAULT
            }
        },
        _ => KernelSet::DEFAULT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for set in [KernelSet::Reference, KernelSet::Fast] {
            assert_eq!(KernelSet::parse(set.name()), Ok(set));
        }
        assert!(matches!(
            KernelSet::parse("int4"),
            Err(KernelSetError::Unknown(_))
        ));
    }
}
