//! MTP speculative decoding (`shared/specs/mtp.md`): the model's own MTP
//! head drafts up to K tokens, the trunk verifies them in one (K+1)-row
//! forward, and the sampling law's exact acceptance keeps the emitted
//! sequence distributed exactly as AR sampling at any temperature (greedy:
//! exactly the AR tokens). Family-agnostic: a family plugs in through
//! [`Model::MtpHistory`], [`crate::ModelState::Window`],
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
//!    `max_tokens`); under a draft-stop threshold
//!    ([`crate::MtpContract::min_draft_confidence`]) drafting ends early,
//!    before the first greedy `d_i` whose head row is less confident than
//!    the threshold, and `k` is the number drafted (0 makes the verify a
//!    single row: an AR step);
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
//! Greedy samplers take no draws at all, and neither does a position the
//! observer samples at temperature 0 ([`super::turn::TurnObserver::greedy_after`],
//! asked before every primary, draft, verify row and bonus; a draft and the
//! verify row at its position get the same answer). `k` is clamped to the
//! context left before step 2, so the clamp changes the number of draws but
//! never their order; a draft stop ends step 2 early at a greedy position
//! (which takes no draw), so it never changes a sampled turn's draws.
//! Penalty counts for a row are the emitted tokens before its position
//! (drafts count as emitted for the rows after them).
//!
//! ## Constraints
//!
//! Under a constraint ([`super::turn::TurnObserver::allowed_after`]) every
//! position's row is masked before the law: draft `d_{j+1}` is drawn from
//! the head's row under the mask of the position after the primary and
//! `d_1..d_j`, and verify row `j` is read under that same mask (asked once,
//! kept for the cycle), so `p`, `q`, the acceptance and the residual are
//! the masked laws' and the emitted tokens are distributed exactly as a
//! constrained AR turn's (greedy: the same tokens). A rejected draft rolls
//! the constraint back by itself: the next question's `pending` no longer
//! contains it. A mask that allows nothing stops drafting at that position
//! (it depends on the prefix alone); reaching it in verification ends the
//! turn with [`FinishReason::NoAllowedToken`] after the accepted drafts.
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
//!
//! The prefill loop ([`super::prefill::prefill_turn`]) and the exit
//! classifier ([`super::exit::Emitter::emit`]) are the AR loop's.

use std::time::{Duration, Instant};

use ds4_sampling::{Distribution, Sampler};

use super::draft_stop::stops_before;
use super::exit::{CANCELLED, Emitter, cancelled_in_prefill};
use super::mask::TokenMask;
use super::media::PromptMedia;
use super::prefill::prefill_turn;
use super::session::{LiveSession, MtpSide};
use super::step::{StepSamplers, constrain};
use super::turn::{
    FinishReason, MtpStats, TokenSource, TurnObserver, TurnRequest, TurnResult, TurnTimings,
};
use crate::error::{EngineError, Result};
use crate::model::{HiddenRows, LogitsRows, Model, ModelState, MtpHistory, MtpStep};

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

/// An MTP turn at draft depth `depth` (1..=the family's maximum; the
/// request's `mtp_depth` is not read), stopping a cycle's drafts early under
/// `draft_stop` ([`crate::MtpContract::min_draft_confidence`]). Session
/// handling as in [`super::generate`]; exits and draw order as in the
/// module docs.
pub(crate) fn generate<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    depth: usize,
    draft_stop: Option<f32>,
    media: Option<&PromptMedia<'_>>,
    observer: &mut dyn TurnObserver,
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
    let TurnRequest {
        prompt,
        sampler,
        config,
        ..
    } = request;
    let result = Turn {
        model,
        session: &mut *session,
        samplers: StepSamplers::new(sampler),
        out: Emitter::new(&config, observer),
        stats: MtpStats::new(depth),
        draft_stop,
        media,
        trunk_time: Duration::ZERO,
        head_time: Duration::ZERO,
    }
    .run(prompt);
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
    samplers: StepSamplers<'a>,
    out: Emitter<'a>,
    stats: MtpStats,
    /// The draft-stop threshold (see [`super::draft_stop`]).
    draft_stop: Option<f32>,
    /// The prompt's real ids and image rows when it holds keys.
    media: Option<&'a PromptMedia<'a>>,
    /// Decode time in trunk forwards and in head forwards
    /// ([`TurnTimings::decode_trunk`], [`TurnTimings::decode_head`]).
    trunk_time: Duration,
    head_time: Duration,
}

/// Trunk output at the last covered position.
struct Last<H> {
    logits: Vec<f32>,
    hidden: H,
}

fn state_err(msg: &str) -> EngineError {
    EngineError::State(msg.to_string())
}

/// The MTP side of `session`.
fn side_of<M: Model>(
    session: &mut LiveSession<M>,
) -> Result<&mut MtpSide<M::MtpHistory, M::Hidden>> {
    session
        .mtp_mut()
        .as_mut()
        .ok_or_else(|| state_err("the MTP side of the session is missing"))
}

impl<M: Model> Turn<'_, M> {
    /// Emit one token (see [`Emitter::emit`]).
    fn emit(
        &mut self,
        token: u32,
        fallback: bool,
        row: &[f32],
        source: TokenSource,
    ) -> Option<FinishReason> {
        self.out.emit(token, fallback, row, source)
    }

    fn mtp(&mut self) -> Result<&mut MtpSide<M::MtpHistory, M::Hidden>> {
        side_of(self.session)
    }

    /// A decode-time head forward, appending `tokens`' rows to the history.
    fn head_forward(&mut self, tokens: &[u32], hidden: &M::Hidden) -> Result<MtpStep<M::Hidden>> {
        let start = Instant::now();
        let model = self.model;
        let step = model.mtp_forward(tokens, hidden, &mut self.mtp()?.history);
        self.head_time += start.elapsed();
        step
    }

    /// Rewind, make sure the MTP history is in step (else start over), and
    /// prefill the new prompt tokens through trunk and head. `None`: the
    /// cancel token was set before a chunk; the session covers the chunks
    /// that ran (trunk, head and last logits in step).
    fn prefill(&mut self, prompt: &[u32]) -> Result<(usize, Option<Last<M::Hidden>>)> {
        let model = self.model;
        let mut reused = self.session.rewind_for(model, prompt);
        if self.session.mtp_mut().is_none() {
            if reused > 0 {
                // The history is not in step with the trunk (an AR turn ran,
                // or a rewind could not keep it): rebuild both from the start.
                self.session.reset(model);
                reused = 0;
            }
            let history = model
                .new_mtp_history()
                .ok_or_else(|| state_err("the model gave no MTP history"))?;
            *self.session.mtp_mut() = Some(MtpSide {
                history,
                hidden: None,
                ahead: None,
            });
        }
        let fresh = &prompt[reused..];
        if let Some(ahead) = self.mtp()?.ahead
            && fresh.first() != Some(&ahead)
        {
            return Err(state_err("the MTP history holds another next token"));
        }
        let config = self.out.config;
        let prefilled = prefill_turn(
            model,
            self.session,
            fresh,
            config,
            self.out.observer(),
            self.media,
            |session, piece, chunk| {
                let (out, hidden) = model.forward_hidden_media(
                    piece,
                    chunk,
                    session.state_mut(),
                    LogitsRows::Last,
                )?;
                // MTP rows: (pending hidden, piece[0]), then (hidden[j], piece[j+1]).
                let n = piece.len();
                let side = side_of(session)?;
                // One ahead (a rewind): the history already holds piece[0]
                // (checked against the prompt before the prefill).
                side.ahead = None;
                let (toks, rows): (&[u32], Option<M::Hidden>) = match side.hidden.take() {
                    Some(h) if n == 1 => (piece, Some(h)),
                    Some(h) => (piece, Some(h.cat(&hidden.narrow(0, n - 1)?)?)),
                    None if n == 1 => (&[], None),
                    None => (&piece[1..], Some(hidden.narrow(0, n - 1)?)),
                };
                if let Some(rows) = rows {
                    model.mtp_forward(toks, &rows, &mut side.history)?;
                }
                side.hidden = Some(hidden.narrow(n - 1, 1)?);
                Ok(out.last_row().to_vec())
            },
        )?;
        let Some(logits) = prefilled else {
            return Ok((reused, None));
        };
        let hidden = self.mtp()?.hidden.clone().ok_or_else(|| {
            state_err(if fresh.is_empty() {
                "the session kept no hidden"
            } else {
                "prefill produced no hidden"
            })
        })?;
        Ok((reused, Some(Last { logits, hidden })))
    }

    fn run(mut self, prompt: &[u32]) -> Result<TurnResult> {
        let prefill_start = Instant::now();
        let (reused, last) = self.prefill(prompt)?;
        let Some(mut last) = last else {
            let prefilled = self.session.tokens().len() - reused;
            return Ok(cancelled_in_prefill(
                reused,
                prefilled,
                prefill_start,
                Some(self.stats),
            ));
        };
        let mut timings = TurnTimings {
            prefill_tokens: prompt.len() - reused,
            prefill: prefill_start.elapsed(),
            ..TurnTimings::default()
        };
        let decode_start = Instant::now();
        let finish_reason = self.decode(&mut last)?;
        timings.decode = decode_start.elapsed();
        timings.decode_tokens = self.out.tokens.len();
        timings.decode_trunk = self.trunk_time;
        timings.decode_head = self.head_time;
        let covered = self.session.tokens().len();
        Ok(self.out.finish(
            finish_reason,
            covered,
            prompt.len(),
            reused,
            timings,
            Some(self.stats),
        ))
    }

    /// The cycles. On return the session is consistent (see module docs).
    fn decode(&mut self, last: &mut Last<M::Hidden>) -> Result<FinishReason> {
        if self.out.config.max_tokens == 0 {
            return Ok(FinishReason::MaxTokens);
        }
        // Draw: the primary of the first cycle.
        let greedy = self.out.observer().greedy_after(&[]);
        let mask = self.out.observer().allowed_after(&[]);
        let Some(row) = constrain(mask.as_ref(), &last.logits) else {
            // Nothing allowed before the first token: the session covers
            // the prompt, the history one row behind.
            return Ok(FinishReason::NoAllowedToken);
        };
        let s = self.samplers.pick(greedy)?.sample(&row, &self.out.counts)?;
        let mut exit = self.emit(s.token, s.argmax_fallback, &row, TokenSource::Sampled);
        drop(row);
        let mut pending = s.token;
        // Output of the MTP row holding `pending` (history covers S rows).
        let mut head: Option<MtpStep<M::Hidden>> = None;
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
                    let hidden = last.hidden.clone();
                    self.head_forward(&[pending], &hidden)?
                }
            };
            // Not clamped to the tokens left: a seed's tokens must not depend
            // on `max_tokens` (surplus drafts are verified and dropped).
            let room = self.model.context_length() - s_len - 1;
            let mut k = self.stats.depth.min(room);

            // Drafts (draws 2). `masks[j]`: the constraint's mask at the
            // position after the primary and d_1..d_j — draft j + 1's and
            // verify row j's (asked once, used for both).
            let mut drafts = Vec::with_capacity(k);
            let mut qs: Vec<Distribution> = Vec::with_capacity(k);
            let mut masks: Vec<Option<TokenMask>> = Vec::with_capacity(k + 1);
            let mut dcounts = self.out.counts.clone();
            let mut step = head_step.clone();
            for i in 0..k {
                // Draft i's position follows the emitted tokens and d_1..d_{i-1}.
                let greedy = self.out.observer().greedy_after(&drafts);
                if let Some(threshold) = self.draft_stop
                    && self.samplers.pick(greedy)?.is_greedy()
                    && stops_before(&step.logits, threshold)
                {
                    // The head doubts its next greedy draft: verify what is
                    // drafted.
                    k = i;
                    break;
                }
                let mask = self.out.observer().allowed_after(&drafts);
                let Some(row) = constrain(mask.as_ref(), &step.logits) else {
                    // The constraint admits no token here: draft no further
                    // (the answer depends on the prefix alone, so the
                    // verify row at this position ends the turn the same way).
                    masks.push(mask);
                    k = i;
                    break;
                };
                let sampler = self.samplers.pick(greedy)?;
                let q = sampler.distribution(&row, &dcounts)?;
                drop(row);
                masks.push(mask);
                let d = sampler.sample_from(&q);
                dcounts.add(d);
                drafts.push(d);
                qs.push(q);
                self.stats.drafted[i] += 1;
                if i + 1 < k {
                    step = self.head_forward(&[d], &step.hidden)?;
                }
            }

            // Verify.
            let mut window = Vec::with_capacity(k + 1);
            window.push(pending);
            window.extend_from_slice(&drafts);
            let model = self.model;
            let verify_start = Instant::now();
            let w = model.forward_window(&window, self.session.state_mut())?;
            self.trunk_time += verify_start.elapsed();
            self.stats.cycles += 1;
            self.stats.verify_rows += window.len();

            // Accept in order (draws 3), then residual or bonus (draw 4).
            let mut accepted = 0;
            let mut next: Option<(u32, bool, usize, TokenSource)> = None;
            for i in 0..k {
                // d_1..d_i are emitted: the same position, and so the same
                // law and mask, as draft i's.
                let row = constrain(masks[i].as_ref(), w.logits.row(i))
                    .ok_or_else(|| state_err("a verify row lost its draft's tokens"))?;
                let row = &*row;
                let greedy = self.out.observer().greedy_after(&[]);
                let sampler = self.samplers.pick(greedy)?;
                let p = sampler.distribution(row, &self.out.counts)?;
                if sampler.accept(&p, &qs[i], drafts[i]) {
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
                    let t = sampler.sample_from(&r);
                    next = Some((t, p.argmax_fallback(), i, TokenSource::Residual));
                    break;
                }
            }
            if exit.is_none() && next.is_none() {
                let greedy = self.out.observer().greedy_after(&[]);
                // Every draft is emitted: row k's position. Its mask was
                // asked already if drafting stopped at an empty one.
                let mask = match masks.len() > k {
                    true => masks.pop().flatten(),
                    false => self.out.observer().allowed_after(&[]),
                };
                match constrain(mask.as_ref(), w.logits.row(k)) {
                    Some(row) => {
                        let s = self.samplers.pick(greedy)?.sample(&row, &self.out.counts)?;
                        self.stats.bonus += 1;
                        next = Some((s.token, s.argmax_fallback, k, TokenSource::Bonus));
                        masks.truncate(k);
                        masks.push(mask);
                    }
                    // Nothing to sample: the turn ends after the drafts.
                    None => exit = Some(FinishReason::NoAllowedToken),
                }
            }
            if let Some((token, fallback, row, source)) = next {
                let masked = constrain(masks[row].as_ref(), w.logits.row(row))
                    .ok_or_else(|| state_err("a sampled row has no allowed token"))?;
                exit = self.emit(token, fallback, &masked, source);
            }

            // Commit exactly [primary, accepted drafts] in the trunk.
            let committed = 1 + accepted;
            self.session.state_mut().commit(&w.record, committed)?;
            self.session.record(&window[..committed]);
            last.logits = w.logits.row(accepted).to_vec();
            last.hidden = w.hidden.narrow(accepted, 1)?;
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
                let hidden = w.hidden.narrow(0, rows.len())?;
                Some(self.head_forward(&rows, &hidden)?)
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
        last: &mut Last<M::Hidden>,
    ) -> Result<FinishReason> {
        let s_len = self.session.tokens().len();
        let forwardable = s_len < self.model.context_length();
        if reason == CANCELLED || !forwardable {
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
            self.head_forward(&[pending], &hidden)?;
        }
        self.session.set_last_logits(None);
        let forward_start = Instant::now();
        let (out, hidden) =
            model.forward_hidden(&[pending], self.session.state_mut(), LogitsRows::Last)?;
        self.trunk_time += forward_start.elapsed();
        self.session.record(&[pending]);
        last.logits = out.last_row().to_vec();
        last.hidden = hidden.narrow(0, 1)?;
        self.session.set_last_logits(Some(last.logits.clone()));
        self.mtp()?.hidden = Some(last.hidden.clone());
        Ok(reason)
    }
}
