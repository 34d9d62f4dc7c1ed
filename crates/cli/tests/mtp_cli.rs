//! `run --mtp-depth` over the real binary on the tiny qwen4_exp fixture:
//! greedy MTP prints the AR tokens, `run --json` carries the MTP statistics,
//! and a depth above the family's maximum or on a model without an MTP head
//! is a readable error.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen4_exp/tiny_a")
        .display()
        .to_string()
}

fn run(depth: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args(["run", "-m", &fixture(), "--prompt-tokens", "5,9,17,33,2,8"])
        .args(["--temperature", "0", "--max-tokens", "10", "--json"])
        .args(["--mtp-depth", depth])
        .output()
        .unwrap()
}

fn json(depth: &str) -> Value {
    let out = run(depth);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

#[test]
fn run_mtp_depth_reports_stats_and_matches_ar() {
    let ar = json("0");
    assert!(ar["mtp"].is_null());
    assert_eq!(ar["final_state"], "complete");
    for depth in ["1", "3"] {
        let m = json(depth);
        assert_eq!(m["tokens"], ar["tokens"], "depth {depth}");
        assert_eq!(m["final_state"], "complete");
        let stats = &m["mtp"];
        assert_eq!(stats["depth"].as_u64().unwrap().to_string(), depth);
        let cycles = stats["cycles"].as_u64().unwrap();
        assert!(cycles >= 1);
        let drafted = stats["drafted"].as_array().unwrap();
        assert_eq!(drafted.len().to_string(), depth);
        assert_eq!(drafted[0].as_u64().unwrap(), cycles);
        assert!(stats["verify_rows"].as_u64().unwrap() >= cycles);
        assert!(stats["mean_accepted_len"].as_f64().is_some());
    }
    let bad = run("99");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("MTP depth 99"));
}
