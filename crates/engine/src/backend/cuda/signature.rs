//! Kernel signatures parsed from the CUDA sources, so every launch is
//! checked against the parameters its kernel declares: a wrong argument
//! count or kind is a typed error instead of a kernel reading garbage.

use std::collections::HashMap;

use super::device::Arg;

/// How a kernel parameter is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Param {
    /// A device pointer or a `u64` size.
    U64,
    U32,
    I32,
    F32,
    /// The `Many` struct of `matmul.cu`, by value
    /// ([`super::device::Device::launch_many`]).
    Many,
    /// The `Fast8` struct of `fast8.cu`, by value
    /// ([`super::device::Device::launch_fast8`]).
    Fast8,
    /// The `GroupedF32` struct of `matmul.cu`, by value
    /// ([`super::device::Device::launch_grouped_f32`]).
    GroupedF32,
}

impl Param {
    fn of(ty: &str) -> Option<Self> {
        if ty.contains('*') {
            return Some(Param::U64);
        }
        match ty.trim() {
            "u64" => Some(Param::U64),
            "u32" => Some(Param::U32),
            "int" => Some(Param::I32),
            "float" => Some(Param::F32),
            "Many" => Some(Param::Many),
            "Fast8" => Some(Param::Fast8),
            "GroupedF32" => Some(Param::GroupedF32),
            _ => None,
        }
    }

    pub fn matches(self, a: &Arg) -> bool {
        matches!(
            (self, a),
            (Param::U64, Arg::U64(_))
                | (Param::U32, Arg::U32(_))
                | (Param::I32, Arg::I32(_))
                | (Param::F32, Arg::F32(_))
        )
    }
}

/// Every `extern "C" __global__ void name(…)` of `text`, by name. A
/// parameter of a type this backend does not pass is an error (it would be
/// unlaunchable).
pub(super) fn parse(text: &str) -> Result<HashMap<String, Vec<Param>>, String> {
    const MARK: &str = "extern \"C\" __global__ void ";
    let mut out = HashMap::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        rest = &rest[at + MARK.len()..];
        let open = rest.find('(').ok_or("a kernel without parameters")?;
        let close = rest.find(')').ok_or("an unclosed parameter list")?;
        let name = rest[..open].trim().to_string();
        let mut params = Vec::new();
        for p in rest[open + 1..close].split(',') {
            let p = p.trim();
            // The type is everything before the parameter's name.
            let cut = p
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .ok_or_else(|| format!("kernel `{name}`: parameter `{p}`"))?;
            let ty = &p[..=cut];
            params.push(
                Param::of(ty).ok_or_else(|| format!("kernel `{name}`: parameter type `{ty}`"))?,
            );
        }
        out.insert(name, params);
        rest = &rest[close..];
    }
    Ok(out)
}

/// Programmatic dependent launch is only sound when no kernel reads what
/// an earlier kernel wrote, or writes anything, before its wait
/// (`kernels/common.cuh`): every `extern "C" __global__` kernel's first
/// statement must be `dep_entry();`.
pub(super) fn check_waits(text: &str) -> Result<(), String> {
    const KERNEL: &str = "extern \"C\" __global__ void ";
    let mut rest = text;
    while let Some(at) = rest.find(KERNEL) {
        let name_at = at + KERNEL.len();
        let name = rest[name_at..]
            .split('(')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let close = name_at
            + rest[name_at..]
                .find(')')
                .ok_or("an unclosed parameter list")?;
        let open = close
            + rest[close..]
                .find('{')
                .ok_or_else(|| format!("kernel `{name}`: no body"))?;
        let after = &rest[open + 1..];
        if !after.trim_start().starts_with("dep_entry();") {
            return Err(format!(
                "kernel `{name}` does not begin with `dep_entry();`"
            ));
        }
        rest = after;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::SOURCES;

    #[test]
    fn every_embedded_kernel_has_a_passable_signature() {
        let text: String = SOURCES.iter().map(|(_, s)| *s).collect();
        let sigs = parse(&text).unwrap();
        assert!(sigs.len() >= 40, "{} kernels", sigs.len());
        assert_eq!(
            sigs["copy2d"],
            vec![Param::U64; 8],
            "pointers and sizes are u64"
        );
        assert_eq!(sigs["route_softmax_topk_f32"][5], Param::I32);
        assert_eq!(sigs["affine_f32"][2], Param::F32);
        assert_eq!(sigs["topk_select"][6], Param::U32);
        assert_eq!(sigs["matmul_q4_1_many"], vec![Param::Many]);
    }

    #[test]
    fn every_embedded_kernel_waits_before_its_work() {
        let text: String = SOURCES.iter().map(|(_, s)| *s).collect();
        check_waits(&text).unwrap();
    }

    #[test]
    fn kernels_that_can_skip_their_wait_are_refused() {
        let early = "extern \"C\" __global__ void k(u64 n) { if (n) return; dep_entry(); }";
        assert!(check_waits(early).unwrap_err().contains("`k`"));
        let good = "extern \"C\" __global__ void a(u64 n) { dep_entry(); if (n) return; }\n\
                    extern \"C\" __global__ void b(Many m) {\n    dep_entry();\n}";
        check_waits(good).unwrap();
    }

    #[test]
    fn unknown_parameter_types_are_refused() {
        let bad = "extern \"C\" __global__ void k(double x) {}";
        assert!(parse(bad).unwrap_err().contains("double"));
    }
}
