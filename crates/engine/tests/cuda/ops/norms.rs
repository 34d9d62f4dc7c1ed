//! Norms (the GPU's own warp order for Σx², so a bound) and RoPE (the CPU's
//! operations exactly).

use ds4_engine::backend::{Backend, CpuOps, CudaOps, GateAct, RopeLayout};

use crate::support::{check, down, gpu, rnd, rows_invariant, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_norms_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let rows = 7;
    // rms_norm over rows of 100 (not a multiple of 32).
    let (w, x) = (100, rnd(rows * 100, 50));
    let wt = rnd(w, 51);
    let gw = up(&g, &wt);
    check(
        "rms_norm",
        &down(&g, &g.rms_norm(&up(&g, &x), w, &gw, 1e-5).unwrap()),
        &c.rms_norm(&x, w, &wt, 1e-5).unwrap(),
        1e-5,
        false,
    );
    rows_invariant("rms_norm", rows, |r| {
        down(
            &g,
            &g.rms_norm(&up(&g, &x[r.start * w..r.end * w]), w, &gw, 1e-5)
                .unwrap(),
        )
    });
    // Wide rows: 70 rows of 5000 run a warp a row, 64 or fewer a block a
    // row (`rms_norm_wide_f32`, pieces of 4096 with a tail): the splits
    // below cross that line, so equal bits mean the two kernels agree.
    let (ww, wrows) = (5000, 70);
    let (xw, wtw) = (rnd(wrows * ww, 52), rnd(ww, 53));
    let gww = up(&g, &wtw);
    check(
        "rms_norm wide",
        &down(&g, &g.rms_norm(&up(&g, &xw), ww, &gww, 1e-5).unwrap()),
        &c.rms_norm(&xw, ww, &wtw, 1e-5).unwrap(),
        1e-5,
        false,
    );
    rows_invariant("rms_norm wide", wrows, |r| {
        down(
            &g,
            &g.rms_norm(&up(&g, &xw[r.start * ww..r.end * ww]), ww, &gww, 1e-5)
                .unwrap(),
        )
    });
    // Grouped, zero-centred scale: short groups, and groups longer than
    // the kernel's 256 threads (not a multiple of them).
    for (width, group) in [(96, 32), (2 * 1000, 1000)] {
        grouped(&g, &c, rows, width, group);
    }
    grouped_tail(&g, &c, rows);
}

/// The grouped norm (zero-centred scale) at one shape.
fn grouped(g: &CudaOps, c: &CpuOps, rows: usize, width: usize, group: usize) {
    let xg = rnd(rows * width, 52);
    let scale: Vec<f32> = rnd(width, 53).iter().map(|v| 1.0 + v).collect();
    let gs = up(g, &scale);
    check(
        "rms_norm_grouped",
        &down(
            g,
            &g.rms_norm_grouped(&up(g, &xg), width, group, &gs, 1e-6)
                .unwrap(),
        ),
        &c.rms_norm_grouped(&xg, width, group, &scale, 1e-6).unwrap(),
        1e-5,
        false,
    );
    rows_invariant("rms_norm_grouped", rows, |r| {
        down(
            g,
            &g.rms_norm_grouped(
                &up(g, &xg[r.start * width..r.end * width]),
                width,
                group,
                &gs,
                1e-6,
            )
            .unwrap(),
        )
    });
}

/// `rms_norm_heads` and `l2_norm_heads` of `heads` heads of `dim` against
/// the CPU, row-invariant, and in place on a clone only.
fn per_head(g: &CudaOps, c: &CpuOps, rows: usize, dim: usize, heads: usize) {
    let xh = rnd(rows * heads * dim, 54);
    let sh = rnd(dim, 55);
    let gsh = up(g, &sh);
    let heads_norm = |v: &[f32]| {
        let mut b = up(g, v);
        g.rms_norm_heads(&mut b, dim, &gsh, 1e-6).unwrap();
        down(g, &b)
    };
    let mut ch = xh.clone();
    c.rms_norm_heads(&mut ch, dim, &sh, 1e-6).unwrap();
    check("rms_norm_heads", &heads_norm(&xh), &ch, 1e-5, false);
    rows_invariant("rms_norm_heads", rows, |r| {
        heads_norm(&xh[r.start * heads * dim..r.end * heads * dim])
    });
    // In place on a clone leaves the original alone.
    let orig = up(g, &xh);
    let mut cl = orig.clone();
    g.rms_norm_heads(&mut cl, dim, &gsh, 1e-6).unwrap();
    assert_eq!(down(g, &orig), xh, "an in-place op wrote through a clone");
    let l2 = |v: &[f32]| {
        let mut b = up(g, v);
        g.l2_norm_heads(&mut b, dim, 0.5).unwrap();
        down(g, &b)
    };
    let mut cl2 = xh.clone();
    c.l2_norm_heads(&mut cl2, dim, 0.5).unwrap();
    check("l2_norm_heads", &l2(&xh), &cl2, 1e-5, false);
    rows_invariant("l2_norm_heads", rows, |r| {
        l2(&xh[r.start * heads * dim..r.end * heads * dim])
    });
}

/// The per-head, L2 and gated norms and RoPE.
fn grouped_tail(g: &CudaOps, c: &CpuOps, rows: usize) {
    // Per-head in place: short heads, and heads of a whole batch of
    // NORM_BATCH loads a lane and a tail (544 = 32 · 16 + 32).
    for (dim, heads) in [(24, 3), (544, 2)] {
        per_head(g, c, rows, dim, heads);
    }
    let (dim, heads) = (24, 3);
    let xh = rnd(rows * heads * dim, 54);
    let sh = rnd(dim, 55);
    let gsh = up(g, &sh);
    // Gated.
    let z = rnd(rows * heads * dim, 56);
    for act in [GateAct::Sigmoid, GateAct::Silu] {
        let gz = |r: std::ops::Range<usize>| {
            let s = r.start * heads * dim..r.end * heads * dim;
            down(
                g,
                &g.gated_rms_norm(&up(g, &xh[s.clone()]), &up(g, &z[s]), &gsh, 1e-6, act)
                    .unwrap(),
            )
        };
        check(
            &format!("gated_rms_norm {act:?}"),
            &gz(0..rows),
            &c.gated_rms_norm(&xh, &z, &sh, 1e-6, act).unwrap(),
            1e-5,
            false,
        );
        rows_invariant("gated_rms_norm", rows, gz);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_layer_norm_matches_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, w) = (6, 72);
    let x: Vec<f32> = rnd(rows * w, 57).iter().map(|v| 3.0 * v + 0.5).collect();
    let (wt, bias) = (rnd(w, 58), rnd(w, 59));
    let (gw, gb) = (up(&g, &wt), up(&g, &bias));
    let run = |r: std::ops::Range<usize>| {
        down(
            &g,
            &g.layer_norm(&up(&g, &x[r.start * w..r.end * w]), w, &gw, &gb, 1e-6)
                .unwrap(),
        )
    };
    check(
        "layer_norm",
        &run(0..rows),
        &c.layer_norm(&x, w, &wt, &bias, 1e-6).unwrap(),
        1e-5,
        false,
    );
    rows_invariant("layer_norm", rows, run);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_rope_is_bit_identical_to_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, heads, hd, half) = (5, 3, 16, 6);
    let x = rnd(rows * heads * hd, 60);
    let cos = rnd(rows * half, 61);
    let sin = rnd(rows * half, 62);
    for layout in [
        RopeLayout::HalfSplit,
        RopeLayout::Interleaved,
        RopeLayout::InterleavedTail,
    ] {
        let run = |r: std::ops::Range<usize>| {
            let mut b = up(&g, &x[r.start * heads * hd..r.end * heads * hd]);
            g.rope(
                &mut b,
                hd,
                &up(&g, &cos[r.start * half..r.end * half]),
                &up(&g, &sin[r.start * half..r.end * half]),
                half,
                layout,
            )
            .unwrap();
            down(&g, &b)
        };
        let mut cx = x.clone();
        c.rope(&mut cx, hd, &cos, &sin, half, layout).unwrap();
        check(&format!("rope {layout:?}"), &run(0..rows), &cx, 0.0, true);
        rows_invariant("rope", rows, run);
    }
}
