//! End-to-end tests over the real `ds4server` binary. Tests whose names
//! contain `default_model` use the real default model (pulled once into the
//! user cache; nextest runs them one at a time).

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4server"))
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "ds4server failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("stdout is UTF-8")
}

fn run_json(args: &[&str]) -> Value {
    let out = ok(bin().arg("run").args(args).arg("--json").output().unwrap());
    serde_json::from_str(out.trim()).expect("run --json prints one JSON object")
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn run_greedy_default_model_is_deterministic_and_reports() {
    // Both kernel sets: deterministic greedy runs. The answer is checked on
    // the reference set (whose logits equal transformers'); the fast set's
    // int8 activations flip this prompt's first token, a near tie
    // ("L'Étoile, …" instead of "The capital of France is Paris.").
    for kernels in ["reference", "fast"] {
        let args = [
            "-p",
            "What is the capital of France?",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--kernels",
            kernels,
        ];
        let a = run_json(&args);
        let b = run_json(&args);
        assert_eq!(tokens(&a), tokens(&b), "greedy runs must be identical");
        if kernels == "reference" {
            assert!(a["text"].as_str().unwrap().contains("Paris"), "{a}");
        }
    }
    let args = [
        "-p",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
    ];
    let a = run_json(&args);
    let n = tokens(&a).len();
    assert!((1..=24).contains(&n), "{a}");
    assert!(["stop", "length"].contains(&a["finish_reason"].as_str().unwrap()));
    assert!(a["prefill_tps"].as_f64().unwrap() > 0.0);
    assert!(a["seed"].is_u64());
}

#[test]
fn run_seeded_sampling_default_model_replays_exactly() {
    let args = [
        "-p",
        "Tell me a short story about a robot.",
        "--temperature",
        "1.0",
        "--seed",
        "1234",
        "--max-tokens",
        "32",
    ];
    let a = run_json(&args);
    let b = run_json(&args);
    assert_eq!(tokens(&a), tokens(&b));
    assert_eq!(a["seed"], 1234);
    let c = run_json(&[
        "-p",
        "Tell me a short story about a robot.",
        "--temperature",
        "1.0",
        "--seed",
        "99",
        "--max-tokens",
        "32",
    ]);
    assert_ne!(
        tokens(&a),
        tokens(&c),
        "different seeds should differ at T=1"
    );
}

#[test]
fn run_stop_string_default_model_cuts_text_before_the_stop() {
    let base = [
        "-p",
        "List the numbers from one to twenty in words, separated by commas.",
        "--temperature",
        "0",
        "--max-tokens",
        "48",
    ];
    let full = run_json(&base);
    let text = full["text"].as_str().unwrap().to_string();
    // A stop string taken from the middle of the greedy reply.
    let stop = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map(|(i, _)| &text[i..])
        .and_then(|rest| rest.get(..3))
        .expect("reply long enough")
        .to_string();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--stop", &stop]);
    let stopped = run_json(&args);
    assert_eq!(stopped["text"].as_str().unwrap(), cut, "stop {stop:?}");
    assert_eq!(stopped["finish_reason"], "stop");
}

#[test]
fn run_reports_parameters_the_law_ignores_default_model() {
    let v = run_json(&[
        "-p",
        "Hi",
        "--min-p",
        "0.1",
        "--temperature",
        "0",
        "--max-tokens",
        "2",
    ]);
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("min_p")),
        "{v}"
    );
}

#[test]
fn run_prompt_tokens_and_max_tokens_default_model() {
    let v = run_json(&[
        "--prompt-tokens",
        "1,9690,198,19556,2,198,1,520,9531,198",
        "--max-tokens",
        "1",
        "--temperature",
        "0",
    ]);
    assert_eq!(tokens(&v).len(), 1);
    assert_eq!(v["prompt_tokens"], 10);
}

#[test]
fn debug_tokenize_round_trips_default_model() {
    let text = "Hello, world! 12345 ①Ⅻ² 你好 👩‍💻";
    let out = ok(bin()
        .args(["debug", "tokenize", "--text", text])
        .output()
        .unwrap());
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let ids: Vec<String> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.to_string())
        .collect();
    assert!(!ids.is_empty());
    let decoded = ok(bin()
        .args(["debug", "tokenize", "--decode", &ids.join(",")])
        .output()
        .unwrap());
    assert_eq!(decoded.trim_end_matches('\n'), text);
}

fn read_logits(path: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let data = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (t.shape().to_vec(), data)
}

#[test]
fn debug_logits_modes_agree_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = "1,9690,198,2683,359,253,5356,5646,11,1,4093,198,28120,905,30,2";
    let modes: [(&str, Vec<&str>); 3] = [
        ("one", vec![]),
        ("chunked", vec!["--chunk", "5"]),
        ("stepped", vec!["--prefill", "4", "--steps", "12"]),
    ];
    let mut results = Vec::new();
    for (name, extra) in &modes {
        let out = dir.path().join(format!("{name}.safetensors"));
        ok(bin()
            .args(["debug", "logits", "--tokens", tokens, "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap());
        results.push(read_logits(&out));
    }
    let (shape, one) = &results[0];
    assert_eq!(shape, &vec![16, 49152]);
    for (other_shape, other) in &results[1..] {
        assert_eq!(other_shape, shape);
        for row in 0..16 {
            let a = &one[row * 49152..(row + 1) * 49152];
            let b = &other[row * 49152..(row + 1) * 49152];
            // Every kernel on the CPU path computes a row the same way
            // whatever the window (backend::cpu::{block_matmul, attention}),
            // so chunked and stepped runs equal one forward bit for bit —
            // the property that makes a warm turn equal a cold one.
            assert_eq!(a, b, "row {row} differs between chunkings");
            assert_eq!(argmax(a), argmax(b));
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

#[test]
fn debug_sample_replays_cases_for_both_laws() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        concat!(
            r#"{"id":"a","logits":[1.0,2.0,3.0,"-inf"],"seed":7,"draws":5,"temperature":1.0,"top_p":1.0,"top_k":0,"min_p":0.0,"presence_penalty":0.0,"frequency_penalty":0.0,"counts":{}}"#,
            "\n",
            r#"{"id":"b","logits":[1.0,"nan",3.0],"seed":7,"draws":1,"temperature":0.0,"top_p":1.0,"top_k":0,"min_p":0.0,"presence_penalty":0.0,"frequency_penalty":0.0,"counts":{}}"#,
            "\n"
        ),
    )
    .unwrap();
    for law in ["nucleus", "ds4"] {
        let out = ok(bin()
            .args(["debug", "sample", "--law", law, "--cases"])
            .arg(&cases)
            .output()
            .unwrap());
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{law}: {out}");
        assert_eq!(lines[0]["id"], "a");
        let drawn = lines[0]["tokens"].as_array().unwrap();
        assert_eq!(drawn.len(), 5);
        assert!(
            drawn.iter().all(|t| t.as_u64().unwrap() < 3),
            "{law}: {out}"
        );
        if law == "nucleus" {
            assert_eq!(lines[1]["error"], "non_finite_logits");
        }
    }
    let bad = bin()
        .args(["debug", "sample", "--law", "gumbel", "--cases"])
        .arg(&cases)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("nucleus"));
}

#[test]
fn chat_reuses_the_live_state_default_model() {
    // AR: a session that drafted (MTP is on by default on the fast set)
    // drops its MTP history when rewound, so /reset's shorter prompt would
    // start cold (docs/ARCHITECTURE.md, warm reuse).
    let mut child = bin()
        .args(["chat", "--temperature", "0", "--max-tokens", "12"])
        .args(["--mtp-depth", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Say hello.\nNow say goodbye.\n/reset\nSay hello.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reused: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.split("reused ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(reused.len(), 3, "{stderr}");
    assert_eq!(reused[0], 0, "first turn starts cold");
    assert!(reused[1] > 20, "second turn reuses the first: {stderr}");
    // /reset forgets the conversation, not the session cache: the same first
    // prompt again reuses its prefix of the earlier live state (an
    // attention-only state truncates), and the reply is what the cold first
    // turn said (greedy; warm equals cold).
    assert!(
        reused[2] > 20,
        "the cache serves the restarted prompt: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replies: Vec<&str> = stdout.lines().filter(|l| !l.is_empty()).collect();
    assert!(replies.len() >= 3, "{stdout}");
    assert_eq!(replies.first(), replies.last(), "{stdout}");
}

#[test]
fn inspect_default_model_lists_tensors() {
    let out = ok(bin().args(["inspect", "--json"]).output().unwrap());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["family"], "llama");
    assert_eq!(v["chat_template"], true);
    assert!(v["tensors"].as_array().unwrap().len() > 200);
}

#[test]
fn missing_model_path_is_a_readable_error() {
    let out = bin()
        .args(["run", "-m", "/nonexistent/model.gguf", "-p", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/model.gguf"), "{stderr}");
}

/// `--devices` (issue 49): a list of fewer than two GPUs or a part that
/// is not `cuda:N` is a usage error that says what to write; with
/// `--device` it conflicts; a build without CUDA says how to get one.
#[test]
fn devices_lists_are_checked_before_anything_loads() {
    let fails = |args: &[&str], says: &str| {
        let out = bin().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    let tiny = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/deepseek_v4/tiny_a"
    );
    let run = ["run", "-m", tiny, "-p", "hi"];
    fails(
        &[&run[..], &["--devices", "cuda:0"]].concat(),
        "2 to 8 parts",
    );
    fails(
        &[&run[..], &["--devices", "cuda:0,gpu1"]].concat(),
        "write cuda:N",
    );
    fails(
        &[&run[..], &["--devices", "cuda:0,cuda:1", "--device", "cpu"]].concat(),
        "cannot be used with",
    );
    if !cfg!(feature = "cuda") {
        fails(
            &[&run[..], &["--devices", "cuda:0,cuda:1"]].concat(),
            "built without CUDA support",
        );
    }
}

#[test]
fn bench_writes_csv_and_svg_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("b.csv");
    let svg = dir.path().join("b.svg");
    let out = ok(bin()
        .args([
            "bench",
            "--ctx-start",
            "32",
            "--ctx-max",
            "80",
            "--step",
            "32",
            "--gen",
            "4",
            "--threads",
            "2",
            "--csv",
        ])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap());
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,state_bytes,kv_cache,backend,kernels"
    );
    // Every row names its kv cache type, backend id and kernel set (the
    // CPU's default: fast, whose ids carry the `-fast` suffix, and with it
    // `--kv-cache auto`'s f16 for a llama model).
    for l in &lines[1..] {
        let cols: Vec<&str> = l.split(',').collect();
        assert_eq!(cols[6], "f16", "{out}");
        assert!(
            cols[7].starts_with("cpu-") && cols[7].ends_with("-fast"),
            "{out}"
        );
        assert_eq!(cols[8], "fast", "{out}");
    }
    let ctx: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(ctx, ["32", "64", "80"]);
    let prefilled: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(
        prefilled,
        ["32", "32", "16"],
        "only the new interval is prefilled"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

/// `bench --nll` on a tiny checkpoint (random weights, its own small
/// tokenizer): windows of 16 tokens, every position but a window's first
/// scored, the same numbers from two runs, `--csv` equal to stdout.
#[test]
fn bench_nll_scores_a_text_on_a_tiny_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "It was the best of times, it was the worst of times, it was the age of wisdom, \
         it was the age of foolishness, it was the epoch of belief.",
    )
    .unwrap();
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen4_exp/tiny_a"
    );
    let csv = dir.path().join("nll.csv");
    let run = |extra: &[&str]| {
        ok(bin()
            .args(["bench", "--device", "cpu", "-m", model, "--nll"])
            .arg(&text)
            .args(["--nll-window", "16", "--csv"])
            .arg(&csv)
            .args(extra)
            .output()
            .unwrap())
    };
    let out = run(&[]);
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "window,windows,text_tokens,tokens_scored,mean_nll,perplexity,backend,kernels,wall_s"
    );
    let row: Vec<&str> = lines[1].split(',').collect();
    let (windows, text_tokens, scored): (usize, usize, usize) = (
        row[1].parse().unwrap(),
        row[2].parse().unwrap(),
        row[3].parse().unwrap(),
    );
    assert_eq!(row[0], "16");
    assert_eq!(windows, text_tokens.div_ceil(16), "{out}");
    // No BOS for this tokenizer: each window loses its first position.
    assert_eq!(scored, text_tokens - windows, "{out}");
    let nll: f64 = row[4].parse().unwrap();
    let ppl: f64 = row[5].parse().unwrap();
    assert!(nll > 0.0 && nll.is_finite(), "{out}");
    assert!((ppl.ln() - nll).abs() < 1e-3, "{out}");
    assert!(row[6].starts_with("cpu-"), "{out}");
    assert_eq!(row[7], "fast", "the CPU's default set");
    // Deterministic: the same NLL again; a cap on the tokens read is
    // honoured.
    let again = run(&[]);
    assert_eq!(
        again.lines().nth(1).unwrap().split(',').nth(4),
        Some(row[4])
    );
    let capped = run(&["--nll-max-tokens", "20"]);
    let capped: Vec<&str> = capped.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(
        (capped[2], capped[3]),
        ("20", "18"),
        "16 + 4 tokens: 15 + 3 scored"
    );
}

/// `--kernels fast` is accepted and reported by `inspect`, `bench` and
/// `bench --nll` on the default model (whose Q4_1/Q8_0 weights the fast
/// set's int8 products cover); a bad `--kernels` or `DS4_KERNELS` value is
/// a readable error.
#[test]
fn kernels_flag_default_model_is_reported_by_inspect_bench_and_nll() {
    let inspect = ok(bin()
        .args(["inspect", "--kernels", "fast"])
        .output()
        .unwrap());
    let line = inspect
        .lines()
        .find(|l| l.starts_with("kernels:"))
        .expect("a kernels line");
    assert!(
        line.contains("cpu-") && line.contains("-fast (fast set)"),
        "{line}"
    );
    // The CPU's default is fast; DS4_KERNELS and --kernels choose.
    let inspect = ok(bin().args(["inspect", "--json"]).output().unwrap());
    let v: Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(v["kernels"]["set"], "fast");
    assert!(v["kernels"]["backend"].as_str().unwrap().ends_with("-fast"));
    let inspect = ok(bin()
        .args(["inspect", "--json"])
        .env("DS4_KERNELS", "reference")
        .output()
        .unwrap());
    let v: Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(v["kernels"]["set"], "reference");
    assert!(!v["kernels"]["backend"].as_str().unwrap().ends_with("-fast"));

    let bench = ok(bin()
        .args([
            "bench",
            "--kernels",
            "fast",
            "--prompts",
            "24",
            "--gen",
            "2",
        ])
        .output()
        .unwrap());
    let row: Vec<&str> = bench.lines().nth(1).unwrap().split(',').collect();
    assert!(row[7].ends_with("-fast"), "{bench}");
    assert_eq!(row[8], "fast", "{bench}");

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "Whoso would be a man must be a nonconformist. He who would gather immortal palms \
         must not be hindered by the name of goodness, but must explore if it be goodness.",
    )
    .unwrap();
    let nll = |kernels: &str| {
        let out = ok(bin()
            .args(["bench", "--kernels", kernels, "--nll-window", "32", "--nll"])
            .arg(&text)
            .output()
            .unwrap());
        let row: Vec<String> = out
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(str::to_string)
            .collect();
        row
    };
    let (r, f) = (nll("reference"), nll("fast"));
    assert_eq!((r[7].as_str(), f[7].as_str()), ("reference", "fast"));
    assert!(f[6].ends_with("-fast") && !r[6].ends_with("-fast"));
    assert_eq!(r[3], f[3], "the same tokens scored");
    let (rn, fn_): (f64, f64) = (r[4].parse().unwrap(), f[4].parse().unwrap());
    // A real model on English: a few nats a token under either set, and
    // the int8 activations move it by little.
    assert!(rn > 0.5 && rn < 6.0, "{r:?}");
    assert!((fn_ - rn).abs() / rn < 0.05, "{r:?} {f:?}");

    let bad = bin()
        .args(["run", "-p", "hi", "--kernels", "int8"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("unknown kernel set `int8`"), "{stderr}");
    let bad = bin()
        .args(["run", "-p", "hi", "--max-tokens", "1"])
        .env("DS4_KERNELS", "int8")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("DS4_KERNELS=int8"), "{stderr}");
}

/// `bench --streams` needs token ids only, so it runs on a GGUF with no
/// vocabulary (a shape-only file: the GPU's SmolLM2-shaped bench), where
/// the modes that read text still say the tokenizer is missing.
#[test]
fn bench_streams_runs_without_a_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("shape-only.gguf");
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/llama/tiny/f32_tied"
    );
    ok(bin()
        .args(["quantize", src])
        .arg(&gguf)
        .args(["--recipe", "q8_0"])
        .output()
        .unwrap());
    let out = ok(bin()
        .args(["bench", "--device", "cpu", "-m"])
        .arg(&gguf)
        .args(["--streams", "1,2", "--prompts", "8", "--gen", "2"])
        .output()
        .unwrap());
    assert!(out.contains("\n2,4,"), "{out}");
    let text = bin()
        .args([
            "bench",
            "--device",
            "cpu",
            "--ctx-start",
            "8",
            "--ctx-max",
            "8",
            "-m",
        ])
        .arg(&gguf)
        .output()
        .unwrap();
    assert!(!text.status.success());
    assert!(
        String::from_utf8_lossy(&text.stderr).contains("tokenizer"),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
}

/// `bench --synthetic FAMILY --streams`: continuous batching on a synthetic
/// model (the GPU's full-size shapes have no file here), both the Q4_1 path
/// (qwen4_exp) and ds4's stored types (deepseek_v4 ds4-q2): one CSV row per
/// stream count, every stream identical to its turn alone.
#[test]
fn bench_synthetic_streams_are_identical_to_alone() {
    for (family, extra) in [("qwen4_exp", None), ("deepseek_v4", Some("ds4-q2"))] {
        let mut cmd = bin();
        cmd.args(["bench", "--synthetic", family, "--shape", "tiny"])
            .args(["--streams", "1,3", "--prompts", "12", "--gen", "4"]);
        if let Some(w) = extra {
            cmd.args(["--weights", w]);
        }
        let out = ok(cmd.output().unwrap());
        let mut lines = out.lines().skip_while(|l| !l.starts_with("streams,"));
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let col = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .unwrap_or_else(|| panic!("{family}: no column {name} in {header:?}"))
        };
        let (identical, batches) = (col("identical_to_alone"), col("decode_batches"));
        let rows: Vec<&str> = lines.collect();
        assert_eq!(rows.len(), 2, "{family}: {out}");
        for (row, n) in rows.iter().zip(["1", "3"]) {
            let cols: Vec<&str> = row.split(',').collect();
            assert_eq!(cols.len(), header.len(), "{family}: {row}");
            assert_eq!(cols[0], n, "{family}: {row}");
            assert_eq!(
                cols[1],
                (4 * n.parse::<usize>().unwrap()).to_string(),
                "{family}: {row}"
            );
            assert_eq!(
                cols[identical], "true",
                "{family}: {row} (a stream differs from alone)"
            );
            // The decode phase's batches: at least one, at most one per
            // stream's forward (4 tokens and the last one's forward each;
            // how many shared a batch depends on the threads' timing).
            let decode_batches: usize = cols[batches].parse().unwrap();
            let most = 5 * n.parse::<usize>().unwrap();
            assert!((1..=most).contains(&decode_batches), "{family}: {row}");
        }
    }
}
