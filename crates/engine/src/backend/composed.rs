//! The fused ops of the inventory as their parts, one op after another: the
//! default of each ([`Backend`]'s provided methods), and what a device runs
//! for the calls it does not fuse (a prefill chunk, say), so a fused op's
//! definition is written once.

use super::{Backend, CausalPart, Epilogue, ScanDims, ScanPart};
use crate::error::{EngineError, Result};

/// [`Backend::matmul_many`] part by part: each product with its epilogue.
pub fn matmul_many<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    parts: &[(&B::Matrix, Epilogue<'_>)],
) -> Result<Vec<B::Buf>> {
    parts
        .iter()
        .map(|&(w, then)| match then {
            Epilogue::Chain(chain) => ops.matmul_unary(x, rows, w, chain),
            Epilogue::Swiglu(_) => epilogue(ops, ops.matmul(x, rows, w)?, rows, then),
        })
        .collect()
}

/// [`Backend::matmul_grouped`] as its parts: the groups' columns split
/// off, each multiplied, the products joined.
pub fn matmul_grouped<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    parts: &[&B::Matrix],
) -> Result<B::Buf> {
    let g = parts.len();
    let len = ops.len(x);
    if g == 0 || rows == 0 || !len.is_multiple_of(rows * g) {
        return if len == 0 && rows == 0 {
            ops.zeros(0)
        } else {
            Err(crate::error::EngineError::State(format!(
                "matmul_grouped: {len} values are not {rows} rows of {g} groups"
            )))
        };
    }
    let k = len / (rows * g);
    let xs = ops.split_cols(x, rows, &vec![k; g], 1)?;
    let ys = xs
        .iter()
        .zip(parts)
        .map(|(xi, w)| ops.matmul(xi, rows, w))
        .collect::<Result<Vec<_>>>()?;
    let cat: Vec<(&B::Buf, usize)> = ys.iter().map(|y| (y, ops.len(y) / rows)).collect();
    ops.concat_cols(&cat, rows)
}

/// [`Backend::attention_causal_batch`] (and its f16 twin) one part after
/// another: `one` per part, the outputs appended in order.
pub fn part_by_part<B: Backend, K>(
    ops: &B,
    parts: &[CausalPart<'_, B::Buf, K>],
    one: impl Fn(&CausalPart<'_, B::Buf, K>) -> Result<B::Buf>,
) -> Result<B::Buf> {
    let mut y = ops.zeros(0)?;
    for p in parts {
        ops.append(&mut y, &one(p)?)?;
    }
    Ok(y)
}

/// What [`Backend::matmul_many`] does to a part's product `y` (`rows`
/// rows): its unary chain (none: `y` itself), or the SwiGLU of its `[gate
/// | up]` columns.
pub fn epilogue<B: Backend>(ops: &B, y: B::Buf, rows: usize, then: Epilogue<'_>) -> Result<B::Buf> {
    match then {
        Epilogue::Chain([]) => Ok(y),
        Epilogue::Chain(chain) => ops.unary_chain(&y, chain),
        Epilogue::Swiglu(limit) => {
            let inter = ops.len(&y) / (2 * rows.max(1));
            ops.swiglu(&y, inter, limit)
        }
    }
}

/// [`Backend::delta_inputs`] by its parts.
#[allow(clippy::too_many_arguments)]
pub fn delta_inputs<B: Backend>(
    ops: &B,
    d: ScanDims,
    u: &B::Buf,
    window: &mut B::Buf,
    w: &B::Buf,
    kernel: usize,
    q_scale: f32,
    a: &B::Buf,
    neg_a: &B::Buf,
    dt_bias: &B::Buf,
) -> Result<[B::Buf; 4]> {
    let (kd, vd) = (d.hk * d.dk, d.hv * d.dv);
    let channels = 2 * kd + vd;
    let c = ops.causal_conv_silu(u, window, w, channels, kernel, 1)?;
    let rows = ops.len(&c) / channels;
    let [q, k, v]: [B::Buf; 3] = ops
        .split_cols(&c, rows, &[kd, kd, vd], 1)?
        .try_into()
        .map_err(|_| EngineError::State("delta_inputs: split_cols gave other parts".into()))?;
    let (mut q, mut k) = (q, k);
    ops.l2_norm_heads(&mut q, d.dk, q_scale)?;
    ops.l2_norm_heads(&mut k, d.dk, 1.0)?;
    let g = ops.softplus_decay(a, neg_a, dt_bias)?;
    Ok([q, k, v, g])
}

/// [`Backend::delta_rule_scan_parts`] part by part: each part's scan,
/// the outputs one after another.
pub fn delta_rule_scan_parts<B: Backend>(
    ops: &B,
    d: ScanDims,
    parts: &mut [ScanPart<'_, B::Buf>],
) -> Result<B::Buf> {
    let os = parts
        .iter_mut()
        .map(|p| ops.delta_rule_scan(d, p.q, p.k, p.v, p.g, p.beta, p.s))
        .collect::<Result<Vec<_>>>()?;
    if os.is_empty() {
        return Err(EngineError::State("delta_rule_scan_parts: no parts".into()));
    }
    ops.concat_rows(os, d.hv * d.dv)
}

/// [`Backend::inject_streams_norm`] by its parts.
#[allow(clippy::too_many_arguments)]
pub fn inject_streams_norm<B: Backend>(
    ops: &B,
    xs: &B::Buf,
    y: &B::Buf,
    inj: &B::Buf,
    c: usize,
    scale: &B::Buf,
    eps: f64,
) -> Result<[B::Buf; 2]> {
    let out = ops.inject_streams(xs, y, inj, c)?;
    let width = ops.len(scale);
    let n = ops.rms_norm_grouped(&out, width, width / c.max(1), scale, eps)?;
    Ok([out, n])
}

/// [`Backend::rms_matmul`]'s two ops.
pub fn rms_matmul<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    ones: &B::Buf,
    w: &B::Matrix,
    eps: f32,
) -> Result<B::Buf> {
    let f = ops.rms_norm(x, ops.len(ones), ones, eps)?;
    ops.matmul(&f, rows, w)
}

/// `all` cut into consecutive parts of `lens[i]` values each
/// ([`Backend::download_parts`]); the lengths must add up to `all`'s.
pub fn split_parts(all: &[f32], lens: &[usize]) -> Result<Vec<Vec<f32>>> {
    if lens.iter().sum::<usize>() != all.len() {
        return Err(EngineError::State(format!(
            "parts of {} values in all from {} values",
            lens.iter().sum::<usize>(),
            all.len()
        )));
    }
    let mut at = 0;
    Ok(lens
        .iter()
        .map(|&n| {
            at += n;
            all[at - n..at].to_vec()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::split_parts;

    #[test]
    fn parts_are_cut_in_order_and_must_add_up() {
        let all: Vec<f32> = (0..7).map(|i| i as f32).collect();
        let parts = split_parts(&all, &[2, 0, 4, 1]).unwrap();
        assert_eq!(
            parts,
            [vec![0.0, 1.0], vec![], vec![2.0, 3.0, 4.0, 5.0], vec![6.0]]
        );
        assert!(split_parts(&all, &[2, 4]).is_err());
        assert!(split_parts(&all, &[8]).is_err());
    }
}
