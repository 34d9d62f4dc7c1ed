//! Matrix products and routed experts.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use ds4_engine::backend::cpu::block_matmul::isa;
use ds4_engine::backend::{Backend, CpuOps, CudaOps, HostWeight};

use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

/// f32 weights: the kernel runs the CPU's 8-lane sequence, so every bit
/// matches; n and k leave partial column groups and a tail below 8.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_f32_is_bit_identical_to_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    for (rows, n, k) in [(9, 300, 1029), (1, 37, 45), (5, 64, 8)] {
        let w = Tensor::from_vec(rnd(n * k, 20), (n, k), &Device::Cpu).unwrap();
        let x = rnd(rows * k, 21);
        let gm = g.matrix(HostWeight::F32(w.clone()), n, k).unwrap();
        let cm = c.matrix(HostWeight::F32(w), n, k).unwrap();
        let gy = down(&g, &g.matmul(&up(&g, &x), rows, &gm).unwrap());
        check(
            &format!("matmul f32 [{n},{k}]x{rows}"),
            &gy,
            &c.matmul(&x, rows, &cm).unwrap(),
            0.0,
            true,
        );
        if rows >= 3 {
            rows_invariant("matmul f32", rows, |r| {
                down(
                    &g,
                    &g.matmul(&up(&g, &x[r.start * k..r.end * k]), r.len(), &gm)
                        .unwrap(),
                )
            });
        }
    }
    assert!(
        g.matmul(
            &up(&g, &[1.0; 7]),
            1,
            &g.matrix(
                HostWeight::F32(
                    Tensor::zeros((2, 8), candle_core::DType::F32, &Device::Cpu).unwrap()
                ),
                2,
                8
            )
            .unwrap()
        )
        .is_err()
    );
}

/// Q8_0 / Q4_1: the dequantized weights times f32 activations in the GPU's
/// order (a warp per row), within f32 rounding of the CPU's order.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_blocks_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    println!("REPORT cpu_block_kernels={:?}", isa());
    // k = 608: 19 blocks (eight-lane minima plus a tail of 3); k = 4192:
    // 131 blocks, few output rows (the split kernel: eight warps per row,
    // steps not a multiple of eight warps). "One row at a time" runs the
    // one-row kernels, the whole call the several-row ones: bit for bit;
    // n = 4098 runs them over many blocks of warps.
    for (rows, n, k) in [(7, 70, 608), (6, 5, 4192), (4, 4098, 608)] {
        blocks_at(&g, &c, rows, n, k);
    }
}

fn blocks_at(g: &CudaOps, c: &CpuOps, rows: usize, n: usize, k: usize) {
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
        let t = Tensor::from_vec(rnd(n * k, 30), (n, k), &Device::Cpu).unwrap();
        let q = HostWeight::Quant(Arc::new(
            ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap()).unwrap(),
        ));
        let gm = g.matrix(q.clone(), n, k).unwrap();
        let cm = c.matrix(q, n, k).unwrap();
        let x = rnd(rows * k, 31);
        let gy = down(g, &g.matmul(&up(g, &x), rows, &gm).unwrap());
        check(
            &format!("matmul {dtype:?} k={k}"),
            &gy,
            &c.matmul(&x, rows, &cm).unwrap(),
            1e-5,
            false,
        );
        rows_invariant(&format!("matmul {dtype:?} k={k}"), rows, |r| {
            down(
                g,
                &g.matmul(&up(g, &x[r.start * k..r.end * k]), r.len(), &gm)
                    .unwrap(),
            )
        });
    }
}

/// Routed SwiGLU experts (plain and clamped): the projections are the f32
/// products, so only the SiLU's exp differs from the CPU.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_experts_swiglu_matches_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, e, k, h, inter) = (9, 6, 2, 40, 24);
    let gu = Tensor::from_vec(rnd(e * 2 * inter * h, 40), (e, 2 * inter, h), &Device::Cpu).unwrap();
    let dn = Tensor::from_vec(rnd(e * h * inter, 41), (e, h, inter), &Device::Cpu).unwrap();
    let (ggu, gdn) = (
        g.experts(HostWeight::F32(gu.clone()), e, 2 * inter, h)
            .unwrap(),
        g.experts(HostWeight::F32(dn.clone()), e, h, inter).unwrap(),
    );
    let (cgu, cdn) = (
        c.experts(HostWeight::F32(gu), e, 2 * inter, h).unwrap(),
        c.experts(HostWeight::F32(dn), e, h, inter).unwrap(),
    );
    let x: Vec<f32> = rnd(rows * h, 42).iter().map(|v| 3.0 * v).collect();
    let logits = rnd(rows * e, 43);
    for limit in [None, Some(0.5f32)] {
        let groute = g
            .route_softmax_topk(&up(&g, &logits), rows, e, k, true)
            .unwrap();
        let croute = c.route_softmax_topk(&logits, rows, e, k, true).unwrap();
        assert_eq!(g.routing_to_host(&groute).unwrap().0, croute.experts);
        let gy = down(
            &g,
            &g.experts_swiglu(&up(&g, &x), rows, &groute, &ggu, &gdn, limit)
                .unwrap(),
        );
        let cy = c
            .experts_swiglu(&x, rows, &croute, &cgu, &cdn, limit)
            .unwrap();
        check(
            &format!("experts_swiglu limit {limit:?}"),
            &gy,
            &cy,
            1e-5,
            false,
        );
        rows_invariant("experts_swiglu", rows, |r| {
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
                    &ggu,
                    &gdn,
                    limit,
                )
                .unwrap(),
            )
        });
    }
}

/// Block-quantized expert stacks: synthetic Q4_1 stacks generated on the
/// device (`load::synthetic`, the host's bytes) against the CPU, which
/// dequantizes them to f32; and every routed product is a row of the block
/// GEMV of that expert's matrix (the same order), bit for bit.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_block_experts_match_the_cpu() {
    use ds4_engine::load::synthetic::{SyntheticWeight, tensor_seed};
    let (g, c) = (gpu(), CpuOps);
    let (rows, e, k, h, inter) = (5, 8, 3, 256, 96);
    let (ggu, gdn, cgu, cdn) = q4_1_stacks(9, e, h, inter);
    let x: Vec<f32> = rnd(rows * h, 52).iter().map(|v| 3.0 * v).collect();
    let logits = rnd(rows * e, 53);
    let groute = g
        .route_softmax_topk(&up(&g, &logits), rows, e, k, true)
        .unwrap();
    let croute = c.route_softmax_topk(&logits, rows, e, k, true).unwrap();
    let (chosen, _) = g.routing_to_host(&groute).unwrap();
    assert_eq!(chosen, croute.experts);
    let gy = down(
        &g,
        &g.experts_swiglu(&up(&g, &x), rows, &groute, &ggu, &gdn, None)
            .unwrap(),
    );
    let cy = c
        .experts_swiglu(&x, rows, &croute, &cgu, &cdn, None)
        .unwrap();
    check("experts_swiglu Q4_1 stacks", &gy, &cy, 1e-5, false);
    // The device generator makes the host's bytes: a synthetic matrix
    // filled on the device and the same matrix expanded on the host and
    // uploaded give the same product, bit for bit.
    let w = Arc::new(SyntheticWeight::q4_1(tensor_seed(9, "m"), vec![300, h]));
    let dev_made = g.matrix(HostWeight::Synthetic(w.clone()), 300, h).unwrap();
    let host_made = g.matrix(w.to_host().unwrap(), 300, h).unwrap();
    let xs = up(&g, &x);
    let a = down(&g, &g.matmul(&xs, rows, &dev_made).unwrap());
    let b = down(&g, &g.matmul(&xs, rows, &host_made).unwrap());
    assert_eq!(a, b, "device-made vs host-made synthetic Q4_1");
    rows_invariant("experts_swiglu Q4_1", rows, |r| {
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
                &ggu,
                &gdn,
                None,
            )
            .unwrap(),
        )
    });
}

/// A product and its gate chain (`matmul_unary`): a block product of one
/// row, or of a verify window's 2..=4 (the one-row kernels once per row,
/// over grid y), applies the chain as it stores (one launch), every
/// other call runs the two ops; all have the bits of `unary_chain(matmul)`,
/// for the warp-per-row and the split kernels, and rows stay independent
/// (windows against single rows and, through `blocks_at`, against the
/// several-row kernels).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_unary_is_the_product_then_the_chain() {
    use ds4_engine::backend::Unary;
    let (g, c) = (gpu(), CpuOps);
    let chains: [&[Unary]; 3] = [
        &[],
        &[Unary::Affine(0.25, 0.0), Unary::Silu],
        &[
            Unary::Affine(0.25, 0.0),
            Unary::Sigmoid,
            Unary::Affine(2.0, 0.0),
        ],
    ];
    for (rows, n, k) in [(4, 70, 608), (3, 5, 4192)] {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let t = Tensor::from_vec(rnd(n * k, 60), (n, k), &Device::Cpu).unwrap();
            let q = HostWeight::Quant(Arc::new(
                ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap()).unwrap(),
            ));
            let gm = g.matrix(q.clone(), n, k).unwrap();
            let cm = c.matrix(q, n, k).unwrap();
            let x = rnd(rows * k, 61);
            for chain in chains {
                let what = format!("matmul_unary {dtype:?} [{n},{k}] {chain:?}");
                let one = down(
                    &g,
                    &g.matmul_unary(&up(&g, &x[..k]), 1, &gm, chain).unwrap(),
                );
                let product = g.matmul(&up(&g, &x[..k]), 1, &gm).unwrap();
                let two = if chain.is_empty() {
                    down(&g, &product)
                } else {
                    down(&g, &g.unary_chain(&product, chain).unwrap())
                };
                assert_eq!(
                    bits(&one),
                    bits(&two),
                    "{what}: fused and two launches differ"
                );
                check(
                    &what,
                    &one,
                    &c.matmul_unary(&x[..k].to_vec(), 1, &cm, chain).unwrap(),
                    1e-5,
                    false,
                );
                rows_invariant(&what, rows, |r| {
                    down(
                        &g,
                        &g.matmul_unary(&up(&g, &x[r.start * k..r.end * k]), r.len(), &gm, chain)
                            .unwrap(),
                    )
                });
                let xs = up(&g, &x);
                let before = g.launches();
                g.matmul_unary(&xs, rows, &gm, chain).unwrap();
                assert_eq!(
                    g.launches() - before,
                    1,
                    "{what}: {rows} rows in one launch"
                );
            }
        }
    }
    let x = up(&g, &rnd(608, 62));
    let t = Tensor::from_vec(rnd(70 * 608, 60), (70, 608), &Device::Cpu).unwrap();
    let q = HostWeight::Quant(Arc::new(
        ds4_engine::quant::from_candle(&QTensor::quantize(&t, GgmlDType::Q4_1).unwrap()).unwrap(),
    ));
    let gm = g.matrix(q, 70, 608).unwrap();
    assert!(g.matmul_unary(&x, 1, &gm, &[Unary::Silu; 5]).is_err());
}

/// Several products of one input (`matmul_many`): one launch for a
/// call of one row or a verify window's 2..=4 whose parts share a block
/// format and kernel form (warp per row, or the split form), each part with
/// the bits of its own `matmul_unary` (or `matmul` then `swiglu`); other
/// calls (more rows, a SwiGLU part in the split form) run the parts one by
/// one, with the same bits.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_many_is_each_product_alone() {
    use ds4_engine::backend::{Epilogue, Unary};
    let (g, c) = (gpu(), CpuOps);
    let gate: &[Unary] = &[Unary::Affine(0.25, 0.0), Unary::Silu];
    let inject: &[Unary] = &[
        Unary::Affine(0.25, 0.0),
        Unary::Sigmoid,
        Unary::Affine(2.0, 0.0),
    ];
    let warp: &[(usize, Epilogue)] = &[
        (70, Epilogue::Chain(&[])),
        (64, Epilogue::Swiglu(None)),
        (5, Epilogue::Chain(gate)),
        (2, Epilogue::Swiglu(Some(0.5))),
    ];
    let split: &[(usize, Epilogue)] = &[(40, Epilogue::Chain(gate)), (3, Epilogue::Chain(inject))];
    // A SwiGLU part has no split form (k ≥ 4096): the parts one by one
    // (one launch, then the SwiGLU part's product and its swiglu).
    let mixed: &[(usize, Epilogue)] = &[(3, Epilogue::Chain(inject)), (64, Epilogue::Swiglu(None))];
    for (k, parts, launches) in [(608, warp, 1), (4192, split, 1), (4096, mixed, 3)] {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let mats: Vec<_> = parts
                .iter()
                .enumerate()
                .map(|(i, &(n, _))| {
                    let t =
                        Tensor::from_vec(rnd(n * k, 70 + i as u64), (n, k), &Device::Cpu).unwrap();
                    let q = HostWeight::Quant(Arc::new(
                        ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap())
                            .unwrap(),
                    ));
                    (
                        g.matrix(q.clone(), n, k).unwrap(),
                        c.matrix(q, n, k).unwrap(),
                    )
                })
                .collect();
            let gparts: Vec<_> = mats
                .iter()
                .zip(parts)
                .map(|((m, _), &(_, e))| (m, e))
                .collect();
            let cparts: Vec<_> = mats
                .iter()
                .zip(parts)
                .map(|((_, m), &(_, e))| (m, e))
                .collect();
            let rows = 3;
            let x = rnd(rows * k, 69);
            let what = format!("matmul_many {dtype:?} k={k}");
            let before = g.launches();
            let many = g.matmul_many(&up(&g, &x[..k]), 1, &gparts).unwrap();
            // `up` is a copy, not a launch.
            assert_eq!(g.launches() - before, launches, "{what}: launches");
            // A verify window's rows take as many launches as one row.
            let xs = up(&g, &x);
            let before = g.launches();
            g.matmul_many(&xs, rows, &gparts).unwrap();
            assert_eq!(
                g.launches() - before,
                launches,
                "{what}: {rows} rows, launches"
            );
            for (i, (&(w, then), cpu)) in gparts.iter().zip(&cparts).enumerate() {
                let xg = up(&g, &x[..k]);
                let alone = match then {
                    Epilogue::Chain(chain) => g.matmul_unary(&xg, 1, w, chain).unwrap(),
                    Epilogue::Swiglu(limit) => {
                        let gu = g.matmul(&xg, 1, w).unwrap();
                        g.swiglu(&gu, parts[i].0 / 2, limit).unwrap()
                    }
                };
                let got = down(&g, &many[i]);
                assert_eq!(bits(&got), bits(&down(&g, &alone)), "{what} part {i}");
                let want = c.matmul_many(&x[..k].to_vec(), 1, &[*cpu]).unwrap();
                check(&format!("{what} part {i}"), &got, &want[0], 1e-5, false);
                rows_invariant(&format!("{what} part {i}"), rows, |r| {
                    let xs = up(&g, &x[r.start * k..r.end * k]);
                    down(&g, &g.matmul_many(&xs, r.len(), &gparts).unwrap()[i])
                });
            }
        }
    }
}

/// The gated-residual mix with its gates as a product
/// (`matmul_gated_mean`): one launch for a decode row of a block matrix
/// (and for a verify window's few rows),
/// with the bits of `matmul` then `gated_mean_streams`, rows independent;
/// against the CPU within the product's bound.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_gated_mean_is_the_product_then_the_mix() {
    let (g, c) = (gpu(), CpuOps);
    // The last shape is the split form: the two ops.
    for (streams, h, k, launches) in [(4, 70, 320, 1), (3, 33, 64, 1), (4, 10, 4096, 2)] {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let n = streams * h;
            let t = Tensor::from_vec(rnd(n * k, 80), (n, k), &Device::Cpu).unwrap();
            let q = HostWeight::Quant(Arc::new(
                ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap()).unwrap(),
            ));
            let (gm, cm) = (
                g.matrix(q.clone(), n, k).unwrap(),
                c.matrix(q, n, k).unwrap(),
            );
            let rows = 3;
            let x = rnd(rows * k, 81);
            let s = rnd(rows * n, 82);
            let what = format!("matmul_gated_mean {dtype:?} {streams}x{h} k={k}");
            let (x1, s1) = (up(&g, &x[..k]), up(&g, &s[..n]));
            let before = g.launches();
            let fused = down(
                &g,
                &g.matmul_gated_mean(&x1, 1, &gm, &s1, streams, h).unwrap(),
            );
            assert_eq!(g.launches() - before, launches, "{what}: launches");
            let gates = g.matmul(&x1, 1, &gm).unwrap();
            let two = down(&g, &g.gated_mean_streams(&gates, &s1, streams, h).unwrap());
            assert_eq!(
                bits(&fused),
                bits(&two),
                "{what}: fused and two launches differ"
            );
            let cpu = c
                .matmul_gated_mean(&x[..k].to_vec(), 1, &cm, &s[..n].to_vec(), streams, h)
                .unwrap();
            check(&what, &fused, &cpu, 1e-5, false);
            rows_invariant(&what, rows, |r| {
                let xs = up(&g, &x[r.start * k..r.end * k]);
                let ss = up(&g, &s[r.start * n..r.end * n]);
                down(
                    &g,
                    &g.matmul_gated_mean(&xs, r.len(), &gm, &ss, streams, h)
                        .unwrap(),
                )
            });
            // A verify window's rows take the launches of one row.
            let (xs, ss) = (up(&g, &x), up(&g, &s));
            let before = g.launches();
            g.matmul_gated_mean(&xs, rows, &gm, &ss, streams, h)
                .unwrap();
            assert_eq!(
                g.launches() - before,
                launches,
                "{what}: {rows} rows, launches"
            );
        }
    }
}

/// Routed experts plus a gated shared expert (`experts_swiglu_gated`): the
/// gated term added in the launch that sums the slots, with the bits of
/// `experts_swiglu` then `add_gated_rows`; rows independent; against the
/// CPU within the experts' bound.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_experts_swiglu_gated_is_the_experts_then_the_gate() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, e, k, h, inter) = (5, 8, 3, 256, 96);
    let (ggu, gdn, cgu, cdn) = q4_1_stacks(11, e, h, inter);
    let x: Vec<f32> = rnd(rows * h, 90).iter().map(|v| 3.0 * v).collect();
    let logits = rnd(rows * e, 91);
    let shared = rnd(rows * h, 92);
    let gate = rnd(rows, 93);
    let run = |r: std::ops::Range<usize>| {
        let route = g
            .route_softmax_topk(
                &up(&g, &logits[r.start * e..r.end * e]),
                r.len(),
                e,
                k,
                true,
            )
            .unwrap();
        let xs = up(&g, &x[r.start * h..r.end * h]);
        let (sh, ga) = (
            up(&g, &shared[r.start * h..r.end * h]),
            up(&g, &gate[r.clone()]),
        );
        let fused = g
            .experts_swiglu_gated(&xs, r.len(), &route, &ggu, &gdn, None, &sh, &ga)
            .unwrap();
        let out = g
            .experts_swiglu(&xs, r.len(), &route, &ggu, &gdn, None)
            .unwrap();
        let two = g.add_gated_rows(&out, &sh, &ga, h).unwrap();
        (down(&g, &fused), down(&g, &two))
    };
    let (fused, two) = run(0..rows);
    assert_eq!(bits(&fused), bits(&two), "fused and two launches differ");
    let croute = c.route_softmax_topk(&logits, rows, e, k, true).unwrap();
    let cy = c
        .experts_swiglu_gated(&x, rows, &croute, &cgu, &cdn, None, &shared, &gate)
        .unwrap();
    check("experts_swiglu_gated", &fused, &cy, 1e-5, false);
    rows_invariant("experts_swiglu_gated", rows, |r| run(r).0);
}

type Stacks = (
    <CudaOps as Backend>::Experts,
    <CudaOps as Backend>::Experts,
    <CpuOps as Backend>::Experts,
    <CpuOps as Backend>::Experts,
);

/// Synthetic Q4_1 gate/up `[e, 2·inter, h]` and down `[e, h, inter]` stacks
/// (`load::synthetic`, made on the device and expanded on the host) on the
/// GPU and on the CPU.
fn q4_1_stacks(seed: u64, e: usize, h: usize, inter: usize) -> Stacks {
    use ds4_engine::load::synthetic::{SyntheticWeight, tensor_seed};
    let (g, c) = (gpu(), CpuOps);
    let gu = HostWeight::Synthetic(Arc::new(SyntheticWeight::q4_1(
        tensor_seed(seed, "gu"),
        vec![e, 2 * inter, h],
    )));
    let dn = HostWeight::Synthetic(Arc::new(SyntheticWeight::q4_1(
        tensor_seed(seed, "dn"),
        vec![e, h, inter],
    )));
    (
        g.experts(gu.clone(), e, 2 * inter, h).unwrap(),
        g.experts(dn.clone(), e, h, inter).unwrap(),
        c.experts(gu, e, 2 * inter, h).unwrap(),
        c.experts(dn, e, h, inter).unwrap(),
    )
}
