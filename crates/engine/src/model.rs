//! The model contract: the only surface the decode loops, the session layer
//! and the CLI see of a family.

use crate::error::{EngineError, Result};
use crate::table::NamedTensor;
use ds4_sampling::{Law, SamplingParams};

/// Which rows of a forward's logits the caller needs. Prefill chunks only
/// need the last row; `debug logits` and speculative verify need all rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsRows {
    Last,
    All,
}

/// Logits on the host, row-major `[rows, vocab]`, f32.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    pub logits: Vec<f32>,
    pub rows: usize,
    pub vocab: usize,
}

impl ForwardOutput {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn last_row(&self) -> &[f32] {
        self.row(self.rows - 1)
    }
}

/// What one call of a batched forward returns besides its logits: the
/// forward a session alone would have called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchWant {
    /// [`Model::forward`]: the logits rows.
    Logits,
    /// [`Model::forward_hidden`]: also the hidden of every new row.
    Hidden,
    /// [`Model::forward_window`]: every logits row, the hidden of every
    /// row and the window record.
    Window,
}

/// One session's part of a batched forward ([`Model::forward_batch`]): the
/// tokens it processes after everything its state covers, which logits
/// rows it wants and what else ([`BatchWant`]).
pub struct BatchCall<'a, S> {
    pub tokens: &'a [u32],
    pub state: &'a mut S,
    pub rows: LogitsRows,
    pub want: BatchWant,
}

impl<'a, S> BatchCall<'a, S> {
    /// A [`Model::forward`].
    pub fn logits(tokens: &'a [u32], state: &'a mut S, rows: LogitsRows) -> Self {
        Self {
            tokens,
            state,
            rows,
            want: BatchWant::Logits,
        }
    }

    /// A [`Model::forward_hidden`].
    pub fn hidden(tokens: &'a [u32], state: &'a mut S, rows: LogitsRows) -> Self {
        Self {
            tokens,
            state,
            rows,
            want: BatchWant::Hidden,
        }
    }

    /// A [`Model::forward_window`] (every logits row).
    pub fn window(tokens: &'a [u32], state: &'a mut S) -> Self {
        Self {
            tokens,
            state,
            rows: LogitsRows::All,
            want: BatchWant::Window,
        }
    }
}

/// One call's result of a batched forward: its logits, and its hidden
/// rows and window record when its [`BatchWant`] asked for them.
#[derive(Debug)]
pub struct BatchOutput<W, H> {
    pub logits: ForwardOutput,
    pub hidden: Option<H>,
    pub record: Option<W>,
}

/// A batched call's result for model `M`.
pub type BatchResult<M> =
    BatchOutput<<<M as Model>::State as ModelState>::Window, <M as Model>::Hidden>;

impl<W, H> BatchOutput<W, H> {
    /// A [`BatchWant::Logits`] result.
    pub fn logits(logits: ForwardOutput) -> Self {
        Self {
            logits,
            hidden: None,
            record: None,
        }
    }

    /// What [`Model::forward_hidden`] returns.
    pub fn into_hidden(self) -> Result<(ForwardOutput, H)> {
        let hidden = self.hidden.ok_or_else(|| {
            EngineError::State("a batched forward returned no hidden rows".into())
        })?;
        Ok((self.logits, hidden))
    }

    /// What [`Model::forward_window`] returns.
    pub fn into_window(self) -> Result<VerifyWindow<W, H>> {
        let record = self
            .record
            .ok_or_else(|| EngineError::State("a batched forward returned no window".into()))?;
        let (logits, hidden) = BatchOutput {
            logits: self.logits,
            hidden: self.hidden,
            record: None::<W>,
        }
        .into_hidden()?;
        Ok(VerifyWindow {
            logits,
            hidden,
            record,
        })
    }
}

/// One session's part of a batched MTP head call
/// ([`Model::mtp_forward_batch`]): what [`Model::mtp_forward`] takes.
pub struct MtpCall<'a, H, Hist> {
    pub tokens: &'a [u32],
    pub hidden: &'a H,
    pub history: &'a mut Hist,
}

/// `call` through the forward a session alone calls for its
/// [`BatchWant`] (what [`Model::forward_batch`] does for a call that
/// cannot share a pass).
pub fn forward_alone<M: Model + ?Sized>(
    model: &M,
    call: &mut BatchCall<'_, M::State>,
) -> Result<BatchResult<M>> {
    match call.want {
        BatchWant::Logits => Ok(BatchOutput::logits(model.forward(
            call.tokens,
            call.state,
            call.rows,
        )?)),
        BatchWant::Hidden => {
            let (logits, hidden) = model.forward_hidden(call.tokens, call.state, call.rows)?;
            Ok(BatchOutput {
                logits,
                hidden: Some(hidden),
                record: None,
            })
        }
        BatchWant::Window => {
            let w = model.forward_window(call.tokens, call.state)?;
            Ok(BatchOutput {
                logits: w.logits,
                hidden: Some(w.hidden),
                record: Some(w.record),
            })
        }
    }
}

/// Everything a model remembers about the tokens it has processed.
/// Rows of one prefill chunk that come from a media encoder rather than
/// the token embedding (family-neutral: host values, so no backend type
/// crosses the contract).
#[derive(Clone, Copy, Debug, Default)]
pub struct MediaChunk<'a> {
    /// `(first token index in the chunk, rows [n, width] row-major)`, in
    /// chunk order, not overlapping.
    pub spans: &'a [(usize, &'a [f32])],
    /// One `(t, h, w)` position per token of the chunk, or empty for the
    /// family's text positions.
    pub positions: &'a [[u32; 3]],
}

impl MediaChunk<'_> {
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty() && self.positions.is_empty()
    }
}

pub trait ModelState: Send {
    /// The family's record of a verify window (see [`Model::forward_window`]):
    /// what [`ModelState::commit`] needs to keep any prefix of the window.
    /// Families without verify windows use [`NoMtp`].
    type Window: Send;

    /// Number of tokens the state covers.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// An independent copy: mutating either afterwards never affects the other.
    fn snapshot(&self) -> Self
    where
        Self: Sized;
    /// Forget everything after the first `n` tokens. Below
    /// [`ModelState::truncate_floor`] it returns an error instead of a wrong
    /// state.
    fn truncate(&mut self, n: usize) -> Result<()>;
    /// The shortest length [`ModelState::truncate`] can take this state back
    /// to: 0 for attention-only states (any prefix), `len()` for states with
    /// recurrent layers (only what they cover; they are reusable at shorter
    /// prefixes only through the boundaries a session cache stored).
    fn truncate_floor(&self) -> usize;
    /// Bytes of tensor data held (what a snapshot costs).
    fn byte_size(&self) -> usize;
    /// Become a copy of `snapshot` (taken from the same model).
    fn restore(&mut self, snapshot: &Self)
    where
        Self: Sized,
    {
        *self = snapshot.snapshot();
    }
    /// Keep exactly the first `accepted` rows of the verify window recorded
    /// in `window` (which must be the last forward on this state): every
    /// cache ends as if only those rows had been forwarded. Families without
    /// verify windows refuse.
    fn commit(&mut self, window: &Self::Window, accepted: usize) -> Result<()> {
        let _ = (window, accepted);
        Err(EngineError::Unsupported(
            "this model state has no verify-window commit".into(),
        ))
    }
    /// Every cache as host tensors (valid rows only), in a fixed order: what
    /// a checkpoint file stores. Families that cannot serialise refuse.
    fn export(&self) -> Result<Vec<NamedTensor>> {
        Err(EngineError::Unsupported(
            "this model state cannot be exported".into(),
        ))
    }
    /// Rebuild from [`ModelState::export`]'s table. `self` must be a fresh
    /// state of the same model (its shapes are what the table is checked
    /// against); on error it is left unspecified and must be discarded.
    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        let _ = tensors;
        Err(EngineError::Unsupported(
            "this model state cannot be imported".into(),
        ))
    }
}

pub trait Model: Send + Sync {
    type State: ModelState;
    /// The MTP head's own cache ([`NoMtp`] for a family without a head).
    type MtpHistory: MtpHistory;
    /// Hidden rows the MTP head reads ([`NoMtp`] without a head).
    type Hidden: HiddenRows;

    fn descriptor(&self) -> &'static FamilyDescriptor;
    /// The backend the model runs on (part of every checkpoint's identity).
    fn backend(&self) -> crate::backend::BackendId;
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports (positions).
    fn context_length(&self) -> usize;
    fn new_state(&self) -> Self::State;
    /// Process `tokens` (one prefill chunk, one decode step or a verify
    /// window) after everything `state` covers, extending it.
    fn forward(
        &self,
        tokens: &[u32],
        state: &mut Self::State,
        rows: LogitsRows,
    ) -> Result<ForwardOutput>;

    /// Several sessions' forwards at once (continuous batching): each call's
    /// result is exactly what the forward its [`BatchWant`] names gives for
    /// that call alone ([`forward_alone`]; the kernels are row-independent:
    /// `shared/specs/backend.md`), so a session's bits do not depend on
    /// what else runs. Decode steps, prefill chunks, MTP prefills and
    /// verify windows may share one pass. The default runs the calls one
    /// after another; a family whose layers can share the products of
    /// several sessions' rows overrides it.
    fn forward_batch(
        &self,
        calls: &mut [BatchCall<'_, Self::State>],
    ) -> Vec<Result<BatchResult<Self>>> {
        calls.iter_mut().map(|c| forward_alone(self, c)).collect()
    }

    /// [`Model::forward`] with media: `media.rows` replace the embeddings of
    /// the tokens they name (placeholders, whose ids stay in `tokens` for
    /// whatever the family derives from ids), and `media.positions` gives
    /// every token of the chunk its `(t, h, w)` position. A family without
    /// media input refuses a non-empty one; an empty one is `forward`.
    fn forward_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Self::State,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        if media.is_empty() {
            return self.forward(tokens, state, rows);
        }
        Err(EngineError::Unsupported(format!(
            "{} takes no image input",
            self.descriptor().name
        )))
    }

    // ---- Speculative decoding (families with an MTP head). The defaults
    // describe a family without one; the AR path never calls these. ----

    /// [`Model::forward_hidden`] with media (see [`Model::forward_media`]):
    /// an MTP turn's prefill of a prompt with images.
    fn forward_hidden_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Self::State,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, Self::Hidden)> {
        if media.is_empty() {
            return self.forward_hidden(tokens, state, rows);
        }
        Err(EngineError::Unsupported(format!(
            "{} takes no image input",
            self.descriptor().name
        )))
    }

    /// The family's MTP contract, `None` when the model has no MTP head.
    fn mtp_contract(&self) -> Option<MtpContract> {
        None
    }
    /// Like [`Model::forward`], also returning the hidden of every new row
    /// (`[tokens.len(), width]`), the input of the MTP head.
    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut Self::State,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, Self::Hidden)> {
        let _ = (tokens, state, rows);
        Err(no_mtp(self.descriptor().name, "forward_hidden"))
    }
    /// A verify window: all logits rows, all hidden rows and the record
    /// [`ModelState::commit`] keeps a prefix of.
    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Self::State,
    ) -> Result<VerifyWindow<<Self::State as ModelState>::Window, Self::Hidden>> {
        let _ = (tokens, state);
        Err(no_mtp(self.descriptor().name, "forward_window"))
    }
    /// Hidden rows `[rows, width]` from host values (session import).
    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<Self::Hidden> {
        let _ = (rows, width, data);
        Err(no_mtp(self.descriptor().name, "hidden_from_host"))
    }
    /// A fresh, empty MTP history.
    fn new_mtp_history(&self) -> Option<Self::MtpHistory> {
        None
    }
    /// Append MTP rows: `tokens[i]` with `hidden[i]` (`[n, width]`, trunk
    /// hidden or the previous depth's output) at position `history.len() +
    /// i`. Returns the last row's logits and output hidden.
    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &Self::Hidden,
        history: &mut Self::MtpHistory,
    ) -> Result<MtpStep<Self::Hidden>> {
        let _ = (tokens, hidden, history);
        Err(no_mtp(self.descriptor().name, "mtp_forward"))
    }

    /// Several sessions' MTP head calls at once (their draft steps):
    /// each result is exactly [`Model::mtp_forward`] of that call alone.
    /// The default runs them one after another; a family whose head can
    /// share its products over several sessions' rows overrides it.
    fn mtp_forward_batch(
        &self,
        calls: &mut [MtpCall<'_, Self::Hidden, Self::MtpHistory>],
    ) -> Vec<Result<MtpStep<Self::Hidden>>> {
        calls
            .iter_mut()
            .map(|c| self.mtp_forward(c.tokens, c.hidden, c.history))
            .collect()
    }
}

/// A block of hidden rows `[rows, width]` on the model's device that a
/// family's MTP head reads (which hidden it is — before or after the final
/// norm, before or after a hyper-connection collapse — is the family's
/// [`MtpContract`]). The decode loop only slices and joins rows; it reads
/// them back to the host only to export a session.
pub trait HiddenRows: Clone + Send + Sync + std::fmt::Debug {
    fn rows(&self) -> usize;
    /// Rows `first .. first + count`.
    fn narrow(&self, first: usize, count: usize) -> Result<Self>;
    /// `[self | other]` by rows.
    fn cat(&self, other: &Self) -> Result<Self>;
    /// `(rows, width, values)` on the host (session export).
    fn to_host(&self) -> Result<(usize, usize, Vec<f32>)>;
}

/// The hidden rows of a family written against the op inventory: a backend
/// buffer `[rows, width]`.
#[derive(Debug, Clone)]
pub struct DeviceRows<B: crate::backend::Backend> {
    ops: B,
    buf: B::Buf,
    rows: usize,
    width: usize,
}

impl<B: crate::backend::Backend> DeviceRows<B> {
    pub fn new(ops: &B, buf: B::Buf, rows: usize, width: usize) -> Result<Self> {
        if ops.len(&buf) != rows * width {
            return Err(EngineError::State(format!(
                "hidden rows: {} values are not [{rows}, {width}]",
                ops.len(&buf)
            )));
        }
        Ok(Self {
            ops: ops.clone(),
            buf,
            rows,
            width,
        })
    }

    pub fn buf(&self) -> &B::Buf {
        &self.buf
    }

    pub fn width(&self) -> usize {
        self.width
    }
}

impl<B: crate::backend::Backend> HiddenRows for DeviceRows<B> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn narrow(&self, first: usize, count: usize) -> Result<Self> {
        let buf = self.ops.rows(&self.buf, self.width, first, count)?;
        Self::new(&self.ops, buf, count, self.width)
    }

    fn cat(&self, other: &Self) -> Result<Self> {
        if other.width != self.width {
            return Err(EngineError::State(format!(
                "hidden rows of width {} and {} cannot be joined",
                self.width, other.width
            )));
        }
        let mut buf = self.buf.clone();
        self.ops.append(&mut buf, &other.buf)?;
        Self::new(&self.ops, buf, self.rows + other.rows, self.width)
    }

    fn to_host(&self) -> Result<(usize, usize, Vec<f32>)> {
        Ok((self.rows, self.width, self.ops.download(&self.buf)?))
    }
}

impl HiddenRows for NoMtp {
    fn rows(&self) -> usize {
        match *self {}
    }
    fn narrow(&self, _first: usize, _count: usize) -> Result<Self> {
        match *self {}
    }
    fn cat(&self, _other: &Self) -> Result<Self> {
        match *self {}
    }
    fn to_host(&self) -> Result<(usize, usize, Vec<f32>)> {
        match *self {}
    }
}

/// What a family's MTP head promises the decode loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MtpContract {
    /// Draft depth used when a request does not choose one.
    pub default_depth: usize,
    /// Deepest draft chain the family supports (requests are refused above).
    pub max_depth: usize,
    /// Which trunk hidden feeds the head (documentation for tooling).
    pub hidden: &'static str,
    /// `Some(c)`: a cycle stops drafting before a greedy draft whose head
    /// row gives its top token a probability (softmax at temperature 1)
    /// below `c`, so the request's depth is an upper bound and a cycle may
    /// verify fewer rows. The decision reads only the head's row, never the
    /// trunk's or the stream, and a greedy position takes no draw, so the
    /// emitted tokens and every draw are unchanged; only the cost moves
    /// (`decode/draft_stop.rs`). `None`: every cycle drafts the depth.
    pub min_draft_confidence: Option<f32>,
}

/// The window record and MTP history of a family without an MTP head: an
/// uninhabited type, so no value of it exists and the code that would use
/// one is statically unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMtp {}

impl MtpHistory for NoMtp {
    fn len(&self) -> usize {
        match *self {}
    }
    fn truncate(&mut self, _n: usize) -> Result<()> {
        match *self {}
    }
    fn byte_size(&self) -> usize {
        match *self {}
    }
}

/// A (K+1)-row verify forward: logits of every row, the hidden of every row
/// (what the MTP history is appended with) and the family's window record
/// `W` (its [`ModelState::Window`]).
#[derive(Debug)]
pub struct VerifyWindow<W, H> {
    pub logits: ForwardOutput,
    /// `[rows, width]`.
    pub hidden: H,
    pub record: W,
}

/// One MTP head call: the logits row of its last input row and that row's
/// output hidden `[1, width]` (the next depth's input).
#[derive(Debug, Clone)]
pub struct MtpStep<H> {
    pub logits: Vec<f32>,
    pub hidden: H,
}

/// The MTP head's own cache (the "MTP history"). Row `t` combines the trunk
/// hidden of position `t` with the token at `t + 1`, at position `t`; rows
/// are appended at `len()`. Drafted rows are dropped with
/// [`MtpHistory::truncate`]. `Clone` is an independent deep copy.
pub trait MtpHistory: Send + Clone {
    /// Rows the history covers.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keep the first `n` rows.
    fn truncate(&mut self, n: usize) -> Result<()>;
    fn byte_size(&self) -> usize;
    /// Like [`ModelState::export`], for the MTP head's cache.
    fn export(&self) -> Result<Vec<NamedTensor>> {
        Err(EngineError::Unsupported(
            "this MTP history cannot be exported".into(),
        ))
    }
    /// Like [`ModelState::import`]: `self` is a fresh history of the model.
    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        let _ = tensors;
        Err(EngineError::Unsupported(
            "this MTP history cannot be imported".into(),
        ))
    }
}

fn no_mtp(name: &str, what: &str) -> EngineError {
    EngineError::Unsupported(format!("{name}: the model has no MTP head ({what})"))
}

/// What the rest of the system may know about a family.
#[derive(Debug)]
pub struct FamilyDescriptor {
    pub name: &'static str,
    /// `model_type` values (config.json) of Hugging Face directories the
    /// family loads.
    pub model_types: &'static [&'static str],
    /// `general.architecture` values of GGUF files the family loads.
    pub gguf_architectures: &'static [&'static str],
    /// The one sampling law this family is bound to.
    pub law: Law,
    /// Defaults for the parameters a request leaves unset.
    pub sampling_defaults: SamplingParams,
}
