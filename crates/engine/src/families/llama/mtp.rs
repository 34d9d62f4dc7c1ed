//! The llama family's MTP head and its contract: a DeepSeek-style layer
//! trained by self-distillation for the default model (`tools/mtp_head`),
//! stored in its own GGUF file beside the model and attached with
//! [`super::LlamaModel::attach_mtp_head`].
//!
//! Row `p` of the MTP history pairs the trunk hidden of position `p` with
//! the token at `p + 1` and predicts the token at `p + 2`:
//!
//! ```text
//! x = eh_proj . [ enorm(embed(tok_{p+1})) | hnorm(h_p) ]   embedding first
//! x = decoder_layer(x)        the head's own layer and KV cache, RoPE at p
//! z = output_subset . output_norm(x)                       S rows only
//! ```
//!
//! * `h_p` is the trunk's residual stream after its last layer, **before**
//!   the final norm (`MTP_HIDDEN`); a deeper draft feeds back the head's own
//!   `x` (also before its norm) with the drafted token.
//! * The output head is the trunk's tied embedding restricted to a fixed
//!   vocabulary subset `S` (the tokens the model emits most often, ranked on
//!   the training replies): `output_subset` holds those rows of
//!   `token_embd`, the trunk's Q8_0 blocks copied byte for byte. The draft
//!   logits row has every token outside `S` at `-inf`, so the draft
//!   distribution gives them probability 0 under any law setting. Exactness
//!   does not depend on it: acceptance is the law's `min(1, p/q)` rule and
//!   the residual `max(0, p - q)` puts the mass of tokens outside `S` back.
//!   Drafting then costs `|S| / vocab` of a full head (8192 of 49152 rows).
//!
//! The head file's tensors (GGUF, `general.architecture = llama-mtp-head`):
//! `mtp.{enorm,hnorm}.weight [H]`, `mtp.eh_proj.weight [H, 2H]`, one llama
//! layer under the trunk's GGUF names (`mtp.attn_norm.weight`,
//! `mtp.attn_q.weight`, ..., `mtp.ffn_down.weight`), `mtp.output_norm.weight
//! [H]`, `mtp.vocab_subset [S]` (token ids stored as f32: exact below 2^24;
//! strictly increasing) and `mtp.output_subset.weight [S, H]`. Every tensor
//! must be bound (strict) and every shape must fit the trunk.

use std::path::{Path, PathBuf};

use super::config::LlamaConfig;
use super::model::{Block, GGUF_NAMES, GgufWeights};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::layers::attention::AttnPart;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::layers::rope::Rope;
use crate::load::binder::Binder;
use crate::load::gguf::GgufFile;
use crate::model::MtpHistory;
use crate::state::kv_cache::KvCache;
use crate::table::NamedTensor;

/// What feeds the head (the [`crate::MtpContract`]'s description).
pub const MTP_HIDDEN: &str = "last layer's residual stream [H], before the final norm";

/// Draft depth when a request leaves it unset: plain AR. The head speeds
/// decoding up only where drafting is cheap against a verify window, which
/// depends on the machine; `--mtp-depth auto` picks [`MTP_AUTO_DEPTH`].
pub const MTP_DEFAULT_DEPTH: usize = 0;
/// The depth `--mtp-depth auto` runs for this family: the fastest depth of
/// `ds4server bench --mtp` on the idle 2-core x86 CPU this project is
/// developed on (`bench/README.md`, 2026-12-01: depth 2 at 1.35× AR greedy
/// and 1.27× at temperature 0.7, against 1.30× / 1.22× at depth 1 and
/// 1.31× / 1.18× at depth 3). A verify window of 3 rows costs 1.29 AR
/// steps there and a draft 0.03; depth 3 loses because its fourth row
/// costs more than the 0.25 drafts it adds per cycle. On the noisy 2-core
/// Xeon of 2026-12-03 (third head, draft stop) depths 1–3 tied at T 0
/// (1.21 / 1.19 / 1.24) and depth 3 lost at T 0.7 (1.13 / 1.11 / 0.99).
/// With the fourth head (2026-12-04, three runs) depths 1 and 2 still tie
/// at T 0 there (medians 1.23 / 1.22).
pub const MTP_AUTO_DEPTH: usize = 2;
/// The depth `--mtp-depth auto` runs for a sampled request (temperature
/// above 0). A sampled cycle also samples the head's rows and every
/// verify row (a full-vocabulary softmax each), so a deeper chain costs
/// more than at temperature 0 while its later drafts are accepted less.
/// Depth 1 was fastest or tied at T 0.7 on every host measured
/// (`bench/README.md`): the 2026-12-04 Xeon 1.25 / 1.22 / 1.23 at depth 1
/// against 1.18 / 1.12 / 1.11 at depth 2 (fourth head, three runs), the
/// 2026-12-02 Xeon 1.15 against 1.08, the EPYC 1.18 against 1.19.
pub const MTP_AUTO_DEPTH_SAMPLED: usize = 1;
/// `--mtp-depth auto` under the CPU's fast kernel set (int8 activations),
/// greedy and sampled; for the shipped head the greedy depth is measured
/// at load instead (`LoadedModel::measure_greedy_mtp_depth`: the pieces
/// of 2026-12-06's Xeon give 1, that day's EPYC's 2–3) and this is its
/// fallback. There a verify row costs far less than under the
/// reference set (a window of 2 rows 1.13 AR steps, of 4 rows 1.59, against
/// 1.27 / 2.06; `bench/README.md`, 2026-12-05), so the head is faster than
/// AR at both temperatures and a request that asks for no depth drafts
/// ([`crate::families::LoadedModel::mtp_default_depth`]). Chosen on the
/// first half of `bench/mtp_prompts.txt`, measured on the second.
pub const MTP_AUTO_DEPTH_FAST: usize = 1;
/// See [`MTP_AUTO_DEPTH_FAST`].
pub const MTP_AUTO_DEPTH_SAMPLED_FAST: usize = 1;
/// Deepest chain: the head was trained for depths 1..=3.
pub const MTP_MAX_DEPTH: usize = 3;
/// The shipped head's draft-stop threshold on the CPU's reference set
/// ([`crate::MtpContract::min_draft_confidence`], [`draft_stop_on`]): a
/// cycle stops drafting before a greedy draft whose head row gives its top
/// token less than this probability. Picked with `bench --mtp
/// --mtp-draft-stop` on the held-out prompts (`bench/README.md`,
/// 2026-12-03), where a verify row cost about a quarter of a step: such
/// drafts are rejected more often than a verify row pays for.
pub const MTP_MIN_DRAFT_CONFIDENCE: f32 = 0.3;

/// The draft stop where `id` runs: [`MTP_MIN_DRAFT_CONFIDENCE`] on the
/// CPU's reference set only. Under the CPU's fast set a verify row costs a
/// tenth of a step or less (int8 activations, 8-row VNNI passes), so a
/// doubtful draft is worth its row: at depth 1 (`--mtp-depth auto` there)
/// drafting every cycle was 4 % faster at T 0 on the tuning prompts
/// (lines 1–8 of `bench/mtp_prompts.txt`) and 7 % on the held-out ones
/// (lines 9–16: 1.26 / 1.24× AR against 1.17 / 1.17× with the stop;
/// `bench/mtp-2026-12-06-xeon-fast-draft-stop.log`), the stop's own check
/// costing 0.1 ms a cycle besides. On a GPU a row costs next to nothing.
pub fn draft_stop_on(id: &crate::backend::BackendId) -> Option<f32> {
    let reference = crate::backend::CpuOps::id_for(crate::backend::KernelSet::Reference);
    (id.backend == reference.backend && id.kernels == reference.kernels)
        .then_some(MTP_MIN_DRAFT_CONFIDENCE)
}

/// The value of `general.architecture` in a head file.
pub const HEAD_ARCHITECTURE: &str = "llama-mtp-head";

/// The MTP head's weights.
#[derive(Debug)]
pub struct MtpHead<B: Backend> {
    enorm: RmsNorm<B>,
    hnorm: RmsNorm<B>,
    eh_proj: Linear<B>,
    block: Block<B>,
    norm: RmsNorm<B>,
    /// Token id of each row of `output`, strictly increasing.
    subset: Vec<u32>,
    output: Linear<B>,
    vocab: usize,
    hidden: usize,
    source: PathBuf,
    /// The greedy depth `--mtp-depth auto` runs with this head, measured on
    /// this machine (`LlamaModel::set_measured_greedy_depth`); `None`: the
    /// family's constants.
    pub(super) measured_greedy_depth: Option<usize>,
}

impl<B: Backend> MtpHead<B> {
    /// Read a head file for a trunk of configuration `cfg`.
    pub fn load(path: &Path, cfg: &LlamaConfig, ops: &B) -> Result<Self> {
        let mut g = GgufFile::open(path)?;
        let arch = g.string("general.architecture")?;
        if arch != HEAD_ARCHITECTURE {
            return Err(invalid(
                path,
                format!("general.architecture is {arch:?}, not {HEAD_ARCHITECTURE:?}"),
            ));
        }
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let s = g
            .tensor_meta("mtp.vocab_subset")
            .map(|(dims, _)| dims.first().copied().unwrap_or(0))
            .ok_or_else(|| invalid(path, "no mtp.vocab_subset tensor".into()))?;
        if s == 0 || s > cfg.vocab_size {
            return Err(invalid(
                path,
                format!(
                    "a vocabulary subset of {s} tokens for a vocabulary of {}",
                    cfg.vocab_size
                ),
            ));
        }
        let mut root = Binder::new(&mut g, ops);
        let mut w = root.pp("mtp");
        let raw = w.host("vocab_subset", &[s])?;
        let subset = subset_ids(&raw, cfg.vocab_size).map_err(|m| invalid(path, m))?;
        let head = Self {
            enorm: RmsNorm::load(&mut w, "enorm.weight", h, eps)?,
            hnorm: RmsNorm::load(&mut w, "hnorm.weight", h, eps)?,
            eh_proj: w.linear("eh_proj", h, 2 * h)?,
            block: Block::load(&mut w, &GGUF_NAMES, cfg, GgufWeights::Quantized)?,
            norm: RmsNorm::load(&mut w, "output_norm.weight", h, eps)?,
            output: w.linear("output_subset", s, h)?,
            subset,
            vocab: cfg.vocab_size,
            hidden: h,
            source: path.to_path_buf(),
            measured_greedy_depth: None,
        };
        g.finish()?;
        Ok(head)
    }

    /// The file the head was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Size of the vocabulary subset the head drafts from.
    pub fn subset_len(&self) -> usize {
        self.subset.len()
    }

    /// `emb: [n, H]` (embeddings of the tokens at `p + 1`), `hidden: [n,
    /// H]`; appends `n` rows to `history`. Returns the last row's logits
    /// over the whole vocabulary (`-inf` outside the subset) and its output
    /// `x` `[1, H]`.
    pub(super) fn forward(
        &self,
        ops: &B,
        emb: &B::Buf,
        hidden: &B::Buf,
        n: usize,
        rope: &Rope<B>,
        history: &mut LlamaMtpHistory<B>,
    ) -> Result<(Vec<f32>, B::Buf)> {
        let h = self.hidden;
        let e = self.enorm.forward(ops, emb)?;
        let hn = self.hnorm.forward(ops, hidden)?;
        let x = self
            .eh_proj
            .forward(ops, &ops.concat_cols(&[(&e, h), (&hn, h)], n)?, n)?;
        let kv = &mut history.kv;
        let x = match rope
            .tables(ops, kv.len(), n)
            .and_then(|r| self.block.forward(ops, x, n, &r, kv, 0))
        {
            Ok(x) => x,
            Err(e) => {
                kv.rollback()?;
                return Err(e);
            }
        };
        kv.advance(n)?;
        let last = ops.rows(&x, h, n - 1, 1)?;
        let z = ops.download(
            &self
                .output
                .forward(ops, &self.norm.forward(ops, &last)?, 1)?,
        )?;
        let mut logits = vec![f32::NEG_INFINITY; self.vocab];
        for (&t, &v) in self.subset.iter().zip(&z) {
            logits[t as usize] = v;
        }
        Ok((logits, last))
    }
}

impl<B: Backend> MtpHead<B> {
    /// [`MtpHead::forward`] for several sessions' rows at once (their
    /// draft steps): `emb` and `hidden` hold each part's `counts[i]` rows
    /// one after another. The norms, `eh_proj`, the layer's norms,
    /// projections and SwiGLU and the subset head run once over every
    /// row; each session's attention reads its own history at its own
    /// positions. Every op is row-independent, so each part's logits and
    /// output `x` have the bits of its call alone. On an error every
    /// history is as it was.
    pub(super) fn forward_batch(
        &self,
        ops: &B,
        emb: &B::Buf,
        hidden: &B::Buf,
        counts: &[usize],
        rope: &Rope<B>,
        histories: &mut [&mut LlamaMtpHistory<B>],
    ) -> Result<Vec<(Vec<f32>, B::Buf)>> {
        let h = self.hidden;
        let n: usize = counts.iter().sum();
        let e = self.enorm.forward(ops, emb)?;
        let hn = self.hnorm.forward(ops, hidden)?;
        let x = self
            .eh_proj
            .forward(ops, &ops.concat_cols(&[(&e, h), (&hn, h)], n)?, n)?;
        let runs: Vec<(usize, usize)> = histories
            .iter()
            .zip(counts)
            .map(|(hist, &t)| (hist.kv.len(), t))
            .collect();
        let rope_rows = rope.tables_runs(ops, &runs)?;
        let mut parts: Vec<AttnPart<'_, B>> = histories
            .iter_mut()
            .zip(counts)
            .map(|(hist, &t)| AttnPart {
                t,
                cache: &mut hist.kv,
            })
            .collect();
        let y = self.block.forward_batch(ops, x, &rope_rows, &mut parts, 0);
        drop(parts);
        let x = match y {
            Ok(x) => x,
            Err(e) => {
                for hist in histories.iter_mut() {
                    hist.kv.rollback()?;
                }
                return Err(e);
            }
        };
        for (hist, &t) in histories.iter_mut().zip(counts) {
            hist.kv.advance(t)?;
        }
        // Each part's last row, then one subset head over them.
        let lasts = crate::families::draft_batch::last_rows(counts);
        let last = ops.row_runs(&x, h, &lasts)?;
        let m = lasts.len();
        let z = self
            .output
            .forward(ops, &self.norm.forward(ops, &last)?, m)?;
        let zs = ops.download_parts(&z, &vec![self.subset.len(); m])?;
        zs.into_iter()
            .enumerate()
            .map(|(i, z)| {
                let mut logits = vec![f32::NEG_INFINITY; self.vocab];
                for (&t, &v) in self.subset.iter().zip(&z) {
                    logits[t as usize] = v;
                }
                Ok((logits, ops.rows(&last, h, i, 1)?))
            })
            .collect()
    }
}

/// The subset's token ids from their f32 storage: integers, inside the
/// vocabulary, strictly increasing.
fn subset_ids(raw: &[f32], vocab: usize) -> std::result::Result<Vec<u32>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, &v) in raw.iter().enumerate() {
        if !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < vocab) {
            return Err(format!(
                "mtp.vocab_subset[{i}] = {v} is not a token id below {vocab}"
            ));
        }
        let t = v as u32;
        if out.last().is_some_and(|&p| p >= t) {
            return Err(format!(
                "mtp.vocab_subset is not strictly increasing at [{i}]"
            ));
        }
        out.push(t);
    }
    Ok(out)
}

fn invalid(path: &Path, message: String) -> EngineError {
    EngineError::Tensor {
        path: path.to_path_buf(),
        tensor: "mtp".into(),
        message,
    }
}

/// The head's own cache: one llama layer's keys and values, one row per
/// MTP history row.
#[derive(Debug, Clone)]
pub struct LlamaMtpHistory<B: Backend> {
    kv: KvCache<B>,
}

impl<B: Backend> LlamaMtpHistory<B> {
    pub fn new(ops: &B, cfg: &LlamaConfig) -> Result<Self> {
        Ok(Self {
            kv: KvCache::new(ops, 1, cfg.num_kv_heads, cfg.head_dim, cfg.context_length)?,
        })
    }
}

impl<B: Backend> MtpHistory for LlamaMtpHistory<B> {
    fn len(&self) -> usize {
        self.kv.len()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        self.kv.truncate(n)
    }

    fn byte_size(&self) -> usize {
        self.kv.byte_size()
    }

    /// `kv.0.k` / `kv.0.v`, `[kv_heads, len, head_dim]`.
    fn export(&self) -> Result<Vec<NamedTensor>> {
        self.kv.export()
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        self.kv.import(tensors)
    }
}

/// Equal when the exported tables are equal (a download: tests and tools).
impl<B: Backend> PartialEq for LlamaMtpHistory<B> {
    fn eq(&self, other: &Self) -> bool {
        match (self.export(), other.export()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{MTP_MIN_DRAFT_CONFIDENCE, draft_stop_on, subset_ids};

    #[test]
    fn subset_ids_are_checked() {
        assert_eq!(subset_ids(&[0.0, 3.0, 7.0], 8).unwrap(), vec![0, 3, 7]);
        assert!(
            subset_ids(&[0.5], 8)
                .unwrap_err()
                .contains("not a token id")
        );
        assert!(subset_ids(&[8.0], 8).unwrap_err().contains("below 8"));
        assert!(subset_ids(&[-1.0], 8).is_err());
        assert!(subset_ids(&[f32::NAN], 8).is_err());
        assert!(
            subset_ids(&[3.0, 3.0], 8)
                .unwrap_err()
                .contains("increasing")
        );
    }

    /// The draft stop holds on the CPU's reference set only: the fast set
    /// and other backends draft every cycle.
    #[test]
    fn draft_stop_only_on_the_cpu_reference_set() {
        use crate::backend::{BackendId, CpuOps, KernelSet};
        let reference = CpuOps::id_for(KernelSet::Reference);
        assert_eq!(draft_stop_on(&reference), Some(MTP_MIN_DRAFT_CONFIDENCE));
        assert_eq!(draft_stop_on(&CpuOps::id_for(KernelSet::Fast)), None);
        let gpu = BackendId {
            backend: "cuda",
            kernels: reference.kernels.clone(),
            tag: "cuda".into(),
        };
        assert_eq!(draft_stop_on(&gpu), None);
    }
}
