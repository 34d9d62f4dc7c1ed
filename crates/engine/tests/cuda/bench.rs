//! Speed on the GPU (measurements, printed as REPORT lines; they assert only
//! that the runs complete with finite results):
//!
//! * kernels at full-size shapes against the measured device copy
//!   bandwidth: block and f32 GEMV (decode, and the 2–4 rows of an MTP
//!   verify), decode attention over 2k tokens, one delta-rule step;
//! * a SmolLM2-135M-shaped llama (random Q4_1 blocks, Q8_0 tied embedding,
//!   written as a GGUF) decoding on the GPU and on the CPU.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use ds4_engine::backend::{Backend, CpuOps, CudaOps, Heads, HostWeight, ScanDims};
use ds4_engine::families::llama::{GgufWeights, LlamaModel};
use ds4_engine::{LogitsRows, Model, ModelState};

use crate::support::{gpu, rnd};

/// Random bytes of valid GGUF blocks: small positive f16 scales, random
/// quants (and a Q4_1 minimum of −8·d, so values are centred).
fn random_blocks(dtype: GgmlDType, blocks: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let m = half::f16::from_f32(-0.08).to_bits().to_le_bytes();
    let (bb, head): (usize, Vec<u8>) = match dtype {
        GgmlDType::Q4_1 => (20, [d, m].concat()),
        GgmlDType::Q8_0 => (34, d.to_vec()),
        other => panic!("no random blocks for {other:?}"),
    };
    let mut out = Vec::with_capacity(blocks * bb);
    for _ in 0..blocks {
        out.extend_from_slice(&head);
        let mut left = bb - head.len();
        while left > 0 {
            let r = next().to_le_bytes();
            let n = left.min(8);
            out.extend_from_slice(&r[..n]);
            left -= n;
        }
    }
    out
}

fn qtensor(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> QTensor {
    let data = random_blocks(dtype, rows * cols / 32, seed);
    let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, dtype).unwrap();
    QTensor::new(storage, (rows, cols)).unwrap()
}

/// Seconds per call of `f` (after a warm-up), the device drained.
fn time(g: &CudaOps, iters: usize, mut f: impl FnMut(usize)) -> f64 {
    f(0);
    g.synchronize().unwrap();
    let start = Instant::now();
    for i in 0..iters {
        f(i);
    }
    g.synchronize().unwrap();
    start.elapsed().as_secs_f64() / iters as f64
}

/// The ceiling the products are measured against: a device-to-device copy
/// of 1 GiB, bytes read + written a second (printed as a REPORT line).
fn copy_peak(g: &CudaOps) -> f64 {
    let n = 1 << 28;
    let src = g.zeros(n).unwrap();
    let copy = time(g, 10, |_| {
        let mut dst = g.zeros(0).unwrap();
        g.append(&mut dst, &src).unwrap();
    });
    // `zeros` + append: the append's copy dominates (the memset is a
    // tenth of it); counted as one read and one write.
    let peak = 2.0 * 4.0 * n as f64 / copy / 1e9;
    println!("REPORT bench=copy_1GiB GB/s={peak:.0} (read+write)");
    peak
}

fn report(what: &str, bytes: f64, secs: f64, peak: f64) {
    let gbs = bytes / secs / 1e9;
    println!(
        "REPORT bench={what} bytes={:.1}MB time={:.1}us GB/s={gbs:.0} of_copy_bw={:.0}%",
        bytes / 1e6,
        secs * 1e6,
        100.0 * gbs / peak
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_kernels_at_full_size() {
    let g = gpu();
    let peak = copy_peak(&g);
    // Block GEMV, full-size qwen4_exp shapes: the LM head [248320, 2560],
    // and 32 distinct [4096, 2560] projections cycled (210 MB in Q4_1, more
    // than the 50 MB L2, so each call streams from HBM).
    let k = 2560;
    for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let bb = if dtype == GgmlDType::Q4_1 { 20.0 } else { 34.0 };
        let head_n = 248_320;
        let head = g
            .matrix(
                HostWeight::Quant(Arc::new(
                    ds4_engine::quant::from_candle(&qtensor(dtype, head_n, k, 1)).unwrap(),
                )),
                head_n,
                k,
            )
            .unwrap();
        for rows in [1usize, 2, 4] {
            let x = g.upload(&rnd(rows * k, 2)).unwrap();
            let t = time(&g, 20, |_| {
                g.matmul(&x, rows, &head).unwrap();
            });
            report(
                &format!("gemv_{dtype:?}_[{head_n},{k}]x{rows}"),
                head_n as f64 * k as f64 / 32.0 * bb,
                t,
                peak,
            );
        }
        let n = 4096;
        let mats: Vec<_> = (0..32)
            .map(|i| {
                g.matrix(
                    HostWeight::Quant(Arc::new(
                        ds4_engine::quant::from_candle(&qtensor(dtype, n, k, 10 + i)).unwrap(),
                    )),
                    n,
                    k,
                )
                .unwrap()
            })
            .collect();
        let x = g.upload(&rnd(k, 3)).unwrap();
        let t = time(&g, 64, |i| {
            g.matmul(&x, 1, &mats[i % 32]).unwrap();
        });
        report(
            &format!("gemv_{dtype:?}_[{n},{k}]x1_cycled"),
            n as f64 * k as f64 / 32.0 * bb,
            t,
            peak,
        );
    }
    let (n, k) = (32_768, 2560);
    let w = Tensor::from_vec(rnd(n * k, 4), (n, k), &Device::Cpu).unwrap();
    let m = g.matrix(HostWeight::F32(w), n, k).unwrap();
    let x = g.upload(&rnd(k, 5)).unwrap();
    let t = time(&g, 20, |_| {
        g.matmul(&x, 1, &m).unwrap();
    });
    report(
        &format!("gemv_f32_[{n},{k}]x1"),
        4.0 * n as f64 * k as f64,
        t,
        peak,
    );
    // Decode attention: 24 query heads over 2 kv heads of 256, 2048 keys.
    let (hq, hkv, d, ctx) = (24, 2, 256, 2048);
    let kc: Vec<_> = (0..hkv)
        .map(|h| g.upload(&rnd(ctx * d, 6 + h as u64)).unwrap())
        .collect();
    let vc: Vec<_> = (0..hkv)
        .map(|h| g.upload(&rnd(ctx * d, 8 + h as u64)).unwrap())
        .collect();
    let q = g.upload(&rnd(hq * d, 9)).unwrap();
    let t = time(&g, 20, |_| {
        g.attention_causal(
            &q,
            &kc.iter().collect::<Vec<_>>(),
            &vc.iter().collect::<Vec<_>>(),
            ctx - 1,
            hq,
            Heads { heads: hkv, dim: d },
        )
        .unwrap();
    });
    report(
        "attention_decode_24x256_ctx2048",
        2.0 * 4.0 * (hkv * ctx * d) as f64,
        t,
        peak,
    );
    // One delta-rule step at GDN's size: 48 value heads of 128×128.
    let dims = ScanDims {
        hk: 16,
        hv: 48,
        dk: 128,
        dv: 128,
    };
    let mut s = g.upload(&rnd(dims.hv * dims.dk * dims.dv, 11)).unwrap();
    let (qq, kk) = (
        g.upload(&rnd(dims.hk * dims.dk, 12)).unwrap(),
        g.upload(&rnd(dims.hk * dims.dk, 13)).unwrap(),
    );
    let v = g.upload(&rnd(dims.hv * dims.dv, 14)).unwrap();
    let gd = g.upload(&vec![-0.1; dims.hv]).unwrap();
    let beta = g.upload(&vec![0.5; dims.hv]).unwrap();
    let t = time(&g, 20, |_| {
        g.delta_rule_scan(dims, &qq, &kk, &v, &gd, &beta, &mut s)
            .unwrap();
    });
    report(
        "delta_rule_step_48x128x128",
        2.0 * 4.0 * (dims.hv * dims.dk * dims.dv) as f64,
        t,
        peak,
    );
    assert!(g.download(&s).unwrap().iter().all(|v| v.is_finite()));
}

/// SmolLM2-135M's shape: 30 layers, hidden 576, 9 query / 3 kv heads of 64,
/// FFN 1536, vocabulary 49152 (tied, Q8_0), projections Q4_1. With
/// `DS4_VOCAB_GGUF` (a metadata-only GGUF from `tools/gpu/vocab_gguf.py`)
/// its `tokenizer.*` keys are copied in, so tokenizers and llama.cpp load
/// the file too.
pub(crate) fn smollm2_shaped_gguf(path: &std::path::Path) {
    let (layers, hidden, ffn, vocab, heads, kv) =
        (30usize, 576usize, 1536usize, 49_152usize, 9usize, 3usize);
    let hd = hidden / heads;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    tensors.push((
        "token_embd.weight".into(),
        qtensor(GgmlDType::Q8_0, vocab, hidden, 1),
    ));
    let ones = |n: usize| {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    tensors.push(("output_norm.weight".into(), ones(hidden)));
    for l in 0..layers {
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        let s = 100 + 10 * l as u64;
        tensors.push((p("attn_norm"), ones(hidden)));
        tensors.push((p("ffn_norm"), ones(hidden)));
        tensors.push((p("attn_q"), qtensor(GgmlDType::Q4_1, heads * hd, hidden, s)));
        tensors.push((
            p("attn_k"),
            qtensor(GgmlDType::Q4_1, kv * hd, hidden, s + 1),
        ));
        tensors.push((
            p("attn_v"),
            qtensor(GgmlDType::Q4_1, kv * hd, hidden, s + 2),
        ));
        tensors.push((
            p("attn_output"),
            qtensor(GgmlDType::Q4_1, hidden, heads * hd, s + 3),
        ));
        tensors.push((p("ffn_gate"), qtensor(GgmlDType::Q4_1, ffn, hidden, s + 4)));
        tensors.push((p("ffn_up"), qtensor(GgmlDType::Q4_1, ffn, hidden, s + 5)));
        tensors.push((p("ffn_down"), qtensor(GgmlDType::Q4_1, hidden, ffn, s + 6)));
    }
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(layers as u32)),
        ("llama.embedding_length", Value::U32(hidden as u32)),
        ("llama.feed_forward_length", Value::U32(ffn as u32)),
        ("llama.attention.head_count", Value::U32(heads as u32)),
        ("llama.attention.head_count_kv", Value::U32(kv as u32)),
        ("llama.context_length", Value::U32(8192)),
        ("llama.rope.freq_base", Value::F32(100_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let vocab = std::env::var_os("DS4_VOCAB_GGUF").map(|p| {
        let mut f = std::fs::File::open(&p).unwrap();
        gguf_file::Content::read(&mut f).unwrap().metadata
    });
    let mut meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    if let Some(v) = &vocab {
        let mut keys: Vec<&String> = v.keys().filter(|k| k.starts_with("tokenizer.")).collect();
        keys.sort();
        meta.extend(keys.into_iter().map(|k| (k.as_str(), &v[k])));
    }
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta, &refs).unwrap();
}

/// Prefill `prompt` then `gen` greedy single-token steps: (prefill tok/s,
/// decode tok/s, the generated tokens).
fn run<M: Model>(m: &M, prompt: &[u32], steps: usize) -> (f64, f64, Vec<u32>) {
    let mut s = m.new_state();
    let start = Instant::now();
    let out = m.forward(prompt, &mut s, LogitsRows::Last).unwrap();
    let prefill = prompt.len() as f64 / start.elapsed().as_secs_f64();
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0 as u32
    };
    let mut tok = argmax(out.row(0));
    let mut toks = vec![tok];
    let start = Instant::now();
    for _ in 1..steps {
        let out = m.forward(&[tok], &mut s, LogitsRows::Last).unwrap();
        assert!(
            out.row(0).iter().all(|v| v.is_finite()),
            "non-finite logits"
        );
        tok = argmax(out.row(0));
        toks.push(tok);
    }
    let decode = (steps - 1) as f64 / start.elapsed().as_secs_f64();
    assert_eq!(s.len(), prompt.len() + steps - 1);
    (prefill, decode, toks)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_smollm2_shaped_decode() {
    // `DS4_SMOLLM2_GGUF`: keep the file there (for llama.cpp and the CLI).
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("DS4_SMOLLM2_GGUF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("smollm2-shaped.gguf"));
    let t0 = Instant::now();
    smollm2_shaped_gguf(&path);
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "REPORT bench=smollm2_gguf bytes={bytes} written_s={:.1}",
        t0.elapsed().as_secs_f64()
    );
    let cm = LlamaModel::load_gguf(&path, GgufWeights::Quantized, CpuOps).unwrap();
    let g = gpu();
    let gm = LlamaModel::load_gguf(&path, GgufWeights::Quantized, g.clone()).unwrap();
    let prompt: Vec<u32> = (0..256).map(|i| (i * 37 % 49_000 + 5) as u32).collect();
    // Side by side in one process: eager launches, then the same steps as
    // replayed CUDA graphs (captured at the first step and at each growth
    // point of the caches).
    let mut tokens = Vec::new();
    let (mut gp, mut gd) = (0.0, 0.0);
    for graphs in [false, true] {
        g.set_graphs(graphs);
        let mode = if graphs { "graph" } else { "eager" };
        let (c0, r0) = g.graph_counts();
        let before = g.launches();
        let (p, d, t) = run(&gm, &prompt, 128);
        let launches = g.launches() - before;
        let (c1, r1) = g.graph_counts();
        // Kernel launches from the host for one decode step.
        let per_step = {
            let mut s = gm.new_state();
            gm.forward(&prompt[..8], &mut s, LogitsRows::Last).unwrap();
            gm.forward(&[6], &mut s, LogitsRows::Last).unwrap();
            let b = g.launches();
            gm.forward(&[7], &mut s, LogitsRows::Last).unwrap();
            g.launches() - b
        };
        println!(
            "REPORT bench=smollm2_shaped mode={mode} prefill_tok_s={p:.0} decode_tok_s={d:.1} \
             step_us={:.0} kernels_per_decode_step={per_step} \
             total_launches={launches} captures={} replays={}",
            1e6 / d,
            c1 - c0,
            r1 - r0
        );
        // An MTP verify window is a forward of K + 1 rows: its cost against
        // one decode step, from the same state (restored between runs).
        let mut base = gm.new_state();
        gm.forward(&prompt, &mut base, LogitsRows::Last).unwrap();
        let mut step = 0.0;
        for rows in 1..=4usize {
            let toks: Vec<u32> = (0..rows as u32).map(|i| 100 + i).collect();
            let reps = 20;
            // The first window of each state captures (graph mode): one
            // state, truncated back between the timed runs.
            let mut s = base.snapshot();
            gm.forward(&toks, &mut s, LogitsRows::All).unwrap();
            s.truncate(base.len()).unwrap();
            g.synchronize().unwrap();
            let start = Instant::now();
            for _ in 0..reps {
                gm.forward(&toks, &mut s, LogitsRows::All).unwrap();
                s.truncate(base.len()).unwrap();
            }
            let t = start.elapsed().as_secs_f64() / reps as f64;
            if rows == 1 {
                step = t;
            }
            println!(
                "REPORT bench=smollm2_shaped mode={mode} verify_rows={rows} (K={}) time_us={:.0} \
                 vs_one_step={:.2}",
                rows - 1,
                t * 1e6,
                t / step
            );
        }
        tokens.push(t);
        if graphs {
            (gp, gd) = (p, d);
        }
    }
    assert_eq!(tokens[0], tokens[1], "greedy tokens: graphs vs eager");
    let gt = tokens.pop().unwrap();
    let (cp, cd, ct) = run(&cm, &prompt, 32);
    let agree = gt.iter().zip(&ct).take_while(|(a, b)| a == b).count();
    println!(
        "REPORT bench=smollm2_shaped device=gpu (graphs) prefill_tok_s={gp:.0} decode_tok_s={gd:.1}"
    );
    println!(
        "REPORT bench=smollm2_shaped device=cpu prefill_tok_s={cp:.0} decode_tok_s={cd:.1} \
         greedy_tokens_equal_to_gpu={agree}/32"
    );
    // Bytes a decode step reads: every weight once (Q4_1 projections, the
    // Q8_0 head), so the floor at the copy bandwidth is printed next to it.
    let weights = bytes as f64;
    println!(
        "REPORT bench=smollm2_shaped weight_bytes={:.1}MB step_us={:.0}",
        weights / 1e6,
        1e6 / gd
    );
}

/// Host cost per op, where the device work is negligible (64 values): a
/// launch into a new buffer (allocation, launch, free), an in-place launch,
/// and a device copy into a new buffer.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_launch_overhead() {
    let g = gpu();
    let (a, b) = (g.upload(&[1.0; 64]).unwrap(), g.upload(&[2.0; 64]).unwrap());
    let n = 5000;
    let new_buffer = time(&g, n, |_| {
        g.add(&a, &b).unwrap();
    });
    let mut x = g.upload(&[1.0; 64]).unwrap();
    let in_place = time(&g, n, |_| {
        g.l2_norm_heads(&mut x, 64, 1.0).unwrap();
    });
    let copy = time(&g, n, |_| {
        g.rows(&a, 64, 0, 1).unwrap();
    });
    println!(
        "REPORT bench=launch_overhead op_new_buffer_us={:.2} op_in_place_us={:.2} copy_new_buffer_us={:.2}",
        new_buffer * 1e6,
        in_place * 1e6,
        copy * 1e6
    );
    assert!(g.download(&x).unwrap().iter().all(|v| v.is_finite()));
}

/// Stored types kept as stored (`kernels/stored.cu`, the reference set's
/// order): a [4096, 4096] product of one row (a decode step) and of four
/// (a verify window) per type, and a [16384, 4096] one of one row (every SM
/// busy), copies of the matrix cycled so that more
/// than the 50 MB L2 is read between two uses of one copy; GB/s of stored
/// bytes (scales included) against the measured device copy. Q4_1 and
/// Q8_0 (their own warp-per-row kernels) at the same shape for context.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_stored_gemv() {
    use ds4_engine::quant::random::{STORED_TYPES as TYPES, random_stored};
    let g = gpu();
    let peak = copy_peak(&g);
    let k = 4096;
    // [4096, 4096]: one block of 32 rows per SM (a decode-sized
    // projection); [16384, 4096]: enough blocks to fill every SM.
    for (n, row_counts) in [(4096usize, &[1usize, 4][..]), (16_384, &[1][..])] {
        let mut weights: Vec<(String, Arc<ds4_engine::quant::QuantTensor>)> = TYPES
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                (
                    ty.to_string(),
                    Arc::new(random_stored(ty, &[n, k], &[n], 70 + i as u64)),
                )
            })
            .collect();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            weights.push((
                format!("{dtype:?}"),
                Arc::new(ds4_engine::quant::from_candle(&qtensor(dtype, n, k, 90)).unwrap()),
            ));
        }
        for (name, q) in weights {
            let bytes = q.byte_size() as f64;
            let copies = ((192e6 / bytes).ceil() as usize).clamp(2, 64);
            let mats: Vec<_> = (0..copies)
                .map(|_| g.matrix(HostWeight::Quant(q.clone()), n, k).unwrap())
                .collect();
            for &rows in row_counts {
                let x = g.upload(&rnd(rows * k, 3)).unwrap();
                let iters = (4 * copies).max(32);
                let t = time(&g, iters, |i| {
                    g.matmul(&x, rows, &mats[i % copies]).unwrap();
                });
                report(
                    &format!("stored_gemv_{name}_[{n},{k}]x{rows}_cycled{copies}"),
                    bytes,
                    t,
                    peak,
                );
            }
        }
    }
}

/// The fast kernel set's products (`kernels/kq8.cu`: int8 activations,
/// dp4a) against the reference set's stored kernels on the same matrices,
/// side by side in one process: [4096, 4096] and [16384, 4096] of each
/// 256-value super-block type, 1, 4 and 16 activation rows, copies cycled
/// past the L2; GB/s of stored bytes against the measured device copy.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_kq8_gemv_fast_vs_reference() {
    use ds4_engine::quant::WeightType;
    use ds4_engine::quant::random::random_stored;
    let types = [
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::IQ2_XXS,
    ];
    let k = 4096;
    let mut weights = Vec::new();
    for n in [4096usize, 16_384] {
        for (i, ty) in types.into_iter().enumerate() {
            let q = random_stored(ty, &[n, k], &[n], 170 + i as u64);
            weights.push((ty.to_string(), n, Arc::new(q)));
        }
    }
    fast_vs_reference("kq8_gemv", &weights, &[1, 4, 16]);
}

/// The fast set's Q8_0 / Q4_1 products (`kernels/fast8.cu`: `dp4a` warps
/// per output for up to 8 rows, tensor-core tiles above) against the
/// reference set's block kernels, side by side in one process: the row
/// counts of verify windows (2–4) and of batches, [4096, 4096] and
/// [16384, 4096], copies cycled past the L2.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_fast8_gemv_fast_vs_reference() {
    let k = 4096;
    let mut weights = Vec::new();
    for n in [4096usize, 16_384] {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = ds4_engine::quant::from_candle(&qtensor(dtype, n, k, 91)).unwrap();
            weights.push((format!("{dtype:?}"), n, Arc::new(q)));
        }
    }
    fast_vs_reference("fast8_gemv", &weights, &[1, 2, 3, 4, 8, 9, 16, 64]);
}

/// Each `[n, 4096]` matrix of `weights` times each row count on the
/// reference set and the fast set, copies cycled past the L2: one
/// `REPORT bench=<what>_<set>_<type>_[n,k]x<rows>` line each.
fn fast_vs_reference(
    what: &str,
    weights: &[(String, usize, Arc<ds4_engine::quant::QuantTensor>)],
    row_counts: &[usize],
) {
    let (reference, fast) = (gpu(), crate::ops::kq8::fast_gpu());
    let peak = copy_peak(&reference);
    for (ty, n, q) in weights {
        let (n, k) = (*n, q.cols());
        let bytes = q.byte_size() as f64;
        let copies = ((192e6 / bytes).ceil() as usize).clamp(2, 64);
        for (set, g) in [("reference", &reference), ("fast", &fast)] {
            let mats: Vec<_> = (0..copies)
                .map(|_| g.matrix(HostWeight::Quant(q.clone()), n, k).unwrap())
                .collect();
            for &rows in row_counts {
                let x = g.upload(&rnd(rows * k, 3)).unwrap();
                let iters = (4 * copies).max(32);
                let t = time(g, iters, |i| {
                    g.matmul(&x, rows, &mats[i % copies]).unwrap();
                });
                report(
                    &format!("{what}_{set}_{ty}_[{n},{k}]x{rows}_cycled{copies}"),
                    bytes,
                    t,
                    peak,
                );
            }
        }
    }
}

/// Routed SwiGLU experts of the fast set at a DeepSeek-V4-like width
/// (hidden 4096, 128 experts of 1024, IQ2_XXS gate/up and Q2_K down, 6 a
/// token, random routing) for 32–2048 tokens: 1.5–96 pairs an expert,
/// every size grouped by expert into tensor-core tiles (`kq8_mma_*`; run
/// 36 timed the warp-per-output tiles it replaced with this bench).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_fast_routed_experts() {
    use ds4_engine::quant::WeightType;
    use ds4_engine::quant::random::random_stored;
    let g = crate::ops::kq8::fast_gpu();
    let (e, k, h, inter) = (128usize, 6usize, 4096usize, 1024usize);
    let gu = random_stored(
        WeightType::IQ2_XXS,
        &[e, 2 * inter, h],
        &vec![2 * inter; e],
        31,
    );
    let dn = random_stored(WeightType::Q2_K, &[e, h, inter], &vec![h; e], 32);
    let bytes = (gu.byte_size() + dn.byte_size()) as f64;
    let ggu = g
        .experts(HostWeight::Quant(Arc::new(gu)), e, 2 * inter, h)
        .unwrap();
    let gdn = g
        .experts(HostWeight::Quant(Arc::new(dn)), e, h, inter)
        .unwrap();
    for rows in [32usize, 128, 512, 2048] {
        let x = g.upload(&rnd(rows * h, 33)).unwrap();
        let logits = g.upload(&rnd(rows * e, 34)).unwrap();
        let route = g.route_softmax_topk(&logits, rows, e, k, true).unwrap();
        let iters = if rows >= 512 { 8 } else { 32 };
        let t = time(&g, iters, |_| {
            g.experts_swiglu(&x, rows, &route, &ggu, &gdn, None)
                .unwrap();
        });
        let pairs = rows * k;
        println!(
            "REPORT bench=fast_routed_experts tokens={rows} pairs={pairs} \
             pairs_per_expert={:.1} time={:.1}us pairs_per_s={:.0} stack_MB={:.0}",
            pairs as f64 / e as f64,
            t * 1e6,
            pairs as f64 / t,
            bytes / 1e6
        );
    }
}
