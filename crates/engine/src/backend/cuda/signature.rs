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

/// A kernel as its source declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Signature {
    pub params: Vec<Param>,
    /// The threads a block may have at most, where the kernel declares
    /// `__launch_bounds__(threads, …)`: the compiler allocates its registers
    /// for that many, so a launch of more would fail in the driver.
    pub max_threads: Option<u32>,
}

const KERNEL: &str = "extern \"C\" __global__ void ";
const BOUNDS: &str = "__launch_bounds__(";

/// One kernel's head: its name, its launch bound, its parameter list and
/// the text from that list's `)` on.
struct Head<'a> {
    name: String,
    max_threads: Option<u32>,
    params: &'a str,
    rest: &'a str,
}

/// The kernel head at the start of `text` (just past [`KERNEL`]):
/// `[__launch_bounds__(threads[, blocks])] name(params)`. The bound must be
/// integer literals, so the launcher can check it.
fn head(text: &str) -> Result<Head<'_>, String> {
    let (max_threads, text) = match text.trim_start().strip_prefix(BOUNDS) {
        Some(after) => {
            let close = after.find(')').ok_or("an unclosed `__launch_bounds__`")?;
            let threads = after[..close].split(',').next().unwrap_or("").trim();
            let threads = threads.parse::<u32>().map_err(|_| {
                format!(
                    "`__launch_bounds__({})`: threads must be a literal",
                    &after[..close]
                )
            })?;
            (Some(threads), &after[close + 1..])
        }
        None => (None, text),
    };
    let open = text.find('(').ok_or("a kernel without parameters")?;
    let close = text.find(')').ok_or("an unclosed parameter list")?;
    if close < open {
        return Err(format!("a kernel head `{}`", &text[..close]));
    }
    Ok(Head {
        name: text[..open].trim().to_string(),
        max_threads,
        params: &text[open + 1..close],
        rest: &text[close..],
    })
}

/// Every `extern "C" __global__ void [__launch_bounds__(…)] name(…)` of
/// `text`, by name. A parameter of a type this backend does not pass is an
/// error (it would be unlaunchable).
pub(super) fn parse(text: &str) -> Result<HashMap<String, Signature>, String> {
    let mut out = HashMap::new();
    let mut rest = text;
    while let Some(at) = rest.find(KERNEL) {
        let h = head(&rest[at + KERNEL.len()..])?;
        let mut params = Vec::new();
        for p in h.params.split(',') {
            let p = p.trim();
            // The type is everything before the parameter's name.
            let cut = p
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .ok_or_else(|| format!("kernel `{}`: parameter `{p}`", h.name))?;
            let ty = &p[..=cut];
            params.push(
                Param::of(ty)
                    .ok_or_else(|| format!("kernel `{}`: parameter type `{ty}`", h.name))?,
            );
        }
        out.insert(
            h.name,
            Signature {
                params,
                max_threads: h.max_threads,
            },
        );
        rest = h.rest;
    }
    Ok(out)
}

/// Programmatic dependent launch is only sound when no kernel reads what
/// an earlier kernel wrote, or writes anything, before its wait
/// (`kernels/common.cuh`): every `extern "C" __global__` kernel's first
/// statement must be `dep_entry();`.
pub(super) fn check_waits(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(at) = rest.find(KERNEL) {
        let h = head(&rest[at + KERNEL.len()..])?;
        let open = h
            .rest
            .find('{')
            .ok_or_else(|| format!("kernel `{}`: no body", h.name))?;
        let after = &h.rest[open + 1..];
        if !after.trim_start().starts_with("dep_entry();") {
            return Err(format!(
                "kernel `{}` does not begin with `dep_entry();`",
                h.name
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
            sigs["copy2d"].params,
            vec![Param::U64; 8],
            "pointers and sizes are u64"
        );
        assert_eq!(sigs["route_softmax_topk_f32"].params[5], Param::I32);
        assert_eq!(sigs["affine_f32"].params[2], Param::F32);
        assert_eq!(sigs["topk_select"].params[6], Param::U32);
        assert_eq!(sigs["matmul_q4_1_many"].params, vec![Param::Many]);
        assert_eq!(sigs["copy2d"].max_threads, None);
    }

    #[test]
    fn launch_bounds_are_read_and_must_be_literals() {
        let text = "extern \"C\" __global__ void __launch_bounds__(256, 1) k(float* y, u64 n) {\n    dep_entry();\n}\n\
                    extern \"C\" __global__ void plain(u32 n) { dep_entry(); }";
        let sigs = parse(text).unwrap();
        assert_eq!(
            sigs["k"],
            Signature {
                params: vec![Param::U64, Param::U64],
                max_threads: Some(256)
            }
        );
        assert_eq!(sigs["plain"].max_threads, None);
        check_waits(text).unwrap();
        let named = "extern \"C\" __global__ void __launch_bounds__(WARPS * 32) k(u64 n) {}";
        assert!(parse(named).unwrap_err().contains("literal"));
        let early = "extern \"C\" __global__ void __launch_bounds__(128) k(u64 n) { return; }";
        assert!(check_waits(early).unwrap_err().contains("`k`"));
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
