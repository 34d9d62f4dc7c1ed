//! Attention over caches and selections.

use ds4_engine::backend::{Backend, CpuOps, EntryKeep, Heads, IndexerShape};

use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

type Gpu = ds4_engine::backend::CudaOps;

/// The GPU indexer's selection for query rows `r` of `q` (`shape.heads`
/// heads of `shape.dim`), the first at position `base + r.start`.
fn select_rows(
    g: &Gpu,
    q: &[f32],
    blocks: &<Gpu as Backend>::Buf,
    base: usize,
    shape: IndexerShape,
    r: std::ops::Range<usize>,
) -> <Gpu as Backend>::Selection {
    let width = shape.heads * shape.dim;
    let rows = up(g, &q[r.start * width..r.end * width]);
    g.indexer_select(&rows, blocks, base + r.start, shape)
        .unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_attention_causal_matches_the_cpu_and_windows() {
    let (g, c) = (gpu(), CpuOps);
    // d = 20: an 8-lane dot with a tail; 2 kv heads for 4 query heads.
    let (hq, hkv, d, offset, t) = (4, 2, 20, 5, 6);
    let total = offset + t;
    let q = rnd(t * hq * d, 90);
    let kc: Vec<Vec<f32>> = (0..hkv).map(|h| rnd(total * d, 91 + h as u64)).collect();
    let vc: Vec<Vec<f32>> = (0..hkv).map(|h| rnd(total * d, 95 + h as u64)).collect();
    let (gk, gv): (Vec<_>, Vec<_>) = (
        kc.iter().map(|x| up(&g, x)).collect(),
        vc.iter().map(|x| up(&g, x)).collect(),
    );
    let kv = Heads { heads: hkv, dim: d };
    let gpu_rows = |first: usize, n: usize| {
        let gq = up(&g, &q[first * hq * d..(first + n) * hq * d]);
        down(
            &g,
            &g.attention_causal(
                &gq,
                &gk.iter().collect::<Vec<_>>(),
                &gv.iter().collect::<Vec<_>>(),
                offset + first,
                hq,
                kv,
            )
            .unwrap(),
        )
    };
    let cy = c
        .attention_causal(
            &q,
            &kc.iter().collect::<Vec<_>>(),
            &vc.iter().collect::<Vec<_>>(),
            offset,
            hq,
            kv,
        )
        .unwrap();
    let whole = gpu_rows(0, t);
    check("attention_causal", &whole, &cy, 1e-5, false);
    // The window vs each query as its own decode step vs chunks.
    let steps: Vec<f32> = (0..t).flat_map(|i| gpu_rows(i, 1)).collect();
    assert_eq!(
        bits(&steps),
        bits(&whole),
        "attention_causal: steps vs window"
    );
    let mut chunks = gpu_rows(0, 2);
    chunks.extend(gpu_rows(2, t - 2));
    assert_eq!(
        bits(&chunks),
        bits(&whole),
        "attention_causal: chunks vs window"
    );
    assert!(
        g.attention_causal(
            &up(&g, &q),
            &gk.iter().collect::<Vec<_>>(),
            &gv.iter().collect::<Vec<_>>(),
            offset + 1,
            hq,
            kv
        )
        .is_err(),
        "keys past the cache are refused"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_block_keys_indexer_and_gathered_attention_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let (dim, ratio) = (16, 4);
    let raw = rnd(40 * dim, 100);
    check(
        "block_keys",
        &down(&g, &g.block_keys(&up(&g, &raw), dim, ratio, 2, 9).unwrap()),
        &c.block_keys(&raw, dim, ratio, 2, 9).unwrap(),
        0.0,
        true,
    );
    let blocks = c.block_keys(&raw, dim, ratio, 0, 10).unwrap();
    let gblocks = up(&g, &blocks);
    let shape = IndexerShape {
        heads: 2,
        dim,
        ratio,
        block_topk: 3,
    };
    let (base, rows) = (21, 6);
    let q = rnd(rows * 2 * dim, 101);
    let sel = |r: std::ops::Range<usize>| select_rows(&g, &q, &gblocks, base, shape, r);
    let gsel = sel(0..rows);
    let csel = c.indexer_select(&q, &blocks, base, shape).unwrap();
    assert_eq!(g.selection_to_host(&gsel).unwrap(), csel, "indexer_select");
    let pruned: usize = csel
        .iter()
        .enumerate()
        .map(|(i, s)| base + i + 1 - s.len())
        .sum();
    assert!(pruned > 0, "the selection pruned nothing");
    println!("REPORT op=indexer_select identical selections, {pruned} tokens pruned");
    let singles: Vec<Vec<u32>> = (0..rows)
        .flat_map(|r| g.selection_to_host(&sel(r..r + 1)).unwrap())
        .collect();
    assert_eq!(singles, csel, "indexer_select: one row at a time");
    // Attention over the selections, with and without sinks.
    let (hq, hkv, d, p) = (4, 2, 12, base + rows);
    let qa = rnd(rows * hq * d, 102);
    let (k, v) = (rnd(p * hkv * d, 103), rnd(p * hkv * d, 104));
    let (gk, gv) = (up(&g, &k), up(&g, &v));
    let sinks = rnd(hq, 105);
    let gsinks = up(&g, &sinks);
    let kv = Heads { heads: hkv, dim: d };
    for with_sinks in [false, true] {
        let run = |r: std::ops::Range<usize>| {
            let s = sel(r.clone());
            down(
                &g,
                &g.attention_gathered(
                    &up(&g, &qa[r.start * hq * d..r.end * hq * d]),
                    &gk,
                    &gv,
                    &s,
                    hq,
                    kv,
                    with_sinks.then_some(&gsinks),
                )
                .unwrap(),
            )
        };
        let cy = c
            .attention_gathered(&qa, &k, &v, &csel, hq, kv, with_sinks.then_some(&sinks))
            .unwrap();
        check(
            &format!("attention_gathered sinks={with_sinks}"),
            &run(0..rows),
            &cy,
            1e-5,
            false,
        );
        rows_invariant("attention_gathered", rows, run);
    }
    // A selection over more tokens than the cache holds is refused.
    let short = up(&g, &k[..(p - 1) * hkv * d]);
    assert!(
        g.attention_gathered(&up(&g, &qa), &short, &short, &gsel, hq, kv, None)
            .is_err()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_gathered_attention_tiles_by_block_and_by_warp_agree() {
    // Calls of up to 16 queries run a block per tile, longer ones a warp
    // per tile: 20 queries over ~150 selected keys (three tiles, the last
    // partial) with d = 80 (two staged chunks, the second partial), so one
    // at a time and in chunks (blocks) must give the bits of all at once
    // (warps).
    let (g, c) = (gpu(), CpuOps);
    let (dim, ratio, rows, base) = (16, 4, 20, 130);
    let p = base + rows;
    let blocks = c
        .block_keys(&rnd(p * dim, 130), dim, ratio, 0, p / ratio)
        .unwrap();
    let gblocks = up(&g, &blocks);
    let shape = IndexerShape {
        heads: 2,
        dim,
        ratio,
        block_topk: 34,
    };
    let q = rnd(rows * 2 * dim, 131);
    let sel = |r: std::ops::Range<usize>| select_rows(&g, &q, &gblocks, base, shape, r);
    let csel = c.indexer_select(&q, &blocks, base, shape).unwrap();
    assert!(csel.iter().all(|s| s.len() > 128), "fewer than three tiles");
    let (hq, hkv, d) = (4, 2, 80);
    let qa = rnd(rows * hq * d, 132);
    let (k, v) = (rnd(p * hkv * d, 133), rnd(p * hkv * d, 134));
    let (gk, gv) = (up(&g, &k), up(&g, &v));
    let kv = Heads { heads: hkv, dim: d };
    let run = |r: std::ops::Range<usize>| {
        let s = sel(r.clone());
        let qr = up(&g, &qa[r.start * hq * d..r.end * hq * d]);
        down(
            &g,
            &g.attention_gathered(&qr, &gk, &gv, &s, hq, kv, None)
                .unwrap(),
        )
    };
    let cy = c
        .attention_gathered(&qa, &k, &v, &csel, hq, kv, None)
        .unwrap();
    check(
        "attention_gathered (block and warp tiles)",
        &run(0..rows),
        &cy,
        1e-5,
        false,
    );
    rows_invariant("attention_gathered (block and warp tiles)", rows, run);
}

/// A window attention case: `rows` queries of `heads` × `dim` from
/// position `query_first` over `p` window rows from `window_first` (a
/// span of `span`) and `n_entries` compressed entries (none, causal at
/// ratio 2, or the top `top` of random scores), against the CPU and
/// invariant across row splits.
struct WindowCase {
    heads: usize,
    dim: usize,
    span: usize,
    window_first: usize,
    p: usize,
    query_first: usize,
    rows: usize,
    n_entries: usize,
    top: usize,
    seed: u64,
}

fn window_case(w: WindowCase) {
    let (g, c) = (gpu(), CpuOps);
    let WindowCase {
        heads,
        dim,
        span,
        window_first,
        p,
        query_first,
        rows,
        n_entries,
        top,
        seed,
    } = w;
    let q = rnd(rows * heads * dim, seed);
    let window = rnd(p * dim, seed + 1);
    let entries = rnd(n_entries * dim, seed + 2);
    let sinks = rnd(heads, seed + 3);
    let (gw, ge, gs) = (up(&g, &window), up(&g, &entries), up(&g, &sinks));
    let scores = rnd(rows * n_entries, seed + 4);
    let limits: Vec<usize> = (0..rows).map(|r| (r + 2).min(n_entries)).collect();
    let csel = c
        .select_topk(&scores, rows, n_entries, &limits, top)
        .unwrap();
    for mode in 0..3 {
        let run = |r: std::ops::Range<usize>| {
            let gsel = g
                .select_topk(
                    &up(&g, &scores[r.start * n_entries..r.end * n_entries]),
                    r.len(),
                    n_entries,
                    &limits[r.clone()],
                    top,
                )
                .unwrap();
            let keep = match mode {
                0 => EntryKeep::None,
                1 => EntryKeep::Causal { ratio: 2 },
                _ => EntryKeep::Selected(&gsel),
            };
            let gq = up(&g, &q[r.start * heads * dim..r.end * heads * dim]);
            down(
                &g,
                &g.attention_window(
                    &gq,
                    heads,
                    dim,
                    query_first + r.start,
                    &gw,
                    window_first,
                    span,
                    &ge,
                    keep,
                    &gs,
                )
                .unwrap(),
            )
        };
        let keep = match mode {
            0 => EntryKeep::None,
            1 => EntryKeep::Causal { ratio: 2 },
            _ => EntryKeep::Selected(&csel),
        };
        let cy = c
            .attention_window(
                &q,
                heads,
                dim,
                query_first,
                &window,
                window_first,
                span,
                &entries,
                keep,
                &sinks,
            )
            .unwrap();
        check(
            &format!("attention_window {heads}x{dim} mode {mode}"),
            &run(0..rows),
            &cy,
            1e-5,
            false,
        );
        rows_invariant("attention_window", rows, run);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_attention_window_matches_the_cpu() {
    window_case(WindowCase {
        heads: 3,
        dim: 16,
        span: 5,
        window_first: 4,
        p: 12,
        query_first: 8,
        rows: 6,
        n_entries: 7,
        top: 3,
        seed: 110,
    });
}

/// Prefill-sized calls (16 queries and more) run a block per (query,
/// tile, 32 heads) (`attention_window_rows32_f32`), fewer a warp per
/// (query, head, tile) (`attention_window_tiles_f32`): `rows_invariant`'s
/// single rows and first chunk take the second, the whole call the first,
/// so their bits are compared. 70 heads (groups of 32 + 32 + 6), dims 70
/// (rounds of 32 and 64 with a remainder not a multiple of 4), windows of
/// up to 90 keys and up to 70 entries (tiles of 64: full, partial and
/// empty ones).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_attention_window_block_and_warp_kernels_have_the_same_bits() {
    window_case(WindowCase {
        heads: 70,
        dim: 70,
        span: 90,
        window_first: 3,
        p: 140,
        query_first: 100,
        rows: 40,
        n_entries: 70,
        top: 60,
        seed: 150,
    });
}

/// The few-query window attention with the tile's keys staged whole
/// (`attention_window_staged_f32`, dims a multiple of 4 up to 512: a block
/// per (query, tile, 8 heads)) against the prefill kernel
/// (`attention_window_rows32_f32`): `rows_invariant`'s single rows and
/// first chunk take the first, the whole call of 40 or 18 queries the
/// second, so their bits are compared (and both with the CPU's values).
/// 70 heads (groups of 8 with a last of 6) of 128 dims, and DeepSeek-V4's
/// 512-dim heads (132 KB of staged keys a block); windows and entries that
/// fill, part-fill and miss tiles of 64.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_attention_window_staged_and_block_kernels_have_the_same_bits() {
    window_case(WindowCase {
        heads: 70,
        dim: 128,
        span: 90,
        window_first: 3,
        p: 140,
        query_first: 100,
        rows: 40,
        n_entries: 70,
        top: 60,
        seed: 170,
    });
    window_case(WindowCase {
        heads: 12,
        dim: 512,
        span: 128,
        window_first: 0,
        p: 150,
        query_first: 130,
        rows: 18,
        n_entries: 40,
        top: 33,
        seed: 190,
    });
}

/// Continuous batching's two ops on the GPU: `attention_causal_rows` (every
/// session's queries in place, one launch) gives each session's rows the
/// bits of its `attention_causal` alone, and `append_head_rows` (one launch
/// for every session's cache heads) the buffers that row copies, column
/// splits and appends one by one give. Sessions of 1–3 rows after 0–150
/// cached positions (1–4 tiles of 64 keys), 2 kv heads for 6 query heads;
/// heads of 24, 64 and 128 dims (the staged kernel at two and four dims a
/// lane) and of 20 (the warp kernel), and a session of 70 rows (a prefill
/// chunk: many row groups, tiles its first rows do not reach).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_batched_sessions_attend_and_append_as_alone() {
    let g = gpu();
    // (offset, t) per session.
    batched_attend_and_append_as_alone(&g, 24, &[(0, 1), (150, 1), (63, 3), (64, 2), (7, 1)]);
    batched_attend_and_append_as_alone(&g, 20, &[(0, 1), (150, 1), (63, 3), (7, 1)]);
    batched_attend_and_append_as_alone(&g, 64, &[(130, 1), (10, 70), (63, 3), (0, 2)]);
    batched_attend_and_append_as_alone(&g, 128, &[(200, 1), (1, 5), (64, 3)]);
}

fn batched_attend_and_append_as_alone(g: &Gpu, d: usize, sessions: &[(usize, usize)]) {
    use ds4_engine::backend::{CausalRows, HeadRows};
    let (hq, hkv) = (6, 2);
    let kv = Heads { heads: hkv, dim: d };
    let rows: usize = sessions.iter().map(|s| s.1).sum();
    // Each session's cache before this forward, per kv head, and this
    // forward's k/v rows for every session ([rows, hkv·d]).
    let caches: Vec<Vec<Vec<f32>>> = sessions
        .iter()
        .enumerate()
        .map(|(i, &(off, _))| {
            (0..2 * hkv)
                .map(|h| rnd(off * d, 300 + 10 * i as u64 + h as u64))
                .collect()
        })
        .collect();
    let new_k = rnd(rows * hkv * d, 401);
    let new_v = rnd(rows * hkv * d, 402);
    let (gk_new, gv_new) = (up(g, &new_k), up(g, &new_v));
    // One by one (what the batch must equal): the session's rows of k and
    // v, split into heads and appended.
    let mut alone: Vec<Vec<<Gpu as Backend>::Buf>> = caches
        .iter()
        .map(|heads| heads.iter().map(|x| up(g, x)).collect())
        .collect();
    let mut at = 0;
    for (s, &(_, t)) in alone.iter_mut().zip(sessions) {
        for (src, heads) in [(&gk_new, 0..hkv), (&gv_new, hkv..2 * hkv)] {
            let r = g.rows(src, hkv * d, at, t).unwrap();
            let parts = g.split_cols(&r, t, &vec![d; hkv], 1).unwrap();
            for (part, h) in parts.iter().zip(heads) {
                g.append(&mut s[h], part).unwrap();
            }
        }
        at += t;
    }
    // Batched: one append_head_rows for every session's k and v heads.
    let mut batched: Vec<Vec<<Gpu as Backend>::Buf>> = caches
        .iter()
        .map(|heads| heads.iter().map(|x| up(g, x)).collect())
        .collect();
    {
        let mut targets = Vec::new();
        let mut at = 0;
        for (s, &(_, t)) in batched.iter_mut().zip(sessions) {
            let (ks, vs) = s.split_at_mut(hkv);
            targets.push(HeadRows {
                src: &gk_new,
                first: at,
                rows: t,
                dsts: ks.iter_mut().collect(),
            });
            targets.push(HeadRows {
                src: &gv_new,
                first: at,
                rows: t,
                dsts: vs.iter_mut().collect(),
            });
            at += t;
        }
        g.append_head_rows(d, &mut targets).unwrap();
    }
    for (a, b) in alone.iter().zip(&batched) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(bits(&down(g, x)), bits(&down(g, y)), "append_head_rows");
        }
    }
    // Attention: every session's queries in one q, against one by one.
    let q = rnd(rows * hq * d, 403);
    let gq = up(g, &q);
    let refs: Vec<Vec<&<Gpu as Backend>::Buf>> =
        batched.iter().map(|s| s.iter().collect()).collect();
    let parts: Vec<CausalRows<'_, <Gpu as Backend>::Buf>> = refs
        .iter()
        .zip(sessions)
        .map(|(r, &(offset, t))| CausalRows {
            t,
            k: &r[..hkv],
            v: &r[hkv..],
            offset,
        })
        .collect();
    let together = down(g, &g.attention_causal_rows(&gq, &parts, hq, kv).unwrap());
    let mut at = 0;
    for (r, &(offset, t)) in refs.iter().zip(sessions) {
        let qs = up(g, &q[at * hq * d..(at + t) * hq * d]);
        let one = down(
            g,
            &g.attention_causal(&qs, &r[..hkv], &r[hkv..], offset, hq, kv)
                .unwrap(),
        );
        assert_eq!(
            bits(&one),
            bits(&together[at * hq * d..(at + t) * hq * d]),
            "session at {offset} with {t} rows"
        );
        at += t;
    }
}

/// The few-query window attention (`attention_window_staged_f32`) has the
/// same bits with 1, 2, 4 or 8 heads a block (`CudaOps::set_window_heads`):
/// a head's partial is the same warp's work whichever block holds it.
/// DeepSeek-V4's 512-dim heads, 20 heads (a last group part full), one and
/// three queries, every entry mode, windows and entries that fill and
/// part-fill tiles of 64.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_attention_window_heads_a_block_keep_the_bits() {
    let g = gpu();
    let (heads, dim, span, p, n_entries) = (20, 512, 128, 150, 70);
    let window = up(&g, &rnd(p * dim, 211));
    let entries = up(&g, &rnd(n_entries * dim, 212));
    let sinks = up(&g, &rnd(heads, 213));
    let before = g.window_heads();
    for rows in [1, 3] {
        let q = up(&g, &rnd(rows * heads * dim, 214 + rows as u64));
        let scores = up(&g, &rnd(rows * n_entries, 220 + rows as u64));
        let limits: Vec<usize> = (0..rows).map(|r| 60 + r).collect();
        let sel = g
            .select_topk(&scores, rows, n_entries, &limits, 50)
            .unwrap();
        for mode in 0..3 {
            let run = |h: usize| {
                g.set_window_heads(h).unwrap();
                let keep = match mode {
                    0 => EntryKeep::None,
                    1 => EntryKeep::Causal { ratio: 2 },
                    _ => EntryKeep::Selected(&sel),
                };
                let y = g
                    .attention_window(
                        &q, heads, dim, 140, &window, 0, span, &entries, keep, &sinks,
                    )
                    .unwrap();
                bits(&down(&g, &y))
            };
            let eight = run(8);
            for h in [1, 2, 4] {
                assert_eq!(run(h), eight, "{rows} rows, mode {mode}: {h} heads a block");
            }
        }
    }
    assert!(g.set_window_heads(3).is_err());
    g.set_window_heads(before).unwrap();
}
