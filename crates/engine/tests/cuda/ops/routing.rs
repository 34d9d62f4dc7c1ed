//! Routers and top-k selections: identical choices, weights within exp's
//! rounding.

use ds4_engine::backend::{Backend, CpuOps, RouterSpec, Scoring};

use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_routers_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    // The softmax router takes up to 512 experts a block per row (each
    // warp's best, then ranks among them) and more a warp per row: both
    // kernels, with tied logits (lower index first), rows whose best all
    // lie in one warp's experts, the largest k, and fewer experts than
    // threads; experts equal to the CPU's and rows 1 vs n identical.
    for (e, k) in [(512, 10), (600, 10), (512, 64), (100, 10)] {
        let rows = 5;
        let mut logits: Vec<f32> = rnd(rows * e, 122).iter().map(|v| 4.0 * v).collect();
        for r in 0..rows {
            // Ties among the top candidates.
            for i in [7, e * 3 / 5, e - 1] {
                logits[r * e + i] = 9.0;
            }
            // Odd rows: the 64 best among the first warp's experts.
            if r % 2 == 1 {
                for i in 32..96 {
                    logits[r * e + i] = 12.0 + i as f32 / 64.0;
                }
            }
        }
        let gr = g
            .route_softmax_topk(&up(&g, &logits), rows, e, k, true)
            .unwrap();
        let cr = c.route_softmax_topk(&logits, rows, e, k, true).unwrap();
        let (ge, gw) = g.routing_to_host(&gr).unwrap();
        assert_eq!(ge, cr.experts, "route_softmax_topk experts ({e} experts)");
        check(
            &format!("route_softmax_topk ({e} experts)"),
            &gw,
            &cr.weights,
            1e-5,
            false,
        );
        rows_invariant("route_softmax_topk", rows, |r| {
            let l = up(&g, &logits[r.start * e..r.end * e]);
            g.routing_to_host(&g.route_softmax_topk(&l, r.len(), e, k, true).unwrap())
                .unwrap()
                .1
        });
    }
    // The block kernel keeps the warp kernel's bits: 512 experts, and the
    // same rows padded to 600 with −∞ logits for the warp kernel (their p
    // is +0: never chosen, and the lanes' sums gain exact +0s at the end).
    let (rows, k) = (5, 10);
    let logits = rnd(rows * 512, 123);
    let padded: Vec<f32> = logits
        .chunks(512)
        .flat_map(|r| r.iter().copied().chain([f32::NEG_INFINITY; 88]))
        .collect();
    let route = |l: &[f32], e: usize| {
        g.routing_to_host(&g.route_softmax_topk(&up(&g, l), rows, e, k, true).unwrap())
            .unwrap()
    };
    let (block, warp) = (route(&logits, 512), route(&padded, 600));
    assert_eq!(
        block.0, warp.0,
        "route_softmax_topk: block and warp experts"
    );
    assert_eq!(
        bits(&block.1),
        bits(&warp.1),
        "route_softmax_topk: block and warp weights"
    );
    println!("REPORT op=route_softmax_topk block_equals_warp=identical_bits");
    let (rows, e) = (9, 16);
    let logits: Vec<f32> = rnd(rows * e, 120).iter().map(|v| 3.0 * v).collect();
    for renorm in [false, true] {
        let gr = g
            .route_softmax_topk(&up(&g, &logits), rows, e, 4, renorm)
            .unwrap();
        let cr = c.route_softmax_topk(&logits, rows, e, 4, renorm).unwrap();
        let (ge, gw) = g.routing_to_host(&gr).unwrap();
        assert_eq!(ge, cr.experts, "route_softmax_topk experts");
        check(
            &format!("route_softmax_topk renorm={renorm}"),
            &gw,
            &cr.weights,
            1e-5,
            false,
        );
        rows_invariant("route_softmax_topk", rows, |r| {
            let l = up(&g, &logits[r.start * e..r.end * e]);
            g.routing_to_host(&g.route_softmax_topk(&l, r.len(), e, 4, renorm).unwrap())
                .unwrap()
                .1
        });
    }
    let bias: Vec<f32> = rnd(e, 121).iter().map(|v| 0.1 * v).collect();
    let gb = up(&g, &bias);
    let fixed: Vec<u32> = (0..rows * 3).map(|i| (i * 7 % e) as u32).collect();
    for scoring in [Scoring::SqrtSoftplus, Scoring::Sigmoid] {
        for (groups, use_bias, hash) in [
            (None, false, false),
            (None, true, false),
            (Some((4, 2)), true, false),
            (None, false, true),
        ] {
            let spec = RouterSpec {
                scoring,
                experts: e,
                k: 3,
                groups,
                renormalise: groups.is_none(),
                scale: 1.5,
            };
            let what =
                format!("route_scored {scoring:?} groups={groups:?} bias={use_bias} hash={hash}");
            let run = |r: std::ops::Range<usize>| {
                let l = up(&g, &logits[r.start * e..r.end * e]);
                let f = hash.then(|| &fixed[r.start * 3..r.end * 3]);
                g.routing_to_host(
                    &g.route_scored(&l, r.len(), use_bias.then_some(&gb), f, &spec)
                        .unwrap(),
                )
                .unwrap()
            };
            let cr = c
                .route_scored(
                    &logits,
                    rows,
                    use_bias.then_some(&bias),
                    hash.then_some(&fixed[..]),
                    &spec,
                )
                .unwrap();
            let (ge, gw) = run(0..rows);
            assert_eq!(ge, cr.experts, "{what}: experts");
            check(&what, &gw, &cr.weights, 1e-5, false);
            rows_invariant(&what, rows, |r| run(r).1);
        }
    }
    let bad = RouterSpec {
        scoring: Scoring::Sigmoid,
        experts: e,
        k: 3,
        groups: Some((5, 2)),
        renormalise: true,
        scale: 1.0,
    };
    assert!(
        g.route_scored(&up(&g, &logits), rows, None, None, &bad)
            .is_err(),
        "groups must divide the experts"
    );
}

/// The scored router's block kernel (no groups or one, no fixed experts,
/// up to 512 experts) against its warp kernel, bit for bit: two groups
/// that keep both run the warp kernel on the same choices. Tied choices
/// (lower index first), the best all in one warp's experts, the largest k,
/// fewer experts than threads, with and without a bias, both scorings.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_route_scored_block_and_warp_kernels_have_the_same_bits() {
    let g = gpu();
    for (e, k) in [(256, 6), (512, 10), (384, 64), (100, 10), (288, 8)] {
        let rows = 5;
        let mut logits: Vec<f32> = rnd(rows * e, 140).iter().map(|v| 4.0 * v).collect();
        for r in 0..rows {
            for i in [5, e / 2, e - 1] {
                logits[r * e + i] = 6.0;
            }
            if r % 2 == 1 {
                for i in 32..96.min(e) {
                    logits[r * e + i] = 8.0 + i as f32 / 64.0;
                }
            }
        }
        let bias: Vec<f32> = rnd(e, 141).iter().map(|v| 0.1 * v).collect();
        let (l, gb) = (up(&g, &logits), up(&g, &bias));
        for scoring in [Scoring::SqrtSoftplus, Scoring::Sigmoid] {
            for use_bias in [false, true] {
                let spec = |groups| RouterSpec {
                    scoring,
                    experts: e,
                    k,
                    groups,
                    renormalise: true,
                    scale: 1.5,
                };
                let run = |groups| {
                    let r = g
                        .route_scored(&l, rows, use_bias.then_some(&gb), None, &spec(groups))
                        .unwrap();
                    g.routing_to_host(&r).unwrap()
                };
                let (be, bw) = run(None);
                let (oe, ow) = run(Some((1, 1)));
                let (we, ww) = run(Some((2, 2)));
                let what = format!("route_scored e={e} k={k} {scoring:?} bias={use_bias}");
                assert_eq!(be, we, "{what}: experts");
                assert_eq!(bits(&bw), bits(&ww), "{what}: weights");
                assert_eq!((be, bits(&bw)), (oe, bits(&ow)), "{what}: one group");
            }
        }
    }
    println!("REPORT op=route_scored_block identical to the warp kernel (ties, k up to 64)");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_select_topk_matches_the_cpu_with_ties() {
    let (g, c) = (gpu(), CpuOps);
    let (rows, width) = (5, 700);
    let mut scores = rnd(rows * width, 130);
    // Exact ties around the cut (lower index wins), and a NaN-free row of
    // equal values.
    for j in 0..width {
        if j % 3 == 0 {
            scores[width + j] = 0.25;
        }
        scores[2 * width + j] = 1.0;
    }
    let limits = vec![700, 650, 700, 3, 0];
    for k in [1, 64, 600, 700] {
        let gs = g
            .select_topk(&up(&g, &scores), rows, width, &limits, k)
            .unwrap();
        let cs = c.select_topk(&scores, rows, width, &limits, k).unwrap();
        assert_eq!(g.selection_to_host(&gs).unwrap(), cs, "select_topk k={k}");
    }
    println!("REPORT op=select_topk identical selections (ties, limits, k = 1..width)");
    let q = rnd(4 * 2 * 8, 131);
    let w = rnd(4 * 2, 132);
    let keys = rnd(30 * 8, 133);
    let gy = down(
        &g,
        &g.index_scores(&up(&g, &q), &up(&g, &w), &up(&g, &keys), 4, 2, 8, 0.3, 0.7)
            .unwrap(),
    );
    check(
        "index_scores",
        &gy,
        &c.index_scores(&q, &w, &keys, 4, 2, 8, 0.3, 0.7).unwrap(),
        0.0,
        true,
    );
    // More heads than a warp's lanes (40: a full and a partial round of
    // the per-head terms), the sum still the CPU's sequential one.
    let q = rnd(3 * 40 * 8, 134);
    let w = rnd(3 * 40, 135);
    let gy = down(
        &g,
        &g.index_scores(&up(&g, &q), &up(&g, &w), &up(&g, &keys), 3, 40, 8, 0.3, 0.7)
            .unwrap(),
    );
    check(
        "index_scores 40 heads",
        &gy,
        &c.index_scores(&q, &w, &keys, 3, 40, 8, 0.3, 0.7).unwrap(),
        0.0,
        true,
    );
}

/// GLM-5's pools → tokens, with and without the tail, on pools chosen among
/// each query's complete pools.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_expand_pools_matches_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (pool, base, rows) = (4, 9, 6);
    let width = (base + rows) / pool;
    let scores = rnd(rows * width, 170);
    let limits: Vec<usize> = (0..rows).map(|r| (base + r + 1) / pool).collect();
    let gsel = g
        .select_topk(&up(&g, &scores), rows, width, &limits, 2)
        .unwrap();
    let csel = c.select_topk(&scores, rows, width, &limits, 2).unwrap();
    for tail in [false, true] {
        let ge = g
            .selection_to_host(&g.expand_pools(&gsel, base, pool, tail).unwrap())
            .unwrap();
        let ce = c.expand_pools(&csel, base, pool, tail).unwrap();
        assert_eq!(ge, ce, "expand_pools tail={tail}");
    }
    assert!(
        g.expand_pools(&gsel, base - 4, pool, true).is_err(),
        "pools past the queries are refused"
    );
    println!("REPORT op=expand_pools identical selections (tail and not)");
}
