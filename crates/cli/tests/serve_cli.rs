//! `ds4server serve`'s start-up flags over the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `--ctx` above the model's context is capped, and says so at start.
#[test]
fn default_model_serve_warns_when_ctx_exceeds_the_model() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args([
            "serve",
            "--port",
            "0",
            "--ctx",
            "10000000",
            "--default-max-tokens",
            "0",
        ])
        .args(["--model-alias", "gpt-4o", "--strict-model-names"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ds4server serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let listening = line.contains("listening on");
                lines.push(line);
                if listening {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let all = lines.join("\n");
    assert!(
        all.contains("listening on"),
        "the server did not start:\n{all}"
    );
    assert!(
        all.contains("warning: --ctx 10000000 exceeds what the model supports (8192 tokens)"),
        "{all}"
    );
}

/// `serve --kernels fast`: the start line, `/v1/models` and `/v1/status`
/// name the fast set's backend id and its default KV cache type.
#[test]
fn default_model_serve_reports_the_kernel_set() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args(["serve", "--port", "0", "--kernels", "fast"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ds4server serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut started = None;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("listening on") {
            started = Some(line);
            break;
        }
    }
    let get = |addr: &str, path: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let line = started.unwrap_or_default();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string);
    let replies = addr.map(|a| (get(&a, "/v1/models"), get(&a, "/v1/status")));
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("-fast, fast kernels)"), "start line: {line}");
    let (models, status) = replies.expect("the server's address");
    assert!(models.starts_with("HTTP/1.1 200"), "{models}");
    assert!(models.contains("\"kernel_set\":\"fast\""), "{models}");
    assert!(models.contains("-fast\""), "{models}");
    assert!(status.contains("\"kernel_set\":\"fast\""), "{status}");
    // `--kv-cache auto` (the default): f16 rows for llama on the fast set.
    assert!(models.contains("\"kv_cache\":\"f16\""), "{models}");
    assert!(status.contains("\"kv_cache\":\"f16\""), "{status}");
}
