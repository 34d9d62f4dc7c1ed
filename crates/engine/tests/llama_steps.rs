//! The llama forward as a step (`LlamaModel::run_step`: token ids, rope
//! rows, cache writes and the attention's key count from the step
//! parameters, the form a device replays as a graph) equals the eager
//! forward bit for bit on the CPU: decode steps crossing the caches'
//! growth points, verify windows, snapshot / restore / truncate between
//! steps, a refused step leaving the state as it was.

mod common;

use common::tiny;
use ds4_engine::families::llama::load_llama;
use ds4_engine::{EngineError, LogitsRows, Model, ModelState};

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

#[test]
fn llama_steps_equal_eager_forwards_bit_for_bit() {
    for name in ["f32_untied", "rope_llama3"] {
        let model = load_llama(&tiny(name)).unwrap();
        let toks = tokens(110, 96);
        let (mut eager, mut stepped) = (model.new_state(), model.new_state());
        for s in [&mut eager, &mut stepped] {
            model.forward(&toks[..5], s, LogitsRows::Last).unwrap();
        }
        // Single steps, then 2..4-row windows (every row's logits), past
        // 2·5 … and the first growth at 256 is beyond the 128 context, so
        // the tiny model also crosses its context cap.
        let mut at = 5;
        let mut rows = 1;
        while at + rows <= 120 {
            let w = &toks[at % toks.len()..(at % toks.len() + rows).min(toks.len())];
            let mode = if rows == 1 {
                LogitsRows::Last
            } else {
                LogitsRows::All
            };
            let (want, want_x) = model.forward_hidden(w, &mut eager, mode).unwrap();
            let (got, got_x) = model.run_step(w, &mut stepped, mode).unwrap();
            assert_eq!(got.logits, want.logits, "{name}: {} rows at {at}", w.len());
            assert_eq!(got_x, *want_x.buf(), "{name}: hidden at {at}");
            assert_eq!(stepped.len(), eager.len());
            at += w.len();
            rows = if at < 60 { 1 } else { rows % 4 + 1 };
        }
        // Snapshot, a step, restore and truncate: still the eager bits.
        let snap = stepped.snapshot();
        let esnap = eager.snapshot();
        let w = &toks[..1];
        let want = model.forward(w, &mut eager, LogitsRows::Last).unwrap();
        assert_eq!(
            model
                .run_step(w, &mut stepped, LogitsRows::Last)
                .unwrap()
                .0
                .logits,
            want.logits
        );
        stepped.restore(&snap).unwrap();
        eager.restore(&esnap).unwrap();
        stepped.truncate(40).unwrap();
        eager.truncate(40).unwrap();
        let w = &toks[7..10];
        let want = model.forward(w, &mut eager, LogitsRows::All).unwrap();
        let got = model.run_step(w, &mut stepped, LogitsRows::All).unwrap().0;
        assert_eq!(got.logits, want.logits, "{name}: after truncate");
        // A refused step leaves the state as it was.
        let before = stepped.len();
        assert!(matches!(
            model.run_step(&[96], &mut stepped, LogitsRows::Last),
            Err(EngineError::TokenOutOfRange { .. })
        ));
        stepped.truncate(0).unwrap();
        model
            .forward(&toks[..100], &mut stepped, LogitsRows::Last)
            .unwrap();
        assert!(matches!(
            model.run_step(&toks[..30], &mut stepped, LogitsRows::Last),
            Err(EngineError::ContextOverflow { .. })
        ));
        assert_eq!(stepped.len(), 100);
        assert!(before > 0);
    }
}
