//! Element-wise ops, PLE gate, stream ops, mHC and compression.

use ds4_engine::backend::{Backend, CpuOps, GeluForm, Unary};

use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_element_wise_ops_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, w) = (6, 40);
    let a: Vec<f32> = rnd(rows * w, 140).iter().map(|v| 8.0 * v).collect();
    let b = rnd(rows * w, 141);
    let (ga, gb) = (up(&g, &a), up(&g, &b));
    check(
        "add",
        &down(&g, &g.add(&ga, &gb).unwrap()),
        &c.add(&a, &b).unwrap(),
        0.0,
        true,
    );
    check(
        "mul",
        &down(&g, &g.mul(&ga, &gb).unwrap()),
        &c.mul(&a, &b).unwrap(),
        0.0,
        true,
    );
    check(
        "affine",
        &down(&g, &g.affine(&ga, 0.3, -1.5).unwrap()),
        &c.affine(&a, 0.3, -1.5).unwrap(),
        0.0,
        true,
    );
    check(
        "silu",
        &down(&g, &g.silu(&ga).unwrap()),
        &c.silu(&a).unwrap(),
        1e-6,
        false,
    );
    check(
        "sigmoid",
        &down(&g, &g.sigmoid(&ga).unwrap()),
        &c.sigmoid(&a).unwrap(),
        1e-6,
        false,
    );
    // Unary chains: one launch, the bits of the steps launched one by one,
    // and the CPU's (whose chain is those steps) within the steps' bound.
    for chain in [
        vec![Unary::Affine(0.25, 0.0), Unary::Silu],
        vec![
            Unary::Affine(0.25, 0.0),
            Unary::Sigmoid,
            Unary::Affine(2.0, 0.0),
        ],
        vec![
            Unary::Sigmoid,
            Unary::Affine(-3.0, 0.5),
            Unary::Silu,
            Unary::Affine(1.5, 0.25),
        ],
    ] {
        let fused = down(&g, &g.unary_chain(&ga, &chain).unwrap());
        let mut one_by_one = ga.clone();
        for u in &chain {
            one_by_one = match *u {
                Unary::Affine(m, b) => g.affine(&one_by_one, m, b).unwrap(),
                Unary::Silu => g.silu(&one_by_one).unwrap(),
                Unary::Sigmoid => g.sigmoid(&one_by_one).unwrap(),
            };
        }
        let one_by_one = down(&g, &one_by_one);
        assert_eq!(
            bits(&fused),
            bits(&one_by_one),
            "unary chain {chain:?}: fused and one-by-one launches differ"
        );
        check(
            &format!("unary_chain {chain:?}"),
            &fused,
            &c.unary_chain(&a, &chain).unwrap(),
            1e-6,
            false,
        );
    }
    assert!(g.unary_chain(&ga, &[]).is_err());
    assert!(g.unary_chain(&ga, &[Unary::Silu; 5]).is_err());
    for form in [GeluForm::Erf, GeluForm::Tanh] {
        check(
            &format!("gelu {form:?}"),
            &down(&g, &g.gelu(&ga, form).unwrap()),
            &c.gelu(&a, form).unwrap(),
            1e-6,
            false,
        );
    }
    check(
        "add_bias",
        &down(&g, &g.add_bias(&ga, &up(&g, &b[..w]), w).unwrap()),
        &c.add_bias(&a, &b[..w].to_vec(), w).unwrap(),
        0.0,
        true,
    );
    assert!(g.add_bias(&ga, &up(&g, &b[..w - 1]), w).is_err());
    // A listed selection round-trips and drives attention_gathered like
    // any other (the vision tower's per-image attention).
    let listed: Vec<Vec<u32>> = vec![vec![0, 1, 2], vec![0, 1, 2], vec![3, 4], vec![3, 4]];
    let gsel = g.selection_from_host(&listed, 5).unwrap();
    assert_eq!(g.selection_to_host(&gsel).unwrap(), listed);
    assert!(g.selection_from_host(&listed, 4).is_err());
    assert!(g.add(&ga, &up(&g, &b[..10])).is_err());
    for limit in [None, Some(2.5f32)] {
        let run = |r: std::ops::Range<usize>| {
            down(
                &g,
                &g.swiglu(&up(&g, &a[r.start * w..r.end * w]), w / 2, limit)
                    .unwrap(),
            )
        };
        check(
            &format!("swiglu {limit:?}"),
            &run(0..rows),
            &c.swiglu(&a, w / 2, limit).unwrap(),
            1e-6,
            false,
        );
        rows_invariant("swiglu", rows, run);
    }
    let h = 8;
    let (neg_a, dt) = (rnd(h, 142), rnd(h, 143));
    let sp: Vec<f32> = a.iter().map(|v| v * 4.0).collect(); // reaches the linear branch above 20
    check(
        "softplus_decay",
        &down(
            &g,
            &g.softplus_decay(&up(&g, &sp), &up(&g, &neg_a), &up(&g, &dt))
                .unwrap(),
        ),
        &c.softplus_decay(&sp, &neg_a, &dt).unwrap(),
        1e-6,
        false,
    );
    // KDA's per-channel decay, both forms: H = 5 heads of 8 channels.
    let (heads, dim) = (5, 8);
    let f: Vec<f32> = rnd(rows * heads * dim, 160)
        .iter()
        .map(|v| 12.0 * v)
        .collect();
    let (ka, kb) = (
        rnd(heads, 161)
            .iter()
            .map(|v| v.abs() + 0.5)
            .collect::<Vec<_>>(),
        rnd(heads * dim, 162),
    );
    for lb in [None, Some(-5.0f32)] {
        let gy = down(
            &g,
            &g.kda_gate(&up(&g, &f), &up(&g, &ka), &up(&g, &kb), dim, lb)
                .unwrap(),
        );
        check(
            &format!("kda_gate lb={lb:?}"),
            &gy,
            &c.kda_gate(&f, &ka, &kb, dim, lb).unwrap(),
            1e-6,
            false,
        );
    }
    let s = rnd(rows, 144);
    check(
        "scale_rows",
        &down(&g, &g.scale_rows(&ga, &up(&g, &s), w).unwrap()),
        &c.scale_rows(&a, &s, w).unwrap(),
        0.0,
        true,
    );
    // PLE gate: C = 4 streams of H = 10.
    let (cs, hh) = (4, 10);
    let key = rnd(rows * cs * hh, 145);
    let qry = rnd(rows * cs * hh, 146);
    let val = rnd(rows * hh, 147);
    let run = |r: std::ops::Range<usize>| {
        let sl = |x: &[f32], n: usize| up(&g, &x[r.start * n..r.end * n]);
        down(
            &g,
            &g.ple_gate(
                &sl(&key, cs * hh),
                &sl(&qry, cs * hh),
                &sl(&val, hh),
                cs,
                hh,
            )
            .unwrap(),
        )
    };
    check(
        "ple_gate",
        &run(0..rows),
        &c.ple_gate(&key, &qry, &val, cs, hh).unwrap(),
        1e-6,
        false,
    );
    rows_invariant("ple_gate", rows, run);
    // H = 1100: the dot's products staged in three chunks, the last partial.
    let (c2, h2) = (2, 1100);
    let (key2, qry2) = (rnd(rows * c2 * h2, 149), rnd(rows * c2 * h2, 150));
    let val2 = rnd(rows * h2, 151);
    let run2 = |r: std::ops::Range<usize>| {
        let sl = |x: &[f32], n: usize| up(&g, &x[r.start * n..r.end * n]);
        let (k, q, v) = (sl(&key2, c2 * h2), sl(&qry2, c2 * h2), sl(&val2, h2));
        down(&g, &g.ple_gate(&k, &q, &v, c2, h2).unwrap())
    };
    check(
        "ple_gate (H = 1100)",
        &run2(0..rows),
        &c.ple_gate(&key2, &qry2, &val2, c2, h2).unwrap(),
        1e-6,
        false,
    );
    rows_invariant("ple_gate (H = 1100)", rows, run2);
    // Streams.
    let x = rnd(rows * hh, 148);
    check(
        "tile_streams",
        &down(&g, &g.tile_streams(&up(&g, &x), cs, hh).unwrap()),
        &c.tile_streams(&x, cs, hh).unwrap(),
        0.0,
        true,
    );
    check(
        "mean_streams",
        &down(&g, &g.mean_streams(&up(&g, &key), cs, hh).unwrap()),
        &c.mean_streams(&key, cs, hh).unwrap(),
        0.0,
        true,
    );
    // The fused gated mix: the bits of sigmoid, mul and mean_streams
    // launched one by one, and the CPU's within sigmoid's bound.
    let (gk, gq) = (up(&g, &key), up(&g, &qry));
    let fused = down(&g, &g.gated_mean_streams(&gk, &gq, cs, hh).unwrap());
    let steps = down(
        &g,
        &g.mean_streams(&g.mul(&g.sigmoid(&gk).unwrap(), &gq).unwrap(), cs, hh)
            .unwrap(),
    );
    assert_eq!(
        bits(&fused),
        bits(&steps),
        "gated_mean_streams: fused and one-by-one launches differ"
    );
    check(
        "gated_mean_streams",
        &fused,
        &c.gated_mean_streams(&key, &qry, cs, hh).unwrap(),
        1e-6,
        false,
    );
    // The gated shared expert's residual: the bits of sigmoid, scale_rows
    // and add launched one by one, and the CPU's within sigmoid's bound.
    let gates = rnd(rows, 150);
    let shared = key[..rows * hh].to_vec();
    let (gg, gbase, gx) = (up(&g, &gates), up(&g, &val), up(&g, &shared));
    let fused = down(&g, &g.add_gated_rows(&gbase, &gx, &gg, hh).unwrap());
    let steps = down(
        &g,
        &g.add(
            &gbase,
            &g.scale_rows(&gx, &g.sigmoid(&gg).unwrap(), hh).unwrap(),
        )
        .unwrap(),
    );
    assert_eq!(
        bits(&fused),
        bits(&steps),
        "add_gated_rows: fused and one-by-one launches differ"
    );
    check(
        "add_gated_rows",
        &fused,
        &c.add_gated_rows(&val, &shared, &gates, hh).unwrap(),
        1e-6,
        false,
    );
    assert!(
        g.add_gated_rows(&gbase, &gx, &up(&g, &gates[..1]), hh)
            .is_err()
    );
    let inj = rnd(rows * cs, 149);
    check(
        "inject_streams",
        &down(
            &g,
            &g.inject_streams(&up(&g, &key), &up(&g, &val), &up(&g, &inj), cs)
                .unwrap(),
        ),
        &c.inject_streams(&key, &val, &inj, cs).unwrap(),
        0.0,
        true,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_hyper_connections_and_compression_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, n, d) = (5, 4, 24);
    let width = (2 + n) * n;
    let z: Vec<f32> = rnd(rows * width, 150).iter().map(|v| 2.0 * v).collect();
    let base = rnd(width, 151);
    let scale = vec![0.9f32, 1.1, 1.7];
    let (gbase, gscale) = (up(&g, &base), up(&g, &scale));
    for iters in [0, 1, 20] {
        let run = |r: std::ops::Range<usize>| {
            down(
                &g,
                &g.hc_sinkhorn(
                    &up(&g, &z[r.start * width..r.end * width]),
                    &gbase,
                    &gscale,
                    n,
                    iters,
                    1e-6,
                )
                .unwrap(),
            )
        };
        check(
            &format!("hc_sinkhorn iters={iters}"),
            &run(0..rows),
            &c.hc_sinkhorn(&z, &base, &scale, n, iters, 1e-6).unwrap(),
            1e-5,
            false,
        );
        rows_invariant("hc_sinkhorn", rows, run);
    }
    // pre/post on the CPU's mix (so both sides read the same weights).
    let mix = c.hc_sinkhorn(&z, &base, &scale, n, 20, 1e-6).unwrap();
    let xs = rnd(rows * n * d, 152);
    let y = rnd(rows * d, 153);
    let (gx, gm) = (up(&g, &xs), up(&g, &mix));
    check(
        "hc_pre",
        &down(&g, &g.hc_pre(&gx, &gm, n).unwrap()),
        &c.hc_pre(&xs, &mix, n).unwrap(),
        0.0,
        true,
    );
    check(
        "hc_post",
        &down(&g, &g.hc_post(&gx, &up(&g, &y), &gm, n).unwrap()),
        &c.hc_post(&xs, &y, &mix, n).unwrap(),
        0.0,
        true,
    );
    // Gated pooling, with empty (−∞) slots.
    let (slots, dim, groups) = (4, 10, 6);
    let kv = rnd(groups * slots * dim, 154);
    let mut gate = rnd(groups * slots * dim, 155);
    for i in (0..gate.len()).step_by(7) {
        gate[i] = f32::NEG_INFINITY;
    }
    let run = |r: std::ops::Range<usize>| {
        let s = r.start * slots * dim..r.end * slots * dim;
        down(
            &g,
            &g.softmax_pool(&up(&g, &kv[s.clone()]), &up(&g, &gate[s]), slots, dim)
                .unwrap(),
        )
    };
    check(
        "softmax_pool",
        &run(0..groups),
        &c.softmax_pool(&kv, &gate, slots, dim).unwrap(),
        1e-6,
        false,
    );
    rows_invariant("softmax_pool", groups, run);
}
