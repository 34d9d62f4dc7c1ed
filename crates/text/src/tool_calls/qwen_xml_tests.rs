//! Qwen3.5's XML tool calls: every piece boundary gives the same calls,
//! values are typed as vLLM's `qwen3_coder` parser types them, and cut-off
//! or malformed blocks degrade the way the reference does.

use std::sync::Arc;

use serde_json::{Value, json};

use super::qwen_xml::convert_value;
use super::testing::assemble;
use super::{ToolCallFormat, ToolCallParser, ToolSchemas};

const TWO_CALLS: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n\
    <parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n\
    </tool_call>\n<tool_call>\n<function=save_note>\n<parameter=text>\nline one\nline < two\n\
    </parameter>\n<parameter=tags>\n[\"x\", 1]\n</parameter>\n<parameter=pinned>\nTrue\n\
    </parameter>\n<parameter=score>\n2.0\n</parameter>\n</function>\n</tool_call> done";

fn schemas() -> Arc<ToolSchemas> {
    let mut s = ToolSchemas::new();
    s.insert(
        "get_weather".into(),
        json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}),
    );
    s.insert(
        "save_note".into(),
        json!({"type": "object", "properties": {
            "text": {"type": "string"}, "tags": {"type": "array"},
            "pinned": {"type": "boolean"}, "score": {"type": "number"}}}),
    );
    Arc::new(s)
}

fn run_split(text: &str, at: &[usize], typed: bool) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::with_schemas(ToolCallFormat::QwenXml, typed.then(schemas));
    let mut events = Vec::new();
    let mut last = 0;
    for &i in at.iter().chain(std::iter::once(&text.len())) {
        if text.is_char_boundary(i) && i >= last {
            events.extend(p.push(&text[last..i]));
            last = i;
        }
    }
    events.extend(p.finish());
    assemble(&events)
}

fn parsed(args: &str) -> Value {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?} is not JSON: {e}"))
}

#[test]
fn typed_calls_at_every_split() {
    let want_text = "Let me check.\n\n\n done";
    let want = vec![
        (
            "get_weather".to_string(),
            json!({"city": "Paris", "days": 3}),
        ),
        (
            "save_note".to_string(),
            json!({"text": "line one\nline < two", "tags": ["x", 1], "pinned": true, "score": 2}),
        ),
    ];
    let check = |(text, calls): (String, Vec<(String, String)>), what: &str| {
        assert_eq!(text, want_text, "{what}");
        let calls: Vec<(String, Value)> = calls.into_iter().map(|(n, a)| (n, parsed(&a))).collect();
        assert_eq!(calls, want, "{what}");
    };
    check(run_split(TWO_CALLS, &[], true), "whole");
    for i in 0..TWO_CALLS.len() {
        check(run_split(TWO_CALLS, &[i], true), &format!("split at {i}"));
    }
    let every: Vec<usize> = (0..TWO_CALLS.len()).collect();
    check(run_split(TWO_CALLS, &every, true), "char by char");
}

#[test]
fn without_schemas_every_value_is_a_string() {
    let (_, calls) = run_split(TWO_CALLS, &[], false);
    assert_eq!(
        parsed(&calls[0].1),
        json!({"city": "Paris", "days": "3"}),
        "no schema: the reference keeps the text"
    );
}

#[test]
fn arguments_stream_one_member_per_parameter() {
    let mut p = ToolCallParser::with_schemas(ToolCallFormat::QwenXml, Some(schemas()));
    let mut deltas = Vec::new();
    for piece in [
        "<tool_call>\n<function=get_",
        "weather>\n<parameter=city>\nPar",
        "is\n</parameter>\n<parameter=days>\n3",
        "\n</parameter>\n</function>\n</tool_call>",
    ] {
        for e in p.push(piece) {
            if let super::ToolEvent::Arguments { delta, .. } = e {
                deltas.push(delta);
            }
        }
    }
    assert_eq!(deltas, ["{", "\"city\": \"Paris\"", ", \"days\": 3", "}"]);
}

#[test]
fn values_are_typed_as_the_reference_types_them() {
    let props = json!({
        "s": {"type": "string"}, "e": {"type": "enum"}, "i": {"type": "integer"},
        "n": {"type": "number"}, "f": {"type": "float"}, "b": {"type": "boolean"},
        "o": {"type": "object"}, "a": {"type": "array"}, "u": {"type": ["string", "null"]},
        "x": {"description": "no type"}
    });
    let p = Some(&props);
    let cases: &[(&str, &str, Value)] = &[
        ("s", "42", json!("42")),
        ("s", "null", Value::Null),
        ("s", "NULL", Value::Null),
        ("e", "a", json!("a")),
        ("i", "42", json!(42)),
        ("i", " -7 ", json!(-7)),
        ("i", "1_000", json!(1000)),
        ("i", "4.5", json!("4.5")),
        ("i", "abc", json!("abc")),
        ("n", "2.5", json!(2.5)),
        ("n", "3.0", json!(3)),
        ("n", "1e3", json!(1000)),
        ("n", "x", json!("x")),
        ("f", "-0.25", json!(-0.25)),
        ("b", "TRUE", json!(true)),
        ("b", "false", json!(false)),
        ("b", "yes", json!(false)),
        ("o", "{\"k\": [1, 2]}", json!({"k": [1, 2]})),
        ("o", "{broken", json!("{broken")),
        ("a", "[1, \"two\"]", json!([1, "two"])),
        ("u", "{\"k\": 1}", json!({"k": 1})),
        ("u", "plain", json!("plain")),
        ("x", "7", json!("7")),
        ("unlisted", "7", json!("7")),
    ];
    for (name, raw, want) in cases {
        assert_eq!(&convert_value(raw, name, p), want, "{name} = {raw:?}");
    }
    assert_eq!(
        convert_value("7", "i", None),
        json!("7"),
        "no schema at all"
    );
}

#[test]
fn cut_off_and_malformed_calls() {
    // Cut off before the function is named: nothing was a call.
    let (text, calls) = run_split("hi <tool_call>\n<function=get_wea", &[], true);
    assert_eq!(
        (text.as_str(), calls.len()),
        ("hi <tool_call>\n<function=get_wea", 0)
    );
    // Cut off inside a value (max_tokens): the call ends with what it has,
    // the open parameter with the text so far (the reference's `$`).
    let (_, calls) = run_split(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        &[],
        true,
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(parsed(&calls[0].1), json!({"city": "Par"}));
    // Cut off inside a parameter's name: only the complete ones.
    let (_, calls) = run_split(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=da",
        &[],
        true,
    );
    assert_eq!(parsed(&calls[0].1), json!({"city": "Paris"}));
    // A parameter without its closing tag ends at the next one, and a
    // function without `</tool_call>` still closes at `</function>`.
    let (text, calls) = run_split(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\nbye",
        &[],
        true,
    );
    assert_eq!(parsed(&calls[0].1), json!({"city": "Oslo", "days": 2}));
    assert_eq!(text, "\nbye");
    // `<tool_call>` followed by something that is not a function: text.
    let (text, calls) = run_split("a <tool_call>{\"name\": \"x\"}</tool_call> b", &[], true);
    assert_eq!(calls.len(), 0);
    assert_eq!(text, "a <tool_call>{\"name\": \"x\"}</tool_call> b");
    // A call with no parameters.
    let (_, calls) = run_split(
        "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        &[],
        true,
    );
    assert_eq!(calls, vec![("now".to_string(), "{}".to_string())]);
    // Stray `<` and text between parameters are not values.
    let (_, calls) = run_split(
        "<tool_call>\n<function=get_weather>\nnoise < here\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
        &[],
        true,
    );
    assert_eq!(parsed(&calls[0].1), json!({"city": "Rome"}));
}
