//! The fused ops (`backend::composed` defines each by its parts): on the
//! GPU, one launch for a step's rows with the bits of the parts run one by
//! one on the GPU, for every row count that fuses and across successive
//! steps (the conv window carried); more rows run the parts. Against the
//! CPU within the parts' bounds.

use ds4_engine::backend::{Backend, CpuOps, ScanDims, composed};

use crate::support::{bits, check, down, gpu, rnd, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_inject_streams_norm_is_the_inject_then_the_norm() {
    let (g, c) = (gpu(), CpuOps);
    // The real mixer's 4 × 2560 streams (values in registers) and a small
    // odd group.
    for (cs, h) in [(4usize, 2560usize), (3, 40)] {
        let width = cs * h;
        let scale: Vec<f32> = rnd(width, 160).iter().map(|v| 1.0 + 0.5 * v).collect();
        let gscale = up(&g, &scale);
        for rows in [1usize, 2, 3, 4, 8, 12] {
            let xs = rnd(rows * width, 161 + rows as u64);
            let y = rnd(rows * h, 171 + rows as u64);
            let inj: Vec<f32> = rnd(rows * cs, 181).iter().map(|v| 2.0 * v).collect();
            let (gx, gy, gi) = (up(&g, &xs), up(&g, &y), up(&g, &inj));
            let before = g.launches();
            let [out, n] = g
                .inject_streams_norm(&gx, &gy, &gi, cs, &gscale, 1e-6)
                .unwrap();
            let launches = g.launches() - before;
            let [pout, pn] =
                composed::inject_streams_norm(&g, &gx, &gy, &gi, cs, &gscale, 1e-6).unwrap();
            let what = format!("inject_streams_norm {cs}x{h} rows={rows}");
            assert_eq!(launches == 1, rows <= 8, "{what}: {launches} launches");
            assert_eq!(bits(&down(&g, &out)), bits(&down(&g, &pout)), "{what}: X'");
            assert_eq!(bits(&down(&g, &n)), bits(&down(&g, &pn)), "{what}: n");
            let [cout, cn] =
                composed::inject_streams_norm(&c, &xs, &y, &inj, cs, &scale, 1e-6).unwrap();
            check(&format!("{what} X'"), &down(&g, &out), &cout, 0.0, true);
            check(&format!("{what} n"), &down(&g, &n), &cn, 1e-5, false);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_delta_inputs_is_the_conv_split_norms_and_decays() {
    let (g, c) = (gpu(), CpuOps);
    // dk = 128 with the real conv's 4 taps (four values a lane, the
    // kernel's 4-tap path), 48 with 3 taps (a ragged lane loop, any tap
    // count), 288 (past the registers: through memory).
    for (hk, hv, dk, dv, kernel) in [
        (2usize, 4usize, 128usize, 32usize, 4usize),
        (3, 3, 48, 20, 3),
        (1, 2, 288, 16, 4),
    ] {
        let d = ScanDims { hk, hv, dk, dv };
        let channels = 2 * hk * dk + hv * dv;
        let w = rnd(channels * kernel, 190);
        let neg_a: Vec<f32> = rnd(hv, 191).iter().map(|v| -(v.abs() + 0.1)).collect();
        let dt_bias = rnd(hv, 192);
        let (gw, gneg, gdt) = (up(&g, &w), up(&g, &neg_a), up(&g, &dt_bias));
        let q_scale = (dk as f32).powf(-0.5);
        for rows in [1usize, 2, 3, 4, 8, 12] {
            let what = format!("delta_inputs hk={hk} hv={hv} dk={dk} taps={kernel} rows={rows}");
            // Two successive steps from a random window: the second reads
            // the window the first slid.
            let window0 = rnd((kernel - 1) * channels, 193);
            let (mut fw, mut pw) = (up(&g, &window0), up(&g, &window0));
            let mut cw = window0.clone();
            for step in 0..2u64 {
                let u: Vec<f32> = rnd(rows * channels, 200 + step)
                    .iter()
                    .map(|v| 3.0 * v)
                    .collect();
                // Some decays past softplus's linear branch (x > 20).
                let a: Vec<f32> = rnd(rows * hv, 210 + step)
                    .iter()
                    .enumerate()
                    .map(|(i, v)| if i % 5 == 0 { 25.0 + v } else { 4.0 * v })
                    .collect();
                let (gu, ga) = (up(&g, &u), up(&g, &a));
                let before = g.launches();
                let fused = g
                    .delta_inputs(d, &gu, &mut fw, &gw, kernel, q_scale, &ga, &gneg, &gdt)
                    .unwrap();
                let launches = g.launches() - before;
                assert_eq!(launches == 1, rows <= 8, "{what}: {launches} launches");
                let parts = composed::delta_inputs(
                    &g, d, &gu, &mut pw, &gw, kernel, q_scale, &ga, &gneg, &gdt,
                )
                .unwrap();
                let cpu = composed::delta_inputs(
                    &c, d, &u, &mut cw, &w, kernel, q_scale, &a, &neg_a, &dt_bias,
                )
                .unwrap();
                for (i, name) in ["q", "k", "v", "g"].iter().enumerate() {
                    let f = down(&g, &fused[i]);
                    assert_eq!(
                        bits(&f),
                        bits(&down(&g, &parts[i])),
                        "{what} step {step}: {name}"
                    );
                    check(&format!("{what} {name}"), &f, &cpu[i], 1e-5, false);
                }
                assert_eq!(
                    bits(&down(&g, &fw)),
                    bits(&down(&g, &pw)),
                    "{what} step {step}: window"
                );
                check(&format!("{what} window"), &down(&g, &fw), &cw, 0.0, true);
            }
        }
    }
}
