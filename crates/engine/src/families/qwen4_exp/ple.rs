//! PLE: hashed n-gram per-layer embedding (linear layers in `ple_layer_ids`).
//!
//! Hash (deterministic; transformers also saves the constants as int64
//! buffers, which we recompute and do not need to read):
//!
//! ```text
//! m[i]    = 2·(splitmix64(seed + 10007·pli + 0x9E3779B97F4A7C15·(i+1)) mod half) + 1,
//!           half = max(1, ((2^63−1) // vocab) // 2),  pli = index in ple_layer_ids
//! size_h  = the (pli·heads + h + 1)-th prime ≥ ngram_vocab_size_base; offsets cumulative
//! s_0     = tok_t ;  s_k = tok_{t−k} if no EOS in tok_{t−k..t−1}, else EOS
//! mixed_n = XOR_{k<n} (s_k·m[k])  (int64)  for n = 2..N
//! id_h    = mixed_n mod size_h + off_h      heads of order 2 first, hpn per order
//! e       = concat_h table[id_h]            [E = ple_embed_dim]
//! ```
//!
//! Gate and dilated conv (`X: [T, C·H]`):
//!
//! ```text
//! key = N1g(key_proj·e; norm_key) [C, H] ; val = value_proj·e [H] ; qry = N1g(X; norm_query) [C, H]
//! g_s = ⟨key_s, qry_s⟩/√H ;  g_s ← sign(g_s)·sqrt(max(|g_s|, 1e-6))
//! gv  = concat_s( sigmoid(g_s)·val ) ;  gvn = N1g(gv; norm_conv)
//! out = gv + silu( Σ_{k<K} w[:,k]·gvn_{t−(K−1−k)·N} )     depthwise, dilation N
//! ```
//!
//! State: the last `(K−1)·N` `gvn` rows and the last `N−1` token ids.
//!
//! The n-gram table is the checkpoint's shards (`ngram_embedding.shard_{i}`,
//! concatenated on rows) or one `ngram_embedding.weight`. The real table is
//! ~95 GiB in bf16, so it is never copied: [`PleTable`] keeps the shards
//! memory-mapped in their stored dtype and gathers the `heads` rows of each
//! token, converting only those to f32.

use super::config::Qwen4ExpConfig;
use super::state::PleCache;
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::load::binder::Binder;
use crate::quant::QuantTensor;

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

pub fn splitmix64(v: u64) -> u64 {
    let mut z = v.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// Hash constants of one PLE layer.
#[derive(Debug, Clone, PartialEq)]
pub struct PleHash {
    pub multipliers: Vec<i64>,
    pub sizes: Vec<i64>,
    pub offsets: Vec<i64>,
    /// Total rows padded to `make_ngram_vocab_size_divisible_by`.
    pub padded_rows: usize,
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub eos: u32,
}

impl PleHash {
    pub fn new(cfg: &Qwen4ExpConfig, pli: usize, eos: u32) -> Self {
        let n = cfg.ngram_size;
        let heads = (n - 1) * cfg.heads_per_ngram;
        let half = (((1u64 << 63) - 1) / cfg.vocab_size.max(1) as u64 / 2).max(1);
        let base_seed = cfg.seed.wrapping_add(10007u64.wrapping_mul(pli as u64));
        let multipliers = (0..n)
            .map(|i| {
                let v = base_seed.wrapping_add(GAMMA.wrapping_mul(i as u64 + 1));
                (2 * (splitmix64(v) % half) + 1) as i64
            })
            .collect();
        // Head h of layer pli takes the (pli·heads + h + 1)-th prime after
        // base − 1; earlier layers' heads take the smaller ones.
        let mut prime = cfg.ngram_vocab_size_base.saturating_sub(1);
        let mut next = || {
            prime += 1;
            while !is_prime(prime) {
                prime += 1;
            }
            prime
        };
        for _ in 0..pli * heads {
            next();
        }
        let sizes: Vec<i64> = (0..heads).map(|_| next() as i64).collect();
        let mut offsets = Vec::with_capacity(heads);
        let mut total = 0i64;
        for &s in &sizes {
            offsets.push(total);
            total += s;
        }
        let div = cfg.ngram_vocab_divisor as i64;
        let padded_rows = ((total + div - 1) / div * div) as usize;
        Self {
            multipliers,
            sizes,
            offsets,
            padded_rows,
            ngram: n,
            heads_per_ngram: cfg.heads_per_ngram,
            eos,
        }
    }

    /// Table row ids `[T, heads]` for `tokens`, given the previous `N−1`
    /// ids (`window`, oldest first; EOS at the start of a sequence), which
    /// is advanced.
    pub fn ids(&self, tokens: &[u32], window: &mut [u32]) -> Vec<i64> {
        let ctx = self.ngram - 1;
        let mut hist: Vec<u32> = Vec::with_capacity(ctx + tokens.len());
        hist.extend_from_slice(window);
        hist.extend_from_slice(tokens);
        let heads = self.sizes.len();
        let mut out = Vec::with_capacity(tokens.len() * heads);
        let mut s = vec![0i64; self.ngram];
        for p in ctx..hist.len() {
            s[0] = hist[p] as i64;
            let mut valid = true;
            for k in 1..self.ngram {
                // Valid while no EOS sits in hist[p−k .. p−1].
                valid = valid && hist[p - k] != self.eos;
                s[k] = if valid {
                    hist[p - k] as i64
                } else {
                    self.eos as i64
                };
            }
            for n in 2..=self.ngram {
                let mut mixed = 0i64;
                for (k, sk) in s.iter().enumerate().take(n) {
                    mixed ^= sk.wrapping_mul(self.multipliers[k]);
                }
                let first = (n - 2) * self.heads_per_ngram;
                for h in first..first + self.heads_per_ngram {
                    out.push(mixed.rem_euclid(self.sizes[h]) + self.offsets[h]);
                }
            }
        }
        window.copy_from_slice(&hist[hist.len() - ctx..]);
        out
    }
}

#[derive(Debug)]
pub struct Ple<B: Backend> {
    pub hash: PleHash,
    /// `[padded_rows, E/heads]`, memory-mapped on the host (the real table
    /// is ~95 GiB): the gathered rows are uploaded per forward.
    table: PleTable,
    key_proj: Linear<B>,
    value_proj: Linear<B>,
    norm_key: ZcNorm<B>,
    norm_query: ZcNorm<B>,
    norm_conv: ZcNorm<B>,
    /// `[C·H, K]`.
    conv_w: B::Buf,
    kernel: usize,
    c: usize,
    h: usize,
}

impl<B: Backend> Ple<B> {
    /// Bound under `w`'s scope (`…ple`); the table needs a safetensors
    /// directory (it maps the shards directly).
    pub fn load(
        w: &mut Binder<'_, B>,
        config_path: &std::path::Path,
        cfg: &Qwen4ExpConfig,
        pli: usize,
    ) -> Result<Self> {
        let eos = cfg.eos_token_id.ok_or_else(|| EngineError::Config {
            path: config_path.to_path_buf(),
            field: "eos_token_id".into(),
            message: "required by PLE".into(),
        })?;
        let hash = PleHash::new(cfg, pli, eos);
        let (c, h, e) = (cfg.hc_count, cfg.hidden_size, cfg.ple_embed_dim);
        let ch = c * h;
        let heads = hash.sizes.len();
        let dh = e / heads;
        let emb = w.name("ple_embedding.");
        let table = if let Some(s) = w.synthetic() {
            // Random rows made when gathered: nothing table-sized exists.
            PleTable::synthetic(
                s.seed_of(&format!("{emb}ngram_embedding")),
                dh,
                hash.padded_rows,
            )
        } else {
            // The int64 hash buffers carry no information beyond the config.
            for b in [
                "layer_multipliers",
                "ngram_heads_vocab_sizes",
                "ngram_heads_offsets",
            ] {
                w.ignore(&format!("ple_embedding.{b}"));
            }
            let single = "ple_embedding.ngram_embedding.weight".to_string();
            let names: Vec<String> = if w.has(&single) {
                vec![single]
            } else {
                (0..)
                    .map(|i| format!("ple_embedding.ngram_embedding.shard_{i}.weight"))
                    .take_while(|n| w.has(n))
                    .collect()
            };
            let mut views = Vec::with_capacity(names.len());
            for n in &names {
                let dims = w.dims(n).unwrap_or_default();
                if dims.len() != 2 || dims[1] != dh {
                    return Err(w.invalid(n, format!("expected [rows, {dh}], found {dims:?}")));
                }
                views.push(w.view(n, &dims)?);
            }
            let total: usize = views.iter().map(|v| v.rows()).sum();
            if total != hash.padded_rows {
                return Err(w.invalid(
                    "ple_embedding.ngram_embedding.*",
                    format!(
                        "{} tensors hold {total} rows; the config implies {} (padded n-gram vocabulary)",
                        names.len(),
                        hash.padded_rows
                    ),
                ));
            }
            if views.is_empty() {
                return Err(w.invalid("ple_embedding.ngram_embedding.weight", "missing".into()));
            }
            // Shards may differ in type (a GGUF writer's choice per tensor).
            PleTable::stored(views)
        };
        let eps = cfg.rms_norm_eps;
        Ok(Self {
            hash,
            table,
            key_proj: w.linear("key_proj", ch, e)?,
            value_proj: w.linear("value_proj", h, e)?,
            norm_key: ZcNorm::load(w, "norm_key.weight", ch, h, eps)?,
            norm_query: ZcNorm::load(w, "norm_query.weight", ch, h, eps)?,
            norm_conv: ZcNorm::load(w, "norm_conv.weight", ch, h, eps)?,
            conv_w: w.vector("conv1d.weight", &[ch, 1, cfg.ple_conv_kernel])?,
            kernel: cfg.ple_conv_kernel,
            c,
            h,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<PleCache<B>> {
        Ok(PleCache {
            gvn: ops.zeros((self.kernel - 1) * self.hash.ngram * self.c * self.h)?,
            ids: vec![self.hash.eos; self.hash.ngram - 1],
        })
    }

    /// The PLE term added to the streams: `X: [T, C·H]` → `[T, C·H]`.
    /// With `capture`, pushes the cache after every row.
    pub fn forward(
        &self,
        ops: &B,
        xs: &B::Buf,
        tokens: &[u32],
        cache: &mut PleCache<B>,
        capture: Option<&mut Vec<PleCache<B>>>,
    ) -> Result<B::Buf> {
        let (ids, ids_rows) = self.ids(tokens, cache, capture.is_some());
        let [gv, gvn] = self.gated(ops, xs, &ids, tokens.len())?;
        self.conv(ops, gv, gvn, cache, capture, ids_rows)
    }

    /// One session's hashed n-gram ids of `tokens` (advancing its id
    /// window) and, when `per_row`, its window after every row (for a
    /// capture).
    pub(super) fn ids(
        &self,
        tokens: &[u32],
        cache: &mut PleCache<B>,
        per_row: bool,
    ) -> (Vec<i64>, Vec<Vec<u32>>) {
        let mut ids_rows = Vec::new();
        let ids = if per_row {
            // Per-row id windows for the capture.
            let mut all = Vec::new();
            for &tok in tokens {
                all.extend(self.hash.ids(&[tok], &mut cache.ids));
                ids_rows.push(cache.ids.clone());
            }
            all
        } else {
            self.hash.ids(tokens, &mut cache.ids)
        };
        (ids, ids_rows)
    }

    /// Per row: the gated values `gv` and their norm `gvn` of `t_len` rows
    /// `xs` with their n-gram `ids` (a batched forward runs this once over
    /// several sessions' rows).
    pub(super) fn gated(
        &self,
        ops: &B,
        xs: &B::Buf,
        ids: &[i64],
        t_len: usize,
    ) -> Result<[B::Buf; 2]> {
        let (c, h) = (self.c, self.h);
        // Token ids are host data and the table lives on the host: the
        // gathered rows are the forward's input, like the token ids.
        let emb = ops.upload(&self.table.gather(ids))?;
        let key = self
            .norm_key
            .forward(ops, &self.key_proj.forward(ops, &emb, t_len)?)?;
        let val = self.value_proj.forward(ops, &emb, t_len)?;
        let qry = self.norm_query.forward(ops, xs)?;
        let gv = ops.ple_gate(&key, &qry, &val, c, h)?;
        let gvn = self.norm_conv.forward(ops, &gv)?;
        Ok([gv, gvn])
    }

    /// One session's dilated causal conv over its window and its rows of
    /// `gvn` (advancing the window; with `capture`, pushing the cache after
    /// every row with its id window from `ids_rows`); → `gv + conv`.
    pub(super) fn conv(
        &self,
        ops: &B,
        gv: B::Buf,
        gvn: B::Buf,
        cache: &mut PleCache<B>,
        capture: Option<&mut Vec<PleCache<B>>>,
        ids_rows: Vec<Vec<u32>>,
    ) -> Result<B::Buf> {
        let ch = self.c * self.h;
        // Dilated causal conv over [history | gvn]: tap k of token t reads
        // row t + k·N of that array.
        let hist = ops.len(&cache.gvn) / ch;
        if let Some(cap) = capture {
            let mut all = cache.gvn.clone();
            ops.append(&mut all, &gvn)?;
            for (t, ids) in ids_rows.into_iter().enumerate() {
                cap.push(PleCache {
                    gvn: ops.rows(&all, ch, t + 1, hist)?,
                    ids,
                });
            }
        }
        let conv = ops.causal_conv_silu(
            &gvn,
            &mut cache.gvn,
            &self.conv_w,
            ch,
            self.kernel,
            self.hash.ngram,
        )?;
        ops.add(&gv, &conv)
    }
}

/// The n-gram embedding table, gathered row by row from memory-mapped
/// checkpoint bytes (f32, bf16 or f16 in a safetensors shard or a GGUF;
/// rows come out as f32).
#[derive(Debug, Clone)]
pub struct PleTable {
    /// The stored shards in row order (views of the maps), each with its
    /// first global row.
    shards: Vec<(usize, QuantTensor)>,
    /// A synthetic table's stream (`load::synthetic`): row `r`'s values
    /// are `uniform(seed, r·dim + i)`, and `shards` is empty.
    synthetic: Option<u64>,
    rows: usize,
    dim: usize,
}

impl PleTable {
    /// A stored table from its shards in row order (at least one, of
    /// one width).
    fn stored(views: Vec<QuantTensor>) -> Self {
        let dim = views[0].cols();
        let mut first = 0;
        let shards = views
            .into_iter()
            .map(|v| {
                let at = first;
                first += v.rows();
                (at, v)
            })
            .collect();
        Self {
            rows: first,
            dim,
            shards,
            synthetic: None,
        }
    }

    /// A synthetic `[rows, dim]` table of uniform values in [−1, 1).
    fn synthetic(seed: u64, dim: usize, rows: usize) -> Self {
        Self {
            shards: Vec::new(),
            synthetic: Some(seed),
            rows,
            dim,
        }
    }

    /// Rows `ids` (each `< rows`) as f32, concatenated: `[ids.len(), dim]`.
    pub fn gather(&self, ids: &[i64]) -> Vec<f32> {
        let mut out = vec![0f32; ids.len() * self.dim];
        for (o, &id) in out.chunks_exact_mut(self.dim.max(1)).zip(ids) {
            let id = (id.max(0) as usize).min(self.rows - 1);
            if let Some(seed) = self.synthetic {
                let first = (id * self.dim) as u64;
                for (i, v) in o.iter_mut().enumerate() {
                    *v = crate::load::synthetic::uniform(seed, first + i as u64);
                }
                continue;
            }
            let (first, t) = &self.shards[self.shards.partition_point(|s| s.0 <= id) - 1];
            t.dequantize_rows(id - first, id - first + 1, o);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::qwen4_exp::config::Qwen4ExpConfig;
    use std::path::Path;

    /// The digest's tiny-model hash vectors (vocab 512, base 1000, hpn 4).
    #[test]
    fn qwen4_ple_hash_constants() {
        let j = serde_json::json!({"model_type":"qwen4_exp_text","vocab_size":512,"hidden_size":64,
            "num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
            "moe_intermediate_size":32,"shared_expert_intermediate_size":32,"num_experts":8,
            "num_experts_per_tok":2,"indexer_n_heads":4,"indexer_kv_heads":1,"indexer_head_dim":16,
            "indexer_budget":8,"indexer_compress_ratio":4,"eos_token_id":2,"ple_layer_ids":[2],
            "ple_embed_dim":64,"ngram_size":3,"heads_per_ngram":4,"ngram_vocab_size_base":1000,
            "rope_parameters":{"rope_type":"default","rope_theta":1e7,"partial_rotary_factor":0.25,"mrope_section":[2,1,1]}});
        let cfg = Qwen4ExpConfig::from_hf(Path::new("c.json"), &j)
            .unwrap()
            .config;
        let hash = PleHash::new(&cfg, 0, 2);
        assert_eq!(
            hash.multipliers,
            vec![4295158889763781, 17440218147737327, 1270917961434445]
        );
        assert_eq!(
            hash.sizes,
            vec![1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049]
        );
        assert_eq!(
            hash.offsets,
            vec![0, 1009, 2022, 3041, 4062, 5093, 6126, 7165]
        );
        assert_eq!(hash.padded_rows, 8320);
    }

    /// EOS cuts the n-gram context; feeding tokens one by one through the
    /// window equals feeding them at once.
    #[test]
    fn qwen4_ple_ids_segment_and_stream() {
        let hash = PleHash {
            multipliers: vec![3, 5, 7],
            sizes: vec![1_000_003, 1_000_033],
            offsets: vec![0, 1_000_003],
            padded_rows: 0,
            ngram: 3,
            heads_per_ngram: 1,
            eos: 2,
        };
        let toks = [10, 11, 2, 12, 13, 14];
        let mut w = vec![2, 2];
        let all = hash.ids(&toks, &mut w);
        let mut w2 = vec![2, 2];
        let one: Vec<i64> = toks.iter().flat_map(|&t| hash.ids(&[t], &mut w2)).collect();
        assert_eq!(all, one);
        assert_eq!(w, w2);
        // Token 12 follows EOS: its bigram is (12, EOS), its trigram (12, EOS, EOS).
        let bigram = (12 * 3) ^ (2 * 5);
        let trigram = (12 * 3) ^ (2 * 5) ^ (2 * 7);
        assert_eq!(all[3 * 2], bigram);
        assert_eq!(all[3 * 2 + 1], trigram + 1_000_003);
        // Token 14: (14, 13, 12), no EOS within reach.
        assert_eq!(all[5 * 2 + 1], ((14 * 3) ^ (13 * 5) ^ (12 * 7)) + 1_000_003);
    }
}
