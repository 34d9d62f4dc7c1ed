//! MTP speculative decoding (`shared/specs/mtp.md`): the model's own MTP
//! head drafts up to K tokens, the trunk verifies them in one (K+1)-row
//! forward, and the sampling law's exact acceptance keeps the emitted
//! sequence distributed exactly as AR sampling at any temperature (greedy:
//! exactly the AR tokens). Family-agnostic: a family plugs in through
//! [`Model::mtp_contract`], [`Model::forward_hidden`],
//! [`Model::forward_window`], [`crate::ModelState::commit`],
//! [`Model::new_mtp_history`] and [`Model::mtp_forward`].
//!
//! ## Positions
//!
//! The trunk covers `S` tokens (positions `0..S`); the *primary* is the
//! token at position `S`, already emitted. The MTP history row `t` combines
//! the trunk hidden of position `t` with the token at `t + 1`. Between
//! cycles the history covers `S` rows (its last row, with the primary, is
//! what draft 1 comes from); for a fresh primary it covers `S − 1` rows and
//! the row with the primary is run first.
//!
//! ## One cycle
//!
//! 1. primary: sampled from the last trunk logits (first cycle only) or the
//!    pending token from the previous cycle; emitted;
//! 2. drafts `d_1..d_k`: `q_i` = the law's distribution of the MTP head's
//!    row, `d_i` drawn from it; depth `i > 1` runs the head on its own
//!    output hidden and `d_{i−1}`. `k = min(K, context left)` (not clamped
//!    to the tokens left, so the tokens of a seed never depend on
//!    `max_tokens`);
//! 3. verify: one trunk forward of `[primary, d_1..d_k]` (rows `p_0..p_k`);
//! 4. accept `d_i` against row `i − 1` in order, emitting each accepted
//!    draft at once, up to the first rejection;
//! 5. next token: the residual `(p − q)+` of the rejecting row, or on full
//!    acceptance the bonus token sampled from row `k`; emitted;
//! 6. commit: the trunk keeps exactly `[primary, accepted drafts]`; the MTP
//!    history is rolled back to the cycle start (keeping the primary's row)
//!    and appended with the committed rows `(hidden_{S+j}, d_{j+1})` and
//!    `(hidden_{S+a}, next)`; `next` is the new pending primary.
//!
//! ## Draw order (sampling.md section 5, nucleus and ds4 laws alike)
//!
//! Within one cycle the request's stream is drawn exactly in this order:
//!
//! 1. one draw for the primary — first cycle of a turn only (a pending
//!    primary was drawn as the previous cycle's residual or bonus);
//! 2. one draw per draft, depths `1..k` in order;
//! 3. one uniform per draft position `1..k` until the first rejection
//!    (inclusive);
//! 4. one residual draw (on a rejection) or one bonus draw from row `k`
//!    (all accepted), unless the turn ended at an accepted draft.
//!
//! Greedy samplers take no draws at all. `k` is clamped to the context left
//! before step 2, so the clamp changes the number of draws but never their
//! order. Penalty counts for a row are the emitted tokens before
//! its position (drafts count as emitted for the rows after them).
//!
//! ## Exits and the final commit
//!
//! A turn ends at the primary, at an accepted draft or at the residual/bonus
//! token (stop token, stop string from the callback, `max_tokens`,
//! cancellation), on a full context, or on an error:
//!
//! * stop token / stop string / `max_tokens` at an accepted draft: the
//!   window is committed up to that draft — that *is* the final commit;
//! * the same at the primary or the residual/bonus token: the window (if
//!   any) is committed, then the pending token gets its one final forward
//!   (and its MTP row, if not yet run);
//! * either way the session covers exactly `prompt + emitted`, the MTP
//!   history one row less, the last logits and hidden
//!   ([`FinalState::Complete`]);
//! * cancellation: the window is committed to its consistent prefix and no
//!   further forward runs; a full context: the pending token cannot be
//!   forwarded. Both leave a consistent session that does not claim the turn
//!   ([`FinalState::Partial`]);
//! * any error (forward, sampling): the session is reset, so no half-updated
//!   state survives.

use std::time::Instant;

use ds4_sampling::{Distribution, Sampler, TokenCounts};
use serde::Serialize;

use super::logprobs::token_logprobs;
use super::prefill::PrefillProgress;
use super::session::{LiveSession, MtpSide};
use super::turn::{
    CallerStop, FinalState, FinishReason, Flow, TokenEvent, TokenSource, TurnConfig, TurnResult,
    TurnTimings,
};
use crate::error::{EngineError, Result};
use crate::model::{Hidden, LogitsRows, Model, ModelState, MtpHistory, MtpStep};

/// Per-turn speculative statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MtpStats {
    /// Draft depth K the turn ran with.
    pub depth: usize,
    /// Verify cycles run.
    pub cycles: usize,
    /// Drafts proposed at depth position `i + 1`.
    pub drafted: Vec<usize>,
    /// Drafts accepted at depth position `i + 1`.
    pub accepted: Vec<usize>,
    /// Cycles whose drafts were all accepted and sampled a bonus token.
    pub bonus: usize,
    /// Trunk rows forwarded in verify windows.
    pub verify_rows: usize,
}

impl MtpStats {
    fn new(depth: usize) -> Self {
        Self {
            depth,
            drafted: vec![0; depth],
            accepted: vec![0; depth],
            ..Self::default()
        }
    }

    pub fn drafted_total(&self) -> usize {
        self.drafted.iter().sum()
    }

    pub fn accepted_total(&self) -> usize {
        self.accepted.iter().sum()
    }

    /// Accepted drafts over drafted ones (0 when none were drafted).
    pub fn acceptance_rate(&self) -> f64 {
        let d = self.drafted_total();
        if d == 0 {
            0.0
        } else {
            self.accepted_total() as f64 / d as f64
        }
    }

    /// Mean accepted drafts per cycle.
    pub fn mean_accepted_len(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.accepted_total() as f64 / self.cycles as f64
        }
    }
}

/// The draft depth a request runs with: `None` takes the family's default
/// (0, i.e. AR, for a model without an MTP head), `Some(0)` is AR, and a
/// depth above the family's maximum or on a model without a head is refused.
pub fn resolve_mtp_depth<M: Model>(model: &M, requested: Option<usize>) -> Result<usize> {
    let contract = model.mtp_contract();
    match (requested, contract) {
        (None, None) | (Some(0), _) => Ok(0),
        (None, Some(c)) => Ok(c.default_depth),
        (Some(d), None) => Err(EngineError::Unsupported(format!(
            "{}: MTP depth {d} requested but the model has no MTP head",
            model.descriptor().name
        ))),
        (Some(d), Some(c)) if d > c.max_depth => Err(EngineError::Unsupported(format!(
            "{}: MTP depth {d} exceeds the family's maximum {}",
            model.descriptor().name,
            c.max_depth
        ))),
        (Some(d), Some(_)) => Ok(d),
    }
}

/// One turn with AR or MTP decoding: `mtp_depth` as in
/// [`resolve_mtp_depth`]. The entry point for callers that let a request
/// choose (CLI `--mtp-depth`, the API's `mtp_depth`).
#[allow(clippy::too_many_arguments)]
pub fn generate_auto<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    sampler: &mut Sampler,
    config: &TurnConfig,
    mtp_depth: Option<usize>,
    on_prefill: &mut dyn FnMut(PrefillProgress),
    on_token: &mut dyn FnMut(TokenEvent) -> Flow,
) -> Result<TurnResult> {
    match resolve_mtp_depth(model, mtp_depth)? {
        0 => super::ar::generate(
            model, session, prompt, sampler, config, on_prefill, on_token,
        ),
        depth => generate_mtp(
            model, session, prompt, sampler, config, depth, on_prefill, on_token,
        ),
    }
}

/// Generate a reply with MTP speculative decoding at draft depth `depth`
/// (1..=the family's maximum). Session handling as in
/// [`super::ar::generate`]; exits and draw order as in the module docs.
#[allow(clippy::too_many_arguments)]
pub fn generate_mtp<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    sampler: &mut Sampler,
    config: &TurnConfig,
    depth: usize,
    on_prefill: &mut dyn FnMut(PrefillProgress),
    on_token: &mut dyn FnMut(TokenEvent) -> Flow,
) -> Result<TurnResult> {
    let contract = model.mtp_contract().ok_or_else(|| {
        EngineError::Unsupported(format!(
            "{}: the model has no MTP head",
            model.descriptor().name
        ))
    })?;
    if depth == 0 || depth > contract.max_depth {
        return Err(EngineError::Unsupported(format!(
            "MTP depth {depth} outside 1..={}",
            contract.max_depth
        )));
    }
    let result = Turn {
        model,
        session: &mut *session,
        sampler,
        config,
        on_token,
        tokens: Vec::new(),
        counts: TokenCounts::default(),
        fallbacks: 0,
        stats: MtpStats::new(depth),
    }
    .run(prompt, on_prefill);
    if result.is_err() {
        session.reset(model);
    }
    debug_assert!(session.is_consistent());
    result
}

/// The loop's working set for one turn.
struct Turn<'a, M: Model> {
    model: &'a M,
    session: &'a mut LiveSession<M>,
    sampler: &'a mut Sampler,
    config: &'a TurnConfig,
    on_token: &'a mut dyn FnMut(TokenEvent) -> Flow,
    tokens: Vec<u32>,
    counts: TokenCounts,
    fallbacks: usize,
    stats: MtpStats,
}

/// Trunk output at the last covered position.
struct Last {
    logits: Vec<f32>,
    hidden: Hidden,
}

fn state_err(msg: &str) -> EngineError {
    EngineError::State(msg.to_string())
}

impl<M: Model> Turn<'_, M> {
    /// Emit one token: count it, hand it to the callback, and say whether
    /// the turn ends here (stop token, then the callback's answer, then
    /// `max_tokens`, as in the AR loop).
    fn emit(
        &mut self,
        token: u32,
        fallback: bool,
        row: &[f32],
        source: TokenSource,
    ) -> Option<FinishReason> {
        self.counts.add(token);
        self.tokens.push(token);
        self.fallbacks += usize::from(fallback);
        let is_stop_token = self.config.stop_token_ids.contains(&token);
        let flow = (self.on_token)(TokenEvent {
            token,
            index: self.tokens.len() - 1,
            is_stop_token,
            argmax_fallback: fallback,
            logprobs: self
                .config
                .logprobs
                .map(|top_n| token_logprobs(row, token, top_n)),
            source,
        });
        if is_stop_token {
            Some(FinishReason::StopToken)
        } else if let Flow::Stop(why) = flow {
            Some(FinishReason::Caller(why))
        } else if self.config.cancel.is_cancelled() {
            Some(FinishReason::Caller(CallerStop::Cancelled))
        } else if self.tokens.len() >= self.config.max_tokens {
            Some(FinishReason::MaxTokens)
        } else {
            None
        }
    }

    fn mtp(&mut self) -> Result<&mut MtpSide<M::MtpHistory>> {
        self.session
            .mtp_mut()
            .as_mut()
            .ok_or_else(|| state_err("the MTP side of the session is missing"))
    }

    /// Rewind, make sure the MTP history is in step (else start over), and
    /// prefill the new prompt tokens through trunk and head. `None`: the
    /// cancel token was set before a chunk; the session covers the chunks
    /// that ran (trunk, head and last logits in step).
    fn prefill(
        &mut self,
        prompt: &[u32],
        on_prefill: &mut dyn FnMut(PrefillProgress),
    ) -> Result<(usize, Option<Last>)> {
        let model = self.model;
        let mut reused = self.session.rewind_for(model, prompt);
        if self.session.mtp_mut().is_none() {
            if reused > 0 {
                // The history is not in step with the trunk (an AR turn or a
                // rewind ran): rebuild both from the start.
                self.session.reset(model);
                reused = 0;
            }
            let history = model
                .new_mtp_history()
                .ok_or_else(|| state_err("the model gave no MTP history"))?;
            *self.session.mtp_mut() = Some(MtpSide {
                history,
                hidden: None,
            });
        }
        let fresh = &prompt[reused..];
        if fresh.is_empty() {
            let logits = self
                .session
                .last_logits()
                .map(<[f32]>::to_vec)
                .ok_or_else(|| state_err("the prompt is empty"))?;
            let hidden = self
                .mtp()?
                .hidden
                .clone()
                .ok_or_else(|| state_err("the session kept no hidden"))?;
            return Ok((reused, Some(Last { logits, hidden })));
        }
        let needed = self.session.tokens().len() + fresh.len();
        if needed > model.context_length() {
            return Err(EngineError::ContextOverflow {
                needed,
                limit: model.context_length(),
            });
        }
        self.session.set_last_logits(None);
        let chunk = self.config.prefill_chunk.max(1);
        let start = Instant::now();
        let mut last = None;
        for (i, piece) in fresh.chunks(chunk).enumerate() {
            if self.config.cancel.is_cancelled() {
                return Ok((reused, None));
            }
            self.session.set_last_logits(None);
            let (out, hidden) =
                model.forward_hidden(piece, self.session.state_mut(), LogitsRows::Last)?;
            self.session.record(piece);
            // MTP rows: (pending hidden, piece[0]), then (hidden[j], piece[j+1]).
            let n = piece.len();
            let side = self.mtp()?;
            let (toks, rows): (&[u32], Option<Hidden>) = match side.hidden.take() {
                Some(h) if n == 1 => (piece, Some(h)),
                Some(h) => (
                    piece,
                    Some(Hidden::cat(&[&h, &hidden.narrow(0, 0, n - 1)?], 0)?),
                ),
                None if n == 1 => (&[], None),
                None => (&piece[1..], Some(hidden.narrow(0, 0, n - 1)?)),
            };
            if let Some(rows) = rows {
                model.mtp_forward(toks, &rows, &mut side.history)?;
            }
            side.hidden = Some(hidden.narrow(0, piece.len() - 1, 1)?);
            self.session.set_last_logits(Some(out.last_row().to_vec()));
            last = Some(out);
            on_prefill(PrefillProgress {
                done: (i * chunk + piece.len()).min(fresh.len()),
                total: fresh.len(),
                elapsed: start.elapsed(),
            });
        }
        let logits = last
            .ok_or_else(|| state_err("prefill produced no logits"))?
            .last_row()
            .to_vec();
        self.session.set_last_logits(Some(logits.clone()));
        let hidden = self
            .mtp()?
            .hidden
            .clone()
            .ok_or_else(|| state_err("prefill produced no hidden"))?;
        Ok((reused, Some(Last { logits, hidden })))
    }

    fn run(
        mut self,
        prompt: &[u32],
        on_prefill: &mut dyn FnMut(PrefillProgress),
    ) -> Result<TurnResult> {
        let prefill_start = Instant::now();
        let (reused, last) = self.prefill(prompt, on_prefill)?;
        let Some(mut last) = last else {
            return Ok(TurnResult {
                tokens: Vec::new(),
                finish_reason: FinishReason::Caller(CallerStop::Cancelled),
                reused_tokens: reused,
                timings: TurnTimings {
                    prefill_tokens: self.session.tokens().len() - reused,
                    prefill: prefill_start.elapsed(),
                    ..TurnTimings::default()
                },
                argmax_fallbacks: 0,
                final_state: FinalState::Partial,
                mtp: Some(self.stats),
            });
        };
        let mut timings = TurnTimings {
            prefill_tokens: prompt.len() - reused,
            prefill: prefill_start.elapsed(),
            ..TurnTimings::default()
        };
        let decode_start = Instant::now();
        let finish_reason = self.decode(&mut last)?;
        timings.decode = decode_start.elapsed();
        timings.decode_tokens = self.tokens.len();
        let complete = finish_reason != FinishReason::Caller(CallerStop::Cancelled)
            && self.session.tokens().len() == prompt.len() + self.tokens.len();
        Ok(TurnResult {
            tokens: self.tokens,
            finish_reason,
            reused_tokens: reused,
            timings,
            argmax_fallbacks: self.fallbacks,
            final_state: if complete {
                FinalState::Complete
            } else {
                FinalState::Partial
            },
            mtp: Some(self.stats),
        })
    }

    /// The cycles. On return the session is consistent (see module docs).
    fn decode(&mut self, last: &mut Last) -> Result<FinishReason> {
        if self.config.max_tokens == 0 {
            return Ok(FinishReason::MaxTokens);
        }
        // Draw: the primary of the first cycle.
        let s = self.sampler.sample(&last.logits, &self.counts)?;
        let mut exit = self.emit(
            s.token,
            s.argmax_fallback,
            &last.logits,
            TokenSource::Sampled,
        );
        let mut pending = s.token;
        // Output of the MTP row holding `pending` (history covers S rows).
        let mut head: Option<MtpStep> = None;
        loop {
            if let Some(reason) = exit {
                return self.finish_pending(reason, pending, head.is_some(), last);
            }
            let s_len = self.session.tokens().len();
            if s_len + 1 > self.model.context_length() {
                return self.finish_pending(
                    FinishReason::ContextFull,
                    pending,
                    head.is_some(),
                    last,
                );
            }
            let head_step = match head.take() {
                Some(h) => h,
                None => {
                    let model = self.model;
                    let hidden = last.hidden.clone();
                    model.mtp_forward(&[pending], &hidden, &mut self.mtp()?.history)?
                }
            };
            // Not clamped to the tokens left: a seed's tokens must not depend
            // on `max_tokens` (surplus drafts are verified and dropped).
            let room = self.model.context_length() - s_len - 1;
            let k = self.stats.depth.min(room);

            // Drafts (draws 2).
            let mut drafts = Vec::with_capacity(k);
            let mut qs: Vec<Distribution> = Vec::with_capacity(k);
            let mut dcounts = self.counts.clone();
            let mut step = head_step.clone();
            for i in 0..k {
                let q = self.sampler.distribution(&step.logits, &dcounts)?;
                let d = self.sampler.sample_from(&q);
                dcounts.add(d);
                drafts.push(d);
                qs.push(q);
                self.stats.drafted[i] += 1;
                if i + 1 < k {
                    let model = self.model;
                    step = model.mtp_forward(&[d], &step.hidden, &mut self.mtp()?.history)?;
                }
            }

            // Verify.
            let mut window = Vec::with_capacity(k + 1);
            window.push(pending);
            window.extend_from_slice(&drafts);
            let model = self.model;
            let w = model.forward_window(&window, self.session.state_mut())?;
            self.stats.cycles += 1;
            self.stats.verify_rows += window.len();

            // Accept in order (draws 3), then residual or bonus (draw 4).
            let mut accepted = 0;
            let mut next: Option<(u32, bool, usize, TokenSource)> = None;
            for i in 0..k {
                let row = w.logits.row(i);
                let p = self.sampler.distribution(row, &self.counts)?;
                if self.sampler.accept(&p, &qs[i], drafts[i]) {
                    accepted += 1;
                    self.stats.accepted[i] += 1;
                    exit = self.emit(
                        drafts[i],
                        p.argmax_fallback(),
                        row,
                        TokenSource::Draft(i + 1),
                    );
                    if exit.is_some() {
                        break;
                    }
                } else {
                    let r = Sampler::residual(&p, &qs[i]);
                    let t = self.sampler.sample_from(&r);
                    next = Some((t, p.argmax_fallback(), i, TokenSource::Residual));
                    break;
                }
            }
            if exit.is_none() && next.is_none() {
                let row = w.logits.row(k);
                let s = self.sampler.sample(row, &self.counts)?;
                self.stats.bonus += 1;
                next = Some((s.token, s.argmax_fallback, k, TokenSource::Bonus));
            }
            if let Some((token, fallback, row, source)) = next {
                exit = self.emit(token, fallback, w.logits.row(row), source);
            }

            // Commit exactly [primary, accepted drafts] in the trunk.
            let committed = 1 + accepted;
            self.session.state_mut().commit(&w.record, committed)?;
            self.session.record(&window[..committed]);
            last.logits = w.logits.row(accepted).to_vec();
            last.hidden = w.hidden.narrow(0, accepted, 1)?;
            self.session.set_last_logits(Some(last.logits.clone()));

            // MTP history: back to the cycle start plus the primary's row,
            // then the committed rows (and the next primary's row).
            let mut rows = drafts[..accepted].to_vec();
            rows.extend(next.map(|(t, ..)| t));
            let side = self.mtp()?;
            side.history.truncate(s_len)?;
            side.hidden = Some(last.hidden.clone());
            head = if rows.is_empty() {
                None
            } else {
                let hidden = w.hidden.narrow(0, 0, rows.len())?;
                Some(model.mtp_forward(&rows, &hidden, &mut side.history)?)
            };
            match next {
                // Ended at an accepted draft: the commit above was final.
                None => return Ok(exit.unwrap_or(FinishReason::MaxTokens)),
                Some((token, ..)) => pending = token,
            }
        }
    }

    /// End the turn with `pending` emitted but not forwarded. `has_row`:
    /// the MTP history already holds the row with `pending`.
    fn finish_pending(
        &mut self,
        reason: FinishReason,
        pending: u32,
        has_row: bool,
        last: &mut Last,
    ) -> Result<FinishReason> {
        let s_len = self.session.tokens().len();
        let forwardable = s_len < self.model.context_length();
        if reason == FinishReason::Caller(CallerStop::Cancelled) || !forwardable {
            // No final forward: drop the row with `pending` so the history
            // stays one row behind the trunk.
            if has_row {
                self.mtp()?.history.truncate(s_len - 1)?;
            }
            return Ok(reason);
        }
        // The final commit: the MTP row with `pending` (if not yet run),
        // then `pending`'s one trunk forward.
        let model = self.model;
        if !has_row {
            let hidden = last.hidden.clone();
            model.mtp_forward(&[pending], &hidden, &mut self.mtp()?.history)?;
        }
        self.session.set_last_logits(None);
        let (out, hidden) =
            model.forward_hidden(&[pending], self.session.state_mut(), LogitsRows::Last)?;
        self.session.record(&[pending]);
        last.logits = out.last_row().to_vec();
        last.hidden = hidden.narrow(0, 0, 1)?;
        self.session.set_last_logits(Some(last.logits.clone()));
        self.mtp()?.hidden = Some(last.hidden.clone());
        Ok(reason)
    }
}
