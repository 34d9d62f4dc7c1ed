//! Recipes: the stored type of each tensor group, per recipe, and the
//! groups an output tensor belongs to (by its name in the output layout).
//!
//! ds4's own mixes (`gguf-tools/deepseek4-quantize.c` `policy_type`, the
//! files of `antirez/deepseek-v4-gguf`): routed experts IQ2_XXS gate/up +
//! Q2_K down (`ds4-q2`) or Q4_K (`ds4-q4`); attention projections, shared
//! expert and output head Q8_0; embedding, router, hyper-connections,
//! compressor and indexer F16; vectors (norms, biases, sinks, HC base and
//! scale) F32. The same mixes apply to Qwen's and GLM's groups; for the
//! dense llama family the recipes follow llama.cpp's names (`q8_0`:
//! every matrix Q8_0; `q4_k`: Q4_K with the output head Q6_K).

use std::fmt;

use anyhow::{Result, bail};
use ds4_engine::quant::WeightType;

use super::quantize_layout::Layout;

/// A tensor group a recipe types and `--type GROUP=TYPE` overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Embedding,
    Output,
    Attention,
    /// Dense feed-forward gate/up (llama), and dense FFN layers elsewhere.
    Ffn,
    FfnDown,
    SharedExpert,
    /// Routed experts' gate and up projections.
    ExpertGateUp,
    ExpertDown,
    Router,
    HyperConnection,
    Compressor,
    Indexer,
    /// Matrices no other group names.
    Other,
    /// Vectors and other 1-D tensors: norms, biases, sinks. Always F32.
    Vector,
}

impl Group {
    pub const ALL: [Group; 14] = [
        Group::Embedding,
        Group::Output,
        Group::Attention,
        Group::Ffn,
        Group::FfnDown,
        Group::SharedExpert,
        Group::ExpertGateUp,
        Group::ExpertDown,
        Group::Router,
        Group::HyperConnection,
        Group::Compressor,
        Group::Indexer,
        Group::Other,
        Group::Vector,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Embedding => "embedding",
            Group::Output => "output",
            Group::Attention => "attention",
            Group::Ffn => "ffn",
            Group::FfnDown => "ffn-down",
            Group::SharedExpert => "shared-expert",
            Group::ExpertGateUp => "expert-gate-up",
            Group::ExpertDown => "expert-down",
            Group::Router => "router",
            Group::HyperConnection => "hyper-connection",
            Group::Compressor => "compressor",
            Group::Indexer => "indexer",
            Group::Other => "other",
            Group::Vector => "vector",
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The groups a `--type` name sets (`experts` sets both expert groups).
pub fn parse_groups(name: &str) -> Result<Vec<Group>> {
    if name == "experts" {
        return Ok(vec![Group::ExpertGateUp, Group::ExpertDown]);
    }
    if let Some(g) = Group::ALL.into_iter().find(|g| g.name() == name) {
        return Ok(vec![g]);
    }
    bail!(
        "unknown tensor group `{name}` (groups: experts, {})",
        Group::ALL.map(Group::name).join(", ")
    )
}

/// A type name as GGML spells it (case-insensitive).
pub fn parse_type(name: &str) -> Result<WeightType> {
    WeightType::ALL
        .into_iter()
        .filter(|t| t.ggml_id().is_some())
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let known: Vec<&str> = WeightType::ALL
                .into_iter()
                .filter(|t| t.ggml_id().is_some())
                .map(|t| t.name())
                .collect();
            anyhow::anyhow!("unknown type `{name}` (GGML types: {})", known.join(", "))
        })
}

/// The recipes, with what each is for.
pub const RECIPES: &[(&str, &str)] = &[
    (
        "ds4-q2",
        "ds4's q2: experts IQ2_XXS gate/up + Q2_K down; attention, shared expert, output Q8_0; embedding, router, HC, compressor, indexer F16",
    ),
    ("ds4-q4", "ds4's q4: experts Q4_K; the rest as ds4-q2"),
    (
        "q8_0",
        "every matrix Q8_0 (DeepSeek/Qwen/GLM: ds4's F16 groups stay F16)",
    ),
    (
        "q4_k",
        "matrices Q4_K, output head Q6_K (llama.cpp's habit)",
    ),
    ("f16", "every matrix F16"),
    ("bf16", "every matrix BF16"),
    ("f32", "every tensor F32 (a reference, not a quantization)"),
];

/// The type `recipe` gives `group` in `layout`.
pub fn recipe_type(recipe: &str, group: Group, layout: Layout) -> Result<WeightType> {
    use WeightType as T;
    if group == Group::Vector {
        return Ok(T::F32);
    }
    // ds4's F16 groups (DeepSeek / Qwen / GLM layouts).
    let ds4_f16 = layout != Layout::LlamaCpp
        && matches!(
            group,
            Group::Embedding
                | Group::Router
                | Group::HyperConnection
                | Group::Compressor
                | Group::Indexer
        );
    Ok(match recipe {
        "ds4-q2" | "ds4-q4" => match group {
            _ if ds4_f16 => T::F16,
            Group::ExpertGateUp if recipe == "ds4-q2" => T::IQ2_XXS,
            Group::ExpertDown if recipe == "ds4-q2" => T::Q2_K,
            Group::ExpertGateUp | Group::ExpertDown => T::Q4_K,
            // llama has no ds4 groups: its embedding takes ds4's F16 too.
            Group::Embedding => T::F16,
            _ => T::Q8_0,
        },
        "q8_0" => {
            if ds4_f16 {
                T::F16
            } else {
                T::Q8_0
            }
        }
        "q4_k" => match group {
            _ if ds4_f16 => T::F16,
            Group::Output => T::Q6_K,
            _ => T::Q4_K,
        },
        "f16" => T::F16,
        "bf16" => T::BF16,
        "f32" => T::F32,
        other => bail!(
            "unknown recipe `{other}` (recipes: {})",
            RECIPES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// The group of output tensor `name` (`dims` row-major) in `layout`.
pub fn group_of(name: &str, dims: &[usize], layout: Layout) -> Group {
    if dims.len() < 2 || dims.iter().rev().skip(1).product::<usize>() == 1 {
        return Group::Vector;
    }
    match layout {
        Layout::LlamaCpp | Layout::Ds4 => gguf_group(name),
        Layout::HfNames => hf_group(name),
    }
}

/// llama.cpp / ds4 names.
fn gguf_group(name: &str) -> Group {
    let leaf = name.rsplit_once("blk.").map_or(name, |(_, r)| r);
    let has = |s: &str| leaf.contains(s);
    if name == "token_embd.weight" {
        Group::Embedding
    } else if name == "output.weight" {
        Group::Output
    } else if has("_exps") {
        if has("ffn_down_exps") {
            Group::ExpertDown
        } else {
            Group::ExpertGateUp
        }
    } else if has("_shexp") {
        Group::SharedExpert
    } else if has("ffn_gate_inp") {
        Group::Router
    } else if has("hc_") {
        Group::HyperConnection
    } else if has("indexer") {
        Group::Indexer
    } else if has("compressor") {
        Group::Compressor
    } else if has("attn_") || has("e_proj") || has("h_proj") {
        Group::Attention
    } else if has("ffn_down") {
        Group::FfnDown
    } else if has("ffn_gate") || has("ffn_up") {
        Group::Ffn
    } else {
        Group::Other
    }
}

/// Hugging Face names (Qwen, GLM).
fn hf_group(name: &str) -> Group {
    let has = |s: &str| name.contains(s);
    if has("embed_tokens") || has("embedding") {
        Group::Embedding
    } else if name.starts_with("lm_head") || has(".lm_head") || has("shared_head.head") {
        Group::Output
    } else if has("shared_expert") {
        Group::SharedExpert
    } else if has(".experts.") || name.ends_with(".experts.gate_up_proj") {
        if has("down_proj") || has(".w2") {
            Group::ExpertDown
        } else {
            Group::ExpertGateUp
        }
    } else if has("mlp.gate.") || has("router") {
        Group::Router
    } else if has("hyper_connection") || has("hc_") {
        Group::HyperConnection
    } else if has("indexer") {
        Group::Indexer
    } else if has("compressor") {
        Group::Compressor
    } else if has("attn") || has("eh_proj") || has("e_proj") || has("h_proj") {
        Group::Attention
    } else if has("down_proj") {
        Group::FfnDown
    } else if has("gate_proj") || has("up_proj") {
        Group::Ffn
    } else {
        Group::Other
    }
}

/// Where a type's block does not divide a row, llama.cpp's
/// `tensor_type_fallback` (`llama-quant.cpp`): a 256-value type falls back
/// to a 32-value one (Q2_K, Q3_K → Q4_0; Q4_K → Q5_0; Q5_K → Q5_1;
/// Q6_K → Q8_0; IQ2_XXS → IQ4_NL), and to F16 when that does not divide
/// the row either.
pub fn fallback(ty: WeightType, row_len: usize) -> WeightType {
    if row_len.is_multiple_of(ty.block_len()) {
        return ty;
    }
    let smaller = match ty {
        WeightType::Q2_K | WeightType::Q3_K => WeightType::Q4_0,
        WeightType::Q4_K => WeightType::Q5_0,
        WeightType::Q5_K => WeightType::Q5_1,
        WeightType::IQ2_XXS => WeightType::IQ4_NL,
        _ => WeightType::Q8_0,
    };
    if row_len.is_multiple_of(smaller.block_len()) {
        smaller
    } else {
        WeightType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ds4_names_fall_in_ds4s_groups() {
        let g = |n: &str| group_of(n, &[8, 256], Layout::Ds4);
        assert_eq!(g("token_embd.weight"), Group::Embedding);
        assert_eq!(g("output.weight"), Group::Output);
        assert_eq!(g("blk.3.ffn_gate_exps.weight"), Group::ExpertGateUp);
        assert_eq!(g("blk.3.ffn_up_exps.weight"), Group::ExpertGateUp);
        assert_eq!(g("blk.3.ffn_down_exps.weight"), Group::ExpertDown);
        assert_eq!(g("blk.3.ffn_down_shexp.weight"), Group::SharedExpert);
        assert_eq!(g("blk.3.ffn_gate_inp.weight"), Group::Router);
        assert_eq!(g("blk.3.hc_attn_fn.weight"), Group::HyperConnection);
        assert_eq!(g("output_hc_fn.weight"), Group::HyperConnection);
        assert_eq!(g("blk.3.indexer.attn_q_b.weight"), Group::Indexer);
        assert_eq!(g("blk.3.indexer_compressor_kv.weight"), Group::Indexer);
        assert_eq!(g("blk.3.attn_compressor_kv.weight"), Group::Compressor);
        assert_eq!(g("blk.3.attn_output_a.weight"), Group::Attention);
        assert_eq!(g("mtp.0.e_proj.weight"), Group::Attention);
        assert_eq!(
            group_of("blk.3.attn_norm.weight", &[256], Layout::Ds4),
            Group::Vector
        );
    }

    #[test]
    fn ds4_q2_is_ds4s_mix() {
        let t = |g| recipe_type("ds4-q2", g, Layout::Ds4).unwrap();
        assert_eq!(t(Group::ExpertGateUp), WeightType::IQ2_XXS);
        assert_eq!(t(Group::ExpertDown), WeightType::Q2_K);
        assert_eq!(t(Group::Attention), WeightType::Q8_0);
        assert_eq!(t(Group::SharedExpert), WeightType::Q8_0);
        assert_eq!(t(Group::Output), WeightType::Q8_0);
        for g in [
            Group::Embedding,
            Group::Router,
            Group::HyperConnection,
            Group::Compressor,
            Group::Indexer,
        ] {
            assert_eq!(t(g), WeightType::F16, "{g}");
        }
        assert_eq!(t(Group::Vector), WeightType::F32);
        let q4 = |g| recipe_type("ds4-q4", g, Layout::Ds4).unwrap();
        assert_eq!(q4(Group::ExpertGateUp), WeightType::Q4_K);
        assert_eq!(q4(Group::ExpertDown), WeightType::Q4_K);
    }

    #[test]
    fn unknown_names_are_readable_errors() {
        let e = recipe_type("q3", Group::Other, Layout::Ds4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown recipe `q3`") && e.contains("ds4-q2"),
            "{e}"
        );
        let e = parse_groups("expert").unwrap_err().to_string();
        assert!(
            e.contains("unknown tensor group `expert`") && e.contains("expert-down"),
            "{e}"
        );
        let e = parse_type("q9_k").unwrap_err().to_string();
        assert!(
            e.contains("unknown type `q9_k`") && e.contains("IQ2_XXS"),
            "{e}"
        );
        assert_eq!(parse_type("iq2_xxs").unwrap(), WeightType::IQ2_XXS);
        assert_eq!(parse_groups("experts").unwrap().len(), 2);
    }

    #[test]
    fn fallback_keeps_rows_whole_blocks() {
        assert_eq!(fallback(WeightType::Q4_K, 512), WeightType::Q4_K);
        // llama.cpp's table (SmolLM2's rows of 576 are not whole K blocks).
        assert_eq!(fallback(WeightType::Q4_K, 576), WeightType::Q5_0);
        assert_eq!(fallback(WeightType::Q2_K, 576), WeightType::Q4_0);
        assert_eq!(fallback(WeightType::Q3_K, 64), WeightType::Q4_0);
        assert_eq!(fallback(WeightType::Q5_K, 64), WeightType::Q5_1);
        assert_eq!(fallback(WeightType::Q6_K, 64), WeightType::Q8_0);
        assert_eq!(fallback(WeightType::IQ2_XXS, 64), WeightType::IQ4_NL);
        assert_eq!(fallback(WeightType::IQ2_XXS, 48), WeightType::F16);
        assert_eq!(fallback(WeightType::Q4_K, 48), WeightType::F16);
        assert_eq!(fallback(WeightType::Q8_0, 48), WeightType::F16);
    }
}
