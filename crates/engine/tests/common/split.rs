//! Expert-parallel checks shared by the reference and fast-set binaries
//! and the CUDA tests: a model on every plan's group gives the one-device
//! bits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_engine::backend::split::{ExpertSplit, HostCopy, Split};
use ds4_engine::backend::{Backend, CpuOps};
use ds4_engine::{HiddenRows, LogitsRows, Model};

pub fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(p)
}

/// `plan`'s group with every part a clone of `device` (on a GPU: logical
/// shards of one device, the copies through the host).
pub fn group_of<B: Backend>(plan: &ExpertSplit, device: &B) -> Split<B> {
    Split::new(
        vec![device.clone(); plan.devices()],
        plan.clone(),
        Arc::new(HostCopy),
    )
    .unwrap()
}

/// The plans tried: even over 2 and 3 devices, a home with no experts, and
/// an uneven pair.
pub fn plans() -> Vec<ExpertSplit> {
    vec![
        ExpertSplit::even(2).unwrap(),
        ExpertSplit::even(3).unwrap(),
        ExpertSplit::weighted(vec![0, 1, 1]).unwrap(),
        ExpertSplit::weighted(vec![1, 3]).unwrap(),
    ]
}

/// Every logit a model gives over: a 7-token prefill, three decode steps,
/// a 3-row verify window; then the MTP head over the prefill's hidden rows
/// and one more depth, when the model has one. As bits.
pub fn bits<M: Model>(m: &M) -> Vec<u32> {
    let v = m.vocab_size() as u32;
    let ids: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % v).collect();
    let mut s = m.new_state();
    let mut out = m
        .forward(&ids[..7], &mut s, LogitsRows::All)
        .unwrap()
        .logits;
    for &t in &ids[7..10] {
        out.extend(m.forward(&[t], &mut s, LogitsRows::Last).unwrap().logits);
    }
    out.extend(
        m.forward(&ids[10..13], &mut s, LogitsRows::All)
            .unwrap()
            .logits,
    );
    if m.mtp_contract().is_some() {
        let mut s = m.new_state();
        let (_, hidden) = m
            .forward_hidden(&ids[..7], &mut s, LogitsRows::Last)
            .unwrap();
        let mut history = m.new_mtp_history().unwrap();
        let step = m
            .mtp_forward(&ids[1..7], &hidden.narrow(0, 6).unwrap(), &mut history)
            .unwrap();
        out.extend(&step.logits);
        let next = m
            .mtp_forward(&ids[7..8], &step.hidden, &mut history)
            .unwrap();
        out.extend(&next.logits);
    }
    out.iter().map(|x| x.to_bits()).collect()
}

/// `one` (one CPU) against the same model on every plan's group.
pub fn same_bits_on_every_plan<M: Model, N: Model>(
    what: &str,
    one: &M,
    split: impl Fn(Split<CpuOps>) -> N,
) {
    same_bits_on_every_plan_of(what, one, &CpuOps, split)
}

/// `one` (on `device`) against the same model on every plan's group of
/// `device`'s clones.
pub fn same_bits_on_every_plan_of<B: Backend, M: Model, N: Model>(
    what: &str,
    one: &M,
    device: &B,
    split: impl Fn(Split<B>) -> N,
) {
    let want = bits(one);
    for plan in plans() {
        let g = group_of(&plan, device);
        let m = split(g.clone());
        assert_eq!(m.backend(), one.backend(), "{what}: a group is its home");
        let got = bits(&m);
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(got.len(), want.len(), "{what} {plan:?}");
        assert!(first.is_none(), "{what} {plan:?}: logit {first:?} differs");
        let st = g.stats();
        let busy = (0..plan.devices()).filter(|&d| st.slots_on(d) > 0).count();
        assert!(busy >= 2, "{what} {plan:?}: experts ran on {busy} device");
        assert!(st.copies.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
}
