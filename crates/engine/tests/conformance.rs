//! The family conformance suite: one generic body, instantiated for every
//! family by [`conformance!`] (one line per family at the bottom of this
//! file). Every property is checked bit for bit (f32 bits, never a
//! tolerance):
//!
//! 1. chunking invariance — one forward, uneven chunks and single steps give
//!    the same logits row for every position (and the same state);
//! 2. warm == single-prefill cold — a second turn continuing a session gives
//!    exactly the tokens, logits and final session of a cold turn that
//!    prefills the whole prompt at once (AR, and MTP for MTP families);
//!    2b. an edited turn (the prompt diverges inside the session) equals a
//!    cold one, directly and through an export / import of the rewound
//!    session, and an attention-only session stays warm for MTP turns too
//!    (it keeps its MTP history through the rewind);
//! 3. export → import round trip — an imported state re-exports identically
//!    and continues with identical bits (state level and session level);
//! 4. (MTP families) committing every prefix `0..=rows` of a verify window
//!    equals the state of the shorter forward (export and next logits);
//! 5. (MTP families) greedy MTP == greedy AR at depths 1..=3;
//! 6. the exit matrix (AR and MTP): stop token, `max_tokens`, a callback
//!    stop, cancellation (token and callback), context full — the finish
//!    reason, the final state and exactly what the session covers, whose
//!    bits equal a cold prefill of exactly those tokens;
//! 7. cancel-then-continue == uncancelled, for a cancel during prefill (after
//!    the first chunk) and during decode.
//!
//! All calls into the engine go through the adapter section right below, so
//! a change of the decode/turn API or of the `Model` contract is absorbed
//! there. A family joins with one `conformance!(name, || load …)` line at the
//! bottom; a property that needs an MTP head passes trivially (and says so on
//! stderr) for a family without one. Tests of the default model have
//! `default_model` in their name (nextest serialises them, see
//! `.config/nextest.toml`). Run: `cargo nextest run --release -p ds4-engine
//! -E 'test(/conformance/)'`.

#[macro_use]
#[path = "common/conformance.rs"]
mod checks;

use checks::*;

conformance!(llama_default_model, || {
    let path = ds4_models::default_model_path().expect("default model available");
    ds4_engine::families::llama::load_llama(&path).unwrap()
});
// The default model with its trained MTP head (tools/mtp_head).
conformance!(
    llama_mtp_default_model,
    || {
        let path = ds4_models::default_model_path().expect("default model available");
        let head = ds4_models::mtp_head_for(&path)
            .expect("the default model has a head")
            .expect("the head file checks out");
        let mut m = ds4_engine::families::llama::load_llama(&path).unwrap();
        m.attach_mtp_head(&head).unwrap();
        m
    },
    {}
);
// The default model with its MTP head on an f16 KV cache (`--kv-cache
// f16`): chunkings, single steps, verify windows, warm == cold, export /
// import, all bit for bit under the f16 cache as under the f32 one.
conformance!(
    llama_mtp_default_model_kv_f16,
    || {
        let path = ds4_models::default_model_path().expect("default model available");
        let head = ds4_models::mtp_head_for(&path)
            .expect("the default model has a head")
            .expect("the head file checks out");
        let mut m = ds4_engine::families::llama::load_llama(&path).unwrap();
        m.attach_mtp_head(&head).unwrap();
        m.set_kv_type(ds4_engine::state::kv_cache::KvType::F16)
            .unwrap();
        m
    },
    {}
);
conformance!(qwen4_exp_tiny_a, || {
    ds4_engine::families::qwen4_exp::Qwen4ExpModel::from_hf_dir(
        &super::fixtures().join("qwen4_exp/tiny_a"),
    )
    .unwrap()
});
// A Hugging Face llama with f32 weights: since every weight format runs the
// row-independent matmul, it keeps the same bit-for-bit contract.
conformance!(llama_tiny_f32_untied, || {
    ds4_engine::families::llama::load_llama(&super::fixtures().join("llama/tiny/f32_untied"))
        .unwrap()
});
// DeepSeek-V4: sliding, CSA (indexer) and HCA layers, hash and scored MoE,
// the MTP head; its caches keep bounded raw rows, so commits and
// continuations exercise the step-back slack.
conformance!(deepseek_v4_tiny_b, || {
    ds4_engine::families::deepseek_v4::DeepseekV4Model::from_hf_dir(
        &super::fixtures().join("deepseek_v4/tiny_b"),
    )
    .unwrap()
});
// GLM-5: KDA (recurrent) and MLA with a pooled, pruning indexer and a
// NextN head; tiny_a has a shared-indexer layer, tiny_b bf16 weights and
// the softplus KDA gate.
conformance!(glm5_next_tiny_a, || {
    ds4_engine::families::glm5_next::Glm5NextModel::from_hf_dir(
        &super::fixtures().join("glm5_next/tiny_a"),
    )
    .unwrap()
});
conformance!(glm5_next_tiny_b, || {
    ds4_engine::families::glm5_next::Glm5NextModel::from_hf_dir(
        &super::fixtures().join("glm5_next/tiny_b"),
    )
    .unwrap()
});
// Stored weight types: the same contract holds whatever the weights are
// stored as. antirez/ds4's DeepSeek-V4 GGUF layout (IQ2_XXS / Q2_K / Q4_K /
// MXFP4 experts, Q8_0 attention, F16 router and HC) with its separate MTP
// file; DeepSeek's release form (FP8 with E8M0 block scales, FP4 experts);
// GLM-5 FP8 with f32 `weight_scale_inv`; Qwen in a GGUF in Hugging Face
// names with every 32-block type. Their MTP heads are tiny_a's random ones,
// which never get a draft accepted, so the suite's MTP checks (which demand
// both outcomes) are left to the full fixtures above; greedy MTP == AR on
// stored weights is in `stored_safetensors.rs` and `deepseek_v4_gguf.rs`.
conformance_state!(deepseek_v4_ds4_gguf, || {
    let dir = super::fixtures().join("deepseek_v4/ds4_gguf");
    ds4_engine::families::deepseek_v4::DeepseekV4Model::load_gguf(
        &dir.join("model.gguf"),
        Some(&dir.join("mtp.gguf")),
        ds4_engine::backend::CpuOps,
    )
    .unwrap()
});
conformance_state!(deepseek_v4_fp8_fp4, || {
    ds4_engine::families::deepseek_v4::DeepseekV4Model::from_hf_dir(
        &super::fixtures().join("stored/deepseek_v4_fp8_fp4"),
    )
    .unwrap()
});
conformance_state!(glm5_next_fp8, || {
    ds4_engine::families::glm5_next::Glm5NextModel::from_hf_dir(
        &super::fixtures().join("stored/glm5_next_fp8"),
    )
    .unwrap()
});
conformance_state!(qwen4_exp_hf_gguf, || {
    ds4_engine::families::qwen4_exp::Qwen4ExpModel::from_hf_dir(
        &super::fixtures().join("hf_gguf/qwen4_exp_tiny_a.gguf"),
    )
    .unwrap()
});
