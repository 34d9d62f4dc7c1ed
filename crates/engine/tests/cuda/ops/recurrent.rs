//! The causal conv and the delta rule: against the CPU, and one shot ==
//! chunks == single steps on the GPU (state carried between calls).

use ds4_engine::backend::{Backend, CpuOps, ScanDims};

use crate::support::{bits, check, down, gpu, rnd, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_causal_conv_matches_the_cpu_and_chunks() {
    let (g, c) = (gpu(), CpuOps);
    let (t, ch, kernel) = (9, 12, 4);
    let w = rnd(ch * kernel, 70);
    let gw = up(&g, &w);
    let u = rnd(t * ch, 71);
    for dilation in [1, 2] {
        let hist = (kernel - 1) * dilation;
        let win0 = rnd(hist * ch, 72);
        let mut cw = win0.clone();
        let co = c
            .causal_conv_silu(&u, &mut cw, &w, ch, kernel, dilation)
            .unwrap();
        // GPU in pieces: all, (4 + 5), single steps.
        let run = |pieces: &[usize]| {
            let mut win = up(&g, &win0);
            let mut out = Vec::new();
            let mut at = 0;
            for &n in pieces {
                out.extend(down(
                    &g,
                    &g.causal_conv_silu(
                        &up(&g, &u[at * ch..(at + n) * ch]),
                        &mut win,
                        &gw,
                        ch,
                        kernel,
                        dilation,
                    )
                    .unwrap(),
                ));
                at += n;
            }
            (out, down(&g, &win))
        };
        let (go, gwin) = run(&[t]);
        check(
            &format!("causal_conv_silu d{dilation}"),
            &go,
            &co,
            1e-6,
            false,
        );
        check(
            &format!("causal_conv window d{dilation}"),
            &gwin,
            &cw,
            0.0,
            true,
        );
        for pieces in [vec![4, 5], vec![1; t]] {
            let (o, win) = run(&pieces);
            assert_eq!(bits(&o), bits(&go), "conv chunks {pieces:?}");
            assert_eq!(bits(&win), bits(&gwin), "conv window chunks {pieces:?}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_delta_rule_matches_the_cpu_and_steps() {
    // dk 16: the generic kernel; 64 and 128: the state column in registers.
    for dk in [16, 64, 128] {
        delta_rule_case(ScanDims {
            hk: 2,
            hv: 4,
            dk,
            dv: 12,
        });
    }
}

fn delta_rule_case(d: ScanDims) {
    let (g, c) = (gpu(), CpuOps);
    let t = 7;
    let q = rnd(t * d.hk * d.dk, 80);
    let k: Vec<f32> = rnd(t * d.hk * d.dk, 81).iter().map(|v| 0.3 * v).collect();
    let v = rnd(t * d.hv * d.dv, 82);
    let beta: Vec<f32> = rnd(t * d.hv, 83).iter().map(|x| 0.5 + 0.4 * x).collect();
    let s0 = rnd(d.hv * d.dk * d.dv, 84);
    for per_channel in [false, true] {
        let gl = if per_channel { d.hv * d.dk } else { d.hv };
        let gdec: Vec<f32> = rnd(t * gl, 85)
            .iter()
            .map(|x| -0.1 - 0.05 * x.abs())
            .collect();
        let mut cs = s0.clone();
        let co = c
            .delta_rule_scan(d, &q, &k, &v, &gdec, &beta, &mut cs)
            .unwrap();
        let run = |pieces: &[usize]| {
            let mut s = up(&g, &s0);
            let mut out = Vec::new();
            let mut at = 0;
            for &n in pieces {
                let sl = |x: &[f32], w: usize| up(&g, &x[at * w..(at + n) * w]);
                out.extend(down(
                    &g,
                    &g.delta_rule_scan(
                        d,
                        &sl(&q, d.hk * d.dk),
                        &sl(&k, d.hk * d.dk),
                        &sl(&v, d.hv * d.dv),
                        &sl(&gdec, gl),
                        &sl(&beta, d.hv),
                        &mut s,
                    )
                    .unwrap(),
                ));
                at += n;
            }
            (out, down(&g, &s))
        };
        let (go, gs) = run(&[t]);
        check(
            &format!("delta_rule_scan dk{} o per_channel={per_channel}", d.dk),
            &go,
            &co,
            1e-5,
            false,
        );
        check(
            &format!("delta_rule_scan dk{} S per_channel={per_channel}", d.dk),
            &gs,
            &cs,
            1e-5,
            false,
        );
        for pieces in [vec![3, 4], vec![1; t]] {
            let (o, s) = run(&pieces);
            assert_eq!(bits(&o), bits(&go), "scan chunks {pieces:?}");
            assert_eq!(bits(&s), bits(&gs), "scan state chunks {pieces:?}");
        }
    }
}

/// Continuous batching's scan: `delta_rule_scan_parts` (every session's
/// scan in one launch for keys of 64 and 128) gives each session the output
/// and state of its `delta_rule_scan` alone, bit for bit — sessions of 1,
/// 3 and 17 rows (a decode step, a verify window, a prefill chunk), per
/// head and per channel decays; keys of 16 (part by part) too.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_delta_rule_scan_parts_equal_each_scan_alone() {
    use ds4_engine::backend::ScanPart;
    let g = gpu();
    for dk in [64, 128, 16] {
        let d = ScanDims {
            hk: 2,
            hv: 4,
            dk,
            dv: 12,
        };
        for per_channel in [false, true] {
            let rows = [1usize, 3, 17, 1];
            let gl = if per_channel { d.hv * d.dk } else { d.hv };
            // Each session's inputs and state, on the device.
            let inputs: Vec<[_; 5]> = rows
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    let s = 100 + 10 * i as u64;
                    let k: Vec<f32> = rnd(t * d.hk * d.dk, s + 1)
                        .iter()
                        .map(|v| 0.3 * v)
                        .collect();
                    let beta: Vec<f32> =
                        rnd(t * d.hv, s + 3).iter().map(|x| 0.5 + 0.4 * x).collect();
                    let decay: Vec<f32> = rnd(t * gl, s + 4)
                        .iter()
                        .map(|x| -0.1 - 0.05 * x.abs())
                        .collect();
                    [
                        up(&g, &rnd(t * d.hk * d.dk, s)),
                        up(&g, &k),
                        up(&g, &rnd(t * d.hv * d.dv, s + 2)),
                        up(&g, &decay),
                        up(&g, &beta),
                    ]
                })
                .collect();
            let states: Vec<Vec<f32>> = (0..rows.len())
                .map(|i| rnd(d.hv * d.dk * d.dv, 200 + i as u64))
                .collect();
            let mut alone_o = Vec::new();
            let mut alone_s = Vec::new();
            for (x, s0) in inputs.iter().zip(&states) {
                let mut s = up(&g, s0);
                let o = g
                    .delta_rule_scan(d, &x[0], &x[1], &x[2], &x[3], &x[4], &mut s)
                    .unwrap();
                alone_o.extend(down(&g, &o));
                alone_s.push(down(&g, &s));
            }
            let mut batch_states: Vec<_> = states.iter().map(|s| up(&g, s)).collect();
            let before = g.launches();
            let o = {
                let mut parts: Vec<ScanPart<'_, _>> = inputs
                    .iter()
                    .zip(batch_states.iter_mut())
                    .map(|(x, s)| ScanPart {
                        q: &x[0],
                        k: &x[1],
                        v: &x[2],
                        g: &x[3],
                        beta: &x[4],
                        s,
                    })
                    .collect();
                g.delta_rule_scan_parts(d, &mut parts).unwrap()
            };
            let launches = g.launches() - before;
            let case = format!("dk {dk}, per channel {per_channel}");
            if dk != 16 {
                assert_eq!(launches, 1, "{case}: one launch for every session");
            }
            assert!(bits(&down(&g, &o)) == bits(&alone_o), "{case}: outputs");
            for (i, s) in batch_states.iter().enumerate() {
                assert!(bits(&down(&g, s)) == bits(&alone_s[i]), "{case}: state {i}");
            }
        }
    }
}
