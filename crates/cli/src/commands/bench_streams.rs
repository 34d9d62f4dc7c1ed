//! `ds4server bench --streams 1,2,4,8 [--prompts P] [--gen G]`: continuous
//! batching's throughput. For each stream count N, N greedy streams
//! (random prompts of P tokens, G tokens each) run at once on their own
//! threads through one [`BatchingModel`]: each prefills its prompt, waits
//! for the others, then decodes; reported: the aggregate decode rate
//! (every stream's decode tokens over the span from the first decode start
//! to the last one's end), the ratio to one stream, the
//! batches run and their mean size, the decode phase's batches with the
//! time a batch's leader waited for the streams to queue (the gather) and
//! the time its forward ran (what the batch costs beyond the forward is
//! the streams' own work between steps), and whether every stream's tokens
//! are those of its turn served alone (run first, one by one). With
//! `--streams-mtp-depth N` every turn is an MTP turn of depth N (alone
//! too): its verify windows join the batches.

use std::fmt::Write as _;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use ds4_engine::Model;
use ds4_engine::batching::{BatchConfig, BatchingModel};
use ds4_engine::decode::{self, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::families::LoadedModel;
use ds4_sampling::{Sampler, SamplingParams};

use crate::args::BenchArgs;

/// One stream count's measurements.
#[derive(Debug, Clone)]
pub struct StreamsRow {
    pub streams: usize,
    pub decode_tokens: usize,
    pub decode_span: Duration,
    pub batches: u64,
    pub forwards: u64,
    /// The decode phase's batches, and their gather and forward time.
    pub decode_batches: u64,
    pub decode_gather: Duration,
    pub decode_run: Duration,
    /// MTP prefills and verify windows that shared a batch, and draft
    /// steps that did.
    pub shared_mtp: u64,
    pub shared_drafts: u64,
    pub identical: bool,
}

impl StreamsRow {
    pub fn aggregate_tps(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_span.as_secs_f64().max(1e-9)
    }
}

/// Random prompt `i` of `len` tokens (ids 3.. of the vocabulary).
fn prompt(i: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (vocab as u64 - 3)) as u32 + 3
        })
        .collect()
}

/// A greedy turn on `session` of at most `max_tokens`: its tokens.
fn turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    p: &[u32],
    max_tokens: usize,
    args: &BenchArgs,
) -> anyhow::Result<Vec<u32>> {
    let d = model.descriptor();
    let params = SamplingParams {
        temperature: 0.0,
        ..d.sampling_defaults
    };
    let mut sampler = Sampler::new(d.law, params, 1)?;
    let r = decode::generate(
        model,
        session,
        TurnRequest {
            prompt: p,
            sampler: &mut sampler,
            config: TurnConfig {
                max_tokens,
                stop_token_ids: vec![],
                prefill_chunk: args.chunk,
                logprobs: None,
                cancel: Default::default(),
            },
            mtp_depth: Some(args.streams_mtp_depth),
        },
        &mut (),
    )?;
    Ok(r.tokens)
}

/// A stream: the prompt prefilled (a zero-token turn), then, once every
/// stream has (`ready`) and the decode is let go (`go`), its decode: the
/// tokens, when the decode started and when it ended.
fn stream<M: Model>(
    model: &M,
    p: &[u32],
    args: &BenchArgs,
    ready: &Barrier,
    go: &Barrier,
) -> anyhow::Result<(Vec<u32>, Instant, Instant)> {
    let mut session = LiveSession::new(model);
    let prefilled = turn(model, &mut session, p, 0, args);
    ready.wait();
    go.wait();
    prefilled?;
    let start = Instant::now();
    let tokens = turn(model, &mut session, p, args.gen_tokens, args)?;
    Ok((tokens, start, Instant::now()))
}

/// `probe` is told when each count's decode phase starts (`None`) and
/// ends (`Some(batches)`): the CUDA host profile's table per batch
/// (`bench_host_gaps::streams_probe`).
pub fn bench_streams<M: Model>(
    model: &M,
    args: &BenchArgs,
    counts: &[usize],
    probe: &dyn Fn(Option<u64>),
) -> anyhow::Result<Vec<StreamsRow>> {
    if args.streams_mtp_depth > 0 && model.mtp_contract().is_none() {
        anyhow::bail!("--streams-mtp-depth: the model has no MTP head");
    }
    let len = args.prompts.first().copied().unwrap_or(128);
    let most = counts.iter().copied().max().unwrap_or(1);
    let prompts: Vec<Vec<u32>> = (0..most)
        .map(|i| prompt(i, len, model.vocab_size()))
        .collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| stream(model, p, args, &Barrier::new(1), &Barrier::new(1)).map(|t| t.0))
        .collect::<anyhow::Result<_>>()?;
    let mut rows = Vec::new();
    for &n in counts {
        let batching = BatchingModel::new(model, BatchConfig::default());
        // The streams and this thread: the counters read once every
        // stream has prefilled and before any decodes are the decode
        // phase's start.
        let (ready, go) = (Barrier::new(n + 1), Barrier::new(n + 1));
        let mut at_decode = None;
        // The batches on a thread of their own, as the server runs them.
        let outs = batching.with_executor(|| {
            std::thread::scope(|s| {
                let handles: Vec<_> = prompts[..n]
                    .iter()
                    .map(|p| {
                        let (m, ready, go) = (batching.clone(), &ready, &go);
                        s.spawn(move || {
                            let _turn = m.join();
                            stream(&m, p, args, ready, go)
                        })
                    })
                    .collect();
                ready.wait();
                at_decode = Some(batching.stats());
                probe(None);
                go.wait();
                handles
                    .into_iter()
                    .map(|h| h.join().map_err(|_| anyhow::anyhow!("a stream panicked"))?)
                    .collect::<anyhow::Result<Vec<_>>>()
            })
        })?;
        let first = outs.iter().map(|o| o.1).min().expect("one stream at least");
        let last = outs.iter().map(|o| o.2).max().expect("one stream at least");
        let stats = batching.stats();
        let at = at_decode.unwrap_or_default();
        probe(Some(stats.batches - at.batches));
        rows.push(StreamsRow {
            streams: n,
            decode_tokens: outs.iter().map(|o| o.0.len()).sum(),
            decode_span: last - first,
            batches: stats.batches,
            forwards: stats.forwards,
            decode_batches: stats.batches - at.batches,
            decode_gather: Duration::from_nanos(stats.gather_ns - at.gather_ns),
            decode_run: Duration::from_nanos(stats.run_ns - at.run_ns),
            shared_mtp: stats.shared_mtp,
            shared_drafts: stats.shared_drafts,
            identical: outs.iter().zip(&alone).all(|(o, a)| &o.0 == a),
        });
    }
    Ok(rows)
}

/// The probe [`bench_streams`] reports to: the CUDA host profile's table
/// where the model runs on a GPU (`DS4_CUDA_HOST_PROFILE=1`), nothing
/// elsewhere.
pub fn probe_for(loaded: &LoadedModel) -> Box<dyn Fn(Option<u64>) + '_> {
    #[cfg(feature = "cuda")]
    return Box::new(super::bench_host_gaps::streams_probe(loaded));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = loaded;
        Box::new(|_| ())
    }
}

pub fn to_csv(rows: &[StreamsRow], backend: &str, kernels: &str, mtp_depth: usize) -> String {
    let base = rows.first().map_or(1.0, StreamsRow::aggregate_tps);
    let mut out = String::from(
        "streams,decode_tokens,aggregate_decode_tps,per_stream_tps,vs_one_stream,batches,mean_batch,\
         decode_batches,decode_ms_per_batch,gather_ms_per_batch,forward_ms_per_batch,\
         identical_to_alone,mtp_depth,shared_mtp_forwards,shared_drafts,backend,kernels\n",
    );
    for r in rows {
        let agg = r.aggregate_tps();
        let per_batch = |d: Duration| 1e3 * d.as_secs_f64() / r.decode_batches.max(1) as f64;
        let _ = writeln!(
            out,
            "{},{},{agg:.1},{:.1},{:.2},{},{:.2},{},{:.3},{:.3},{:.3},{},{mtp_depth},{},{},{backend},{kernels}",
            r.streams,
            r.decode_tokens,
            agg / r.streams as f64,
            agg / base,
            r.batches,
            r.forwards as f64 / r.batches.max(1) as f64,
            r.decode_batches,
            per_batch(r.decode_span),
            per_batch(r.decode_gather),
            per_batch(r.decode_run),
            r.identical,
            r.shared_mtp,
            r.shared_drafts,
        );
    }
    out
}
