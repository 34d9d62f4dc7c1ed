//! A DeepSeek-V4 model on stored weights against the same weights
//! dequantized to f32: logits one shot (with every layer's streams, routing
//! and selections), in chunks and step by step, each within a tolerance of
//! the largest logit, and the stored model's chunks and steps bit-identical
//! to its own one shot. Shared by the ds4 GGUF tests (`#[path]`-included).

#![allow(dead_code)]

use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::{LogitsRows, Model};

use super::common::max_abs_diff;

pub const T: usize = 48;
pub const BACK: usize = 6;
pub const CHUNKS: [usize; 4] = [17, 1, 5, 25];

/// `T` pseudo-random token ids below `vocab`.
pub fn tokens(vocab: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..T)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Within `tol` of the largest value (reported with whether the bits
/// agree); returns the measured ratio.
pub fn close(what: &str, ours: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(ours.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let rel = max_abs_diff(ours, want) / scale.max(1e-30);
    let identical = ours
        .iter()
        .zip(want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    println!("{what}: max |Δ|/max|x| = {rel:.3e} (max |x| {scale:.3}), bit-identical {identical}");
    assert!(rel <= tol, "{what}: relative difference {rel}");
    rel
}

/// The same bits.
pub fn identical(what: &str, ours: &[f32], want: &[f32]) {
    assert_eq!(ours.len(), want.len(), "{what}: lengths");
    let same = ours
        .iter()
        .zip(want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{what}: max |Δ| = {}", max_abs_diff(ours, want));
}

/// The comparison of the module docs for `g` (stored) and `f` (f32);
/// `label` prefixes every message. Returns the worst logit ratio.
pub fn compare(label: &str, g: &DeepseekV4Model, f: &DeepseekV4Model, tol: f32) -> f32 {
    let ids = tokens(g.vocab_size());
    let (mut sg, mut sf) = (g.new_state(), f.new_state());
    let og = g.forward_ext(&ids, &mut sg, LogitsRows::All, true).unwrap();
    let of = f.forward_ext(&ids, &mut sf, LogitsRows::All, true).unwrap();
    let mut worst = close(
        &format!("{label}one shot"),
        &og.logits.logits,
        &of.logits.logits,
        tol,
    );
    for (l, (a, b)) in og.trace.iter().zip(&of.trace).enumerate() {
        close(
            &format!("{label}layer {l} streams"),
            &a.streams,
            &b.streams,
            tol,
        );
        assert_eq!(a.experts, b.experts, "{label}layer {l} routing");
        assert_eq!(a.selection, b.selection, "{label}layer {l} selections");
    }
    let routed: std::collections::BTreeSet<_> =
        og.trace.iter().flat_map(|t| t.experts.iter()).collect();
    assert_eq!(
        routed.len(),
        g.config().n_routed_experts,
        "{label}every expert routed"
    );
    // Chunks.
    assert_eq!(CHUNKS.iter().sum::<usize>(), T);
    let (mut sg, mut sf) = (g.new_state(), f.new_state());
    let (mut rg, mut rf) = (Vec::new(), Vec::new());
    let mut at = 0;
    for n in CHUNKS {
        let r = &ids[at..at + n];
        rg.extend(g.forward(r, &mut sg, LogitsRows::All).unwrap().logits);
        rf.extend(f.forward(r, &mut sf, LogitsRows::All).unwrap().logits);
        at += n;
    }
    worst = worst.max(close(&format!("{label}chunks"), &rg, &rf, tol));
    identical(
        &format!("{label}stored: chunks vs one shot"),
        &rg,
        &og.logits.logits,
    );
    // Prefill, then single steps.
    let (mut sg, mut sf) = (g.new_state(), f.new_state());
    let pre = &ids[..T - BACK];
    let mut rg = g.forward(pre, &mut sg, LogitsRows::Last).unwrap().logits;
    let mut rf = f.forward(pre, &mut sf, LogitsRows::Last).unwrap().logits;
    for &tok in &ids[T - BACK..] {
        rg.extend(g.forward(&[tok], &mut sg, LogitsRows::Last).unwrap().logits);
        rf.extend(f.forward(&[tok], &mut sf, LogitsRows::Last).unwrap().logits);
    }
    worst = worst.max(close(&format!("{label}steps"), &rg, &rf, tol));
    let v = g.vocab_size();
    identical(
        &format!("{label}stored: steps vs one shot"),
        &rg,
        &og.logits.logits[(T - BACK - 1) * v..],
    );
    worst
}
