//! Checkpoints across real process restarts (tiny qwen4_exp fixture): a
//! second `run` whose prompt extends the first's session reuses it and
//! prints what a cold run prints; a damaged file is refused and the run is
//! served cold; `sessions list|clear` show and empty the store.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen4_exp/tiny_a")
        .display()
        .to_string()
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4server"))
}

fn run(prompt: &[u64], depth: &str, dir: Option<&Path>) -> Value {
    let ids: Vec<String> = prompt.iter().map(u64::to_string).collect();
    let mut cmd = bin();
    cmd.args(["run", "-m", &fixture(), "--prompt-tokens", &ids.join(",")])
        .args(["--temperature", "0", "--max-tokens", "5", "--json"])
        .args(["--mtp-depth", depth]);
    if let Some(d) = dir {
        cmd.arg("--checkpoint-dir")
            .arg(d)
            .args(["--checkpoint-min-tokens", "1"]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn sessions(cmd: &str, dir: &Path) -> String {
    let out = bin()
        .args(["sessions", cmd, "--checkpoint-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn ckpts(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ckpt"))
        .collect()
}

#[test]
fn run_reuses_checkpoints_across_processes() {
    for depth in ["0", "2"] {
        let dir = tempfile::tempdir().unwrap();
        let p1: Vec<u64> = (0..30).map(|i| (i * 7) % 100 + 3).collect();
        let first = run(&p1, depth, Some(dir.path()));
        assert_eq!(first["reused_tokens"], 0);
        assert_eq!(ckpts(dir.path()).len(), 1);

        let mut p2 = p1.clone();
        p2.extend(tokens(&first));
        p2.extend([11, 12, 13]);
        let cold = run(&p2, depth, None);
        let warm = run(&p2, depth, Some(dir.path()));
        assert_eq!(
            warm["reused_tokens"],
            (p1.len() + 5) as u64,
            "depth {depth}"
        );
        assert_eq!(tokens(&warm), tokens(&cold), "depth {depth}");

        let list = sessions("list", dir.path());
        assert!(
            list.contains("qwen4_exp") && list.contains("2 checkpoints"),
            "{list}"
        );

        // Damage every file: the next run refuses them, removes them and is
        // served cold with the same output.
        for p in ckpts(dir.path()) {
            let mut b = std::fs::read(&p).unwrap();
            let i = b.len() - 10;
            b[i] ^= 0xff;
            std::fs::write(&p, b).unwrap();
        }
        let again = run(&p2, depth, Some(dir.path()));
        assert_eq!(again["reused_tokens"], 0);
        assert_eq!(tokens(&again), tokens(&cold));

        let cleared = sessions("clear", dir.path());
        assert!(cleared.starts_with("removed"), "{cleared}");
        assert!(ckpts(dir.path()).is_empty());
        assert!(sessions("list", dir.path()).contains("0 checkpoints"));
    }
}
