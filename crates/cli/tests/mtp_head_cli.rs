//! The default model's MTP head through the real binary: `--mtp-depth auto`
//! drafts with it and greedy output equals AR's; a damaged head file next to
//! the model is refused with a warning and the model runs without MTP.

use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4server"))
}

fn json(out: Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

/// The greedy depth a load measured for the shipped head (`MTP greedy auto
/// depth N`, logged at `DS4SERVER_LOG=info`): on the CPU's fast set
/// `--mtp-depth auto`'s greedy depth comes from this machine's cycle pieces.
fn measured_greedy_depth(stderr: &[u8]) -> usize {
    let s = String::from_utf8_lossy(stderr);
    let key = "greedy auto depth ";
    let at = s
        .find(key)
        .unwrap_or_else(|| panic!("no measured depth: {s}"))
        + key.len();
    let digits: String = s[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().unwrap()
}

/// The depth a `--json` run drafted at (0: plain AR, no `mtp` object).
fn mtp_depth(v: &Value) -> usize {
    v["mtp"]["depth"].as_u64().map_or(0, |d| d as usize)
}

/// `run` of the test prompt: greedy, 24 tokens, JSON, logging at info (the
/// measured depth's line).
fn greedy_command() -> Command {
    let mut c = bin();
    c.env("DS4SERVER_LOG", "info")
        .args([
            "run",
            "-p",
            "Why is exercise important?",
            "--temperature",
            "0",
        ])
        .args(["--max-tokens", "24", "--json"]);
    c
}

/// [`greedy_command`] with `extra` appended, run.
fn greedy(extra: &[&str]) -> Output {
    greedy_command().args(extra).output().unwrap()
}

fn run(model: Option<&std::path::Path>, depth: &str) -> Output {
    match model {
        Some(m) => greedy(&["-m", m.to_str().unwrap(), "--mtp-depth", depth]),
        None => greedy(&["--mtp-depth", depth]),
    }
}

#[test]
fn run_mtp_depth_auto_default_model_matches_ar() {
    let ar = json(run(None, "0"));
    assert!(ar["mtp"].is_null());
    let out = run(None, "auto");
    // The CPU's default kernel set is fast: the greedy depth is the one
    // this load measured (any depth emits AR's tokens).
    let measured = measured_greedy_depth(&out.stderr);
    assert!(measured <= 3, "{measured}");
    let auto = json(out);
    assert_eq!(auto["tokens"], ar["tokens"]);
    assert_eq!(mtp_depth(&auto), measured);
    if measured > 0 {
        assert!(auto["mtp"]["cycles"].as_u64().unwrap() >= 1);
    }
    // A sampled run (the family's default temperature) takes the sampled
    // depth under `auto`.
    let sampled = bin()
        .args(["run", "-p", "Why is exercise important?", "--seed", "3"])
        .args(["--max-tokens", "24", "--json", "--mtp-depth", "auto"])
        .output()
        .unwrap();
    assert_eq!(
        json(sampled)["mtp"]["depth"].as_u64().unwrap() as usize,
        ds4_engine::families::llama::MTP_AUTO_DEPTH_SAMPLED_FAST
    );
    let bad = bin()
        .args(["run", "-p", "x", "--mtp-depth", "deep"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`auto`"));
}

#[test]
fn damaged_head_default_model_is_refused_and_runs_without_mtp() {
    let model = ds4_models::default_model_path().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The default model under its own name in a fresh folder (a link: the
    // head is looked up next to the path given).
    let link = dir.path().join(ds4_models::DEFAULT_MODEL.file_name);
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let head = ds4_models::DEFAULT_MTP_HEAD.path_next_to(&link);
    let good = ds4_models::mtp_head_for(&model).unwrap().unwrap();
    let bytes = std::fs::read(good).unwrap();
    std::fs::write(&head, &bytes[..bytes.len() - 1]).unwrap();

    let out = run(Some(&link), "0");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(stderr.contains("running without MTP"), "{stderr}");
    assert!(stderr.contains("truncated"), "{stderr}");
    let ar = json(out);
    assert!(ar["mtp"].is_null());
    // Asking for MTP now is an error that says why.
    let out = run(Some(&link), "1");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("MTP"));
    // The damaged file was left as it was.
    assert_eq!(std::fs::read(&head).unwrap().len(), bytes.len() - 1);
    // `auto` on a model without a head is plain AR.
    let auto = json(run(Some(&link), "auto"));
    assert!(auto["mtp"].is_null());
    assert_eq!(auto["tokens"], ar["tokens"]);
}

/// `bench --mtp` end to end on the default model, small: AR and depths
/// 1..2 at both temperatures (greedy MTP == AR is checked by the bench
/// itself), the pieces table, and the modelled column.
#[test]
fn bench_mtp_default_model_reports_every_depth_and_its_pieces() {
    let out = bin()
        .args([
            "bench",
            "--device",
            "cpu",
            "--mtp",
            "--mtp-prompt-count",
            "2",
        ])
        .args([
            "--gen",
            "12",
            "--mtp-max-depth",
            "2",
            "--mtp-cost-reps",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (modes, pieces) = stdout.split_once("\n\n").expect("two tables");
    let mut lines = modes.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    for r in &rows {
        let depth: usize = r[col("depth")].parse().unwrap();
        let pieces: f64 = r[col("pieces_speedup")].parse().unwrap();
        let accepted: f64 = r[col("mean_accepted_len")].parse().unwrap();
        if depth == 0 {
            assert_eq!(pieces, 1.0);
            assert_eq!(accepted, 0.0);
        } else {
            // timed pieces: only its presence and sign are checked (the
            // value moves with the machine's load); the trained head gets
            // some drafts accepted
            assert!(pieces.is_finite() && pieces > 0.0, "{stdout}");
            assert!(accepted > 0.0 && accepted <= depth as f64, "{stdout}");
        }
    }
    let names: Vec<&str> = pieces
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(
        names,
        ["ar_step", "verify_window", "verify_window", "draft"],
        "{stdout}"
    );
}

/// `DS4_MTP_HEAD` attaches another head file (here a copy of the shipped
/// one), says so, and drafts with it (greedy output still AR's); a damaged
/// file named there is refused and the model runs without MTP.
#[test]
fn head_override_default_model_attaches_a_file_or_refuses_a_damaged_one() {
    let model = ds4_models::default_model_path().unwrap();
    let shipped = ds4_models::mtp_head_for(&model).unwrap().unwrap();
    let bytes = std::fs::read(shipped).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("candidate.mtp.gguf");
    std::fs::write(&copy, &bytes).unwrap();
    let with = |head: &std::path::Path, depth: &str| {
        greedy_command()
            .env("DS4_MTP_HEAD", head)
            .args(["--mtp-depth", depth])
            .output()
            .unwrap()
    };

    let out = with(&copy, "1");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stderr.contains("DS4_MTP_HEAD") && stderr.contains("not the shipped head"),
        "{stderr}"
    );
    let mtp = json(out);
    assert!(mtp["mtp"]["cycles"].as_u64().unwrap() >= 1, "{mtp}");
    assert_eq!(mtp["tokens"], json(run(None, "0"))["tokens"]);

    let damaged = dir.path().join("damaged.mtp.gguf");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let out = with(&damaged, "0");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stderr.contains("refused") && stderr.contains("running without MTP"),
        "{stderr}"
    );
    assert!(json(out)["mtp"].is_null());
}

/// With no `--mtp-depth`, the default model's head drafts on the CPU's fast
/// kernel set at the greedy depth the load measured fastest (`auto`) and not
/// under the reference set; greedy, the tokens are AR's either way.
#[test]
fn mtp_is_on_by_default_on_the_fast_set_default_model() {
    let default_run = |kernels: &str| greedy(&["--kernels", kernels]);
    let out = default_run("fast");
    let measured = measured_greedy_depth(&out.stderr);
    let fast = json(out);
    assert_eq!(mtp_depth(&fast), measured);
    let ar = json(greedy(&["--kernels", "fast", "--mtp-depth", "0"]));
    assert!(ar["mtp"].is_null());
    assert_eq!(fast["tokens"], ar["tokens"]);
    // The reference set measures nothing and keeps its constant (AR).
    let out = default_run("reference");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("greedy auto depth"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = json(out);
    assert!(reference["mtp"].is_null(), "{reference}");
}
