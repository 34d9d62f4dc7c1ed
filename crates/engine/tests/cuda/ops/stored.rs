//! Stored weight types kept as stored on the GPU (`backend/cuda/stored.rs`):
//! products, routed expert products and table rows, every type against the
//! CPU's reference (`CpuMatrix::Stored`: the f32 kernel over exactly
//! dequantized rows), bit for bit; rows independent of the window.

use std::sync::Arc;

use ds4_engine::backend::{Backend, CpuOps, CudaOps, Epilogue, HostWeight, Unary};
pub use ds4_engine::quant::random::STORED_TYPES as TYPES;
use ds4_engine::quant::random::random_stored;
use ds4_engine::quant::{QuantTensor, WeightType};

use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

/// Runs `body` for every type, each failure reported and the others still
/// run (one run on the GPU names every failing type); panics at the end
/// when any failed.
fn every_type(what: &str, mut body: impl FnMut(usize, WeightType)) {
    let mut failed = Vec::new();
    for (ti, ty) in TYPES.into_iter().enumerate() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(ti, ty)));
        println!("REPORT {what} type={ty} ok={}", r.is_ok());
        if r.is_err() {
            failed.push(ty);
        }
    }
    assert!(failed.is_empty(), "{what}: failing types {failed:?}");
}

/// Reduction lengths per type: a short one (one partial chunk; element
/// types with a tail below 8) and a long one (several chunks around the
/// kernel's ring of stages; element types with a tail).
fn lengths(ty: WeightType) -> [usize; 2] {
    match ty.block_len() {
        1 => [13, 2053],
        2 => [14, 3006],
        32 => [64, 2784],
        _ => [256, 3328],
    }
}

/// Products of 1, 2, 3, 5 and 17 rows against the CPU, bit for bit, for
/// every stored type, one part or two joined (the second part's scale grid
/// starting at its own row 0, inside a grid block of the joined rows); the
/// rows independent of the window; `matmul_unary` and `matmul_many` the
/// product's bits.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_stored_matmul_is_bit_identical_to_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    every_type("stored_matmul", |ti, ty| {
        for (li, k) in lengths(ty).into_iter().enumerate() {
            for (n, parts) in [(37, vec![37]), (70, vec![45, 25])] {
                let seed = 1000 + 10 * ti as u64 + li as u64 + n as u64;
                let q = HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &parts, seed)));
                let gm = g.matrix(q.clone(), n, k).unwrap();
                assert!(
                    format!("{gm:?}").contains("Stored"),
                    "{ty}: {gm:?} is not kept stored"
                );
                let cm = c.matrix(q, n, k).unwrap();
                let x = rnd(17 * k, seed + 1);
                for rows in [1usize, 2, 3, 5, 17] {
                    let xs = &x[..rows * k];
                    let gy = down(&g, &g.matmul(&up(&g, xs), rows, &gm).unwrap());
                    let cy = c.matmul(&xs.to_vec(), rows, &cm).unwrap();
                    check(
                        &format!("stored matmul {ty} [{n},{k}] parts {parts:?} x{rows}"),
                        &gy,
                        &cy,
                        0.0,
                        true,
                    );
                }
                rows_invariant(&format!("stored matmul {ty} [{n},{k}]"), 17, |r| {
                    down(
                        &g,
                        &g.matmul(&up(&g, &x[r.start * k..r.end * k]), r.len(), &gm)
                            .unwrap(),
                    )
                });
                if li == 0 && parts.len() == 1 {
                    // The fused forms fall back to the parts: same bits.
                    let x3 = up(&g, &x[..3 * k]);
                    let chain = [Unary::Affine(0.25, 0.0), Unary::Silu];
                    let p = g.matmul(&x3, 3, &gm).unwrap();
                    let want = down(&g, &g.unary_chain(&p, &chain).unwrap());
                    let got = down(&g, &g.matmul_unary(&x3, 3, &gm, &chain).unwrap());
                    assert_eq!(bits(&got), bits(&want), "{ty}: matmul_unary");
                    let many = g
                        .matmul_many(
                            &x3,
                            3,
                            &[(&gm, Epilogue::Chain(&[])), (&gm, Epilogue::Chain(&chain))],
                        )
                        .unwrap();
                    assert_eq!(bits(&down(&g, &many[0])), bits(&down(&g, &p)), "{ty}: many");
                    assert_eq!(bits(&down(&g, &many[1])), bits(&want), "{ty}: many chain");
                }
            }
        }
    });
}

/// Products of more outputs than the narrow kernels take (the wide
/// `st_matmul_*`: 129 column blocks of 32) on 1, 2 and 5 rows against the
/// CPU, bit for bit: one row runs the kernel's one-row tile loop, more rows
/// its 4-row tiles, with the same sums.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_stored_wide_matmul_is_bit_identical_to_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let n = 129 * 32;
    every_type("stored_wide_matmul", |ti, ty| {
        let k = lengths(ty)[0];
        let seed = 5000 + ti as u64;
        let q = HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &[n], seed)));
        let gm = g.matrix(q.clone(), n, k).unwrap();
        let cm = c.matrix(q, n, k).unwrap();
        let x = rnd(5 * k, seed + 1);
        for rows in [1usize, 2, 5] {
            let xs = &x[..rows * k];
            let gy = down(&g, &g.matmul(&up(&g, xs), rows, &gm).unwrap());
            let cy = c.matmul(&xs.to_vec(), rows, &cm).unwrap();
            check(
                &format!("stored wide matmul {ty} [{n},{k}] x{rows}"),
                &gy,
                &cy,
                0.0,
                true,
            );
        }
    });
}

/// F16 / BF16 products of prefill-sized row counts with k a multiple of 64
/// against the CPU, bit for bit: `st_rows_*` (register tiles of 32 outputs
/// × 32 rows a block, from 64 blocks: [300, k] × 200 rows, [1400, k] in
/// two parts × 100 and 200 rows; partial output and row tiles) and the
/// tile kernels split over grid.y (the smaller ones); rows independent of
/// the window (one row at a time and chunks run the tile kernels, so the
/// two kernels agree too).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_stored_many_rows_are_bit_identical_to_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    for (ti, ty) in [WeightType::F16, WeightType::BF16].into_iter().enumerate() {
        for k in [64usize, 4096] {
            for (n, parts) in [(37, vec![37]), (300, vec![300]), (1400, vec![900, 500])] {
                let seed = 7000 + 10 * ti as u64 + k as u64 + n as u64;
                let q = HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &parts, seed)));
                let gm = g.matrix(q.clone(), n, k).unwrap();
                let cm = c.matrix(q, n, k).unwrap();
                let x = rnd(200 * k, seed + 1);
                for rows in [16usize, 33, 100, 200] {
                    let xs = &x[..rows * k];
                    let gy = down(&g, &g.matmul(&up(&g, xs), rows, &gm).unwrap());
                    let cy = c.matmul(&xs.to_vec(), rows, &cm).unwrap();
                    check(
                        &format!("stored rows {ty} [{n},{k}] parts {parts:?} x{rows}"),
                        &gy,
                        &cy,
                        0.0,
                        true,
                    );
                }
                rows_invariant(&format!("stored rows {ty} [{n},{k}]"), 200, |r| {
                    down(
                        &g,
                        &g.matmul(&up(&g, &x[r.start * k..r.end * k]), r.len(), &gm)
                            .unwrap(),
                    )
                });
            }
        }
        println!("REPORT stored_rows type={ty} ok=true");
    }
}

/// Gate/up `[E, 2I, H]` and down `[E, H, I]` stacks of `ty`, each expert a
/// part of its own (its own scale grid), on both backends; and each
/// expert's matrices alone on the GPU.
pub(crate) struct Stacks {
    pub ggu: <CudaOps as Backend>::Experts,
    pub gdn: <CudaOps as Backend>::Experts,
    pub cgu: <CpuOps as Backend>::Experts,
    pub cdn: <CpuOps as Backend>::Experts,
    pub gu_each: Vec<<CudaOps as Backend>::Matrix>,
    pub dn_each: Vec<<CudaOps as Backend>::Matrix>,
}

fn stacks(ty: WeightType, e: usize, h: usize, inter: usize, seed: u64) -> Stacks {
    stacks_on(&gpu(), ty, e, h, inter, seed)
}

/// [`Stacks`] with the GPU side on `g` (either kernel set).
pub(crate) fn stacks_on(
    g: &CudaOps,
    ty: WeightType,
    e: usize,
    h: usize,
    inter: usize,
    seed: u64,
) -> Stacks {
    let c = CpuOps;
    let gu = random_stored(ty, &[e, 2 * inter, h], &vec![2 * inter; e], seed);
    let dn = random_stored(ty, &[e, h, inter], &vec![h; e], seed + 1);
    let each = |q: &QuantTensor, out: usize, inp: usize| -> Vec<_> {
        (0..e)
            .map(|i| {
                let m = q.row_range(i * out, (i + 1) * out);
                g.matrix(HostWeight::Quant(Arc::new(m)), out, inp).unwrap()
            })
            .collect()
    };
    let (gu_each, dn_each) = (each(&gu, 2 * inter, h), each(&dn, h, inter));
    let (gu, dn) = (
        HostWeight::Quant(Arc::new(gu)),
        HostWeight::Quant(Arc::new(dn)),
    );
    Stacks {
        ggu: g.experts(gu.clone(), e, 2 * inter, h).unwrap(),
        gdn: g.experts(dn.clone(), e, h, inter).unwrap(),
        cgu: c.experts(gu, e, 2 * inter, h).unwrap(),
        cdn: c.experts(dn, e, h, inter).unwrap(),
        gu_each,
        dn_each,
    }
}

/// `[got, want]` for `top` of `e` experts a row routed by softmax over
/// `logits`: `experts_swiglu` over the stacks, and [`expert_products`]
/// from each expert's own matrices (no limit).
pub(crate) fn routed_and_expert_products(
    g: &CudaOps,
    s: &Stacks,
    x: &[f32],
    logits: &[f32],
    (rows, e, top, h, inter): (usize, usize, usize, usize, usize),
) -> [Vec<f32>; 2] {
    let route = g
        .route_softmax_topk(&up(g, logits), rows, e, top, true)
        .unwrap();
    let (chosen, weights) = g.routing_to_host(&route).unwrap();
    let got = down(
        g,
        &g.experts_swiglu(&up(g, x), rows, &route, &s.ggu, &s.gdn, None)
            .unwrap(),
    );
    let want = expert_products(g, s, x, (rows, h, inter, top), &chosen, &weights, None);
    [got, want]
}

/// The routed SwiGLU output `[rows, h]` made from each expert's own
/// matrices on `g`, one (token, slot) at a time: `matmul`, `swiglu`,
/// `matmul`, and the slots' outputs times their weights added in slot order
/// on the host (`chosen`, `weights`: `top` a row).
#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_products(
    g: &CudaOps,
    s: &Stacks,
    x: &[f32],
    (rows, h, inter, top): (usize, usize, usize, usize),
    chosen: &[usize],
    weights: &[f32],
    limit: Option<f32>,
) -> Vec<f32> {
    let mut want = vec![0f32; rows * h];
    for t in 0..rows {
        let xt = up(g, &x[t * h..(t + 1) * h]);
        for slot in 0..top {
            let ex = chosen[t * top + slot];
            let gu = g.matmul(&xt, 1, &s.gu_each[ex]).unwrap();
            let act = g.swiglu(&gu, inter, limit).unwrap();
            let y = down(g, &g.matmul(&act, 1, &s.dn_each[ex]).unwrap());
            let w = weights[t * top + slot];
            for (o, v) in want[t * h..(t + 1) * h].iter_mut().zip(&y) {
                *o += w * v;
            }
        }
    }
    want
}

/// Routed SwiGLU experts over stored stacks: every (token, slot) projection
/// has the bits of a GPU `matmul` by that expert's matrix (which the test
/// above holds to the CPU's bits), so the output equals those products,
/// `swiglu` and the slots summed in order on the host, bit for bit; against
/// the CPU within the SiLU's `exp` (1e-5, as the f32 experts); rows
/// independent of the window.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_stored_experts_are_their_expert_products() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, e, k) = (5, 4, 2);
    every_type("stored_experts", |ti, ty| {
        let (h, inter) = match ty.block_len() {
            256 => (512, 256),
            _ => (160, 96),
        };
        let s = stacks(ty, e, h, inter, 500 + 7 * ti as u64);
        let x: Vec<f32> = rnd(rows * h, 52).iter().map(|v| 3.0 * v).collect();
        let logits = rnd(rows * e, 53);
        for limit in [None, Some(0.75f32)] {
            let groute = g
                .route_softmax_topk(&up(&g, &logits), rows, e, k, true)
                .unwrap();
            let croute = c.route_softmax_topk(&logits, rows, e, k, true).unwrap();
            let (chosen, weights) = g.routing_to_host(&groute).unwrap();
            assert_eq!(chosen, croute.experts);
            let gy = down(
                &g,
                &g.experts_swiglu(&up(&g, &x), rows, &groute, &s.ggu, &s.gdn, limit)
                    .unwrap(),
            );
            // The same from each expert's own matrices, one pair at a time.
            let want = expert_products(&g, &s, &x, (rows, h, inter, k), &chosen, &weights, limit);
            let what = format!(
                "stored experts {ty} [{e},{},{h}] limit {limit:?}",
                2 * inter
            );
            assert_eq!(bits(&gy), bits(&want), "{what}: not its expert products");
            let cy = c
                .experts_swiglu(&x, rows, &croute, &s.cgu, &s.cdn, limit)
                .unwrap();
            check(&what, &gy, &cy, 1e-5, false);
            rows_invariant(&what, rows, |r| {
                let l = &logits[r.start * e..r.end * e];
                let route = g
                    .route_softmax_topk(&up(&g, l), r.len(), e, k, true)
                    .unwrap();
                down(
                    &g,
                    &g.experts_swiglu(
                        &up(&g, &x[r.start * h..r.end * h]),
                        r.len(),
                        &route,
                        &s.ggu,
                        &s.gdn,
                        limit,
                    )
                    .unwrap(),
                )
            });
        }
    });
}

/// Table rows of every stored type (a stored embedding), dequantized on
/// the device: the CPU's rows bit for bit (repeats, the first and last
/// rows, an element type's tail); an id past the table is refused.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_stored_tables_are_the_cpu_rows() {
    let (g, c) = (gpu(), CpuOps);
    every_type("stored_tables", |ti, ty| {
        let (v, width) = (50, lengths(ty)[1]);
        let q = HostWeight::Quant(Arc::new(random_stored(
            ty,
            &[v, width],
            &[30, 20],
            900 + ti as u64,
        )));
        let gt = g.table(q.clone(), v, width).unwrap();
        let ct = c.table(q, v, width).unwrap();
        let ids = [0u32, 49, 7, 7, 31, 29, 30];
        let got = down(&g, &g.gather_rows(&gt, &ids).unwrap());
        let want = c.gather_rows(&ct, &ids).unwrap();
        check(
            &format!("stored table {ty} [{v},{width}]"),
            &got,
            &want,
            0.0,
            true,
        );
        assert!(
            g.gather_rows(&gt, &[50]).is_err(),
            "{ty}: an id past the table"
        );
    });
}

/// The tests' random stored tensors are valid (every type, joined parts,
/// scale grids) and give finite CPU products and rows: runs without a GPU.
#[test]
fn random_stored_tensors_are_valid_on_the_cpu() {
    let c = CpuOps;
    for (ti, ty) in TYPES.into_iter().enumerate() {
        for k in lengths(ty) {
            let q = random_stored(ty, &[70, k], &[45, 25], ti as u64);
            assert_eq!(q.parts.len(), 2, "{ty}");
            let m = c.matrix(HostWeight::Quant(Arc::new(q)), 70, k).unwrap();
            let y = c.matmul(&rnd(3 * k, 5), 3, &m).unwrap();
            assert!(y.iter().all(|v| v.is_finite()), "{ty} k={k}");
            assert!(y.iter().any(|&v| v != 0.0), "{ty} k={k}");
        }
    }
}
