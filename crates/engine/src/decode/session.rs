//! The live session: a model state plus the exact tokens it covers, so the
//! next turn can reuse the longest exact token prefix instead of prefilling
//! the whole conversation again.
//!
//! After a turn the session covers exactly `prompt + emitted` (see
//! [`super::turn::FinalState`]) and keeps the logits row of its last
//! position, so a next turn whose prompt only appends prefills just the new
//! tokens, and one whose prompt equals the covered tokens samples at once.
//! A session used by the MTP loop also keeps the MTP history (one row less
//! than the trunk: row `t` needs the token at `t + 1`) and the trunk hidden
//! of the last position (the input of the next MTP row). A rewind (an
//! edited or regenerated message) keeps the history too, one row ahead of
//! the trunk instead (see [`MtpSide`]), so MTP turns start warm like AR
//! ones.

use crate::error::{EngineError, Result};
use crate::model::{HiddenRows, Model, ModelState, MtpHistory};
use crate::table::{NamedTensor, TableReader, TensorData};

/// The MTP side of a session, in one of two forms:
///
/// - *in step*: `history.len() + 1 == tokens.len()` and `hidden` is the
///   trunk hidden of the last covered position (both empty for an empty
///   session);
/// - *one ahead* (after a rewind): `history.len() == tokens.len()`, no
///   hidden, and `ahead` is the token the last history row already holds
///   (the token at `tokens.len()`). The rows need only the trunk hiddens,
///   which are not kept, so a rewind keeps the history up to the row whose
///   hidden the next prefill recomputes: the trunk re-runs one token, and
///   the turn stays warm instead of rebuilding both from the start.
pub(crate) struct MtpSide<H, X> {
    pub history: H,
    pub hidden: Option<X>,
    pub ahead: Option<u32>,
}

impl<H: MtpHistory, X: HiddenRows> MtpSide<H, X> {
    fn snapshot(&self) -> Self {
        Self {
            history: self.history.clone(),
            hidden: self.hidden.clone(),
            ahead: self.ahead,
        }
    }
}

pub struct LiveSession<M: Model> {
    state: M::State,
    /// Exactly the tokens `state` covers, in order.
    tokens: Vec<u32>,
    /// Logits row of the last covered position, when known.
    last_logits: Option<Vec<f32>>,
    /// Present only while the MTP history is in step with the trunk.
    mtp: Option<MtpSide<M::MtpHistory, M::Hidden>>,
}

impl<M: Model> LiveSession<M> {
    pub fn new(model: &M) -> Self {
        Self {
            state: model.new_state(),
            tokens: Vec::new(),
            last_logits: None,
            mtp: None,
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &M::State {
        &self.state
    }

    /// Logits row of the last covered position (kept at the end of a turn).
    pub fn last_logits(&self) -> Option<&[f32]> {
        self.last_logits.as_deref()
    }

    /// The MTP history, when the last turn kept it in step with the trunk.
    pub fn mtp_history(&self) -> Option<&M::MtpHistory> {
        self.mtp.as_ref().map(|m| &m.history)
    }

    /// Trunk hidden of the last covered position (MTP sessions).
    pub fn mtp_hidden(&self) -> Option<&M::Hidden> {
        self.mtp.as_ref().and_then(|m| m.hidden.as_ref())
    }

    /// Forget everything.
    pub fn reset(&mut self, model: &M) {
        self.state = model.new_state();
        self.tokens.clear();
        self.last_logits = None;
        self.mtp = None;
    }

    /// Rewind the state to the longest exact prefix it shares with `prompt`
    /// and return how many prompt tokens it already covers.
    ///
    /// When the session is a prefix of `prompt` nothing is dropped; if it
    /// covers all of `prompt` it must hold the last logits row (else one
    /// token is dropped so the turn gets fresh logits). Dropping tokens also
    /// drops the kept logits. A session with an MTP side keeps it, one
    /// ahead (see [`MtpSide`]): it rewinds to one token short of the shared
    /// prefix, so the prefill recomputes the hidden of the history's last
    /// row. A state that cannot be truncated (recurrent families) is reset
    /// rather than restored at the wrong point (below its
    /// [`ModelState::truncate_floor`]); so is an MTP history that cannot.
    pub fn rewind_for(&mut self, model: &M, prompt: &[u32]) -> usize {
        let (whole, keep) = self.rewind_point(prompt);
        if whole {
            return keep;
        }
        self.last_logits = None;
        if keep < self.state.truncate_floor() || self.state.truncate(keep).is_err() {
            self.reset(model);
            return 0;
        }
        self.tokens.truncate(keep);
        if let Some(side) = self.mtp.as_mut() {
            if keep > 0 && side.history.truncate(keep).is_ok() {
                side.hidden = None;
                side.ahead = Some(prompt[keep]);
            } else {
                self.mtp = None;
            }
        }
        keep
    }

    /// What [`LiveSession::rewind_for`] would reuse of `prompt`, without
    /// changing anything (0 where it would reset).
    pub fn reusable_for(&self, prompt: &[u32]) -> usize {
        let (whole, keep) = self.rewind_point(prompt);
        if whole || keep >= self.state.truncate_floor() {
            keep
        } else {
            0
        }
    }

    /// Whether the session is kept whole (it is a prefix of `prompt` and,
    /// covering the whole prompt, holds its last logits row), and the length
    /// it keeps. Matching counts an MTP side's `ahead` token as covered. Not
    /// kept whole, a session keeps the common prefix, at most all but the
    /// last prompt token (the turn needs fresh logits); one with an MTP side
    /// keeps one token less than the common prefix (the history's last row
    /// then holds the token after it).
    fn rewind_point(&self, prompt: &[u32]) -> (bool, usize) {
        let ahead = self.mtp.as_ref().and_then(|m| m.ahead);
        let seen = self.tokens.len() + usize::from(ahead.is_some());
        let common = self
            .tokens
            .iter()
            .chain(ahead.iter())
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let whole = common == seen
            && (ahead.is_some()
                || common < prompt.len()
                || (self.last_logits.is_some() && !prompt.is_empty()));
        if whole {
            (true, self.tokens.len())
        } else if self.mtp.is_some() {
            (false, common.saturating_sub(1))
        } else {
            (false, common.min(prompt.len().saturating_sub(1)))
        }
    }

    /// Note that `tokens` were run through the model after the current state.
    pub(crate) fn record(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    pub(crate) fn set_last_logits(&mut self, logits: Option<Vec<f32>>) {
        self.last_logits = logits;
    }

    pub(crate) fn state_mut(&mut self) -> &mut M::State {
        &mut self.state
    }

    pub(crate) fn mtp_mut(&mut self) -> &mut Option<MtpSide<M::MtpHistory, M::Hidden>> {
        &mut self.mtp
    }

    /// Check the invariant that the token list and the state agree (and the
    /// MTP history is one row behind the trunk, or one ahead without a
    /// hidden: see [`MtpSide`]).
    pub fn is_consistent(&self) -> bool {
        let n = self.tokens.len();
        let mtp_ok = self
            .mtp
            .as_ref()
            .is_none_or(|m| match (&m.hidden, m.ahead) {
                (Some(_), None) => n > 0 && m.history.len() + 1 == n,
                (None, Some(_)) => n > 0 && m.history.len() == n,
                (None, None) => n == 0 && m.history.is_empty(),
                (Some(_), Some(_)) => false,
            });
        self.state.len() == self.tokens.len() && mtp_ok
    }

    /// A deep copy (for a session bank or for a test's comparison).
    pub fn snapshot(&self) -> Self {
        Self {
            state: self.state.snapshot(),
            tokens: self.tokens.clone(),
            last_logits: self.last_logits.clone(),
            mtp: self.mtp.as_ref().map(MtpSide::snapshot),
        }
    }

    /// Replace the whole session (e.g. restore a snapshot).
    pub fn restore(&mut self, other: &Self) -> Result<()> {
        *self = other.snapshot();
        Ok(())
    }

    /// Bytes a snapshot of this session holds.
    pub fn byte_size(&self) -> usize {
        self.state.byte_size()
            + self.mtp.as_ref().map_or(0, |m| m.history.byte_size())
            + 4 * self.last_logits.as_ref().map_or(0, Vec::len)
            + 4 * self.tokens.len()
    }

    /// Everything needed to continue this session, as host tensors: the
    /// model state (`state/…`), the MTP history and last trunk hidden
    /// (`mtp/…`, `mtp_hidden`) and the last logits row (`last_logits`).
    pub fn export(&self) -> Result<SessionImage> {
        if !self.is_consistent() {
            return Err(EngineError::State(
                "cannot export a session whose state and tokens disagree".into(),
            ));
        }
        let mut tensors: Vec<NamedTensor> = self
            .state
            .export()?
            .into_iter()
            .map(|t| t.prefixed("state/"))
            .collect();
        if let Some(logits) = &self.last_logits {
            tensors.push(NamedTensor::f32(
                "last_logits",
                vec![logits.len()],
                logits.clone(),
            ));
        }
        if let Some(m) = &self.mtp {
            tensors.extend(m.history.export()?.into_iter().map(|t| t.prefixed("mtp/")));
            if let Some(h) = &m.hidden {
                let (rows, width, data) = h.to_host()?;
                tensors.push(NamedTensor::f32("mtp_hidden", vec![rows, width], data));
            }
            if let Some(token) = m.ahead {
                tensors.push(NamedTensor::u32("mtp_ahead", vec![1], vec![token]));
            }
        }
        Ok(SessionImage {
            tokens: self.tokens.clone(),
            covered: self.state.len(),
            tensors,
        })
    }

    /// Rebuild a session of `model` from [`LiveSession::export`]'s image.
    /// Every table is checked against the model's fresh state, and the
    /// rebuilt session must cover exactly the image's tokens.
    pub fn import(model: &M, image: SessionImage) -> Result<Self> {
        if image.covered != image.tokens.len() {
            return Err(EngineError::State(format!(
                "session image keys {} tokens but its state covers {}",
                image.tokens.len(),
                image.covered
            )));
        }
        let mut state_t = Vec::new();
        let mut mtp_t = Vec::new();
        let mut last_logits = None;
        let mut hidden = None;
        let mut ahead = None;
        for t in image.tensors {
            if let Some(name) = t.name.strip_prefix("state/") {
                let name = name.to_string();
                state_t.push(NamedTensor { name, ..t });
            } else if let Some(name) = t.name.strip_prefix("mtp/") {
                let name = name.to_string();
                mtp_t.push(NamedTensor { name, ..t });
            } else if t.name == "last_logits" {
                let mut r = TableReader::new(vec![t], "session");
                last_logits = Some(r.f32("last_logits", model.vocab_size())?);
            } else if t.name == "mtp_ahead" {
                let mut r = TableReader::new(vec![t], "session");
                ahead = r.u32("mtp_ahead", 1)?.first().copied();
            } else if t.name == "mtp_hidden" {
                let (shape, data) = match t.data {
                    TensorData::F32(d) => (t.shape, d),
                    TensorData::U32(_) => {
                        return Err(EngineError::State(
                            "session: `mtp_hidden` is not f32".into(),
                        ));
                    }
                };
                let [rows, width] = shape[..] else {
                    return Err(EngineError::State(
                        "session: `mtp_hidden` is not `[rows, width]`".into(),
                    ));
                };
                if rows * width != data.len() {
                    return Err(EngineError::State(
                        "session: `mtp_hidden` shape disagrees with its data".into(),
                    ));
                }
                hidden = Some(model.hidden_from_host(rows, width, data)?);
            } else {
                return Err(EngineError::State(format!(
                    "session: unknown tensor `{}` in the image",
                    t.name
                )));
            }
        }
        let mut state = model.new_state();
        state.import(state_t)?;
        let mtp = if mtp_t.is_empty() {
            None
        } else {
            let mut history = model.new_mtp_history().ok_or_else(|| {
                EngineError::State(
                    "session image has an MTP history but the model has no MTP head".into(),
                )
            })?;
            history.import(mtp_t)?;
            Some(MtpSide {
                history,
                hidden,
                ahead,
            })
        };
        let session = Self {
            state,
            tokens: image.tokens,
            last_logits,
            mtp,
        };
        if !session.is_consistent() {
            return Err(EngineError::State(format!(
                "session image covers {} tokens but its state holds {}",
                session.tokens.len(),
                session.state.len()
            )));
        }
        Ok(session)
    }
}

/// A session as host tensors (see [`LiveSession::export`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionImage {
    /// Exactly the tokens the state covers.
    pub tokens: Vec<u32>,
    /// Tokens the model state covers (equal to `tokens.len()` for an image
    /// that can be imported; a file claiming otherwise is refused early).
    pub covered: usize,
    pub tensors: Vec<NamedTensor>,
}
