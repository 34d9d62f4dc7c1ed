//! Which GGUF files `ds4server quantize` writes for a source, and which
//! source rows make each of their tensors: the tensor names and metadata
//! of the layout our loaders read for the family.
//!
//! * llama: llama.cpp's layout (`general.architecture` `llama`): a Hugging
//!   Face directory's names mapped as llama.cpp's `convert_hf_to_gguf.py`
//!   does, q/k rows permuted for its interleaved RoPE (its `permute`), the
//!   `llama.*` keys our `LlamaConfig::from_gguf` reads; a tied head is
//!   left out (the loader ties on a missing `output.weight`).
//! * deepseek_v4: antirez/ds4's layout (`docs/GGUF-LAYOUTS.md`): ds4's
//!   names (`deepseek4-quantize.c` `top_map` / `layer_map`), one `[E, out,
//!   in]` stack per routed projection made of the experts' rows in order,
//!   `tid2eid` as I32, the `deepseek4.*` keys; the MTP head (`mtp.0.*`)
//!   goes to its own file, as ds4 ships it.
//! * qwen4_exp, glm5_next: this project's GGUF in Hugging Face names with
//!   `config.json` embedded (`ds4server.hf_config`), which their loaders
//!   read (no llama.cpp or ds4 layout exists for them).
//!
//! A GGUF source keeps its layout, names, tensor order and metadata
//! (requantizing); only the types change.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use ds4_engine::families::deepseek_v4::DeepseekV4Config;
use ds4_engine::families::deepseek_v4::config::{AttnKind, MlpKind};
use ds4_engine::families::deepseek_v4::gguf::{
    EXPERT_MAP as DS4_EXPERTS, LAYER_MAP as DS4_LAYER, MTP_MAP as DS4_MTP, TOP_MAP as DS4_TOP,
};
use ds4_engine::families::llama::LlamaConfig;
use ds4_engine::layers::rope::RopeScaling;
use ds4_engine::load::ModelFormat;
use ds4_gguf::Value;

use super::quantize_source::{Kind, Source};

/// The naming scheme of an output file (what the recipes classify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    LlamaCpp,
    Ds4,
    HfNames,
}

/// Rows of one source tensor, in order, as part of an output tensor.
#[derive(Debug, Clone)]
pub struct Piece {
    pub source: String,
    pub rows: usize,
    /// llama.cpp's q/k permutation within heads of this many rows.
    pub permute: Option<usize>,
}

/// One tensor of an output file.
#[derive(Debug, Clone)]
pub struct OutTensor {
    pub name: String,
    pub dims: Vec<usize>,
    pub kind: Kind,
    pub pieces: Vec<Piece>,
}

/// One output file: `suffix` is `None` for the main file, `Some("mtp")`
/// for ds4's MTP file (written beside it).
#[derive(Debug)]
pub struct OutFile {
    pub suffix: Option<&'static str>,
    pub layout: Layout,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<OutTensor>,
}

fn rows_of(dims: &[usize]) -> usize {
    dims.iter().rev().skip(1).product()
}

fn whole(src: &Source, name: &str) -> OutTensor {
    let t = &src.tensors[name];
    OutTensor {
        name: name.to_string(),
        dims: t.dims.clone(),
        kind: t.kind,
        pieces: vec![Piece {
            source: name.to_string(),
            rows: rows_of(&t.dims),
            permute: None,
        }],
    }
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// The files for `src` of family `family`.
pub fn plan(src: &Source, family: &str) -> Result<Vec<OutFile>> {
    match (src.format, family) {
        (ModelFormat::Gguf, _) => Ok(vec![requantize(src, family)?]),
        (ModelFormat::HfDir, "llama") => Ok(vec![llama(src)?]),
        (ModelFormat::HfDir, "deepseek_v4") => deepseek(src),
        (ModelFormat::HfDir, "qwen4_exp" | "glm5_next") => Ok(vec![hf_names(src)?]),
        (_, other) => bail!("quantize does not know the GGUF layout of family `{other}`"),
    }
}

/// A GGUF source: same names, order and metadata.
fn requantize(src: &Source, family: &str) -> Result<OutFile> {
    let g = src.gguf().context("a GGUF source")?;
    let layout = if g
        .container()
        .metadata
        .contains_key(ds4_engine::load::checkpoint::HF_CONFIG_KEY)
    {
        Layout::HfNames
    } else {
        match family {
            "llama" => Layout::LlamaCpp,
            "deepseek_v4" => Layout::Ds4,
            other => bail!("a GGUF of family `{other}` without ds4server.hf_config"),
        }
    };
    Ok(OutFile {
        suffix: None,
        layout,
        metadata: src.gguf_metadata().unwrap_or_default(),
        tensors: g.container().order.iter().map(|n| whole(src, n)).collect(),
    })
}

/// Checks `name` exists with `dims`, naming the file.
fn expect(src: &Source, name: &str, dims: &[usize]) -> Result<()> {
    match src.tensors.get(name) {
        None => bail!(
            "{}: tensor `{name}` is missing (expected shape {dims:?})",
            src.path.display()
        ),
        Some(t) if t.dims != dims => bail!(
            "{}: tensor `{name}` has shape {:?}, expected {dims:?}",
            src.file_of(name).display(),
            t.dims
        ),
        Some(_) => Ok(()),
    }
}

fn unexpected(src: &Source, used: &BTreeMap<String, ()>, ignored: &[&str]) -> Result<()> {
    if let Some(n) = src
        .tensors
        .keys()
        .find(|n| !used.contains_key(*n) && !ignored.iter().any(|i| n.ends_with(i)))
    {
        bail!(
            "{}: tensor `{n}` has no place in the output layout (unknown to this family)",
            src.file_of(n).display()
        );
    }
    Ok(())
}

/// llama from a Hugging Face directory.
fn llama(src: &Source) -> Result<OutFile> {
    let config = src.hf_config().context("config.json")?;
    let cfg = LlamaConfig::from_hf(&src.path.join("config.json"), config)?;
    let (h, d, ffn, v) = (
        cfg.hidden_size,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let mut tensors = Vec::new();
    let mut used = BTreeMap::new();
    let mut add = |from: &str, to: String, dims: &[usize], permute: Option<usize>| -> Result<()> {
        expect(src, from, dims)?;
        used.insert(from.to_string(), ());
        let mut t = whole(src, from);
        t.name = to;
        t.pieces[0].permute = permute;
        tensors.push(t);
        Ok(())
    };
    add(
        "model.embed_tokens.weight",
        "token_embd.weight".into(),
        &[v, h],
        None,
    )?;
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        let b = format!("blk.{l}");
        add(
            &format!("{p}.input_layernorm.weight"),
            format!("{b}.attn_norm.weight"),
            &[h],
            None,
        )?;
        for (hf, gg, dims, perm) in [
            ("self_attn.q_proj", "attn_q", [qd, h], Some(d)),
            ("self_attn.k_proj", "attn_k", [kvd, h], Some(d)),
            ("self_attn.v_proj", "attn_v", [kvd, h], None),
            ("self_attn.o_proj", "attn_output", [h, qd], None),
        ] {
            add(
                &format!("{p}.{hf}.weight"),
                format!("{b}.{gg}.weight"),
                &dims,
                perm,
            )?;
        }
        add(
            &format!("{p}.post_attention_layernorm.weight"),
            format!("{b}.ffn_norm.weight"),
            &[h],
            None,
        )?;
        for (hf, gg, dims) in [
            ("mlp.gate_proj", "ffn_gate", [ffn, h]),
            ("mlp.up_proj", "ffn_up", [ffn, h]),
            ("mlp.down_proj", "ffn_down", [h, ffn]),
        ] {
            add(
                &format!("{p}.{hf}.weight"),
                format!("{b}.{gg}.weight"),
                &dims,
                None,
            )?;
        }
    }
    add("model.norm.weight", "output_norm.weight".into(), &[h], None)?;
    let mut ignored = vec!["rotary_emb.inv_freq"];
    if cfg.tie_word_embeddings {
        ignored.push("lm_head.weight");
    } else {
        add("lm_head.weight", "output.weight".into(), &[v, h], None)?;
    }
    unexpected(src, &used, &ignored)?;

    let k = |x: &str| format!("llama.{x}");
    let u32v = |n: usize| Value::U32(n as u32);
    let mut metadata = vec![
        ("general.architecture".into(), s("llama")),
        (k("context_length"), u32v(cfg.context_length)),
        (k("embedding_length"), u32v(h)),
        (k("block_count"), u32v(cfg.num_layers)),
        (k("feed_forward_length"), u32v(ffn)),
        (k("attention.head_count"), u32v(cfg.num_heads)),
        (k("attention.head_count_kv"), u32v(cfg.num_kv_heads)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (k("rope.freq_base"), Value::F32(cfg.rope_theta as f32)),
        (k("rope.dimension_count"), u32v(d)),
        (k("attention.key_length"), u32v(d)),
        (k("attention.value_length"), u32v(d)),
        (k("vocab_size"), u32v(v)),
    ];
    match cfg.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            metadata.push((k("rope.scaling.type"), s("linear")));
            metadata.push((k("rope.scaling.factor"), Value::F32(factor as f32)));
        }
        ref other => bail!(
            "{}: RoPE scaling {other:?} has no llama.cpp GGUF form this loader reads yet (none and linear do)",
            src.path.join("config.json").display()
        ),
    }
    if let Some(name) = config.get("_name_or_path").and_then(|v| v.as_str()) {
        metadata.push(("general.name".into(), s(name)));
    }
    if let Some(t) = super::quantize_tokenizer::metadata(&src.path, v)? {
        metadata.extend(t);
    }
    Ok(OutFile {
        suffix: None,
        layout: Layout::LlamaCpp,
        metadata,
        tensors,
    })
}

/// Qwen / GLM from a Hugging Face directory: the same names, config.json
/// embedded.
fn hf_names(src: &Source) -> Result<OutFile> {
    let config_path = src.path.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("{}: cannot read", config_path.display()))?;
    let model_type = src
        .hf_config()
        .and_then(|c| c.get("model_type"))
        .and_then(|v| v.as_str())
        .unwrap_or("unknown")
        .to_string();
    let mut metadata = vec![
        ("general.architecture".into(), s(&model_type)),
        (
            ds4_engine::load::checkpoint::HF_CONFIG_KEY.into(),
            Value::String(text),
        ),
    ];
    // The embedding's rows are the vocabulary the tokenizer is padded to
    // (config.json's `vocab_size`, top level or under `text_config`).
    let vocab = src.hf_config().and_then(|c| {
        c.get("vocab_size")
            .or_else(|| c.get("text_config")?.get("vocab_size"))
            .and_then(|v| v.as_u64())
    });
    match vocab {
        Some(v) => {
            if let Some(t) = super::quantize_tokenizer::metadata(&src.path, v as usize)? {
                metadata.extend(t);
            }
        }
        None => eprintln!(
            "note: {}: no vocab_size; the GGUF has no tokenizer",
            config_path.display()
        ),
    }
    Ok(OutFile {
        suffix: None,
        layout: Layout::HfNames,
        metadata,
        tensors: src.tensors.keys().map(|n| whole(src, n)).collect(),
    })
}

/// A DeepSeek-V4 name in transformers' saved form (`model.*`) as the
/// upstream one (`embed.weight`, `hc_head_fn`, `layers.L.*`).
fn upstream(name: &str) -> String {
    let Some(rest) = name.strip_prefix("model.") else {
        return name.to_string();
    };
    match rest {
        "embed_tokens.weight" => "embed.weight".into(),
        "hc_head.hc_fn" => "hc_head_fn".into(),
        "hc_head.hc_base" => "hc_head_base".into(),
        "hc_head.hc_scale" => "hc_head_scale".into(),
        other => other.to_string(),
    }
}

fn lookup<'a>(map: &[(&str, &'a str)], k: &str) -> Option<&'a str> {
    map.iter().find(|(a, _)| *a == k).map(|(_, b)| *b)
}

/// The upstream tensors of one DeepSeek-V4 block (a trunk layer or the
/// MTP block), with their shapes from the configuration, in ds4's order.
fn ds4_block(
    cfg: &DeepseekV4Config,
    attn: AttnKind,
    mlp: MlpKind,
) -> Vec<(&'static str, Vec<usize>)> {
    let (dm, n) = (cfg.hidden_size, cfg.hc_mult);
    let mix = (2 + n) * n;
    let (hd, h) = (cfg.head_dim, cfg.num_heads);
    let g = cfg.o_groups;
    let mut v: Vec<(&'static str, Vec<usize>)> = vec![
        ("hc_attn_fn", vec![mix, n * dm]),
        ("hc_attn_base", vec![mix]),
        ("hc_attn_scale", vec![3]),
        ("hc_ffn_fn", vec![mix, n * dm]),
        ("hc_ffn_base", vec![mix]),
        ("hc_ffn_scale", vec![3]),
        ("attn_norm.weight", vec![dm]),
        ("attn.attn_sink", vec![h]),
        ("attn.wq_a.weight", vec![cfg.q_lora_rank, dm]),
        ("attn.q_norm.weight", vec![cfg.q_lora_rank]),
        ("attn.wq_b.weight", vec![h * hd, cfg.q_lora_rank]),
        ("attn.wkv.weight", vec![hd, dm]),
        ("attn.norm.weight", vec![hd]),
        ("attn.wo_a.weight", vec![g * cfg.o_lora_rank, h * hd / g]),
        ("attn.wo_b.weight", vec![dm, g * cfg.o_lora_rank]),
    ];
    let ratio = match attn {
        AttnKind::Sliding => 0,
        AttnKind::Csa => cfg.csa_rate,
        AttnKind::Hca => cfg.hca_rate,
    };
    if ratio != 0 {
        let c = if attn == AttnKind::Csa { 2 } else { 1 };
        v.extend([
            ("attn.compressor.ape", vec![ratio, c * hd]),
            ("attn.compressor.wkv.weight", vec![c * hd, dm]),
            ("attn.compressor.wgate.weight", vec![c * hd, dm]),
            ("attn.compressor.norm.weight", vec![hd]),
        ]);
    }
    if attn == AttnKind::Csa {
        let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
        v.extend([
            ("attn.indexer.wq_b.weight", vec![ih * id, cfg.q_lora_rank]),
            ("attn.indexer.weights_proj.weight", vec![ih, dm]),
            ("attn.indexer.compressor.ape", vec![ratio, 2 * id]),
            ("attn.indexer.compressor.wkv.weight", vec![2 * id, dm]),
            ("attn.indexer.compressor.wgate.weight", vec![2 * id, dm]),
            ("attn.indexer.compressor.norm.weight", vec![id]),
        ]);
    }
    let (e, inter) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
    v.push(("ffn_norm.weight", vec![dm]));
    v.push(("ffn.gate.weight", vec![e, dm]));
    match mlp {
        MlpKind::Hash => v.push((
            "ffn.gate.tid2eid",
            vec![cfg.vocab_size, cfg.num_experts_per_tok],
        )),
        MlpKind::TopK => v.push(("ffn.gate.bias", vec![e])),
    }
    v.extend([
        ("ffn.shared_experts.w1.weight", vec![inter, dm]),
        ("ffn.shared_experts.w3.weight", vec![inter, dm]),
        ("ffn.shared_experts.w2.weight", vec![dm, inter]),
    ]);
    v
}

/// DeepSeek-V4 from a Hugging Face directory: ds4's trunk file, and its
/// MTP file when the checkpoint has `mtp.0.*`.
fn deepseek(src: &Source) -> Result<Vec<OutFile>> {
    let config = src.hf_config().context("config.json")?;
    let cfg = DeepseekV4Config::from_hf(&src.path.join("config.json"), config)?;
    let cfg_err = |m: String| anyhow::anyhow!("{}: {m}", src.path.join("config.json").display());
    if cfg.sigmoid_scoring {
        return Err(cfg_err(
            "ds4's layout has sqrt-softplus routing only; this checkpoint scores by sigmoid".into(),
        ));
    }
    if cfg.tie_word_embeddings {
        return Err(cfg_err("ds4's layout has an untied output head".into()));
    }
    if !matches!(cfg.main_rope.scaling, RopeScaling::None) {
        return Err(cfg_err(
            "ds4's layout has no RoPE scaling on the sliding layers".into(),
        ));
    }
    // Upstream name → source name.
    let by_up: BTreeMap<String, String> = src
        .tensors
        .keys()
        .map(|n| (upstream(n), n.clone()))
        .collect();
    let mut used = BTreeMap::new();
    let take = |used: &mut BTreeMap<String, ()>, up: &str, dims: &[usize]| -> Result<String> {
        // ds4 reads the KV norm as `attn.kv_norm.weight`; transformers
        // saves `attn.norm.weight`.
        let alt = up.replace("attn.norm.weight", "attn.kv_norm.weight");
        let name = by_up
            .get(up)
            .or_else(|| by_up.get(&alt))
            .cloned()
            .with_context(|| {
                format!(
                    "{}: tensor `{up}` is missing (expected shape {dims:?})",
                    src.path.display()
                )
            })?;
        expect(src, &name, dims)?;
        used.insert(name.clone(), ());
        Ok(name)
    };
    let one = |used: &mut BTreeMap<String, ()>,
               up: &str,
               gg: String,
               dims: Vec<usize>,
               ids: bool|
     -> Result<OutTensor> {
        let name = take(used, up, &dims)?;
        let mut t = whole(src, &name);
        t.name = gg;
        if ids {
            t.kind = Kind::Ids(26);
        }
        Ok(t)
    };
    let (v, dm, n) = (cfg.vocab_size, cfg.hidden_size, cfg.hc_mult);
    let mut main = Vec::new();
    let mut blocks = (0..cfg.num_layers)
        .map(|l| {
            (
                format!("layers.{l}."),
                format!("blk.{l}."),
                cfg.attn[l],
                cfg.mlp[l],
                false,
            )
        })
        .collect::<Vec<_>>();
    let with_mtp = by_up.contains_key("mtp.0.e_proj.weight");
    if with_mtp {
        blocks.push((
            "mtp.0.".into(),
            "mtp.0.".into(),
            AttnKind::Sliding,
            MlpKind::TopK,
            true,
        ));
    }
    let mut mtp = Vec::new();
    main.push(one(
        &mut used,
        "embed.weight",
        "token_embd.weight".into(),
        vec![v, dm],
        false,
    )?);
    for (up_p, gg_p, attn, mlp, is_mtp) in &blocks {
        let out = if *is_mtp { &mut mtp } else { &mut main };
        if *is_mtp {
            for (own, gg) in DS4_MTP {
                let dims = match *own {
                    "e_proj.weight" | "h_proj.weight" => vec![dm, dm],
                    "hc_head_fn" => vec![n, n * dm],
                    "hc_head_base" => vec![n],
                    "hc_head_scale" => vec![1],
                    _ => vec![dm],
                };
                out.push(one(
                    &mut used,
                    &format!("mtp.0.{own}"),
                    format!("mtp.0.{gg}"),
                    dims,
                    false,
                )?);
            }
        }
        for (suffix, dims) in ds4_block(&cfg, *attn, *mlp) {
            let gg = lookup(DS4_LAYER, suffix).expect("every block tensor is in the map");
            out.push(one(
                &mut used,
                &format!("{up_p}{suffix}"),
                format!("{gg_p}{gg}"),
                dims,
                suffix == "ffn.gate.tid2eid",
            )?);
        }
        let (e, inter) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
        for (proj, gg) in DS4_EXPERTS {
            let dims = if *proj == "w2.weight" {
                vec![dm, inter]
            } else {
                vec![inter, dm]
            };
            let mut pieces = Vec::with_capacity(e);
            for x in 0..e {
                let name = take(&mut used, &format!("{up_p}ffn.experts.{x}.{proj}"), &dims)?;
                pieces.push(Piece {
                    source: name,
                    rows: dims[0],
                    permute: None,
                });
            }
            out.push(OutTensor {
                name: format!("{gg_p}{gg}"),
                dims: vec![e, dims[0], dims[1]],
                kind: Kind::Float,
                pieces,
            });
        }
    }
    for (up, dims) in [
        ("norm.weight", vec![dm]),
        ("head.weight", vec![v, dm]),
        ("hc_head_fn", vec![n, n * dm]),
        ("hc_head_base", vec![n]),
        ("hc_head_scale", vec![1]),
    ] {
        let gg = lookup(DS4_TOP, up).expect("top-level name");
        main.push(one(&mut used, up, gg.into(), dims, false)?);
    }
    unexpected(src, &used, &[])?;

    let mut metadata = ds4_metadata(&cfg, config)?;
    if let Some(t) = super::quantize_tokenizer::metadata(&src.path, cfg.vocab_size)? {
        // The proven tokenizer names its own eos; config.json's goes.
        metadata.retain(|(k, _)| !k.starts_with("tokenizer.ggml."));
        metadata.extend(t);
    }
    let mut files = vec![OutFile {
        suffix: None,
        layout: Layout::Ds4,
        metadata,
        tensors: main,
    }];
    if with_mtp {
        files.push(OutFile {
            suffix: Some("mtp"),
            layout: Layout::Ds4,
            metadata: vec![
                ("general.architecture".into(), s("deepseek4")),
                ("general.name".into(), s("DeepSeek-V4 MTP head")),
            ],
            tensors: mtp,
        });
    }
    Ok(files)
}

/// The `deepseek4.*` keys ds4's `config_validate_model` reads.
fn ds4_metadata(
    cfg: &DeepseekV4Config,
    config: &serde_json::Value,
) -> Result<Vec<(String, Value)>> {
    let p = |k: &str| format!("deepseek4.{k}");
    let u = |n: usize| Value::U32(n as u32);
    let f = |x: f64| Value::F32(x as f32);
    let ratios: Vec<Value> = cfg
        .attn
        .iter()
        .map(|a| {
            u(match a {
                AttnKind::Sliding => 0,
                AttnKind::Csa => cfg.csa_rate,
                AttnKind::Hca => cfg.hca_rate,
            })
        })
        .collect();
    let hash = cfg.mlp.iter().take_while(|m| **m == MlpKind::Hash).count();
    if cfg.mlp[hash..].contains(&MlpKind::Hash) {
        bail!("ds4's layout has its hash-routed layers first (hash_layer_count)");
    }
    let (factor, original, beta_fast, beta_slow) = match cfg.compress_rope.scaling {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
        } => (
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
        ),
        // YaRN at factor 1 leaves every frequency as it is.
        RopeScaling::None => (1.0, cfg.context_length, 32.0, 1.0),
        ref other => bail!("ds4's layout has YaRN on the compressed layers, not {other:?}"),
    };
    let mut m = vec![
        ("general.architecture".to_string(), s("deepseek4")),
        (p("block_count"), u(cfg.num_layers)),
        (p("context_length"), Value::U64(cfg.context_length as u64)),
        (p("embedding_length"), u(cfg.hidden_size)),
        (p("vocab_size"), u(cfg.vocab_size)),
        (p("attention.head_count"), u(cfg.num_heads)),
        (p("attention.head_count_kv"), u(1)),
        (p("attention.key_length"), u(cfg.head_dim)),
        (p("attention.value_length"), u(cfg.head_dim)),
        (p("rope.dimension_count"), u(cfg.rope_dim)),
        (p("attention.q_lora_rank"), u(cfg.q_lora_rank)),
        (p("attention.output_lora_rank"), u(cfg.o_lora_rank)),
        (p("attention.output_group_count"), u(cfg.o_groups)),
        (p("expert_count"), u(cfg.n_routed_experts)),
        (p("expert_used_count"), u(cfg.num_experts_per_tok)),
        (
            p("expert_feed_forward_length"),
            u(cfg.moe_intermediate_size),
        ),
        (p("expert_shared_count"), u(1)),
        (p("hash_layer_count"), u(hash)),
        (p("expert_group_count"), u(0)),
        (p("expert_group_used_count"), u(0)),
        (p("attention.sliding_window"), u(cfg.sliding_window)),
        (p("attention.indexer.head_count"), u(cfg.index_n_heads)),
        (p("attention.indexer.key_length"), u(cfg.index_head_dim)),
        (p("attention.indexer.top_k"), u(cfg.index_topk)),
        (p("hyper_connection.count"), u(cfg.hc_mult)),
        (
            p("hyper_connection.sinkhorn_iterations"),
            u(cfg.hc_sinkhorn_iters),
        ),
        (p("hyper_connection.epsilon"), Value::F32(cfg.hc_eps)),
        (p("attention.compress_ratios"), Value::Array(ratios)),
        (
            p("swiglu_clamp_exp"),
            Value::Array(vec![Value::F32(cfg.swiglu_limit); cfg.num_layers]),
        ),
        (
            p("rope.scaling.original_context_length"),
            Value::U64(original as u64),
        ),
        (p("rope.freq_base"), f(cfg.main_rope.theta)),
        (p("rope.scaling.factor"), f(factor)),
        (p("rope.scaling.yarn_beta_fast"), f(beta_fast)),
        (p("rope.scaling.yarn_beta_slow"), f(beta_slow)),
        (
            p("attention.compress_rope_freq_base"),
            f(cfg.compress_rope.theta),
        ),
        (
            p("expert_weights_scale"),
            Value::F32(cfg.routed_scaling_factor),
        ),
        (
            p("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps),
        ),
        (p("expert_weights_norm"), Value::Bool(true)),
    ];
    if let Some(eos) = cfg.eos_token_id {
        m.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)));
    }
    if let Some(name) = config.get("_name_or_path").and_then(|v| v.as_str()) {
        m.push(("general.name".into(), s(name)));
    }
    Ok(m)
}
