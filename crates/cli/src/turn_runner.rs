//! One streamed turn, shared by `run` and `chat`: sampler setup from the
//! family's law, the engine's decode loop, and the text pipeline
//! ([`ds4_text::TextStream`], the one the server's worker uses).

use ds4_engine::Model;
use ds4_engine::decode::{
    CallerStop, CancelToken, Flow, TurnConfig, TurnRequest, TurnResult, on_tokens,
};
use ds4_engine::state::warm::SessionCache;
use ds4_sampling::{Sampler, SamplingRequest, resolve_seed};
use ds4_text::{TextStream, Tokenizer};

use crate::args::{GenerationArgs, SamplingArgs};

/// A sampler bound to the family's law, with the seed it uses and the
/// warnings about parameters the law ignores.
pub struct SamplerSetup {
    pub sampler: Sampler,
    pub seed: u64,
    pub warnings: Vec<String>,
}

pub fn sampler_for<M: Model>(model: &M, args: &SamplingArgs) -> anyhow::Result<SamplerSetup> {
    let descriptor = model.descriptor();
    let request = SamplingRequest {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
    };
    let resolved = descriptor
        .law
        .resolve(&descriptor.sampling_defaults, &request)?;
    let seed = resolve_seed(args.seed, None);
    Ok(SamplerSetup {
        sampler: Sampler::new(descriptor.law, resolved.params, seed)?,
        seed,
        warnings: resolved.ignored.iter().map(|w| w.to_string()).collect(),
    })
}

pub struct StreamedTurn {
    pub result: TurnResult,
    pub text: String,
}

/// How a turn runs: its limits and stop strings, and an optional token that
/// stops it at the next prefill chunk or token (Ctrl+C in `chat`).
pub struct TurnOptions<'a> {
    pub generation: &'a GenerationArgs,
    pub cancel: Option<&'a CancelToken>,
}

/// Run one turn, handing each new piece of text to `emit` as soon as it is
/// final.
pub fn stream_turn<M: Model>(
    model: &M,
    cache: &mut SessionCache<M>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampler: &mut Sampler,
    options: &TurnOptions<'_>,
    emit: &mut dyn FnMut(&str),
) -> anyhow::Result<StreamedTurn> {
    let TurnOptions { generation, cancel } = *options;
    let config = TurnConfig {
        max_tokens: generation.max_tokens,
        stop_token_ids: tokenizer.stop_token_ids().to_vec(),
        prefill_chunk: generation.chunk,
        logprobs: None,
        cancel: cancel.cloned().unwrap_or_default(),
    };
    let mut text = TextStream::new(tokenizer, generation.stop.clone());
    let mut text_error = None;
    let request = TurnRequest {
        prompt,
        sampler,
        config,
        mtp_depth: generation.mtp_depth,
    };
    let mut observer = on_tokens(|event| match text.push(event.token, event.is_stop_token) {
        Ok(piece) => {
            emit(&piece.text);
            if piece.stop_string {
                Flow::Stop(CallerStop::StopString)
            } else {
                Flow::Continue
            }
        }
        Err(e) => {
            text_error = Some(anyhow::Error::from(e));
            Flow::Stop(CallerStop::Cancelled)
        }
    });
    let result = cache.decode_turn(model, request, &mut observer)?;
    if let Some(e) = text_error {
        return Err(e);
    }
    emit(&text.finish());
    Ok(StreamedTurn {
        result,
        text: text.text().to_string(),
    })
}
