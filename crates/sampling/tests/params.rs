//! Family binding: defaults, request resolution, ignored parameters,
//! validation, seeds, and the replay tool's input errors.

use ds4_sampling::replay::{ReplayError, replay_cases};
use ds4_sampling::{Field, Law, ParamError, SamplingParams, SamplingRequest, resolve_seed};

#[test]
fn law_names_and_defaults() {
    for law in [Law::Nucleus, Law::Ds4] {
        assert_eq!(law.name().parse::<Law>(), Ok(law));
        assert_eq!(law.to_string(), law.name());
        law.default_params().validate().unwrap();
    }
    assert!("greedy".parse::<Law>().is_err());
    const N: SamplingParams = Law::Nucleus.default_params();
    assert_eq!(
        (N.temperature, N.top_p, N.top_k, N.min_p),
        (0.6, 0.95, 20, 0.0)
    );
    let d = Law::Ds4.default_params();
    assert_eq!(
        (d.temperature, d.top_p, d.top_k, d.min_p),
        (1.0, 1.0, 0, 0.05)
    );
}

#[test]
fn unknown_parameters_are_ignored_and_reported() {
    let req = SamplingRequest {
        temperature: Some(0.8),
        top_k: Some(5),
        min_p: Some(0.1),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(0.0),
        ..Default::default()
    };
    let n = Law::Nucleus
        .resolve(&Law::Nucleus.default_params(), &req)
        .unwrap();
    assert_eq!(
        (n.params.temperature, n.params.top_k, n.params.min_p),
        (0.8, 5, 0.0)
    );
    assert_eq!(n.params.presence_penalty, 0.5);
    assert_eq!(n.ignored.len(), 1);
    assert_eq!(n.ignored[0].field, Field::MinP);
    assert_eq!(
        n.ignored[0].to_string(),
        "min_p is not part of the nucleus law used by this model family; it was ignored"
    );
    let d = Law::Ds4.resolve(&Law::Ds4.default_params(), &req).unwrap();
    assert_eq!((d.params.min_p, d.params.presence_penalty), (0.1, 0.0));
    // frequency_penalty = 0 is neutral: not worth a warning.
    let fields: Vec<Field> = d.ignored.iter().map(|i| i.field).collect();
    assert_eq!(fields, [Field::PresencePenalty]);
    assert!(
        d.ignored[0]
            .to_string()
            .contains("presence_penalty is not part of the ds4 law")
    );
}

#[test]
fn out_of_range_parameters_name_the_field() {
    let base = Law::Nucleus.default_params();
    let cases = [
        (
            SamplingRequest {
                temperature: Some(-0.1),
                ..Default::default()
            },
            Field::Temperature,
        ),
        (
            SamplingRequest {
                temperature: Some(f64::NAN),
                ..Default::default()
            },
            Field::Temperature,
        ),
        (
            SamplingRequest {
                temperature: Some(f64::INFINITY),
                ..Default::default()
            },
            Field::Temperature,
        ),
        (
            SamplingRequest {
                top_p: Some(1.5),
                ..Default::default()
            },
            Field::TopP,
        ),
        (
            SamplingRequest {
                top_k: Some(-2),
                ..Default::default()
            },
            Field::TopK,
        ),
        (
            SamplingRequest {
                presence_penalty: Some(f64::NAN),
                ..Default::default()
            },
            Field::PresencePenalty,
        ),
    ];
    for (req, field) in cases {
        let err = Law::Nucleus.resolve(&base, &req).unwrap_err();
        assert_eq!(err.field(), field);
        assert!(err.to_string().contains(field.name()), "{err}");
    }
    let err = Law::Ds4
        .resolve(
            &Law::Ds4.default_params(),
            &SamplingRequest {
                min_p: Some(2.0),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ParamError::OutOfRange {
            field: Field::MinP,
            ..
        }
    ));
    // Penalties beyond [-2, 2] are legal: the law clamps them.
    let ok = SamplingRequest {
        frequency_penalty: Some(3.0),
        ..Default::default()
    };
    assert!(Law::Nucleus.resolve(&base, &ok).is_ok());
}

#[test]
fn seeds_resolve_request_then_server_then_fresh() {
    assert_eq!(resolve_seed(Some(5), Some(9)), 5);
    assert_eq!(resolve_seed(None, Some(9)), 9);
    assert_eq!(resolve_seed(Some(0), None), 0);
    let fresh: Vec<u64> = (0..64).map(|_| resolve_seed(None, None)).collect();
    assert!(fresh.iter().all(|&s| s < (1 << 31) - 1));
    let distinct: std::collections::HashSet<_> = fresh.iter().collect();
    assert!(distinct.len() > 60, "fresh seeds repeat: {fresh:?}");
}

fn replay_err(law: Law, input: &str) -> ReplayError {
    replay_cases(law, input.as_bytes(), Vec::new()).unwrap_err()
}

#[test]
fn replay_reports_line_and_field_of_malformed_input() {
    let good = r#"{"id":1,"logits":[0,1],"seed":3}"#;
    let cases = [
        ("{not json", None, 2),
        (r#"[1,2]"#, None, 2),
        (
            r#"{"id":1,"logits":[1],"seed":1,"temprature":0.5}"#,
            None,
            2,
        ),
        (r#"{"logits":[1],"seed":1}"#, Some("id"), 2),
        (r#"{"id":1,"logits":[1,"big"],"seed":1}"#, Some("logits"), 2),
        (r#"{"id":1,"logits":7,"seed":1}"#, Some("logits"), 2),
        (r#"{"id":1,"logits":[1],"seed":-1}"#, Some("seed"), 2),
        (r#"{"id":1,"logits":[1]}"#, Some("seed"), 2),
        (
            r#"{"id":1,"logits":[1],"seed":1,"draws":1e9}"#,
            Some("draws"),
            2,
        ),
        (
            r#"{"id":1,"logits":[1],"seed":1,"top_p":"x"}"#,
            Some("top_p"),
            2,
        ),
        (
            r#"{"id":1,"logits":[1],"seed":1,"top_p":1.5}"#,
            Some("top_p"),
            2,
        ),
        (
            r#"{"id":1,"logits":[1],"seed":1,"top_k":0.5}"#,
            Some("top_k"),
            2,
        ),
        (
            r#"{"id":1,"logits":[1],"seed":1,"counts":{"x":1}}"#,
            Some("counts"),
            2,
        ),
        (
            r#"{"id":1,"logits":[1],"seed":1,"counts":{"1":-1}}"#,
            Some("counts"),
            2,
        ),
    ];
    for (bad, field, line) in cases {
        let input = format!("{good}\n{bad}\n");
        match replay_err(Law::Nucleus, &input) {
            ReplayError::Malformed {
                line: l,
                field: f,
                message,
            } => {
                assert_eq!((l, f), (line, field), "{bad}: {message}");
                assert!(message.len() > 5);
            }
            other => panic!("{bad}: unexpected {other}"),
        }
    }
}

#[test]
fn replay_output_shape() {
    let input = concat!(
        r#"{"id":"a","logits":[0,1,"-inf"],"seed":3,"draws":4}"#,
        "\n\n",
        r#"{"id":"b","logits":["nan",1],"seed":3,"draws":4}"#,
        "\n",
        r#"{"id":"c","logits":[0,1],"seed":3,"draws":2,"temperature":0}"#,
        "\n"
    );
    let mut out = Vec::new();
    let stats = replay_cases(Law::Nucleus, input.as_bytes(), &mut out).unwrap();
    assert_eq!((stats.cases, stats.errors, stats.tokens), (3, 1, 6));
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["draws"], 4);
    assert!(
        lines[0]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t != 2)
    );
    assert_eq!(
        lines[1],
        serde_json::json!({"id": "b", "error": "non_finite_logits"})
    );
    assert_eq!(
        lines[2],
        serde_json::json!({"id": "c", "tokens": [1, 1], "draws": 0})
    );
}
