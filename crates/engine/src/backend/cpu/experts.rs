//! Routed experts on the CPU: tokens grouped per expert, one
//! row-independent matmul per expert and projection, then each token's `k`
//! expert outputs summed in slot order, so a token's result depends on its
//! own row only.

use super::f32_matmul::{matmul, matmul_filled};
use crate::quant::QuantTensor;

/// One projection's stack of expert matrices `[E, out, in]`: f32, or kept
/// stored and dequantized a strip at a time inside each product (the same
/// bits as the f32 stack: [`matmul_filled`]); in the fast kernel set the
/// types of [`super::kq8_matmul`] run its int8 product instead.
#[derive(Clone, Copy)]
pub enum Stack<'a> {
    F32(&'a [f32]),
    Stored(&'a QuantTensor),
}

impl Stack<'_> {
    /// `y[n, out] = x[n, in] · W_eᵀ`.
    fn matmul(self, e: usize, x: &[f32], n: usize, out: usize, inp: usize, y: &mut [f32]) {
        match self {
            Stack::F32(w) => matmul(x, n, &w[e * out * inp..(e + 1) * out * inp], out, inp, y),
            // The fast set's int8 product for the types it covers (each
            // expert's rows read in place, the same bits for any window).
            Stack::Stored(q)
                if crate::backend::kernel_set::current() == crate::backend::KernelSet::Fast
                    && super::kq8_matmul::supports(q) =>
            {
                super::kq8_matmul::matmul_rows(q, e * out, out, x, n, y)
            }
            Stack::Stored(q) => matmul_filled(x, n, out, inp, y, &|j0, j1, w| {
                q.dequantize_rows(e * out + j0, e * out + j1, w)
            }),
        }
    }
}

/// Told each expert's gathered rows and its down projection's input.
pub type SeenRows<'a> = &'a dyn Fn(usize, &[f32], &[f32]);

/// `silu(g)·u`, or `silu(min(g, L))·clamp(u, −L, L)` with a limit.
#[inline]
pub fn swiglu(g: f32, u: f32, limit: Option<f32>) -> f32 {
    let (g, u) = match limit {
        Some(l) => (g.min(l), u.clamp(-l, l)),
        None => (g, u),
    };
    g / (1.0 + (-g).exp()) * u
}

/// The stacks of experts `first..first + count` (global ids; the stacks
/// index them from 0).
#[derive(Clone, Copy)]
pub struct Owned<'a> {
    pub gate_up: Stack<'a>,
    pub down: Stack<'a>,
    pub first: usize,
    pub count: usize,
}

/// Routed experts, `out[t] = Σ_k w[t,k]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t)`,
/// are [`sum_slots`] over these slot outputs (`CpuOps::experts_swiglu`).
///
/// The unweighted output of every slot whose expert `owned` holds,
/// `[T·k, H]` (slot `j` = token `j / k`'s `(j % k)`-th expert), every other
/// slot zero: each owned expert runs once over its routed rows.
#[allow(clippy::too_many_arguments)] // a kernel over flat slices
pub fn slot_outputs(
    x: &[f32],
    experts: &[usize],
    top_k: usize,
    owned: Owned<'_>,
    h: usize,
    inter: usize,
    limit: Option<f32>,
    seen: Option<SeenRows<'_>>,
) -> Vec<f32> {
    let slots = experts.len();
    debug_assert_eq!(slots * h, x.len() * top_k);
    let mut ys = vec![0f32; slots * h];
    let (mut idx, mut xs, mut gu, mut act, mut y) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for local in 0..owned.count {
        let e = owned.first + local;
        idx.clear();
        idx.extend((0..slots).filter(|&j| experts[j] == e));
        if idx.is_empty() {
            continue;
        }
        let n = idx.len();
        xs.clear();
        for &j in &idx {
            let t = j / top_k;
            xs.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        gu.resize(n * 2 * inter, 0.0);
        owned.gate_up.matmul(local, &xs, n, 2 * inter, h, &mut gu);
        act.resize(n * inter, 0.0);
        for (a, g) in act.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
            let (g, u) = g.split_at(inter);
            for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                *a = swiglu(g, u, limit);
            }
        }
        if let Some(seen) = seen {
            seen(e, &xs, &act);
        }
        y.resize(n * h, 0.0);
        owned.down.matmul(local, &act, n, h, inter, &mut y);
        for (&j, yr) in idx.iter().zip(y.chunks_exact(h)) {
            ys[j * h..(j + 1) * h].copy_from_slice(yr);
        }
    }
    ys
}

/// `out[t] = Σ_k w[t,k]·ys[t·k + k]`, slots added in order from 0
/// (`o = 0; o += w·y`): `ys: [T·k, H]` → `[T, H]`.
pub fn sum_slots(ys: &[f32], weights: &[f32], top_k: usize, h: usize) -> Vec<f32> {
    let tokens = weights.len() / top_k.max(1);
    let mut out = vec![0f32; tokens * h];
    for (t, o) in out.chunks_exact_mut(h).enumerate() {
        for j in t * top_k..(t + 1) * top_k {
            let w = weights[j];
            for (o, &v) in o.iter_mut().zip(&ys[j * h..(j + 1) * h]) {
                *o += w * v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: f32) -> Vec<f32> {
        (0..len).map(|i| ((i as f32) * 0.13 + seed).sin()).collect()
    }

    /// The routed experts of one call: every slot, then the sum (what
    /// `CpuOps::experts_swiglu` runs).
    #[allow(clippy::too_many_arguments)]
    fn expert_gather(
        x: &[f32],
        experts: &[usize],
        weights: &[f32],
        top_k: usize,
        gate_up: Stack<'_>,
        down: Stack<'_>,
        n_experts: usize,
        h: usize,
        inter: usize,
        limit: Option<f32>,
    ) -> Vec<f32> {
        let owned = Owned {
            gate_up,
            down,
            first: 0,
            count: n_experts,
        };
        let ys = slot_outputs(x, experts, top_k, owned, h, inter, limit, None);
        sum_slots(&ys, weights, top_k, h)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A token's routed-expert output does not depend on which other
    /// tokens share the call (and so share its experts' matmuls).
    #[test]
    fn expert_gather_rows_are_window_independent() {
        let (e, h, inter, k, total) = (5, 24, 11, 2, 33);
        let gu = data(e * 2 * inter * h, 1.0);
        let dn = data(e * h * inter, 2.0);
        let x = data(total * h, 3.0);
        let experts: Vec<usize> = (0..total * k).map(|j| (j * 7 + j / k) % e).collect();
        let weights: Vec<f32> = (0..total * k).map(|j| 0.3 + 0.1 * (j % 5) as f32).collect();
        let call = |a: usize, b: usize| {
            expert_gather(
                &x[a * h..b * h],
                &experts[a * k..b * k],
                &weights[a * k..b * k],
                k,
                Stack::F32(&gu),
                Stack::F32(&dn),
                e,
                h,
                inter,
                None,
            )
        };
        let alone: Vec<Vec<u32>> = (0..total).map(|t| bits(&call(t, t + 1))).collect();
        for m in [1, 2, 3, 8, 9, 33] {
            for start in [0, total - m, (total - m) / 2] {
                let y = call(start, start + m);
                for (i, row) in y.chunks_exact(h).enumerate() {
                    assert_eq!(bits(row), alone[start + i], "window {m} at {start}");
                }
            }
        }
    }

    /// A stored stack gives the bits of its dequantized f32 stack, for any
    /// window.
    #[test]
    fn stored_experts_equal_their_dequantized_f32_stack() {
        use crate::quant::{QuantTensor, WeightBytes, WeightType};
        let (e, h, inter, k, total) = (3, 64, 32, 2, 9);
        // Q8_0 blocks with varied scales and quants.
        let q8 = |rows: usize, cols: usize, seed: u32| {
            let mut b = Vec::new();
            for i in 0..rows * cols / 32 {
                let d = half::f16::from_f32(0.01 + 0.003 * ((i as u32 * 7 + seed) % 11) as f32);
                b.extend_from_slice(&d.to_le_bytes());
                b.extend((0..32u32).map(|j| ((j * 37 + i as u32 * 13 + seed) % 255) as u8));
            }
            QuantTensor::new(
                WeightType::Q8_0,
                vec![e, rows / e, cols],
                WeightBytes::owned(b),
                None,
            )
            .unwrap()
        };
        let gu = q8(e * 2 * inter, h, 1);
        let dn = q8(e * h, inter, 2);
        let (guf, dnf) = (gu.to_f32_vec(), dn.to_f32_vec());
        let x = data(total * h, 3.0);
        let experts: Vec<usize> = (0..total * k).map(|j| (j * 5 + 1) % e).collect();
        let weights: Vec<f32> = (0..total * k).map(|j| 0.2 + 0.1 * (j % 3) as f32).collect();
        for m in [1, 2, 9] {
            let run = |a: Stack<'_>, b: Stack<'_>| {
                expert_gather(
                    &x[..m * h],
                    &experts[..m * k],
                    &weights[..m * k],
                    k,
                    a,
                    b,
                    e,
                    h,
                    inter,
                    Some(7.0),
                )
            };
            let stored = run(Stack::Stored(&gu), Stack::Stored(&dn));
            let f32s = run(Stack::F32(&guf), Stack::F32(&dnf));
            assert_eq!(bits(&stored), bits(&f32s), "{m} rows");
        }
    }
}
