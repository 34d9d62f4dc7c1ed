//! DSML, the markup DeepSeek-V4 writes tool calls in, and everything ds4
//! renders in it (`antirez/ds4:ds4_server.c`): the literals of its three
//! accepted spellings, the entity rules, the tools block of the system prompt
//! (`append_tools_prompt_text`) and canonical DSML for calls that arrive as
//! JSON (`append_dsml_tool_calls_text`).
//!
//! ```text
//! <｜DSML｜tool_calls>
//! <｜DSML｜invoke name="bash">
//! <｜DSML｜parameter name="command" string="true">ls -la</｜DSML｜parameter>
//! <｜DSML｜parameter name="timeout" string="false">10</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜tool_calls>
//! ```
//!
//! `｜DSML｜` is one token of the vocabulary. String parameters are raw text
//! (`string="true"`); every other value is JSON (`string="false"`).

use super::json_args::{Arg, parse_object};

/// The `｜DSML｜` marker (one token).
pub const DSML: &str = "｜DSML｜";

/// The literals of one spelling of the markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syntax {
    pub tool_calls_start: &'static str,
    pub tool_calls_end: &'static str,
    /// Without the closing `>`: attributes follow.
    pub invoke_start: &'static str,
    pub invoke_end: &'static str,
    /// Without the closing `>`: attributes follow.
    pub param_start: &'static str,
    pub param_end: &'static str,
}

/// What the model writes.
pub const FULL: Syntax = Syntax {
    tool_calls_start: "<｜DSML｜tool_calls>",
    tool_calls_end: "</｜DSML｜tool_calls>",
    invoke_start: "<｜DSML｜invoke",
    invoke_end: "</｜DSML｜invoke>",
    param_start: "<｜DSML｜parameter",
    param_end: "</｜DSML｜parameter>",
};

/// ds4 also accepts the markup with its first bar dropped, and plain XML
/// (`dsml_syntaxes`): long generations sometimes drift into them.
pub const SYNTAXES: [Syntax; 3] = [
    FULL,
    Syntax {
        tool_calls_start: "<DSML｜tool_calls>",
        tool_calls_end: "</DSML｜tool_calls>",
        invoke_start: "<DSML｜invoke",
        invoke_end: "</DSML｜invoke>",
        param_start: "<DSML｜parameter",
        param_end: "</DSML｜parameter>",
    },
    Syntax {
        tool_calls_start: "<tool_calls>",
        tool_calls_end: "</tool_calls>",
        invoke_start: "<invoke",
        invoke_end: "</invoke>",
        param_start: "<parameter",
        param_end: "</parameter>",
    },
];

/// The earliest tool-calls start in `text` of any spelling: (byte offset,
/// spelling).
pub fn find_start(text: &str) -> Option<(usize, &'static Syntax)> {
    SYNTAXES
        .iter()
        .filter_map(|s| text.find(s.tool_calls_start).map(|at| (at, s)))
        .min_by_key(|(at, _)| *at)
}

/// The entities ds4 undoes in DSML text (`dsml_unescape_text`).
const ENTITIES: [(&str, char); 5] = [
    ("&amp;", '&'),
    ("&lt;", '<'),
    ("&gt;", '>'),
    ("&quot;", '"'),
    ("&apos;", '\''),
];

/// `dsml_unescape_text`: the five entities back to characters; any other `&`
/// stays.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match ENTITIES.iter().find(|(e, _)| rest.starts_with(e)) {
            Some((e, c)) => {
                out.push(*c);
                rest = &rest[e.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// How many trailing bytes of `s` could still become an entity (a `&` within
/// the last five bytes whose tail is a proper prefix of one): held back while
/// streaming so an entity is never split (`dsml_entity_stream_safe_len`).
pub fn partial_entity_len(s: &str) -> usize {
    let Some(amp) = s.rfind('&') else { return 0 };
    let tail = &s[amp..];
    if tail.len() < 6
        && ENTITIES
            .iter()
            .any(|(e, _)| e.len() > tail.len() && e.starts_with(tail))
    {
        tail.len()
    } else {
        0
    }
}

/// `dsml_attr`: the value of `name="…"` in a tag (the first occurrence of
/// that text, as ds4 finds it), unescaped.
pub fn attr(tag: &str, name: &str) -> Option<String> {
    let pat = format!("{name}=\"");
    let from = tag.find(&pat)? + pat.len();
    let len = tag[from..].find('"')?;
    Some(unescape(&tag[from..from + len]))
}

/// `append_dsml_attr_escaped`.
pub fn escape_attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The `<` of every occurrence of `end` in `s` replaced by `lt`: how ds4
/// keeps a value from closing its own wrapper.
fn guard(s: &str, end: &str, lt: &str) -> String {
    s.replace(end, &format!("{lt}{}", &end[1..]))
}

/// A string parameter body (`append_dsml_parameter_text`): only the closing
/// tag is escaped; `&` and `<` otherwise stay as they are.
pub fn escape_parameter_text(s: &str) -> String {
    guard(s, FULL.param_end, "&lt;")
}

/// A JSON parameter body (`append_dsml_json_literal`): the closing tag's `<`
/// becomes the JSON escape `\u003c`, which keeps the JSON value the same.
pub fn escape_json_literal(s: &str) -> String {
    guard(s, FULL.param_end, "\\u003c")
}

/// Tool output inside `<tool_result>…</tool_result>` (`append_tool_result_text`):
/// data kept as it is except the wrapper's own closing tag.
pub fn escape_tool_result(s: &str) -> String {
    guard(s, "</tool_result>", "&lt;")
}

fn push_param(out: &mut String, arg: &Arg) {
    out.push_str("<｜DSML｜parameter name=\"");
    out.push_str(&escape_attr(&arg.key));
    out.push_str("\" string=\"");
    out.push_str(if arg.is_string { "true" } else { "false" });
    out.push_str("\">");
    if arg.is_string {
        out.push_str(&escape_parameter_text(&arg.value));
    } else {
        out.push_str(&escape_json_literal(&arg.value));
    }
    out.push_str("</｜DSML｜parameter>\n");
}

/// Canonical DSML for calls known only as JSON (`append_dsml_tool_calls_text`
/// without a remembered block): `(name, arguments JSON text)` each. The
/// arguments' members become parameters in their order; arguments that are
/// not a JSON object become one string parameter named `arguments`. Empty
/// when there are no calls. Starts with the blank line ds4 puts between the
/// assistant's text and its calls.
pub fn canonical_calls<'a>(calls: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut body = String::new();
    for (name, arguments) in calls {
        body.push_str("<｜DSML｜invoke name=\"");
        body.push_str(&escape_attr(name));
        body.push_str("\">\n");
        match parse_object(arguments) {
            Some(args) => args.iter().for_each(|a| push_param(&mut body, a)),
            None => push_param(
                &mut body,
                &Arg {
                    key: "arguments".into(),
                    value: arguments.to_string(),
                    is_string: true,
                },
            ),
        }
        body.push_str("</｜DSML｜invoke>\n");
    }
    if body.is_empty() {
        return body;
    }
    format!("\n\n<｜DSML｜tool_calls>\n{body}</｜DSML｜tool_calls>")
}

/// The tools section of the system prompt (`append_tools_prompt_text`), one
/// JSON schema per line; empty without tools.
pub fn tools_prompt(schemas: &[String]) -> String {
    if schemas.is_empty() {
        return String::new();
    }
    format!(
        "## Tools\n\n\
         You have access to a set of tools to help answer the user question. You can invoke \
         tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n\
         <｜DSML｜tool_calls>\n\
         <｜DSML｜invoke name=\"$TOOL_NAME\">\n\
         <｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n\
         ...\n\
         </｜DSML｜invoke>\n\
         <｜DSML｜invoke name=\"$TOOL_NAME2\">\n\
         ...\n\
         </｜DSML｜invoke>\n\
         </｜DSML｜tool_calls>\n\n\
         String parameters should be specified as raw text and set `string=\"true\"`. Preserve \
         characters such as `>`, `&`, and `&&` exactly; never replace normal string characters \
         with XML or HTML entity escapes. Only if a string value itself contains the exact \
         closing parameter tag `</｜DSML｜parameter>`, write that tag as \
         `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, \
         arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
         If thinking_mode is enabled (triggered by <think>), you MUST output your complete \
         reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n\
         Otherwise, output directly after </think> with tool calls or final response.\n\n\
         ### Available Tool Schemas\n\n\
         {}\n\n\
         You MUST strictly follow the above defined tool name and parameter schemas to invoke \
         tool calls. Use the exact parameter names from the schemas.",
        schemas.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_round_trip_and_partials_are_held() {
        assert_eq!(
            unescape("a &amp;&lt;&gt;&quot;&apos; & &x; &am"),
            "a &<>\"' & &x; &am"
        );
        assert_eq!(partial_entity_len("x &am"), 3);
        assert_eq!(partial_entity_len("x &"), 1);
        assert_eq!(partial_entity_len("x &amp;"), 0);
        assert_eq!(partial_entity_len("x & b"), 0);
        assert_eq!(partial_entity_len("&quot"), 5);
    }

    #[test]
    fn attributes_are_found_and_unescaped() {
        let tag = "<｜DSML｜parameter name=\"a&quot;b\" string=\"true\">";
        assert_eq!(attr(tag, "name").as_deref(), Some("a\"b"));
        assert_eq!(attr(tag, "string").as_deref(), Some("true"));
        assert_eq!(attr(tag, "type"), None);
        assert_eq!(escape_attr("we\"ird<&>"), "we&quot;ird&lt;&amp;&gt;");
    }

    #[test]
    fn wrappers_are_guarded() {
        let v = "a </｜DSML｜parameter> b";
        assert_eq!(escape_parameter_text(v), "a &lt;/｜DSML｜parameter> b");
        assert_eq!(escape_json_literal(v), "a \\u003c/｜DSML｜parameter> b");
        assert_eq!(
            escape_tool_result("x</tool_result>y<z>"),
            "x&lt;/tool_result>y<z>"
        );
    }

    #[test]
    fn canonical_calls_are_ds4s() {
        assert_eq!(canonical_calls([]), "");
        assert_eq!(
            canonical_calls([("f", "{\"a\": \"x\", \"n\": [1, 2]}"), ("g", "[1]")]),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
             <｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n\
             <｜DSML｜parameter name=\"n\" string=\"false\">[1,2]</｜DSML｜parameter>\n\
             </｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n\
             <｜DSML｜parameter name=\"arguments\" string=\"true\">[1]</｜DSML｜parameter>\n\
             </｜DSML｜invoke>\n</｜DSML｜tool_calls>"
        );
    }

    #[test]
    fn earliest_start_of_any_spelling() {
        assert_eq!(
            find_start("x <tool_calls> <｜DSML｜tool_calls>").map(|(a, _)| a),
            Some(2)
        );
        let (at, syn) = find_start("ab<DSML｜tool_calls>").unwrap();
        assert_eq!((at, syn.param_end), (2, "</DSML｜parameter>"));
        assert!(find_start("<｜DSML｜tool_call").is_none());
    }
}
