//! The block-diagonal product (`matmul_grouped`, DeepSeek-V4's grouped
//! output projection): one launch per four groups for a decode row or a
//! verify window's 2..=4 rows of block matrices, each group with the bits
//! of splitting its columns off and running its own `matmul`; five rows
//! run that composed form itself. f32 groups (MLA's per-head absorption)
//! run up to 64 a launch, for any row count.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use ds4_engine::backend::{Backend, CpuOps, HostWeight, composed};

use crate::support::{bits, check, down, gpu, rnd, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_grouped_is_each_group_alone() {
    let (g, c) = (gpu(), CpuOps);
    // Warp form (k < 4096) and split form, eight groups (two launches) and
    // three (one).
    for (k, n, groups) in [(608, 70, 8), (4096, 33, 8), (4192, 40, 3)] {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let (gm, cm): (Vec<_>, Vec<_>) = (0..groups)
                .map(|i| {
                    let t =
                        Tensor::from_vec(rnd(n * k, 90 + i as u64), (n, k), &Device::Cpu).unwrap();
                    let q = HostWeight::Quant(Arc::new(
                        ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap())
                            .unwrap(),
                    ));
                    (
                        g.matrix(q.clone(), n, k).unwrap(),
                        c.matrix(q, n, k).unwrap(),
                    )
                })
                .unzip();
            let grefs: Vec<_> = gm.iter().collect();
            let crefs: Vec<_> = cm.iter().collect();
            for rows in 1..=5 {
                let what = format!("matmul_grouped {dtype:?} k={k} n={n} g={groups} rows={rows}");
                let x = rnd(rows * groups * k, 89 + rows as u64);
                let xs = up(&g, &x);
                let before = g.launches();
                let got = g.matmul_grouped(&xs, rows, &grefs).unwrap();
                if rows <= 4 {
                    let want = groups.div_ceil(4) as u64;
                    assert_eq!(g.launches() - before, want, "{what}: launches");
                }
                let alone = composed::matmul_grouped(&g, &xs, rows, &grefs).unwrap();
                let got = down(&g, &got);
                assert_eq!(got.len(), rows * groups * n, "{what}");
                assert_eq!(bits(&got), bits(&down(&g, &alone)), "{what}");
                let cpu = c.matmul_grouped(&x, rows, &crefs).unwrap();
                check(&what, &got, &cpu, 1e-5, false);
            }
            // A shape that does not divide into the groups is refused.
            let bad = up(&g, &rnd(groups * k + 1, 1));
            assert!(g.matmul_grouped(&bad, 1, &grefs).is_err());
        }
    }
}

/// f32 groups (MLA's per-head absorption, GLM-5): one launch for up to 64
/// groups (`matmul_f32_grouped`), every output the bits of its group's own
/// `matmul` and of the CPU's, for one row to a prefill chunk's tiles; 70
/// groups take two launches, and `k` below a multiple of 8 runs the tail.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_matmul_grouped_f32_is_each_group_alone() {
    let (g, c) = (gpu(), CpuOps);
    for (k, n, groups) in [(256, 512, 64), (37, 24, 70), (512, 40, 3)] {
        let (gm, cm): (Vec<_>, Vec<_>) = (0..groups)
            .map(|i| {
                let t = Tensor::from_vec(rnd(n * k, 190 + i as u64), (n, k), &Device::Cpu).unwrap();
                (
                    g.matrix(HostWeight::F32(t.clone()), n, k).unwrap(),
                    c.matrix(HostWeight::F32(t), n, k).unwrap(),
                )
            })
            .unzip();
        let grefs: Vec<_> = gm.iter().collect();
        let crefs: Vec<_> = cm.iter().collect();
        for rows in [1, 2, 3, 5, 9] {
            let what = format!("matmul_grouped f32 k={k} n={n} g={groups} rows={rows}");
            let x = rnd(rows * groups * k, 189 + rows as u64);
            let xs = up(&g, &x);
            let before = g.launches();
            let got = g.matmul_grouped(&xs, rows, &grefs).unwrap();
            assert_eq!(
                g.launches() - before,
                groups.div_ceil(64) as u64,
                "{what}: launches"
            );
            let alone = composed::matmul_grouped(&g, &xs, rows, &grefs).unwrap();
            let got = down(&g, &got);
            assert_eq!(got.len(), rows * groups * n, "{what}");
            assert_eq!(bits(&got), bits(&down(&g, &alone)), "{what}");
            let cpu = c.matmul_grouped(&x, rows, &crefs).unwrap();
            assert_eq!(bits(&got), bits(&cpu), "{what}: the CPU's bits");
        }
        let bad = up(&g, &rnd(groups * k + 1, 1));
        assert!(g.matmul_grouped(&bad, 1, &grefs).is_err());
    }
}
