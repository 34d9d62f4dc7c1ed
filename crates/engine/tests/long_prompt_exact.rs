//! Long prompts on the default model, bit for bit: one 700-token forward
//! against uneven prefill chunks, then single decode steps and 2..4-row
//! verify windows deep into the cache, then a warm continuation from a
//! snapshot. At these depths the attention crosses dozens of key tiles in
//! prefill and a step or window takes the split plan (keys and dimensions
//! across threads, `backend/cpu/attention/split.rs`) while the one-shot
//! forward takes tiles, so this is the end-to-end form of the kernel tests'
//! "every plan and chunking gives the per-query order". Both KV cache
//! types; `DS4_CPU_KERNELS=avx2` runs it under the other kernel set.

use ds4_engine::families::llama::{LlamaModel, load_llama};
use ds4_engine::state::kv_cache::KvType;
use ds4_engine::{LogitsRows, Model, ModelState};

const LEN: usize = 700;

fn model(kv: KvType) -> LlamaModel {
    let path = ds4_models::default_model_path().expect("default model available");
    let mut m = load_llama(&path).expect("default model loads");
    m.set_kv_type(kv).unwrap();
    m
}

fn tokens(vocab: usize) -> Vec<u32> {
    (0..LEN)
        .map(|i| ((i * 7919 + 104_729) % (vocab - 2) + 1) as u32)
        .collect()
}

fn rows(v: &[f32], vocab: usize) -> Vec<Vec<u32>> {
    v.chunks(vocab)
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn default_model_long_prompt_chunks_steps_windows_and_warm_equal_one_forward() {
    for kv in [KvType::F32, KvType::F16] {
        let m = model(kv);
        // SmolLM2's 49,152 ids; the logits rows say the same.
        let toks = tokens(49_152);
        let mut one = m.new_state();
        let all = m.forward(&toks, &mut one, LogitsRows::All).unwrap().logits;
        let vocab = all.len() / LEN;
        assert_eq!(vocab, 49_152);
        let want = rows(&all, vocab);

        // Uneven prefill chunks up to 550, then single steps to 600, then
        // windows of 2, 3, 4 rows to the end (steps and windows past 512
        // keys take the split plan on two threads).
        let mut st = m.new_state();
        let mut got = Vec::new();
        let mut at = 0;
        let mut snap = None;
        for n in [213, 1, 250, 86] {
            got.extend(rows(
                &m.forward(&toks[at..at + n], &mut st, LogitsRows::All)
                    .unwrap()
                    .logits,
                vocab,
            ));
            at += n;
        }
        while at < 600 {
            got.extend(rows(
                &m.forward(&toks[at..at + 1], &mut st, LogitsRows::All)
                    .unwrap()
                    .logits,
                vocab,
            ));
            at += 1;
            if at == 580 {
                snap = Some(st.snapshot());
            }
        }
        let mut w = 2;
        while at < LEN {
            let n = w.min(LEN - at);
            got.extend(rows(
                &m.forward(&toks[at..at + n], &mut st, LogitsRows::All)
                    .unwrap()
                    .logits,
                vocab,
            ));
            at += n;
            w = w % 4 + 1;
        }
        assert_eq!(got.len(), LEN);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "{kv:?}: position {i} differs from the one-shot forward"
            );
        }

        // Warm: back to the snapshot at 580, the rest in one forward.
        st.restore(snap.as_ref().unwrap()).unwrap();
        let tail = rows(
            &m.forward(&toks[580..], &mut st, LogitsRows::All)
                .unwrap()
                .logits,
            vocab,
        );
        assert!(
            tail == want[580..],
            "{kv:?}: the warm continuation differs from the cold forward"
        );
    }
}
