//! GLM-5.3-Flash (`glm5_next`) in antirez/ds4's stored types: which type
//! each tensor the GLM loader asks for gets ([`glm5_type`]), the F16
//! fallback for rows that are not whole blocks ([`fit`]), and the tensor
//! list for a dry run ([`glm5_next_manifest`], checked against the loader
//! by a test).
//!
//! ds4 ships GLM 5.3 in DeepSeek-V4-Flash's policy
//! (`shared/research/serving-anchors.md` §0, §1.2): routed experts IQ2_XXS
//! gate/up + Q2_K down (q2) or Q4_K (q4); the projections of the MLA layers
//! (`q_a`, `q_b`, `kv_a`, `kv_b`, `o`), of the KDA layers (`q`, `k`, `v`,
//! `f_a`, `f_b`, `g_a`, `g_b`, `b`, `o`), of the dense layers' MLPs and of
//! the shared expert, and the output head Q8_0; the embedding, the
//! hyper-connection `fn` projections, the DSA indexer's projections
//! (`wq_b`, `wk`, the pool gate, the head weights) and the router F16;
//! everything else (norms, conv1d, `dt_bias`, `A_log`, hyper-connection
//! scale/base, the router bias, the pool `ape`) F32.

use super::{Ds4Recipe, Read, StoredFamily, StoredLedger, dry_ledger};
use crate::families::glm5_next::Glm5NextConfig;
use crate::families::glm5_next::config::{IndexerKind, LayerKind, MlpKind};
use crate::quant::WeightType;

/// The projections stored Q8_0, by the last part of their name before
/// `.weight`: MLA, KDA (its forget gate's `f_a` / `f_b` included), the
/// dense layers' and the shared expert's SwiGLU.
const Q8_PROJECTIONS: &[&str] = &[
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
    "o_proj",
    "q_proj",
    "k_proj",
    "v_proj",
    "f_a_proj",
    "f_b_proj",
    "g_a_proj",
    "g_b_proj",
    "b_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The stored type of GLM-5 tensor `name` under `recipe`: the names the
/// GLM loader binds (`model.layers.L.self_attn.q_a_proj.weight`,
/// `model.layers.L.mlp.experts.gate_up_proj`, `lm_head.weight`, …), with
/// or without the `model.` / `model.language_model.` prefix.
pub fn glm5_type(recipe: Ds4Recipe, name: &str) -> WeightType {
    let [gate_up, down] = recipe.experts();
    let name = name
        .strip_prefix("model.language_model.")
        .or_else(|| name.strip_prefix("model."))
        .unwrap_or(name);
    let stem = name.strip_suffix(".weight");
    let last = stem.unwrap_or(name).rsplit('.').next().unwrap_or(name);
    let routed = name.contains(".experts.") && !name.contains("shared_experts.");
    if name.ends_with("experts.gate_up_proj") {
        gate_up
    } else if name.ends_with("experts.down_proj") {
        down
    } else if routed {
        // Per-expert names (`experts.{e}.{gate,up,down}_proj.weight`).
        if last == "down_proj" { down } else { gate_up }
    } else if name.contains(".indexer.") {
        // wq_b, wk, weights_proj and the pool gate (a bare parameter used
        // as a linear map); the key LayerNorm and the pool ape stay F32.
        let projection =
            (stem.is_some() && !last.ends_with("norm")) || last == "index_kpool_compress_gate";
        if projection {
            WeightType::F16
        } else {
            WeightType::F32
        }
    } else if name.ends_with("mlp.gate.weight") || name == "embed_tokens.weight" {
        // The router and the embedding.
        WeightType::F16
    } else if name == "lm_head.weight" || (stem.is_some() && Q8_PROJECTIONS.contains(&last)) {
        WeightType::Q8_0
    } else if last.ends_with("_fn") || name.ends_with("_hc.fn") {
        // Hyper-connection projections (upstream `hc_attn_fn` or internal
        // `attn_hc.fn`).
        WeightType::F16
    } else {
        // Norms, conv1d, dt_bias, A_log, hyper-connection scale and base,
        // the router bias.
        WeightType::F32
    }
}

/// `ty`, or F16 when the rows of `dims` (its last dimension) are not whole
/// blocks of `ty` (a tiny or custom shape: the full one is all whole
/// blocks). DeepSeek's source refuses such a tensor instead
/// ([`StoredFamily::DeepseekV4`]).
pub fn fit(ty: WeightType, dims: &[usize]) -> WeightType {
    let cols = *dims.last().unwrap_or(&1);
    if ty.block_len() > 1 && !cols.is_multiple_of(ty.block_len()) {
        WeightType::F16
    } else {
        ty
    }
}

/// Every tensor GLM-5's loader reads from a [`super::StoredSource`] (the
/// text-only names, no NextN head), with its shape and how it is read —
/// for a dry run that counts bytes without making any. A test binds the
/// tiny shape and checks this list against what the loader asked for.
pub fn glm5_next_manifest(cfg: &Glm5NextConfig) -> Vec<(String, Vec<usize>, Read)> {
    let (h, v, n) = (cfg.hidden_size, cfg.vocab_size, cfg.hc_mult);
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<usize>, how: Read| out.push((name, dims, how));
    add("model.embed_tokens.weight".into(), vec![v, h], Read::Stored);
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        match cfg.layer_kinds[l] {
            LayerKind::Kda => {
                let (heads, d, k) = (
                    cfg.linear_num_heads,
                    cfg.linear_head_dim,
                    cfg.linear_conv_kernel,
                );
                let c = heads * d;
                for m in ["q_proj", "k_proj", "v_proj"] {
                    add(format!("{a}.{m}.weight"), vec![c, h], Read::Stored);
                }
                add(format!("{a}.conv1d.weight"), vec![3 * c, 1, k], Read::F32);
                let g = format!("{a}.forget_gate");
                add(format!("{g}.A_log"), vec![heads], Read::F32);
                add(format!("{g}.f_a_proj.weight"), vec![d, h], Read::Stored);
                add(format!("{g}.f_b_proj.weight"), vec![c, d], Read::Stored);
                add(format!("{g}.dt_bias"), vec![c], Read::F32);
                add(format!("{a}.b_proj.weight"), vec![heads, h], Read::Stored);
                add(format!("{a}.g_a_proj.weight"), vec![d, h], Read::Stored);
                add(format!("{a}.g_b_proj.weight"), vec![c, d], Read::Stored);
                add(format!("{a}.o_norm.weight"), vec![d], Read::F32);
                add(format!("{a}.o_proj.weight"), vec![h, c], Read::Stored);
            }
            LayerKind::Mla => {
                let (heads, ql, lat) = (cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank);
                let (nope, vd) = (cfg.qk_nope_head_dim, cfg.v_head_dim);
                // Read as f32: split per head and absorbed at load.
                add(
                    format!("{a}.kv_b_proj.weight"),
                    vec![heads * (nope + vd), lat],
                    Read::F32,
                );
                add(format!("{a}.q_a_proj.weight"), vec![ql, h], Read::Stored);
                add(format!("{a}.q_a_layernorm.weight"), vec![ql], Read::F32);
                add(
                    format!("{a}.q_b_proj.weight"),
                    vec![heads * nope, ql],
                    Read::Stored,
                );
                add(
                    format!("{a}.kv_a_proj_with_mqa.weight"),
                    vec![lat, h],
                    Read::Stored,
                );
                add(format!("{a}.kv_a_layernorm.weight"), vec![lat], Read::F32);
                add(
                    format!("{a}.o_proj.weight"),
                    vec![h, heads * vd],
                    Read::Stored,
                );
                if cfg.indexer_kinds[l] == IndexerKind::Full {
                    let x = format!("{a}.indexer");
                    let (hi, di) = (cfg.index_n_heads, cfg.index_head_dim);
                    add(
                        format!("{x}.index_kpool_compress_gate"),
                        vec![di, h],
                        Read::Stored,
                    );
                    add(format!("{x}.wq_b.weight"), vec![hi * di, ql], Read::Stored);
                    add(format!("{x}.wk.weight"), vec![di, h], Read::Stored);
                    add(format!("{x}.k_norm.weight"), vec![di], Read::F32);
                    add(format!("{x}.k_norm.bias"), vec![di], Read::F32);
                    add(
                        format!("{x}.weights_proj.weight"),
                        vec![hi, h],
                        Read::Stored,
                    );
                    add(
                        format!("{x}.index_kpool_compress_ape"),
                        vec![cfg.index_pool, di],
                        Read::F32,
                    );
                }
            }
        }
        let f = format!("{p}.mlp");
        let swiglu = |add: &mut dyn FnMut(String, Vec<usize>, Read), s: &str, i: usize| {
            add(format!("{s}.gate_proj.weight"), vec![i, h], Read::Stored);
            add(format!("{s}.up_proj.weight"), vec![i, h], Read::Stored);
            add(format!("{s}.down_proj.weight"), vec![h, i], Read::Stored);
        };
        match cfg.mlp_kinds[l] {
            MlpKind::Dense => swiglu(&mut add, &f, cfg.intermediate_size),
            MlpKind::Sparse => {
                let (e, i) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
                add(format!("{f}.gate.weight"), vec![e, h], Read::Stored);
                add(
                    format!("{f}.gate.e_score_correction_bias"),
                    vec![e],
                    Read::F32,
                );
                add(
                    format!("{f}.experts.gate_up_proj"),
                    vec![e, 2 * i, h],
                    Read::Stored,
                );
                add(
                    format!("{f}.experts.down_proj"),
                    vec![e, h, i],
                    Read::Stored,
                );
                swiglu(
                    &mut add,
                    &format!("{f}.shared_experts"),
                    i * cfg.n_shared_experts,
                );
            }
        }
        add(format!("{p}.input_layernorm.weight"), vec![h], Read::F32);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Read::F32,
        );
        let m = (2 + n) * n;
        for which in ["attn", "ffn"] {
            add(format!("{p}.hc_{which}_fn"), vec![m, n * h], Read::Stored);
            add(format!("{p}.hc_{which}_base"), vec![m], Read::F32);
            add(format!("{p}.hc_{which}_scale"), vec![3], Read::F32);
        }
    }
    add("model.norm.weight".into(), vec![h], Read::F32);
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), vec![v, h], Read::Stored);
    }
    out
}

/// The ledger a GLM-5 [`super::StoredSource`] would fill for `cfg` under
/// `recipe`, without making any weight.
pub fn glm5_next_dry_ledger(cfg: &Glm5NextConfig, recipe: Ds4Recipe) -> StoredLedger {
    dry_ledger(glm5_next_manifest(cfg), StoredFamily::Glm5Next, recipe)
}

#[cfg(test)]
mod tests {
    use super::super::type_totals;
    use super::*;
    use crate::families::{Device, LoadedModel};

    fn config(shape: &str) -> Glm5NextConfig {
        let j = crate::load::synthetic::shape_config("glm5_next", shape).unwrap();
        Glm5NextConfig::from_hf(std::path::Path::new(shape), &j).unwrap()
    }

    fn load(json: &serde_json::Value, recipe: Ds4Recipe) -> StoredLedger {
        LoadedModel::synthetic_stored("glm5_next", json, 1, recipe, Device::Cpu)
            .unwrap()
            .1
    }

    /// The type the recipe intends for a tensor of the tiny shape, from its
    /// role (written out here, apart from [`glm5_type`]).
    fn intended(recipe: Ds4Recipe, name: &str) -> (&'static str, WeightType) {
        let [gu, dn] = recipe.experts();
        let ends = |s: &str| name.ends_with(s);
        if ends("mlp.experts.gate_up_proj") {
            ("routed gate/up", gu)
        } else if ends("mlp.experts.down_proj") {
            ("routed down", dn)
        } else if name.contains(".indexer.") {
            if ends("k_norm.weight") || ends("k_norm.bias") || ends("compress_ape") {
                ("indexer norm/ape", WeightType::F32)
            } else {
                ("indexer projection", WeightType::F16)
            }
        } else if ends("mlp.gate.weight") {
            ("router", WeightType::F16)
        } else if ends("_fn") {
            ("hc fn", WeightType::F16)
        } else if name == "model.embed_tokens.weight" {
            ("embedding", WeightType::F16)
        } else if name == "lm_head.weight" {
            ("head", WeightType::Q8_0)
        } else if name.contains(".shared_experts.") {
            ("shared expert", WeightType::Q8_0)
        } else if name.contains(".mlp.") && ends("_proj.weight") {
            ("dense mlp", WeightType::Q8_0)
        } else if name.contains(".self_attn.")
            && ends("_proj.weight")
            && !name.contains("forget_gate")
        {
            ("attention/KDA projection", WeightType::Q8_0)
        } else if ends("f_a_proj.weight") || ends("f_b_proj.weight") {
            ("KDA forget gate projection", WeightType::Q8_0)
        } else if ends("_proj_with_mqa.weight") {
            ("MLA kv_a", WeightType::Q8_0)
        } else {
            ("norm/conv/decay/hc scale-base/router bias", WeightType::F32)
        }
    }

    /// (a) Every tensor the tiny GLM model's real loader asks for gets the
    /// type ds4's recipe intends for its role, under both recipes, and
    /// every role appears.
    #[test]
    fn glm5_tiny_tensors_get_the_recipes_types() {
        let j = crate::load::synthetic::shape_config("glm5_next", "tiny").unwrap();
        for recipe in [Ds4Recipe::Q2, Ds4Recipe::Q4] {
            let ledger = load(&j, recipe);
            let mut roles = std::collections::BTreeSet::new();
            for (name, e) in &ledger {
                let (role, ty) = intended(recipe, name);
                assert_eq!(e.ty, ty.name(), "{name} ({role}) under {}", recipe.name());
                roles.insert(role);
            }
            assert_eq!(roles.len(), 14, "{roles:?}");
            let t = type_totals(&ledger);
            let [gu, dn] = recipe.experts();
            assert!(t.contains_key(gu.name()) && t.contains_key(dn.name()));
            for ty in ["Q8_0", "F16", "F32"] {
                assert!(t.contains_key(ty), "{ty}");
            }
        }
        // The expert stacks' bytes: 8 experts of [2·256, 256] / [256, 256].
        let q2 = load(&j, Ds4Recipe::Q2);
        let gu = &q2["model.layers.2.mlp.experts.gate_up_proj"];
        assert_eq!(gu.bytes, 8 * 512 * 66, "IQ2_XXS: 66 bytes per 256");
        let dn = &q2["model.layers.2.mlp.experts.down_proj"];
        assert_eq!(dn.bytes, 8 * 256 * 84, "Q2_K: 84 bytes per 256");
    }

    /// The dry run's tensor list is exactly what the loader reads (names,
    /// shapes, types, stored and held bytes), at the tiny shape.
    #[test]
    fn glm5_manifest_is_what_the_loader_reads() {
        let j = crate::load::synthetic::shape_config("glm5_next", "tiny").unwrap();
        for recipe in [Ds4Recipe::Q2, Ds4Recipe::Q4] {
            let ledger = load(&j, recipe);
            let dry = glm5_next_dry_ledger(&config("tiny"), recipe);
            for (k, e) in &ledger {
                assert_eq!(dry.get(k), Some(e), "{k}");
            }
            assert_eq!(ledger.len(), dry.len());
        }
    }

    /// Rows that are not whole blocks fall back to F16: the tiny fixture's
    /// own configuration (16 wide) loads, its matrices all F16.
    #[test]
    fn glm5_rows_of_partial_blocks_fall_back_to_f16() {
        assert_eq!(fit(WeightType::Q8_0, &[8, 16]), WeightType::F16);
        assert_eq!(fit(WeightType::Q8_0, &[8, 64]), WeightType::Q8_0);
        assert_eq!(fit(WeightType::Q2_K, &[4, 8, 128]), WeightType::F16);
        assert_eq!(fit(WeightType::F32, &[3]), WeightType::F32);
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/glm5_next/tiny_a/config.json"
        ))
        .unwrap();
        let j: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ledger = load(&j, Ds4Recipe::Q2);
        assert_eq!(ledger["model.layers.2.mlp.experts.down_proj"].ty, "F16");
        assert_eq!(ledger["model.layers.0.self_attn.q_proj.weight"].ty, "F16");
        assert_eq!(ledger["model.norm.weight"].ty, "F32");
    }

    /// (c) The full shape: GLM-5.3-Flash's schedules, 313 B parameters
    /// (experts 42 × 288 × 3 × 4096 × 2048 = 304.4 B of them), and its
    /// q2 / q4 bytes (89.3 / 169.0 GiB).
    #[test]
    fn glm5_full_shape_parses_and_counts() {
        let cfg = config("full");
        assert_eq!(
            (cfg.num_layers, cfg.hidden_size, cfg.vocab_size),
            (45, 4096, 154_880)
        );
        assert_eq!((cfg.n_routed_experts, cfg.num_experts_per_tok), (288, 8));
        let mla = cfg
            .layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::Mla)
            .count();
        assert_eq!(mla, 11);
        assert_eq!(cfg.layer_kinds[3], LayerKind::Mla);
        assert_eq!(
            cfg.mlp_kinds[..4],
            [
                MlpKind::Dense,
                MlpKind::Dense,
                MlpKind::Dense,
                MlpKind::Sparse
            ]
        );
        assert!(cfg.indexer_kinds.iter().all(|k| *k == IndexerKind::Full));
        let q2 = glm5_next_dry_ledger(&cfg, Ds4Recipe::Q2);
        let params: usize = q2.values().map(|e| e.dims.iter().product::<usize>()).sum();
        assert!((313e9..314e9).contains(&(params as f64)), "{params}");
        let gib = |l: &StoredLedger| {
            l.values().map(|e| e.bytes).sum::<usize>() as f64 / (1u64 << 30) as f64
        };
        let (a, b) = (gib(&q2), gib(&glm5_next_dry_ledger(&cfg, Ds4Recipe::Q4)));
        assert!((89.0..89.5).contains(&a), "q2 {a} GiB");
        assert!((168.8..169.2).contains(&b), "q4 {b} GiB");
    }
}
