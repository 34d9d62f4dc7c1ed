//! Batched decode steps of the SmolLM2 shape on both kernel sets (issue
//! 47's GPU rows, where a step of many sessions' rows spends its time):
//! one forward of `n` sessions' decode rows (`Model::forward_batch`), timed
//! with the host's wait on the device split out, and a batched prefill of
//! every session's prompt; each batched session's logits checked against
//! its forward alone. With `DS4_CUDA_HOST_PROFILE=1` the host's gaps of the
//! widest step, by the driver call after each.

use std::time::Instant;

use ds4_engine::backend::CudaOps;
use ds4_engine::families::llama::{GgufWeights, LlamaModel};
use ds4_engine::model::BatchCall;
use ds4_engine::{LogitsRows, Model};

use crate::bench::smollm2_shaped_gguf;
use crate::ops::kq8::fast_gpu;
use crate::support::{bits, gpu};

const PROMPT: usize = 128;
const STEPS: usize = 8;

fn prompt(i: usize) -> Vec<u32> {
    (0..PROMPT)
        .map(|t| ((i * 7919 + t * 37) % 49_000 + 5) as u32)
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_bench_smollm2_shaped_batched_steps() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("DS4_SMOLLM2_GGUF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("smollm2-shaped.gguf"));
    if !path.exists() {
        smollm2_shaped_gguf(&path);
    }
    let counts: Vec<usize> = std::env::var("DS4_BATCH_COUNTS")
        .unwrap_or_else(|_| "1,8,32,64".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let most = counts.iter().copied().max().unwrap_or(1);
    let sets: [(&str, CudaOps); 2] = [("reference", gpu()), ("fast", fast_gpu())];
    for (set, g) in sets {
        let m = LlamaModel::load_gguf(&path, GgufWeights::Quantized, g.clone()).unwrap();
        let prompts: Vec<Vec<u32>> = (0..most).map(prompt).collect();
        // Every session's prompt in one batched forward (prefill).
        let mut states: Vec<_> = (0..most).map(|_| m.new_state()).collect();
        g.synchronize().unwrap();
        let start = Instant::now();
        {
            let mut calls: Vec<_> = prompts
                .iter()
                .zip(states.iter_mut())
                .map(|(p, s)| BatchCall::logits(p, s, LogitsRows::Last))
                .collect();
            for r in m.forward_batch(&mut calls) {
                r.unwrap();
            }
        }
        g.synchronize().unwrap();
        let prefill_s = start.elapsed().as_secs_f64();
        println!(
            "REPORT batched set={set} prefill_sessions={most} prompt={PROMPT} tok_s={:.0}",
            (most * PROMPT) as f64 / prefill_s
        );
        // Session 0 alone against its batched self: same bits.
        let mut alone = m.new_state();
        m.forward(&prompts[0], &mut alone, LogitsRows::Last)
            .unwrap();
        let mut base_one = None;
        for &n in &counts {
            let mut times = Vec::new();
            let mut waits = Vec::new();
            for (step, tok) in (0..STEPS + 2).zip(6u32..) {
                if n == most && step == 2 {
                    // The gaps of the timed steps alone (the first steps
                    // grow the caches of sessions that join).
                    let _ = g.host_gaps();
                }
                let toks: Vec<[u32; 1]> = (0..n).map(|i| [tok + i as u32]).collect();
                let w0 = g.sync_wait_ns();
                let start = Instant::now();
                let outs = m.forward_batch(&mut decode_calls(&toks, &mut states));
                let dt = start.elapsed().as_secs_f64();
                let outs: Vec<_> = outs.into_iter().map(|r| r.unwrap()).collect();
                if step == 0 && n == counts[0] {
                    // The first decode row of session 0 against alone.
                    let a = m.forward(&[tok], &mut alone, LogitsRows::Last).unwrap();
                    assert_eq!(
                        bits(outs[0].logits.row(0)),
                        bits(a.row(0)),
                        "{set}: batched != alone"
                    );
                }
                if step >= 2 {
                    times.push(dt);
                    waits.push((g.sync_wait_ns() - w0) as f64 / 1e9);
                }
            }
            let step = times.iter().sum::<f64>() / times.len() as f64;
            let wait = waits.iter().sum::<f64>() / waits.len() as f64;
            let tps = n as f64 / step;
            let one = *base_one.get_or_insert(tps);
            println!(
                "REPORT batched set={set} sessions={n} step_ms={:.3} host_ms={:.3} wait_ms={:.3} \
                 tok_s={tps:.0} vs_one={:.2}",
                step * 1e3,
                (step - wait) * 1e3,
                wait * 1e3,
                tps / one
            );
            if n == most {
                let gaps = g.host_gaps();
                print_gaps(set, &gaps, "same_thread");
                // One more step inside the profiler's range: what Nsight
                // Compute profiles under `--profile-from-start off`
                // (`tools/gpu/smollm2-streams.sh`, NCU=1); untimed.
                let toks: Vec<[u32; 1]> = (0..n).map(|i| [50 + i as u32]).collect();
                g.profiler_range(true).unwrap();
                for r in m.forward_batch(&mut decode_calls(&toks, &mut states)) {
                    r.unwrap();
                }
                g.profiler_range(false).unwrap();
                // The same steps as `BatchingModel` runs them for
                // `bench --streams`: each forward on another thread (the
                // leader is whichever stream queued first) and each
                // session's logits dropped on a thread of its own (its
                // stream's): what the host's time costs off one warm thread.
                let mut times = Vec::new();
                for (step, tok) in (0..STEPS).zip(100u32..) {
                    let toks: Vec<[u32; 1]> = (0..n).map(|i| [tok + i as u32]).collect();
                    let states = &mut states;
                    let (dt, outs) = std::thread::scope(|s| {
                        s.spawn(|| {
                            let start = Instant::now();
                            let outs = m.forward_batch(&mut decode_calls(&toks, states));
                            (start.elapsed().as_secs_f64(), outs)
                        })
                        .join()
                        .unwrap()
                    });
                    std::thread::scope(|s| {
                        for o in outs {
                            s.spawn(move || drop(o.unwrap()));
                        }
                    });
                    if step >= 2 {
                        times.push(dt);
                    }
                }
                let step = times.iter().sum::<f64>() / times.len() as f64;
                println!(
                    "REPORT batched set={set} sessions={n} step_ms_thread_per_step={:.3}",
                    step * 1e3
                );
                print_gaps(set, &g.host_gaps(), "thread_per_step");
            }
        }
    }
}

/// One decode row a session: `toks[i]` after session `i`'s state.
fn decode_calls<'a, S>(toks: &'a [[u32; 1]], states: &'a mut [S]) -> Vec<BatchCall<'a, S>> {
    toks.iter()
        .zip(states.iter_mut())
        .map(|(t, s)| BatchCall::logits(t, s, LogitsRows::Last))
        .collect()
}

/// The host profile's rows of a step (`DS4_CUDA_HOST_PROFILE=1`).
fn print_gaps(set: &str, gaps: &[ds4_engine::backend::cuda::GapRow], how: &str) {
    let steps = STEPS as f64;
    let (calls, pairs): (Vec<_>, Vec<_>) = gaps.iter().partition(|r| r.after.is_none());
    for r in calls.iter().take(20) {
        println!(
            "REPORT batched_gap set={set} how={how} name={} calls_per_step={:.1} gap_ms={:.3} driver_ms={:.3}",
            r.name,
            r.calls as f64 / steps,
            r.gap_ns as f64 / 1e6 / steps,
            r.call_ns as f64 / 1e6 / steps
        );
    }
    // Per transition: whose host code a gap was (the first call of a
    // step's gap spans the loop's own work between steps).
    for r in pairs.iter().take(12) {
        println!(
            "REPORT batched_gap_after set={set} how={how} after={} name={} calls_per_step={:.1} gap_ms={:.3}",
            r.after.as_deref().unwrap_or("-"),
            r.name,
            r.calls as f64 / steps,
            r.gap_ns as f64 / 1e6 / steps
        );
    }
}
