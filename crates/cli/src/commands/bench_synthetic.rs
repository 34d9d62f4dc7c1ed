//! `ds4server bench --synthetic FAMILY [--shape full|tiny|PATH.json]
//! [--weights q4_1|ds4-q2|ds4-q4] [--dry-run]`: prefill and decode of a
//! family at its real configuration with random weights
//! (`ds4_engine::load::synthetic`: 4-bit projections and expert stacks,
//! generated on the device on CUDA; or, for deepseek_v4 and glm5_next,
//! antirez/ds4's real stored types per tensor group,
//! `load::synthetic::stored`, made on the host), against the memory
//! roofline.
//!
//! With ds4's recipes the bench reports the weight bytes per stored type
//! (against ds4's published file sizes), and with `--prompts 512,2048`
//! prefills each length from an empty state. `--dry-run` prints the bytes
//! per type from the family's tensor list without making any weight (the
//! full shape does not fit a development machine's memory).
//!
//! The bytes a decode step must read are counted from the weights the
//! synthetic source handed out: every weight once, except the expert stacks
//! (`k` of `E` experts per layer), the embedding table (one row) and the
//! MTP head (not run by a plain decode step); plus the state (KV caches,
//! recurrent states and windows) at the decode context. On CUDA that is
//! set against a device copy measured in the same run (bytes read +
//! written per second), as `bench.rs` in the CUDA tests does.
//!
//! GLM-5.3-Flash's full shape (`--shape full`, 313.3 B parameters) is
//! 95.9 GB (89.3 GiB) as stored at ds4-q2 and 181.5 GB (169.0 GiB) at
//! ds4-q4 (`--dry-run`), more than an 80 GB H100 holds; a decode step
//! reads 11.9 GB (q2) / 14.3 GB (q4) of it (8 of 288 experts), plus the
//! state. `tools/gpu/glm5_next_full_20_layers.json` (its first 20 layers:
//! the three dense ones first, KDA / MLA in the full model's 3:1 pattern)
//! is 128.1 B parameters, 40.5 GB (37.7 GiB) at ds4-q2 with 5.8 GB read per
//! step, and fits one; at ds4-q4 it is 75.2 GB (70.0 GiB), too close to a
//! 78 GiB card for the state and workspaces.

use std::time::Instant;

use ds4_engine::decode::prefill;
use ds4_engine::families::LoadedModel;
use ds4_engine::load::synthetic::stored::glm5::glm5_next_dry_ledger;
use ds4_engine::load::synthetic::stored::{
    Ds4Recipe, StoredFamily, StoredLedger, deepseek_v4_dry_ledger, making_secs, type_totals,
};
use ds4_engine::load::synthetic::{Ledger, hash64, shape_config};
use ds4_engine::{LogitsRows, Model, ModelState};

use crate::args::BenchArgs;
#[cfg(feature = "cuda")]
use ds4_engine::backend::cuda::GapRow;

/// One run's measurements.
#[derive(Debug, Clone)]
pub struct SyntheticReport {
    pub load_secs: f64,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub gen_tokens: usize,
    pub gen_tps: f64,
    /// Seconds of a forward of K + 1 rows, K = 0..=3 (median of the reps).
    pub verify_secs: Vec<f64>,
    pub state_bytes: usize,
    /// FNV-1a of the greedy tokens and of the last decode row's logit bits:
    /// two runs (builds, kernel sets) with the same digest decoded the same
    /// bits.
    pub decode_digest: u64,
}

/// Which weights `--synthetic` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// Q4_1 projections made on the device, small f32 parameters.
    Q4_1,
    /// antirez/ds4's stored types per tensor group.
    Ds4(Ds4Recipe),
}

/// `--weights`, or the family's default (`ds4-q2` for deepseek_v4 and
/// glm5_next, Q4_1 otherwise).
pub fn weights_of(family: &str, weights: Option<&str>) -> anyhow::Result<Weights> {
    Ok(match weights {
        None if StoredFamily::of(family).is_some() => Weights::Ds4(Ds4Recipe::Q2),
        None | Some("q4_1") => Weights::Q4_1,
        Some(s) => Weights::Ds4(
            Ds4Recipe::parse(s)
                .ok_or_else(|| anyhow::anyhow!("--weights {s}: expected q4_1, ds4-q2 or ds4-q4"))?,
        ),
    })
}

pub fn bench_synthetic(family: &str, args: &BenchArgs) -> anyhow::Result<()> {
    let config = shape_config(family, &args.shape)?;
    let weights = weights_of(family, args.weights.as_deref())?;
    if let Weights::Ds4(recipe) = weights {
        return bench_stored(family, &config, recipe, args);
    }
    if args.dry_run {
        anyhow::bail!(
            "--dry-run counts the bytes of --weights ds4-q2 / ds4-q4 (deepseek_v4, glm5_next)"
        );
    }
    let (device, kernels) = crate::model_source::device_and_kernels(&args.model)?;
    let start = Instant::now();
    let (loaded, ledger) = LoadedModel::synthetic(family, &config, args.seed, false, device)?;
    let load_secs = start.elapsed().as_secs_f64();
    // Kernels launched by the load (the device-made weights): where an
    // `ncu --launch-skip` of the first forward starts.
    #[cfg(feature = "cuda")]
    if let LoadedModel::Qwen4ExpCuda(m) = &loaded {
        println!("REPORT load_launches={}", m.ops().launches());
    }
    if !args.streams.is_empty() {
        return streams(&loaded, args, kernels.name());
    }
    let report = ds4_engine::with_model!(&loaded, model => run(model, args, load_secs))?;
    let count = |key: &str| config.get(key).and_then(|v| v.as_u64()).unwrap_or(1) as usize;
    let step = step_bytes(
        &ledger,
        count("num_experts_per_tok"),
        count("num_experts"),
        count("vocab_size"),
    );
    let weight_total: usize = ledger.values().sum();
    let step_secs = 1.0 / report.gen_tps.max(1e-12);
    println!(
        "REPORT synthetic={family} shape={} device={device:?} backend={} kernels={} weights_gb={:.2} load_s={:.1}",
        args.shape,
        loaded.backend(),
        kernels.name(),
        weight_total as f64 / 1e9,
        report.load_secs
    );
    println!(
        "REPORT prefill_tokens={} prefill_tok_s={:.1} decode_tokens={} decode_tok_s={:.2} step_ms={:.3}",
        report.prefill_tokens,
        report.prefill_tps,
        report.gen_tokens,
        report.gen_tps,
        step_secs * 1e3
    );
    let verify: Vec<String> = report
        .verify_secs
        .iter()
        .enumerate()
        .map(|(k, t)| format!("K={k}:{:.3}ms({:.2}x)", t * 1e3, t / report.verify_secs[0]))
        .collect();
    println!("REPORT verify_rows {}", verify.join(" "));
    println!("REPORT decode_digest={:016x}", report.decode_digest);
    let bytes = step.weights + report.state_bytes;
    println!(
        "REPORT step_bytes_mb={:.1} (weights {:.1}: dense {:.1}, experts {:.1}, lm_head {:.1}; state {:.1})",
        bytes as f64 / 1e6,
        step.weights as f64 / 1e6,
        step.dense as f64 / 1e6,
        step.experts as f64 / 1e6,
        step.head as f64 / 1e6,
        report.state_bytes as f64 / 1e6
    );
    #[cfg(feature = "cuda")]
    if let LoadedModel::Qwen4ExpCuda(m) = &loaded {
        roofline_report(m.as_ref(), m.ops(), bytes, step_secs)?;
        window_profile(m, args)?;
    }
    Ok(())
}

/// The step against the HBM roofline (the device's measured copy rate over
/// the bytes a step reads), its launches, and the host's share of it.
#[cfg(feature = "cuda")]
fn roofline_report<M: Model>(
    m: &M,
    ops: &ds4_engine::backend::CudaOps,
    bytes: usize,
    step_secs: f64,
) -> anyhow::Result<()> {
    let bw = ops.copy_bandwidth(1 << 30, 10)?;
    let floor = bytes as f64 / bw;
    let (launches, host_ms, wait_ms) = step_profile(m, ops)?;
    println!(
        "REPORT hbm_copy_tb_s={:.3} roofline_step_ms={:.3} roofline_tok_s={:.1} fraction={:.3} launches_per_step={launches:.0}",
        bw / 1e12,
        floor * 1e3,
        1.0 / floor,
        floor / step_secs,
    );
    println!("REPORT step_host_ms={host_ms:.3} step_wait_ms={wait_ms:.3}");
    let (used, total) = ops.device_memory()?;
    println!("REPORT device_memory used={} of {}", gb(used), gb(total));
    Ok(())
}

/// GB and GiB of `bytes`.
fn gb(bytes: usize) -> String {
    format!(
        "{:.3} GB ({:.3} GiB)",
        bytes as f64 / 1e9,
        bytes as f64 / (1u64 << 30) as f64
    )
}

/// The bytes per stored type and in all, against ds4's file of `recipe`
/// where its size is known (DeepSeek-V4-Flash's).
fn print_types(ledger: &StoredLedger, recipe: Ds4Recipe, kind: StoredFamily) {
    let (mut stored, mut held, mut params) = (0usize, 0usize, 0usize);
    for (ty, (n, b, h)) in type_totals(ledger) {
        println!(
            "REPORT weights type={ty} tensors={n} stored={} held={}",
            gb(b),
            gb(h)
        );
        stored += b;
        held += h;
    }
    for e in ledger.values().filter(|e| e.ty != "I32") {
        params += e.dims.iter().product::<usize>();
    }
    let file = if kind == StoredFamily::DeepseekV4 {
        format!("ds4's file: about {}", recipe.published_size())
    } else {
        "no published size of ds4's file here".into()
    };
    println!(
        "REPORT weights_total recipe={} params={:.3}B stored={} held={} ({file}; held: as the loader keeps it, vectors as f32)",
        recipe.name(),
        params as f64 / 1e9,
        gb(stored),
        gb(held),
    );
}

/// The host's peak resident memory (`VmHWM`), bytes.
fn host_peak_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The routing a step's bytes depend on: `(k, E, vocab)` of the parsed
/// configuration (GLM nests its fields in `text_config`).
fn routing_of(
    kind: StoredFamily,
    config: &serde_json::Value,
) -> anyhow::Result<(usize, usize, usize)> {
    let path = std::path::PathBuf::from(format!("synthetic:{}", kind.name()));
    Ok(match kind {
        StoredFamily::Glm5Next => {
            let c = ds4_engine::families::glm5_next::Glm5NextConfig::from_hf(&path, config)?;
            (c.num_experts_per_tok, c.n_routed_experts, c.vocab_size)
        }
        StoredFamily::DeepseekV4 => {
            let c = ds4_engine::families::deepseek_v4::DeepseekV4Config::from_hf(&path, config)?;
            (c.num_experts_per_tok, c.n_routed_experts, c.vocab_size)
        }
    })
}

/// The ledger of a dry run: the family's tensor list typed by the recipe.
fn dry_ledger(
    kind: StoredFamily,
    config: &serde_json::Value,
    recipe: Ds4Recipe,
) -> anyhow::Result<StoredLedger> {
    let path = std::path::PathBuf::from(format!("synthetic:{}", kind.name()));
    Ok(match kind {
        StoredFamily::Glm5Next => {
            let cfg = ds4_engine::families::glm5_next::Glm5NextConfig::from_hf(&path, config)?;
            glm5_next_dry_ledger(&cfg, recipe)
        }
        StoredFamily::DeepseekV4 => {
            let cfg = ds4_engine::families::deepseek_v4::DeepseekV4Config::from_hf(&path, config)?;
            deepseek_v4_dry_ledger(&cfg, recipe)
        }
    })
}

/// The weights a decode step reads from a stored ledger (as held; ids
/// excluded).
fn stored_step_bytes(ledger: &StoredLedger, (k, e, vocab): (usize, usize, usize)) -> StepBytes {
    let held: Ledger = ledger
        .iter()
        .filter(|(_, e)| e.ty != "I32")
        .map(|(n, e)| (n.clone(), e.held))
        .collect();
    step_bytes(&held, k, e, vocab)
}

/// deepseek_v4 or glm5_next in ds4's stored types: the bytes per type, then (unless
/// `--dry-run`) the load, a prefill of each `--prompts` length (or
/// `--ctx-start`) from an empty state and `--gen` greedy decode steps.
fn bench_stored(
    family: &str,
    config: &serde_json::Value,
    recipe: Ds4Recipe,
    args: &BenchArgs,
) -> anyhow::Result<()> {
    let Some(kind) = StoredFamily::of(family) else {
        anyhow::bail!(
            "--weights {}: ds4's recipes are for deepseek_v4 and glm5_next, not {family}",
            recipe.name()
        );
    };
    let routing = routing_of(kind, config)?;
    if args.dry_run {
        println!(
            "REPORT dry_run synthetic={family} shape={} recipe={} (no weight made)",
            args.shape,
            recipe.name()
        );
        let ledger = dry_ledger(kind, config, recipe)?;
        print_types(&ledger, recipe, kind);
        // The weights a decode step reads (the state is not counted).
        let step = stored_step_bytes(&ledger, routing);
        println!(
            "REPORT dry_run step_weights_mb={:.1} (dense {:.1}, experts {:.1}, head {:.1}; state not counted)",
            step.weights as f64 / 1e6,
            step.dense as f64 / 1e6,
            step.experts as f64 / 1e6,
            step.head as f64 / 1e6
        );
        return Ok(());
    }
    let (device, kernels) = crate::model_source::device_and_kernels(&args.model)?;
    let start = Instant::now();
    let (loaded, ledger) =
        LoadedModel::synthetic_stored(family, config, args.seed, recipe, device)?;
    let load_secs = start.elapsed().as_secs_f64();
    println!(
        "REPORT synthetic={family} shape={} recipe={} device={device:?} backend={} kernels={} load_s={load_secs:.1} (making the weights on the host {:.1} s) host_peak={}",
        args.shape,
        recipe.name(),
        loaded.backend(),
        kernels.name(),
        making_secs(),
        host_peak_bytes().map_or("?".into(), gb)
    );
    print_types(&ledger, recipe, kind);
    if !args.streams.is_empty() {
        return streams(&loaded, args, kernels.name());
    }
    let lens = if args.prompts.is_empty() {
        vec![args.ctx_start]
    } else {
        args.prompts.clone()
    };
    for len in lens {
        let report =
            ds4_engine::with_model!(&loaded, model => run_at(model, args, len, load_secs))?;
        let step = stored_step_bytes(&ledger, routing);
        println!(
            "REPORT prefill_tokens={} prefill_tok_s={:.1} decode_tokens={} decode_tok_s={:.2} step_ms={:.3}",
            report.prefill_tokens,
            report.prefill_tps,
            report.gen_tokens,
            report.gen_tps,
            1e3 / report.gen_tps.max(1e-12)
        );
        let verify: Vec<String> = report
            .verify_secs
            .iter()
            .enumerate()
            .map(|(k, t)| format!("K={k}:{:.3}ms({:.2}x)", t * 1e3, t / report.verify_secs[0]))
            .collect();
        println!("REPORT verify_rows {}", verify.join(" "));
        println!("REPORT decode_digest={:016x}", report.decode_digest);
        println!(
            "REPORT step_bytes_mb={:.1} (weights {:.1}: dense {:.1}, experts {:.1}, head {:.1}; state {:.1})",
            (step.weights + report.state_bytes) as f64 / 1e6,
            step.weights as f64 / 1e6,
            step.dense as f64 / 1e6,
            step.experts as f64 / 1e6,
            step.head as f64 / 1e6,
            report.state_bytes as f64 / 1e6
        );
        #[cfg(feature = "cuda")]
        {
            let (bytes, step_secs) = (step.weights + report.state_bytes, 1.0 / report.gen_tps);
            match &loaded {
                LoadedModel::DeepseekV4Cuda(m) => {
                    roofline_report(m.as_ref(), m.ops(), bytes, step_secs)?
                }
                LoadedModel::Glm5NextCuda(m) => {
                    roofline_report(m.as_ref(), m.ops(), bytes, step_secs)?
                }
                LoadedModel::Qwen4ExpCuda(m) => {
                    roofline_report(m.as_ref(), m.ops(), bytes, step_secs)?
                }
                _ => {}
            }
        }
    }
    println!(
        "REPORT host_peak={}",
        host_peak_bytes().map_or("?".into(), gb)
    );
    Ok(())
}

/// `--streams` on a synthetic model: continuous batching's throughput with
/// the same bench as a real model's (`bench_streams`), for shapes no file
/// here holds (issue 47's GPU rows).
fn streams(loaded: &LoadedModel, args: &BenchArgs, kernels: &str) -> anyhow::Result<()> {
    if args.streams.contains(&0) {
        anyhow::bail!("--streams: every count must be at least 1");
    }
    let probe = super::bench_streams::probe_for(loaded);
    let rows = ds4_engine::with_model!(loaded, model => super::bench_streams::bench_streams(model, args, &args.streams, &probe))?;
    print!(
        "{}",
        super::bench_streams::to_csv(
            &rows,
            &loaded.backend().to_string(),
            kernels,
            args.streams_mtp_depth,
        )
    );
    Ok(())
}

/// With `DS4_PROFILE_STEP=1` (and the `cuda` feature), one more decode step
/// runs inside the profiler's capture range and is kept (the verify times
/// after it start one token later), so `ncu
/// --profile-from-start off` profiles exactly one step of any family
/// (`run.sh`'s `ncu-step`; `tools/gpu/ncu_table.py` sums it per kernel).
/// `DS4_PROFILE_STEP=N` with N > 1 profiles one forward of N rows instead
/// (a prefill chunk from the decoded state: what prefill's kernels cost).
/// Not undone from a snapshot: a snapshot held across the step shares the
/// caches' storage, so every append would copy its whole cache first
/// (copy on write), which no decode step does (run 46's profile counted
/// those copies as the step's).
fn profile_step<M: Model>(model: &M, state: &mut M::State, token: u32) -> anyhow::Result<()> {
    let rows = match std::env::var("DS4_PROFILE_STEP") {
        Ok(v) => v.trim().parse::<usize>().unwrap_or(0),
        Err(_) => 0,
    };
    if rows == 0 {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    {
        let vocab = model.vocab_size() as u64;
        let tokens: Vec<u32> = (0..rows as u64)
            .map(|i| {
                if i == 0 {
                    token
                } else {
                    (hash64(u64::from(token), i) % vocab) as u32
                }
            })
            .collect();
        ds4_engine::backend::cuda::profiler_range_current(true)?;
        let out = model.forward(&tokens, state, LogitsRows::Last);
        ds4_engine::backend::cuda::profiler_range_current(false)?;
        out?;
        println!("REPORT profiled_forward rows={rows} token={token}");
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (model, state, token, rows);
    Ok(())
}

/// Eager forwards of 1..=4 rows from a `--ctx-start` prefill: their kernel
/// launches and times, which say what a verify window adds to a step. With
/// `DS4_PROFILE_WINDOWS=1,2` the forwards of those row counts run inside the
/// profiler's capture range, one after another in that order, so
/// `ncu --profile-from-start off` profiles exactly them (`run.sh
/// ncu-windows`; split the CSV by the launch counts printed here).
#[cfg(feature = "cuda")]
fn window_profile(
    m: &ds4_engine::families::qwen4_exp::Qwen4ExpModel<ds4_engine::backend::CudaOps>,
    args: &BenchArgs,
) -> anyhow::Result<()> {
    let profiled: Vec<usize> = std::env::var("DS4_PROFILE_WINDOWS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let ops = m.ops();
    let graphs = ops.graphs();
    ops.set_graphs(false);
    let prompt = bench_prompt(args, args.ctx_start, m.vocab_size());
    let mut state = m.new_state();
    prefill(m, &mut state, &prompt, args.chunk, &mut |_| {})?;
    let mut rows_report = Vec::new();
    for rows in 1..=4usize {
        let toks: Vec<u32> = (0..rows as u32).map(|i| 7 + i).collect();
        let profile = profiled.contains(&rows);
        let snapshot = state.snapshot();
        // Once unprofiled (lazy workspaces), then the measured forward.
        m.forward(&toks, &mut state, LogitsRows::All)?;
        state.restore(&snapshot);
        if profile {
            ops.profiler_range(true)?;
        }
        let before = ops.launches();
        let start = Instant::now();
        m.forward(&toks, &mut state, LogitsRows::All)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let launches = ops.launches() - before;
        if profile {
            ops.profiler_range(false)?;
        }
        state.restore(&snapshot);
        rows_report.push(format!("rows={rows}:{launches}@{ms:.3}ms"));
    }
    ops.set_graphs(graphs);
    println!("REPORT eager_windows {}", rows_report.join(" "));
    Ok(())
}

/// Kernel launches of one decode step (the second of a fresh state), and
/// over 16 more steps the milliseconds per step the host spent queueing
/// (a step's time less its wait for the device) and waiting: a step whose
/// wait is near zero is bound by the host's launches, not the kernels.
#[cfg(feature = "cuda")]
fn step_profile<M: Model>(
    m: &M,
    ops: &ds4_engine::backend::CudaOps,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut state = m.new_state();
    m.forward(&[1], &mut state, LogitsRows::Last)?;
    let before = ops.launches();
    m.forward(&[2], &mut state, LogitsRows::Last)?;
    let launches = (ops.launches() - before) as f64;
    const STEPS: u32 = 16;
    let wait = ops.sync_wait_ns();
    let counts = ops.host_counts();
    ops.host_gaps();
    let start = Instant::now();
    for i in 0..STEPS {
        m.forward(&[3 + i], &mut state, LogitsRows::Last)?;
    }
    let total = start.elapsed().as_secs_f64() * 1e3 / f64::from(STEPS);
    let wait = (ops.sync_wait_ns() - wait) as f64 / 1e6 / f64::from(STEPS);
    let per = |now: u64, then: u64| (now - then) as f64 / f64::from(STEPS);
    let [copies, allocs] = ops.host_counts();
    let gaps = ops.host_gaps();
    let driver_ms = |keep: fn(&GapRow) -> bool| {
        let calls = gaps.iter().filter(|r| r.after.is_none() && keep(r));
        per(calls.map(|r| r.call_ns).sum(), 0) / 1e6
    };
    println!(
        "REPORT step_host_profile launch_ms={:.3} copy_ms={:.3} copies={:.1} driver_allocs={:.1} \
         (times need DS4_CUDA_HOST_PROFILE=1)",
        driver_ms(GapRow::is_kernel),
        driver_ms(GapRow::is_upload),
        per(copies, counts[0]),
        per(allocs, counts[1])
    );
    print!(
        "{}",
        super::bench_host_gaps::host_gaps_report(&gaps, u64::from(STEPS), "step")
    );
    Ok((launches, total - wait, wait))
}

/// The weights one decode step reads, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepBytes {
    pub weights: usize,
    pub dense: usize,
    pub experts: usize,
    pub head: usize,
}

/// From a source's ledger: the routed experts at `k / e` of their stacks,
/// one row of the embedding table, no MTP head, every other weight once
/// (qwen4_exp's names and DeepSeek's upstream `embed` / `head`).
pub fn step_bytes(ledger: &Ledger, k: usize, e: usize, vocab: usize) -> StepBytes {
    let mut s = StepBytes::default();
    for (name, &b) in ledger {
        if name.starts_with("mtp.") {
            continue;
        }
        if name.ends_with("embed_tokens.weight") || name == "embed.weight" {
            s.dense += b / vocab.max(1);
        } else if name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj") {
            s.experts += b / e.max(1) * k;
        } else if name.starts_with("lm_head") || name == "head.weight" {
            s.head += b;
        } else {
            s.dense += b;
        }
    }
    s.weights = s.dense + s.experts + s.head;
    s
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn finite(logits: &[f32], what: &str) -> anyhow::Result<()> {
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        anyhow::bail!(
            "{what}: logit {i} is {} (synthetic activations diverged)",
            logits[i]
        );
    }
    Ok(())
}

/// The bench's random prompt of `len` tokens (fixed by `--seed`).
fn bench_prompt(args: &BenchArgs, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| (hash64(args.seed ^ 0x5eed, i) % vocab as u64) as u32)
        .collect()
}

/// Prefill `--ctx-start` random tokens, decode `--gen` greedy tokens (every
/// logits row checked finite), then time forwards of 1..=4 rows from the
/// decoded state (restored after each).
pub fn run<M: Model>(
    model: &M,
    args: &BenchArgs,
    load_secs: f64,
) -> anyhow::Result<SyntheticReport> {
    run_at(model, args, args.ctx_start, load_secs)
}

/// [`run`] with a prompt of `prompt_len` tokens.
pub fn run_at<M: Model>(
    model: &M,
    args: &BenchArgs,
    prompt_len: usize,
    load_secs: f64,
) -> anyhow::Result<SyntheticReport> {
    let vocab = model.vocab_size() as u64;
    let prompt = bench_prompt(args, prompt_len, model.vocab_size());
    if prompt.is_empty() || args.gen_tokens == 0 {
        anyhow::bail!("--ctx-start and --gen must be positive");
    }
    let mut state = model.new_state();
    let start = Instant::now();
    let out = prefill(model, &mut state, &prompt, args.chunk, &mut |_| {})?;
    let prefill_secs = start.elapsed().as_secs_f64();
    finite(&out.logits, "prefill")?;
    let mut token = argmax(out.row(out.rows - 1));
    // One untimed step first (lazy allocations, a graph capture).
    let warm = model.forward(&[token], &mut state, LogitsRows::Last)?;
    finite(&warm.logits, "decode")?;
    token = argmax(warm.row(0));
    let mut tokens = Vec::with_capacity(args.gen_tokens);
    let mut last = warm;
    let start = Instant::now();
    for _ in 0..args.gen_tokens {
        let out = model.forward(&[token], &mut state, LogitsRows::Last)?;
        finite(&out.logits, "decode")?;
        token = argmax(out.row(0));
        tokens.push(token);
        last = out;
    }
    let gen_secs = start.elapsed().as_secs_f64();
    profile_step(model, &mut state, token)?;
    let decode_digest = fnv1a(
        tokens
            .iter()
            .copied()
            .chain(last.row(0).iter().map(|v| v.to_bits())),
    );
    let state_bytes = state.byte_size();
    let mut verify_secs = Vec::new();
    for rows in 1..=4usize {
        let toks: Vec<u32> = (0..rows as u64)
            .map(|i| (hash64(args.seed, 1000 + i) % vocab) as u32)
            .collect();
        let mut times = Vec::new();
        for _ in 0..5 {
            let snapshot = state.snapshot();
            let start = Instant::now();
            let out = model.forward(&toks, &mut state, LogitsRows::All)?;
            times.push(start.elapsed().as_secs_f64());
            finite(&out.logits, "verify")?;
            state.restore(&snapshot);
        }
        times.sort_by(f64::total_cmp);
        verify_secs.push(times[times.len() / 2]);
    }
    Ok(SyntheticReport {
        load_secs,
        prefill_tokens: prompt.len(),
        prefill_tps: prompt.len() as f64 / prefill_secs.max(1e-9),
        gen_tokens: args.gen_tokens,
        gen_tps: args.gen_tokens as f64 / gen_secs.max(1e-9),
        verify_secs,
        state_bytes,
        decode_digest,
    })
}

/// FNV-1a over 32-bit words (little-endian bytes).
fn fnv1a(words: impl Iterator<Item = u32>) -> u64 {
    words
        .flat_map(u32::to_le_bytes)
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn step_bytes_count_routed_experts_and_one_embedding_row() {
        let mut l = Ledger::new();
        l.insert("model.embed_tokens.weight".into(), 1000);
        l.insert("model.layers.0.mlp.experts.gate_up_proj".into(), 800);
        l.insert("model.layers.0.mlp.experts.down_proj".into(), 400);
        l.insert("model.layers.0.mlp.gate.weight".into(), 7);
        l.insert("lm_head.weight".into(), 50);
        l.insert("mtp.fc_hidden.weight".into(), 99);
        let s = step_bytes(&l, 2, 8, 10);
        assert_eq!(s.experts, 200 + 100);
        assert_eq!(s.dense, 100 + 7);
        assert_eq!(s.head, 50);
        assert_eq!(s.weights, 457);
    }

    /// deepseek_v4 in ds4's stored types on the CPU at the tiny shape:
    /// finite, deterministic for a seed, both recipes; the step's bytes
    /// count the routed experts at k / E.
    #[test]
    fn synthetic_stored_tiny_bench_runs_on_the_cpu() {
        let cli = crate::args::Cli::parse_from([
            "ds4server",
            "bench",
            "--synthetic",
            "deepseek_v4",
            "--shape",
            "tiny",
            "--weights",
            "ds4-q4",
            "--device",
            "cpu",
            "--ctx-start",
            "40",
            "--gen",
            "3",
        ]);
        let crate::args::Command::Bench(args) = cli.command else {
            panic!("not a bench command");
        };
        assert_eq!(
            weights_of("deepseek_v4", args.weights.as_deref()).unwrap(),
            Weights::Ds4(Ds4Recipe::Q4)
        );
        assert_eq!(
            weights_of("deepseek_v4", None).unwrap(),
            Weights::Ds4(Ds4Recipe::Q2)
        );
        assert_eq!(weights_of("qwen4_exp", None).unwrap(), Weights::Q4_1);
        assert!(weights_of("qwen4_exp", Some("ds4-q3")).is_err());
        let config = shape_config("deepseek_v4", "tiny").unwrap();
        let logits = |seed: u64, recipe: Ds4Recipe| {
            let (loaded, ledger) = LoadedModel::synthetic_stored(
                "deepseek_v4",
                &config,
                seed,
                recipe,
                ds4_engine::families::Device::Cpu,
            )
            .unwrap();
            let LoadedModel::DeepseekV4(m) = &loaded else {
                panic!("not the CPU deepseek_v4 model");
            };
            let report = run_at(&**m, &args, 40, 0.0).unwrap();
            assert!(report.gen_tps > 0.0 && report.verify_secs.len() == 4);
            let mut state = m.new_state();
            let out = m.forward(&[5, 6, 7], &mut state, LogitsRows::All).unwrap();
            (out.logits, ledger)
        };
        let (a, ledger) = logits(3, Ds4Recipe::Q2);
        let (b, _) = logits(3, Ds4Recipe::Q2);
        let (c, _) = logits(4, Ds4Recipe::Q2);
        let (d, _) = logits(3, Ds4Recipe::Q4);
        assert!(a.iter().all(|v| v.is_finite()) && d.iter().all(|v| v.is_finite()));
        assert_eq!(a, b, "same seed, same weights");
        assert_ne!(a, c, "another seed, other weights");
        assert_ne!(a, d, "another recipe, other weights");
        let held: Ledger = ledger
            .iter()
            .filter(|(_, e)| e.ty != "I32")
            .map(|(n, e)| (n.clone(), e.held))
            .collect();
        let s = step_bytes(&held, 2, 8, 512);
        let gu = ledger["layers.0.ffn.experts.gate_up_proj"].bytes;
        assert_eq!(gu, 8 * 512 * 66, "IQ2_XXS: 66 bytes per 256");
        assert_eq!(ledger["head.weight"].bytes, s.head);
        assert!(s.experts > 0 && s.dense > 0);
    }

    /// glm5_next in ds4-q2's stored types on the CPU at the tiny shape:
    /// the bench path runs; two loads decode the same greedy tokens and
    /// logits; a verify window's rows equal the single steps' rows (bit
    /// for bit); the step's bytes count the routed experts at k / E (3 of
    /// 8).
    #[test]
    fn glm5_synthetic_stored_tiny_bench_runs_on_the_cpu() {
        let cli = crate::args::Cli::parse_from([
            "ds4server",
            "bench",
            "--synthetic",
            "glm5_next",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--gen",
            "4",
        ]);
        let crate::args::Command::Bench(args) = cli.command else {
            panic!("not a bench command");
        };
        assert_eq!(
            weights_of("glm5_next", args.weights.as_deref()).unwrap(),
            Weights::Ds4(Ds4Recipe::Q2)
        );
        let config = shape_config("glm5_next", "tiny").unwrap();
        let load = || {
            LoadedModel::synthetic_stored(
                "glm5_next",
                &config,
                3,
                Ds4Recipe::Q2,
                ds4_engine::families::Device::Cpu,
            )
            .unwrap()
        };
        let prompt = bench_prompt(&args, 24, 512);
        // Prefill, then 6 greedy steps: the tokens and every step's logits.
        let decode = |m: &ds4_engine::families::glm5_next::Glm5NextModel| {
            let mut state = m.new_state();
            let out = prefill(m, &mut state, &prompt, args.chunk, &mut |_| {}).unwrap();
            let mut token = argmax(out.row(out.rows - 1));
            let snapshot = state.snapshot();
            let (mut tokens, mut rows) = (vec![token], Vec::new());
            for _ in 0..6 {
                let out = m.forward(&[token], &mut state, LogitsRows::Last).unwrap();
                assert!(out.logits.iter().all(|v| v.is_finite()));
                rows.push(out.logits.clone());
                token = argmax(out.row(0));
                tokens.push(token);
            }
            (tokens, rows, snapshot)
        };
        let (a, ledger) = load();
        let (b, _) = load();
        let (LoadedModel::Glm5Next(a), LoadedModel::Glm5Next(b)) = (&a, &b) else {
            panic!("not the CPU glm5_next model");
        };
        let report = run_at(&**a, &args, 16, 0.0).unwrap();
        assert!(report.gen_tps > 0.0 && report.verify_secs.len() == 4);
        let (ta, ra, snapshot) = decode(a);
        let (tb, rb, _) = decode(b);
        assert_eq!(ta, tb, "two loads, the same greedy tokens");
        assert_eq!(ra, rb, "two loads, the same logits");
        // The greedy tokens fed as one verify window of 6 rows.
        let mut state = snapshot;
        let w = a.forward_window(&ta[..6], &mut state).unwrap();
        for (i, row) in ra.iter().enumerate() {
            // Bit for bit: the CPU runs a window's rows as it runs steps.
            assert_eq!(w.logits.row(i), &row[..], "window row {i} against its step");
        }
        let s = stored_step_bytes(&ledger, (3, 8, 512));
        let experts: usize = ledger
            .iter()
            .filter(|(n, _)| n.contains(".experts."))
            .map(|(_, e)| e.held)
            .sum();
        assert_eq!(s.experts, experts / 8 * 3);
        assert_eq!(s.head, ledger["lm_head.weight"].bytes);
        assert_eq!(ledger["lm_head.weight"].ty, "Q8_0");
    }

    /// The synthetic source and the bench path on the CPU at the tiny
    /// shape: deterministic for a seed, finite logits, decode runs.
    #[test]
    fn synthetic_tiny_bench_runs_on_the_cpu() {
        let cli = crate::args::Cli::parse_from([
            "ds4server",
            "bench",
            "--synthetic",
            "qwen4_exp",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--ctx-start",
            "12",
            "--gen",
            "4",
            "--seed",
            "3",
        ]);
        let crate::args::Command::Bench(args) = cli.command else {
            panic!("not a bench command");
        };
        let config = shape_config("qwen4_exp", "tiny").unwrap();
        let greedy = |seed: u64| {
            let (loaded, ledger) = LoadedModel::synthetic(
                "qwen4_exp",
                &config,
                seed,
                false,
                ds4_engine::families::Device::Cpu,
            )
            .unwrap();
            let LoadedModel::Qwen4Exp(m) = &loaded else {
                panic!("not the CPU qwen4_exp model");
            };
            let report = run(m, &args, 0.0).unwrap();
            assert!(report.gen_tps > 0.0 && report.verify_secs.len() == 4);
            let mut state = m.new_state();
            let out = m.forward(&[5, 6, 7], &mut state, LogitsRows::All).unwrap();
            (out.logits, ledger)
        };
        let (a, ledger) = greedy(3);
        let (b, _) = greedy(3);
        let (c, _) = greedy(4);
        assert!(a.iter().all(|v| v.is_finite()));
        assert_eq!(a, b, "same seed, same weights");
        assert_ne!(a, c, "another seed, other weights");
        // Projections whose rows are whole blocks are 4-bit: the tiny
        // shape's [64, 32] gate/up stack is, its [32, 8] down stack is not.
        let gu = ledger["model.layers.0.mlp.experts.gate_up_proj"];
        assert_eq!(gu, 4 * 16 * 32 / 32 * 20);
        assert_eq!(
            ledger["model.layers.0.mlp.experts.down_proj"],
            4 * 32 * 8 * 4
        );
    }
}
