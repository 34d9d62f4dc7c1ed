//! Chat templates rendered with minijinja the way transformers renders them with Jinja2
//! (`utils/chat_template_utils.py`, `_compile_jinja_template` and `render_jinja_template`):
//!
//! * `trim_blocks=True, lstrip_blocks=True`, Jinja2's default `keep_trailing_newline=False`;
//! * transformers' `tojson` (`json.dumps` with `ensure_ascii=False`, Python separators, no HTML
//!   escaping, `indent`/`separators`/`sort_keys`), `raise_exception`, `strftime_now`;
//! * Python string/dict methods (`.strip()`, `.items()`, ...) through minijinja-contrib pycompat;
//! * the context `messages`, `tools`, `documents`, `add_generation_prompt`, `bos_token`,
//!   `eos_token`, plus any extra variables; messages carrying reasoning under `reasoning`,
//!   `thinking` or `reasoning_content` get it under `thinking` and `reasoning_content` too;
//! * `None`/`True`/`False` print as Python prints them.
//!
//! `strftime_now` uses the system time zone when jiff can find one, else UTC (Python's
//! `datetime.now()` is local time).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde_json::Value as Json;

use crate::error::{Result, TextError};

const TEMPLATE_NAME: &str = "chat_template";

/// Options for one rendering.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End with the assistant turn's opening so the model answers.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, passed to the template as `tools`.
    pub tools: Option<Vec<Json>>,
    /// Further template variables (`enable_thinking`, `documents`, ...); they override the
    /// built-in ones of the same name, as transformers' kwargs do.
    pub extra: serde_json::Map<String, Json>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// The error `raise_exception` raises, found again in the error chain after rendering.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported here, not at render time.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| TextError::TemplateSyntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TextError::TemplateSyntax(describe(&e)))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template a tokenizer ships (GGUF `tokenizer.chat_template`, HF `chat_template`), with
    /// its bos/eos text; `None` when it has no template.
    pub fn for_tokenizer(tokenizer: &crate::Tokenizer) -> Result<Option<Self>> {
        let Some(source) = tokenizer.chat_template() else {
            return Ok(None);
        };
        let text = |t: Option<&crate::SpecialToken>| t.map(|t| t.text.clone()).unwrap_or_default();
        Self::new(
            source,
            &text(tokenizer.bos_token()),
            &text(tokenizer.eos_token()),
        )
        .map(Some)
    }

    /// Renders a conversation (`[{"role": ..., "content": ...}, ...]`).
    pub fn render(&self, messages: &[Json], opts: &RenderOptions) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(alias_reasoning)
            .map(|m| to_value(&m))
            .collect();
        let tools = match &opts.tools {
            Some(tools) => Value::from(tools.iter().map(to_value).collect::<Vec<_>>()),
            None => Value::from(()),
        };
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), tools),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos_token.clone())),
            ("eos_token".into(), Value::from(self.eos_token.clone())),
        ];
        for (k, v) in &opts.extra {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k.clone(), to_value(v)));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TextError::TemplateRender(describe(&e)))?;
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| match raised(&e) {
                Some(message) => TextError::TemplateRaised(message),
                None => TextError::TemplateRender(describe(&e)),
            })
    }
}

/// A readable one-paragraph error: kind, detail, template line.
fn describe(err: &Error) -> String {
    let mut s = err.to_string();
    if let Some(line) = err.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

fn raised(err: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cur = e.source();
    }
    None
}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> std::result::Result<Value, Error> {
    let now = jiff::Zoned::now();
    jiff::fmt::strtime::format(format.as_bytes(), &now)
        .map(Value::from)
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("strftime_now({format:?}): {e}"),
            )
        })
}

/// Python prints `None`, `True`, `False`; everything else as minijinja does (no autoescape).
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), Error> {
    let text = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

/// `{"thinking": r, **message, "reasoning_content": r}` when the message carries reasoning.
fn alias_reasoning(message: &Json) -> Json {
    let Json::Object(map) = message else {
        return message.clone();
    };
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| map.get(*k).filter(|v| !v.is_null()));
    let Some(reasoning) = reasoning else {
        return message.clone();
    };
    let mut out = serde_json::Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in map {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), reasoning.clone());
    Json::Object(out)
}

/// serde_json → minijinja, keeping key order (both crates are built with `preserve_order`).
fn to_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.clone()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_pairs(map.iter().map(|(k, v)| (k.clone(), to_value(v)))),
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(
                v.as_usize()
                    .ok_or_else(|| bad("indent must be an integer or a string"))?,
            ),
        }),
    };
    // Python's defaults: (", ", ": ") without indent, (",", ": ") with it.
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(bad("separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let opts = JsonOpts {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

fn bad(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn newline(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    v: &Value,
    opts: &JsonOpts,
    depth: usize,
) -> std::result::Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).map_err(|_| bad("unsupported number"))?;
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                write_json(out, item, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, depth + 1);
                write_str(out, &key.to_string(), opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                write_json(out, &v.get_item(key)?, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push('}');
        }
        _ => return Err(bad(&format!("cannot serialize a {} value", v.kind()))),
    }
    Ok(())
}

/// Python's `repr(float)` for the common cases (`1.0`, `0.5`, `1e-05`, `inf` is `Infinity`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Python: shortest digits, exponent with sign and at least two digits.
        let s = format!("{f:e}");
        if let Some((mantissa, exp)) = s.split_once('e') {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            return format!("{mantissa}e{sign}{digits:0>2}");
        }
        return s;
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: Json, opts: &RenderOptions) -> Result<String> {
        let t = ChatTemplate::new(src, "<s>", "</s>")?;
        let messages = messages.as_array().cloned().unwrap_or_default();
        t.render(&messages, opts)
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let out = render(
            "{{ x | tojson }}|{{ x | tojson(sort_keys=true) }}|{{ y | tojson(ensure_ascii=true) }}|{{ z | tojson(separators=[',', ':']) }}",
            json!([]),
            &RenderOptions {
                extra: json!({"x": {"b": 1, "a": [1.5, null, true, "<&>"]}, "y": "é😀\u{1}", "z": {"k": [1, 2]}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                ..Default::default()
            },
        )
        .expect("renders");
        assert_eq!(
            out,
            r#"{"b": 1, "a": [1.5, null, true, "<&>"]}|{"a": [1.5, null, true, "<&>"], "b": 1}|"\u00e9\ud83d\ude00\u0001"|{"k":[1,2]}"#
        );
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
        assert_send_sync::<crate::Tokenizer>();
    }

    #[test]
    fn python_floats() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e-5), "1e-05");
        assert_eq!(python_float(1e20), "1e+20");
        assert_eq!(python_float(-2.5e-7), "-2.5e-07");
    }

    #[test]
    fn raise_exception_message_reaches_the_user() {
        let err = render(
            "{{ raise_exception('no system role, sorry') }}",
            json!([]),
            &RenderOptions::default(),
        )
        .expect_err("raises");
        assert!(
            matches!(&err, TextError::TemplateRaised(m) if m == "no system role, sorry"),
            "{err:?}"
        );
    }

    #[test]
    fn syntax_errors_are_reported_at_compile_time() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").expect_err("unclosed for");
        assert!(matches!(err, TextError::TemplateSyntax(_)), "{err:?}");
    }

    #[test]
    fn python_literals_and_reasoning_aliases() {
        let out = render(
            "{{ none_var }} {{ t }} {{ f }} {% for m in messages %}{{ m.thinking }}/{{ m.reasoning_content }}{% endfor %}",
            json!([{"role": "assistant", "content": "x", "reasoning": "hmm"}]),
            &RenderOptions {
                extra: json!({"none_var": null, "t": true, "f": false}).as_object().cloned().unwrap_or_default(),
                ..Default::default()
            },
        )
        .expect("renders");
        assert_eq!(out, "None True False hmm/hmm");
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let out = render(
            "{{ strftime_now('%Y-%m-%d') }}",
            json!([]),
            &RenderOptions::default(),
        )
        .expect("renders");
        assert_eq!(out.len(), 10, "{out}");
        assert!(out.starts_with("20"), "{out}");
    }
}
