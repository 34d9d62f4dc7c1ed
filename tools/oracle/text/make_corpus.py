"""The tokenizer test corpus, written to tests/fixtures/text/corpus.jsonl (one JSON string a line).

The corpus is hand-written here rather than in the JSONL so that escapes stay readable.
generate.py calls `write()` first, so regenerating everything stays one command.
"""
import json
import pathlib

CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's what they're doing, isn't it? We've, you'll, he'd.",
    "IT'S LOUD, THEY'RE HERE, WE'VE WON",
    "don’t use curly apostrophes’s",
    "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) { return printf(\"%d\\n\", 42) < 0; }",
    "const x = async () => { await fetch(`/api/${id}?q=1&r=2`); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<html><body><div class=\"a b\">text</div></body></html>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "    ",
    "\t\t\t",
    "\n\n\n",
    "a  b   c    d     e",
    "line1\nline2\r\nline3\rline4",
    " \t \n \t\n",
    "mixed\t \ttabs  \n\n  and spaces   ",
    "end with newline\n",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space",
    "zero\u200bwidth\u200dspace and word\u2028separator\u2029para",
    "0",
    "12345678901234567890",
    "3.14159 2,718 1e-9 -42 +7 0x1F 0b1010",
    "Phone: +1 (555) 123-4567, year 2024.",
    "①②③ circled, ⑩⑳",
    "Roman Ⅻ Ⅸ ⅳ numerals",
    "E = mc² and x³ with H₂O",
    "fullwidth ７８９ and ＡＢＣ",
    "math 𝟙𝟚𝟛 and 𝐀𝐁𝐂",
    "Arabic-Indic ٠١٢٣ and Devanagari ०१२३",
    "你好，世界！这是一个测试。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다.",
    "中文English混合mixed文本123",
    "😀😃😄 emoji",
    "family 👨‍👩‍👧‍👦 and 👩🏽‍💻 ZWJ",
    "flags 🇺🇸🇯🇵🇫🇷 and 🏳️‍🌈",
    "skin tones 👍🏻👍🏿 and keycap 1️⃣",
    "مرحبا بالعالم، هذا اختبار.",
    "العَرَبِيَّة مع التشكيل",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "क्षत्रिय ज्ञान श्री",
    "สวัสดีครับ ภาษาไทย ที่นี่",
    "Ελληνικά και Русский текст",
    "café naïve résumé Zürich",
    "e\u0301 combining acute, n\u0303",
    "<|im_start|>user\nHi<|im_end|>",
    "text with <|endoftext|> inside",
    "<|im_start|><|im_end|><|im_start|>",
    "fake <|im_startx|> and <|im_end",
    "<repo_name>ds4<file_sep>main.rs",
    "Supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "a" * 200,
    "ab" * 100,
    "!!!???...,,,;;;",
    "---===+++***",
    "https://example.com/path?query=value&other=1#frag",
    "user@example.com",
    "$100.00 €50 £30 ¥1000",
    "αβγ ∑∫∂ ≤≥≠ → ⇒ ∞",
    "\u0000null\u0001ctl\u007fdel",
    "\ufeffBOM at start",
    "🙂",
    "x\ny",
    "'s 't 're 've 'm 'll 'd",
    "''quoted'' and \"double\"",
]



def write():
    out = pathlib.Path(__file__).resolve().parents[3] / "tests/fixtures/text/corpus.jsonl"
    out.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in CORPUS), encoding="utf-8")
    print(f"{len(CORPUS)} strings -> {out}")


if __name__ == "__main__":
    write()
