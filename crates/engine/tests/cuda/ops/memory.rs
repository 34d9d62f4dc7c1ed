//! Memory ops and embedding lookups.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use std::sync::Arc;

use crate::support::{bits, check, down, gpu, rnd, up};

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_memory_ops_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps);
    let x = rnd(6 * 10, 1);
    let gx = up(&g, &x);
    assert_eq!(g.len(&gx), 60);
    check(
        "rows",
        &down(&g, &g.rows(&gx, 10, 2, 3).unwrap()),
        &c.rows(&x, 10, 2, 3).unwrap(),
        0.0,
        true,
    );
    assert!(
        g.rows(&gx, 10, 5, 2).is_err(),
        "rows past the end are refused"
    );
    // append / truncate, and a clone is a snapshot (copy on write).
    let mut a = g.zeros(0).unwrap();
    let mut ca = c.zeros(0).unwrap();
    for i in 0..40 {
        let piece = rnd(7, 100 + i);
        g.append(&mut a, &up(&g, &piece)).unwrap();
        c.append(&mut ca, &piece).unwrap();
    }
    let snap = a.clone();
    g.truncate(&mut a, 100).unwrap();
    c.truncate(&mut ca, 100).unwrap();
    let tail = rnd(13, 7);
    g.append(&mut a, &up(&g, &tail)).unwrap();
    c.append(&mut ca, &tail).unwrap();
    check("append_truncate", &down(&g, &a), &ca, 0.0, true);
    assert_eq!(down(&g, &snap).len(), 280, "the snapshot kept its length");
    let want: Vec<f32> = (0..40).flat_map(|i| rnd(7, 100 + i)).collect();
    assert_eq!(
        bits(&down(&g, &snap)),
        bits(&want),
        "the snapshot kept its values"
    );
    // concat / split.
    let (p1, p2) = (rnd(4 * 3, 2), rnd(4 * 5, 3));
    let gc = g
        .concat_cols(&[(&up(&g, &p1), 3), (&up(&g, &p2), 5)], 4)
        .unwrap();
    let cc = c.concat_cols(&[(&p1, 3), (&p2, 5)], 4).unwrap();
    check("concat_cols", &down(&g, &gc), &cc, 0.0, true);
    // Two to four parts run in one launch (a part may be empty), five in
    // one copy each.
    for parts in [&[2, 3][..], &[4, 0, 1], &[1, 2, 3, 4], &[1, 1, 2, 1, 3]] {
        let period: usize = parts.iter().sum();
        let y = rnd(2 * 3 * period, 4);
        let gs = g.split_cols(&up(&g, &y), 2, parts, 3).unwrap();
        let cs = c.split_cols(&y, 2, parts, 3).unwrap();
        assert_eq!(gs.len(), parts.len());
        for (i, (a, b)) in gs.iter().zip(&cs).enumerate() {
            if b.is_empty() {
                assert!(down(&g, a).is_empty(), "split_cols{parts:?}[{i}]");
                continue;
            }
            check(
                &format!("split_cols{parts:?}[{i}]"),
                &down(&g, a),
                b,
                0.0,
                true,
            );
        }
    }
    let y = rnd(2 * 3 * 5, 4);
    assert!(g.split_cols(&up(&g, &y), 2, &[4, 4], 1).is_err());
    let z = down(&g, &g.zeros(33).unwrap());
    assert!(z.iter().all(|&v| v == 0.0) && z.len() == 33);
}

/// Downloads land in a page-locked block of at most 64 MiB, in pieces past
/// it: sizes below, at and past the block (and its growth from 1 MiB) read
/// back every value.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_downloads_of_every_size_read_back_every_value() {
    let g = gpu();
    let block = (64usize << 20) / 4;
    for n in [0, 1, 1000, (1 << 18) + 3, block, block + 1, 2 * block + 7] {
        let x: Vec<f32> = (0..n).map(|i| (i as f32).sqrt() - (i % 7) as f32).collect();
        let back = g.download(&g.upload(&x).unwrap()).unwrap();
        assert_eq!(back.len(), n);
        assert!(bits(&back) == bits(&x), "{n} values");
    }
    // Parts (a batch's logits) across the pieces, empty ones included,
    // against the CPU's split of the same values.
    let lens = [block - 3, 10, 0, block + 5, 1];
    let n: usize = lens.iter().sum();
    let x: Vec<f32> = (0..n).map(|i| (i as f32) * 0.5 - 3.0).collect();
    let got = g.download_parts(&g.upload(&x).unwrap(), &lens).unwrap();
    let want = CpuOps.download_parts(&x, &lens).unwrap();
    assert_eq!(got.len(), lens.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.len(), lens[i]);
        assert!(bits(a) == bits(b), "part {i}");
    }
    assert!(
        g.download_parts(&g.upload(&x).unwrap(), &lens[..2])
            .is_err(),
        "parts that do not add up to the buffer are refused"
    );
}

fn quantized(dtype: GgmlDType, rows: usize, width: usize, seed: u64) -> HostWeight {
    let t = Tensor::from_vec(rnd(rows * width, seed), (rows, width), &Device::Cpu).unwrap();
    HostWeight::Quant(Arc::new(
        ds4_engine::quant::from_candle(&QTensor::quantize(&t, dtype).unwrap()).unwrap(),
    ))
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_embedding_lookup_is_exact() {
    let (g, c) = (gpu(), CpuOps);
    let (v, w) = (50, 64);
    let ids = [3u32, 0, 49, 3, 17];
    let f32_table = HostWeight::F32(Tensor::from_vec(rnd(v * w, 9), (v, w), &Device::Cpu).unwrap());
    for (name, table) in [
        ("gather_rows f32", f32_table),
        ("gather_rows q8_0", quantized(GgmlDType::Q8_0, v, w, 10)),
        ("gather_rows q4_1", quantized(GgmlDType::Q4_1, v, w, 11)),
    ] {
        let gt = g.table(table.clone(), v, w).unwrap();
        let ct = c.table(table, v, w).unwrap();
        check(
            name,
            &down(&g, &g.gather_rows(&gt, &ids).unwrap()),
            &c.gather_rows(&ct, &ids).unwrap(),
            0.0,
            true,
        );
        assert!(
            g.gather_rows(&gt, &[50]).is_err(),
            "{name}: an id past the table is refused"
        );
    }
}

/// A batch's rows cut into per-session parts and put back together in one
/// launch each (`split_rows`, `concat_rows`): every part the CPU's rows,
/// the concatenation the values in order — parts of 0 to 40 rows (a
/// prefill chunk's part cut into several row blocks), and a concatenation
/// whose unit is two rows.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_split_and_concat_rows_in_one_launch_each() {
    let (g, c) = (gpu(), CpuOps);
    let width = 24;
    let counts = [1, 0, 3, 40, 1, 17];
    let total: usize = counts.iter().sum();
    let x = rnd(total * width, 7);
    let gx = up(&g, &x);
    let before = g.launches();
    let parts = g.split_rows(&gx, width, &counts).unwrap();
    assert_eq!(g.launches() - before, 1, "one copy for every part");
    let want = c.split_rows(&x, width, &counts).unwrap();
    assert_eq!(parts.len(), counts.len());
    for (i, (p, w)) in parts.iter().zip(&want).enumerate() {
        assert_eq!(g.len(p), counts[i] * width);
        assert!(bits(&down(&g, p)) == bits(w), "part {i}");
    }
    let before = g.launches();
    let back = g.concat_rows(parts, width).unwrap();
    assert_eq!(g.launches() - before, 1, "one copy for every part");
    assert!(bits(&down(&g, &back)) == bits(&x));
    let pairs: Vec<_> = [2usize, 4, 2]
        .iter()
        .scan(0, |at, &r| {
            let p = up(&g, &x[*at * width..(*at + r) * width]);
            *at += r;
            Some(p)
        })
        .collect();
    let joined = down(&g, &g.concat_rows(pairs, 2 * width).unwrap());
    assert!(bits(&joined) == bits(&x[..8 * width]));
    assert!(g.split_rows(&gx, width, &[total + 1]).is_err());
    assert!(g.concat_rows(vec![up(&g, &x[..width + 1])], width).is_err());
}

/// A pure unit of seven inputs of uneven lengths (one and four, a copy
/// launch of eight pairs and one of four, and the outputs likewise):
/// captured on the first call, replayed on later ones with new values, its
/// outputs each input's own `x + x` every time.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_pure_units_of_many_buffers_copy_each_in_and_out() {
    let g = gpu();
    let lens = [1usize, 5, 33, 300, 1, 64, 9];
    let key = [0x5eed_u64, 7, 7, 1];
    for call in 0..3u64 {
        let host: Vec<Vec<f32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| rnd(n, 100 * call + i as u64))
            .collect();
        let bufs: Vec<_> = host.iter().map(|h| up(&g, h)).collect();
        let refs: Vec<_> = bufs.iter().collect();
        let mut body = |inp: &[&<ds4_engine::backend::CudaOps as Backend>::Buf]| {
            inp.iter().map(|x| g.add(x, x)).collect()
        };
        let outs = g.run_pure(&key, &refs, &mut body).unwrap();
        assert_eq!(outs.len(), lens.len(), "call {call}");
        for (i, (o, h)) in outs.iter().zip(&host).enumerate() {
            let want: Vec<f32> = h.iter().map(|v| v + v).collect();
            assert_eq!(bits(&down(&g, o)), bits(&want), "call {call} buffer {i}");
        }
    }
}
