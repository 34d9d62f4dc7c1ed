//! `--max-batch 4`: turns that run at once, their forwards batched, answer
//! exactly what the same requests answer one at a time on a `--max-batch 1`
//! server (greedy and sampled, a long prompt prefilled in chunks between
//! the others' decode steps), a conversation's next turn goes back to the
//! lane holding it, warm, and shutdown ends every lane. With the default
//! model's MTP head and `--mtp-depth 2` on both servers, the MTP turns'
//! verify windows and draft steps share the batches and every answer is
//! still the one served alone.

mod common;

use serde_json::{Value, json};

/// Prompt `seed` as `len` token ids (distinct from the first token on).
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005) | 1;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 20_000) as u32 + 100
        })
        .collect()
}

fn requests() -> Vec<Value> {
    let job = |seed: u64, len: usize, temperature: f64, max_tokens: u32| {
        json!({
            "prompt": prompt(seed, len),
            "temperature": temperature,
            "seed": seed,
            "max_tokens": max_tokens,
            "logprobs": 2,
        })
    };
    vec![
        job(1, 12, 0.0, 24),
        job(2, 150, 0.8, 12),
        job(3, 5, 0.8, 30),
        job(4, 40, 1.0, 8),
        job(5, 20, 0.0, 16),
        job(6, 9, 0.7, 20),
    ]
}

/// What must not change with batching: text, finish, token counts and
/// every token's logprobs (as JSON numbers, so bit for bit).
fn answer(r: &Value) -> Value {
    json!({
        "text": r["choices"][0]["text"],
        "finish_reason": r["choices"][0]["finish_reason"],
        "logprobs": r["choices"][0]["logprobs"],
        "completion_tokens": r["usage"]["completion_tokens"],
        "prompt_tokens": r["usage"]["prompt_tokens"],
    })
}

/// Every request of [`requests`] sent one after another: their answers.
async fn answers_one_at_a_time(server: &common::TestServer) -> Vec<Value> {
    let mut out = Vec::new();
    for body in requests() {
        let (status, r) = server.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{r}");
        out.push(answer(&r));
    }
    out
}

/// Every request of [`requests`] sent at once: each answers `expected`.
async fn answers_at_once_equal(server: &std::sync::Arc<common::TestServer>, expected: &[Value]) {
    let tasks: Vec<_> = requests()
        .into_iter()
        .map(|body| {
            let s = server.clone();
            tokio::spawn(async move { s.post("/v1/completions", &body).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let (status, r) = task.await.expect("request task");
        assert_eq!(status, 200, "{r}");
        assert_eq!(answer(&r), expected[i], "request {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_max_batch_4_answers_each_request_as_alone_and_stays_warm() {
    let configure = |lanes: usize| {
        move |c: &mut ds4_server::ServerConfig| {
            c.max_batch = lanes;
            // The long prompt prefills in chunks between the others' steps,
            // and a forward takes at most 40 rows (--max-batch-tokens): a
            // chunk and a few decode rows meet, the rest wait a forward.
            c.prefill_chunk = 32;
            c.max_batch_tokens = 40;
        }
    };
    let alone = common::start_with(configure(1)).await;
    let expected = answers_one_at_a_time(&alone).await;

    let batched = std::sync::Arc::new(common::start_with(configure(4)).await);
    answers_at_once_equal(&batched, &expected).await;
    // A turn ends (its session banked, its lane freed) just after its last
    // bytes are sent: wait for the gauges to settle.
    let mut metrics = String::new();
    for _ in 0..200 {
        let (_, m) = batched.get("/metrics").await;
        metrics = m.as_str().expect("metrics text").to_string();
        if metrics.contains("ds4_running_turns 0") && metrics.contains("ds4_turns_total 6") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(metrics.contains("ds4_running_turns 0"), "{metrics}");
    assert!(metrics.contains("ds4_turns_total 6"), "{metrics}");
    // The forwards really shared batches.
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let (batches, forwards) = (
        value("ds4_batches_total "),
        value("ds4_batched_forwards_total "),
    );
    assert!(
        batches > 0 && forwards > batches,
        "{batches} batches of {forwards} forwards"
    );
    assert!(value("ds4_batch_largest ") >= 2, "{metrics}");
    let seconds = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(
        seconds("ds4_batch_forward_seconds_total ") > 0.0,
        "the batches' forwards took time: {metrics}"
    );
    assert!(
        seconds("ds4_batch_gather_seconds_total ") >= 0.0,
        "{metrics}"
    );

    // The next turn of conversation 3 (its prompt extends the first) goes
    // back to the lane holding it and reuses the whole first prompt.
    let first = prompt(3, 5);
    let mut next = first.clone();
    next.extend(prompt(30, 6));
    let body = json!({"prompt": next, "temperature": 0, "max_tokens": 4});
    let (status, r) = batched.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= first.len() as u64, "cached {cached}: {r}");
    // And it answers as the single worker does.
    let (_, alone_r) = alone.post("/v1/completions", &body).await;
    assert_eq!(answer(&r), answer(&alone_r));

    // The cache gauges sum over the lanes: every turn banked its session
    // (seven distinct token lists) in its own lane's bank.
    let (_, status) = batched.get("/v1/status").await;
    let banked = status["cache"]["bank"]["sessions"].as_u64().unwrap();
    assert!(banked >= 7, "{status}");
    assert!(
        status["cache"]["live_session"]["tokens"].as_u64().unwrap() >= 11,
        "{status}"
    );

    // Shutdown waits for every lane, each saving its session, and returns.
    let batched = std::sync::Arc::into_inner(batched).expect("the only owner");
    batched._running.shutdown().await.expect("clean shutdown");
}

/// Every request as an MTP turn (the trained head, depth 2): greedy and
/// sampled answers on `--max-batch 4` equal `--max-batch 1`'s bit for bit,
/// and the turns' prefills, verify windows and draft steps shared batches.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_max_batch_4_mtp_turns_answer_as_alone() {
    let configure = |lanes: usize| {
        move |c: &mut ds4_server::ServerConfig| {
            c.max_batch = lanes;
            c.prefill_chunk = 32;
            c.max_batch_tokens = 40;
            c.mtp_depth = Some(2);
        }
    };
    let alone = common::start_with_mtp_head(configure(1)).await;
    let expected = answers_one_at_a_time(&alone).await;
    let batched = std::sync::Arc::new(common::start_with_mtp_head(configure(4)).await);
    answers_at_once_equal(&batched, &expected).await;
    let (_, m) = batched.get("/metrics").await;
    let metrics = m.as_str().expect("metrics text").to_string();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let windows = value("ds4_batched_mtp_forwards_total ");
    assert!(windows > 0, "no MTP window shared a batch: {metrics}");
    let drafts = value("ds4_batched_mtp_drafts_total ");
    assert!(drafts > 0, "no draft step shared a batch: {metrics}");
}
