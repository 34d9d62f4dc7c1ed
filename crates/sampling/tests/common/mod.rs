//! Shared helpers for the fixture tests.
#![allow(dead_code)]

use std::path::PathBuf;

use ds4_sampling::Law;
use ds4_sampling::replay::{ReplayStats, replay_cases};
use serde_json::Value;

/// tests/fixtures/sampling at the workspace root.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sampling")
}

pub fn read_fixture(name: &str) -> String {
    let path = fixture_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with tools/oracle/sampling/generate.sh)",
            path.display()
        )
    })
}

/// Replay `{law}_cases.jsonl` and compare every output line with
/// `{law}_expected.jsonl` (as JSON values: tokens, draws, errors, flags).
pub fn check_law_fixture(law: Law) -> ReplayStats {
    let cases = read_fixture(&format!("{}_cases.jsonl", law.name()));
    let expected = read_fixture(&format!("{}_expected.jsonl", law.name()));
    let mut out = Vec::new();
    let stats =
        replay_cases(law, cases.as_bytes(), &mut out).expect("fixture cases are well formed");
    let got = String::from_utf8(out).expect("replay writes UTF-8");
    let got: Vec<Value> = got
        .lines()
        .map(|l| serde_json::from_str(l).expect("replay JSON"))
        .collect();
    let want: Vec<Value> = expected
        .lines()
        .map(|l| serde_json::from_str(l).expect("expected JSON"))
        .collect();
    assert_eq!(got.len(), want.len(), "one output line per case");
    let mut mismatches = Vec::new();
    for (g, w) in got.iter().zip(&want) {
        if g != w {
            mismatches.push(format!("got {g}\n want {w}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} {} cases differ from the reference; first ones:\n{}",
        mismatches.len(),
        want.len(),
        law,
        mismatches
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    stats
}
