//! `ds4server bench`: prefill and decode speed across context lengths.
//!
//! The model is loaded once and walks one fixed token sequence (a
//! public-domain text shipped in the repository, repeated if the requested
//! context is longer) to each context frontier. Only the newly prefilled
//! interval is timed for prefill; then a fixed greedy decode of `--gen`
//! tokens runs from a snapshot of that frontier and the state is restored,
//! so every frontier sees the same prefix and the decode never leaks into
//! the next interval. With `--prompts`, each length is instead a cold
//! prompt: an empty state, the whole prompt prefilled and timed (a first
//! agent turn), then the decode at that depth.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ds4_engine::backend::kernel_set;
use ds4_engine::decode::prefill;
use ds4_engine::{LogitsRows, Model, ModelState};
use ds4_sampling::{Sampler, TokenCounts};
use ds4_text::Tokenizer;

use crate::args::BenchArgs;

/// The benchmark text: public-domain American founding documents.
const CORPUS: &str = include_str!("../../../../bench/corpus.txt");

#[derive(Debug, Clone)]
pub struct Row {
    pub ctx_tokens: usize,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub gen_tokens: usize,
    pub gen_tps: f64,
    pub state_bytes: usize,
    /// The KV cache element type (`f32`, `f16`: `--kv-cache`).
    pub kv_cache: &'static str,
    /// The backend id (`cpu-avx512`, `cpu-avx512-fast`, `cuda-sm_90a`).
    pub backend: String,
    /// The kernel set (`reference`, `fast`: `--kernels`).
    pub kernels: &'static str,
}

/// What every row of a run carries besides its measurements.
#[derive(Debug, Clone)]
pub struct Labels {
    pub kv_cache: &'static str,
    pub backend: String,
    pub kernels: &'static str,
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(family) = &args.synthetic {
        return super::bench_synthetic::bench_synthetic(family, &args);
    }
    if !args.streams.is_empty() {
        if args.streams.contains(&0) {
            anyhow::bail!("--streams: every count must be at least 1");
        }
        // Token ids only: no tokenizer (a shape-only GGUF has none).
        let path = crate::model_source::resolve(args.model.model.as_deref())?;
        let model = crate::model_source::load_model(&path, &args.model)?;
        let kernels = kernel_set::current().name();
        let probe = super::bench_streams::probe_for(&model);
        let rows = ds4_engine::with_model!(&model, model => super::bench_streams::bench_streams(model, &args, &args.streams, &probe))?;
        let csv = super::bench_streams::to_csv(
            &rows,
            &model.backend().to_string(),
            kernels,
            args.streams_mtp_depth,
        );
        print!("{csv}");
        if let Some(path) = &args.csv {
            std::fs::write(path, &csv).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let loaded = crate::model_source::load(args.model.model.as_deref(), &args.model)?;
    // The set this process fixed before the load.
    let kernels = kernel_set::current().name();
    if let Some(path) = &args.nll {
        let report = ds4_engine::with_model!(&loaded.model, model => super::bench_nll::bench_nll(model, &loaded.tokenizer, &args, path, kernels))?;
        let csv = super::bench_nll::to_csv(&report);
        print!("{csv}");
        if let Some(path) = &args.csv {
            std::fs::write(path, &csv).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    if args.mtp {
        let csv = ds4_engine::with_model!(&loaded.model, model => super::bench_mtp::bench_mtp(model, &loaded.tokenizer, &args))?;
        print!("{csv}");
        if let Some(path) = &args.csv {
            std::fs::write(path, &csv).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let labels = Labels {
        kv_cache: loaded.model.kv_type().name(),
        backend: loaded.model.backend().to_string(),
        kernels,
    };
    let rows = ds4_engine::with_model!(&loaded.model, model => bench_with(model, &loaded.tokenizer, &args, &labels))?;
    let csv = to_csv(&rows);
    print!("{csv}");
    if let Some(path) = &args.csv {
        std::fs::write(path, &csv).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        plot(&rows, path)?;
    }
    Ok(())
}

/// Context frontiers: `start, start+step, …` up to and including `max`.
pub fn frontiers(start: usize, max: usize, step: usize) -> anyhow::Result<Vec<usize>> {
    if start == 0 || step == 0 || max < start {
        anyhow::bail!(
            "need 0 < --ctx-start <= --ctx-max and --step > 0 (got {start}, {max}, {step})"
        );
    }
    let mut out: Vec<usize> = (start..=max).step_by(step).collect();
    if out.last() != Some(&max) {
        out.push(max);
    }
    Ok(out)
}

fn bench_with<M: Model>(
    model: &M,
    tokenizer: &Tokenizer,
    args: &BenchArgs,
    labels: &Labels,
) -> anyhow::Result<Vec<Row>> {
    // Cold prompts each start from an empty state; frontiers walk on.
    let cold = !args.prompts.is_empty();
    let frontiers = if cold {
        if args.prompts.contains(&0) {
            anyhow::bail!("--prompts lengths must be positive");
        }
        args.prompts.clone()
    } else {
        frontiers(args.ctx_start, args.ctx_max, args.step)?
    };
    let longest = frontiers.iter().copied().max().unwrap_or(0);
    let needed = longest + args.gen_tokens;
    if needed > model.context_length() {
        anyhow::bail!(
            "a context of {longest} tokens plus --gen {} exceeds the model's context of {} tokens",
            args.gen_tokens,
            model.context_length()
        );
    }
    let text = tokenizer.encode(CORPUS, false)?;
    if text.is_empty() {
        anyhow::bail!("the benchmark corpus tokenized to nothing");
    }
    let tokens: Vec<u32> = text.iter().copied().cycle().take(longest).collect();

    let descriptor = model.descriptor();
    let mut greedy = descriptor.law.default_params();
    greedy.temperature = 0.0;
    eprintln!(
        "{} backend, {} kernels, kv cache {}",
        labels.backend, labels.kernels, labels.kv_cache
    );
    let mut state = model.new_state();
    let mut rows = Vec::new();
    let mut done = 0;
    for &frontier in &frontiers {
        if cold {
            state = model.new_state();
            done = 0;
        }
        let interval = &tokens[done..frontier];
        let start = Instant::now();
        let out = prefill(model, &mut state, interval, args.chunk, &mut |_| {})?;
        let prefill_secs = start.elapsed().as_secs_f64();
        done = frontier;

        let snapshot = state.snapshot();
        let mut sampler = Sampler::new(descriptor.law, greedy, 0)?;
        let counts = TokenCounts::default();
        let mut logits = out.logits;
        let start = Instant::now();
        for _ in 0..args.gen_tokens {
            let token = sampler.sample(&logits, &counts)?.token;
            logits = model
                .forward(&[token], &mut state, LogitsRows::Last)?
                .logits;
        }
        let gen_secs = start.elapsed().as_secs_f64();
        let state_bytes = state.byte_size();
        state = snapshot;

        let row = Row {
            ctx_tokens: frontier,
            prefill_tokens: interval.len(),
            prefill_tps: interval.len() as f64 / prefill_secs.max(1e-9),
            gen_tokens: args.gen_tokens,
            gen_tps: args.gen_tokens as f64 / gen_secs.max(1e-9),
            state_bytes,
            kv_cache: labels.kv_cache,
            backend: labels.backend.clone(),
            kernels: labels.kernels,
        };
        eprintln!(
            "ctx {:>6}: prefill {:>5} tok at {:>8.1} tok/s, decode {} tok at {:>6.1} tok/s",
            row.ctx_tokens, row.prefill_tokens, row.prefill_tps, row.gen_tokens, row.gen_tps
        );
        rows.push(row);
    }
    Ok(rows)
}

pub fn to_csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,state_bytes,kv_cache,backend,kernels\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{:.2},{},{:.2},{},{},{},{}",
            r.ctx_tokens,
            r.prefill_tokens,
            r.prefill_tps,
            r.gen_tokens,
            r.gen_tps,
            r.state_bytes,
            r.kv_cache,
            r.backend,
            r.kernels
        );
    }
    out
}

/// A plotted line: its name, colour and the value it takes from a row.
type Series = (&'static str, plotters::style::RGBColor, fn(&Row) -> f64);

/// Prefill and decode tok/s against context length, as an SVG line chart.
fn plot(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = rows.iter().map(|r| r.ctx_tokens).max().unwrap_or(1) as f64;
    let y_max = rows
        .iter()
        .flat_map(|r| [r.prefill_tps, r.gen_tps])
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("ds4server bench", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("context tokens")
        .y_desc("tokens / s")
        .draw()?;
    let series: [Series; 2] = [
        ("prefill", BLUE, |r| r.prefill_tps),
        ("decode", RED, |r| r.gen_tps),
    ];
    for (name, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.ctx_tokens as f64, value(r))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontiers_cover_the_range_and_end_at_max() {
        assert_eq!(frontiers(128, 512, 128).unwrap(), vec![128, 256, 384, 512]);
        assert_eq!(frontiers(100, 250, 100).unwrap(), vec![100, 200, 250]);
        assert_eq!(frontiers(64, 64, 10).unwrap(), vec![64]);
        assert!(frontiers(0, 64, 10).is_err());
        assert!(frontiers(128, 64, 10).is_err());
        assert!(frontiers(64, 128, 0).is_err());
    }

    #[test]
    fn csv_has_the_documented_columns() {
        let csv = to_csv(&[Row {
            ctx_tokens: 512,
            prefill_tokens: 512,
            prefill_tps: 150.0,
            gen_tokens: 32,
            gen_tps: 60.5,
            state_bytes: 1024,
            kv_cache: "f16",
            backend: "cpu-avx512-fast".into(),
            kernels: "fast",
        }]);
        assert_eq!(
            csv,
            "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,state_bytes,kv_cache,backend,kernels\n\
             512,512,150.00,32,60.50,1024,f16,cpu-avx512-fast,fast\n"
        );
    }
}
