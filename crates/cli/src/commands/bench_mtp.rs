//! `ds4server bench --mtp`: MTP speculative decoding against plain AR in
//! one run, on held-out chat prompts (`bench/mtp_prompts.txt`: instructions
//! of the MTP head's evaluation split, which training never saw).
//!
//! For every prompt and temperature the modes (AR, depth 1..=max) run one
//! after another, each a cold turn from a fresh session with the same seed,
//! and the starting mode rotates from prompt to prompt, so a slow phase of
//! a shared machine falls on every mode alike. Reported per temperature and
//! depth: decode tok/s (decode time only, prefill excluded), its ratio to
//! AR's over the same prompts, the acceptance rate at each draft position
//! (accepted / drafted), and the mean accepted length per cycle. At
//! temperature 0 the MTP tokens must equal AR's (checked; a mismatch is an
//! error). A second table times the pieces of one cycle on a prompt's
//! prefilled state: one AR step, a verify window of k + 1 rows, one draft.
//!
//! Each depth runs under every draft-stop threshold of `--mtp-draft-stop`
//! (default: the family's own, [`ds4_engine::MtpContract::min_draft_confidence`];
//! 0 drafts the full depth every cycle), so both policies are measured in
//! the same run; `draft_stop` names the threshold of a row.
//!
//! From those pieces each mode also gets `pieces_speedup`: the tokens a
//! cycle emitted (1 + accepted drafts) over what its pieces cost in AR
//! steps (a window of j + 1 rows for a cycle that drafted j, an AR step when
//! it drafted none, plus one head forward per draft). It is what the pieces
//! allow; the measured `speedup_vs_ar` is lower by the loop's own work
//! (sampling, acceptance, commit), and the pieces are medians, so this
//! column moves much less than the measured one on a noisy machine.
//!
//! A third table splits each mode's measured decode time inside the loop
//! ([`ds4_engine::decode::TurnTimings::decode_trunk`] and `decode_head`):
//! per cycle (per token for AR) the trunk's forwards, the same in AR steps
//! of this run, the head's forwards and the loop's own work (columns
//! `trunk_ms_per_cycle`, `head_ms_per_cycle`, `own_ms_per_cycle`). A turn's
//! final forward counts toward its trunk time.

use anyhow::Context;
use ds4_engine::Model;
use ds4_engine::decode::mtp_pieces::{PieceCosts, measure_pieces};
use ds4_engine::decode::{self, LiveSession, TurnConfig, TurnRequest};
use ds4_sampling::Sampler;
use ds4_text::Tokenizer;

use crate::args::BenchArgs;
use crate::prompt;

/// The held-out prompts shipped with the binary (one per line).
const PROMPTS: &str = include_str!("../../../../bench/mtp_prompts.txt");

#[derive(Debug, Default, Clone)]
struct Tally {
    tokens: usize,
    secs: f64,
    drafted: Vec<usize>,
    accepted: Vec<usize>,
    cycles: usize,
    verify_rows: usize,
    /// Of `secs`: trunk forwards and head forwards (the rest is the loop's
    /// own work: sampling, acceptance, commit).
    trunk_secs: f64,
    head_secs: f64,
}

impl Tally {
    /// AR: one cycle per token; MTP: one per verify window.
    fn cycles_or_tokens(&self) -> f64 {
        (if self.cycles == 0 {
            self.tokens
        } else {
            self.cycles
        })
        .max(1) as f64
    }
}

/// One mode's line of the tables.
struct TableRow {
    temperature: f64,
    depth: usize,
    stop: String,
    tps: f64,
    speedup: f64,
    acceptance: String,
    mean_len: f64,
    rows: f64,
    pieces: f64,
    /// Milliseconds per cycle (per token for AR), measured in the loop.
    trunk_ms: f64,
    head_ms: f64,
    own_ms: f64,
    /// `trunk_ms` over AR's trunk milliseconds per token in the same run.
    trunk_steps: f64,
}

pub fn bench_mtp<M: Model>(
    model: &M,
    tokenizer: &Tokenizer,
    args: &BenchArgs,
) -> anyhow::Result<String> {
    let Some(contract) = model.mtp_contract() else {
        anyhow::bail!(
            "bench --mtp: this model has no MTP head (the default model's head is attached \
             when its file is next to the model)"
        );
    };
    let max_depth = args.mtp_max_depth.min(contract.max_depth);
    let text = match &args.mtp_prompts {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => PROMPTS.to_string(),
    };
    let family = model.descriptor().name;
    let prompts: Vec<Vec<u32>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(args.mtp_prompt_count)
        .map(|l| prompt::chat_prompt(tokenizer, family, &[prompt::message("user", l.trim())]))
        .collect::<anyhow::Result<_>>()?;
    if prompts.is_empty() {
        anyhow::bail!("bench --mtp: no prompts");
    }
    // The pieces first: the modelled column needs them.
    let costs = measure_pieces(model, &prompts[0], max_depth, args.mtp_cost_reps)?;
    let cost_csv = costs.csv();
    let law = model.descriptor().law;
    // (depth, draft-stop threshold): AR first, then every depth under each
    // threshold.
    let stops: Vec<Option<f32>> = if args.mtp_draft_stop.is_empty() {
        vec![contract.min_draft_confidence]
    } else {
        args.mtp_draft_stop
            .iter()
            .map(|&c| (c > 0.0).then_some(c))
            .collect()
    };
    let mut modes: Vec<(usize, Option<f32>)> = vec![(0, None)];
    for &stop in &stops {
        modes.extend((1..=max_depth).map(|d| (d, stop)));
    }
    let mut out = String::new();
    out.push_str(
        "temperature,depth,draft_stop,tokens,decode_tps,speedup_vs_ar,acceptance_by_position,\
         mean_accepted_len,verify_rows_per_cycle,pieces_speedup,trunk_ms_per_cycle,\
         head_ms_per_cycle,own_ms_per_cycle,backend,kernels\n",
    );
    // Every row names the backend and kernel set it ran on.
    let backend = model.backend().to_string();
    let kernels = ds4_engine::backend::kernel_set::current().name();
    let mut table = Vec::new();
    for &temperature in &args.mtp_temperatures {
        let mut params = model.descriptor().sampling_defaults;
        params.temperature = temperature;
        let mut tallies = vec![Tally::default(); modes.len()];
        for (pi, p) in prompts.iter().enumerate() {
            let mut emitted = vec![Vec::new(); modes.len()];
            for r in 0..modes.len() {
                let mi = (pi + r) % modes.len();
                let (depth, stop) = modes[mi];
                let mut sampler = Sampler::new(law, params, 1000 + pi as u64)?;
                let mut session = LiveSession::new(model);
                let res = decode::generate_with_draft_stop(
                    model,
                    &mut session,
                    TurnRequest {
                        prompt: p,
                        sampler: &mut sampler,
                        config: TurnConfig {
                            max_tokens: args.gen_tokens,
                            stop_token_ids: tokenizer.stop_token_ids().to_vec(),
                            prefill_chunk: args.chunk,
                            logprobs: None,
                            cancel: Default::default(),
                        },
                        mtp_depth: Some(depth),
                    },
                    stop,
                    &mut (),
                )?;
                emitted[mi] = res.tokens.clone();
                let t = &mut tallies[mi];
                t.tokens += res.tokens.len();
                t.secs += res.timings.decode.as_secs_f64();
                t.trunk_secs += res.timings.decode_trunk.as_secs_f64();
                t.head_secs += res.timings.decode_head.as_secs_f64();
                if let Some(m) = &res.mtp {
                    t.drafted.resize(m.drafted.len(), 0);
                    t.accepted.resize(m.accepted.len(), 0);
                    for (i, (&d, &a)) in m.drafted.iter().zip(&m.accepted).enumerate() {
                        t.drafted[i] += d;
                        t.accepted[i] += a;
                    }
                    t.cycles += m.cycles;
                    t.verify_rows += m.verify_rows;
                }
            }
            if temperature == 0.0
                && let Some(mi) = (1..modes.len()).find(|&mi| emitted[mi] != emitted[0])
            {
                anyhow::bail!(
                    "greedy MTP depth {} (draft stop {}) differs from AR on prompt {pi}",
                    modes[mi].0,
                    stop_name(modes[mi].1)
                );
            }
        }
        let ar_tps = tallies[0].tokens as f64 / tallies[0].secs.max(1e-9);
        let ar_trunk_ms = tallies[0].trunk_secs * 1e3 / tallies[0].cycles_or_tokens();
        for (mi, t) in tallies.iter().enumerate() {
            let tps = t.tokens as f64 / t.secs.max(1e-9);
            let acc: Vec<String> = t
                .drafted
                .iter()
                .zip(&t.accepted)
                .map(|(&d, &a)| format!("{:.3}", a as f64 / d.max(1) as f64))
                .collect();
            let cycles = t.cycles.max(1) as f64;
            let mean_len = t.accepted.iter().sum::<usize>() as f64 / cycles;
            let rows = if modes[mi].0 == 0 {
                1.0
            } else {
                t.verify_rows as f64 / cycles
            };
            let pieces = pieces_speedup(&costs, t);
            let (depth, stop) = (modes[mi].0, stop_name(modes[mi].1));
            let per_cycle = 1e3 / t.cycles_or_tokens();
            let (trunk_ms, head_ms) = (t.trunk_secs * per_cycle, t.head_secs * per_cycle);
            let own_ms = t.secs * per_cycle - trunk_ms - head_ms;
            out.push_str(&format!(
                "{temperature},{depth},{stop},{},{tps:.2},{:.3},{},{mean_len:.3},{rows:.3},\
                 {pieces:.3},{trunk_ms:.3},{head_ms:.3},{own_ms:.3},{backend},{kernels}\n",
                t.tokens,
                tps / ar_tps,
                acc.join("/"),
            ));
            table.push(TableRow {
                temperature,
                depth,
                stop,
                tps,
                speedup: tps / ar_tps,
                acceptance: acc.join(" / "),
                mean_len,
                rows,
                pieces,
                trunk_ms,
                head_ms,
                own_ms,
                trunk_steps: trunk_ms / ar_trunk_ms.max(1e-9),
            });
        }
    }
    out.push('\n');
    out.push_str(&cost_csv);
    eprintln!(
        "| T | depth | draft stop | tok/s | × AR | acceptance by draft position | \
         accepted per cycle | rows per cycle | × AR the pieces allow |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|");
    for r in &table {
        eprintln!(
            "| {} | {} | {} | {:.1} | {:.2} | {} | {:.2} | {:.2} | {:.2} |",
            r.temperature,
            r.depth,
            r.stop,
            r.tps,
            r.speedup,
            r.acceptance,
            r.mean_len,
            r.rows,
            r.pieces
        );
    }
    // Where a cycle's time goes, measured inside the loop (the pieces
    // above are timed alone, on one snapshot).
    eprintln!(
        "\n| T | depth | draft stop | ms per cycle (AR: per token) | trunk ms | trunk in AR steps | \
         head ms | own work ms |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|");
    for r in &table {
        eprintln!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.temperature,
            r.depth,
            r.stop,
            r.trunk_ms + r.head_ms + r.own_ms,
            r.trunk_ms,
            r.trunk_steps,
            r.head_ms,
            r.own_ms
        );
    }
    Ok(out)
}

/// Emitted tokens over the cycles' cost in AR steps (1 for AR itself): a
/// cycle that drafted j tokens costs a window of j + 1 rows (an AR step for
/// j = 0) and j head forwards. `t.drafted[i]` counts the cycles that
/// drafted at least i + 1, since drafting runs in order.
fn pieces_speedup(c: &PieceCosts, t: &Tally) -> f64 {
    if t.cycles == 0 {
        return 1.0;
    }
    let mut cost = 0.0;
    let mut reached = t.cycles;
    for j in 0..=t.drafted.len() {
        let deeper = t.drafted.get(j).copied().unwrap_or(0);
        let window = if j == 0 { c.ar_step } else { c.windows[j - 1] };
        cost += reached.saturating_sub(deeper) as f64 * window;
        reached = deeper;
    }
    cost += t.drafted.iter().sum::<usize>() as f64 * c.draft;
    let tokens = t.cycles + t.accepted.iter().sum::<usize>();
    tokens as f64 * c.ar_step / cost
}

/// A threshold as the tables print it (`none`: full depth every cycle).
fn stop_name(stop: Option<f32>) -> String {
    stop.map_or_else(|| "none".to_string(), |c| format!("{c}"))
}
