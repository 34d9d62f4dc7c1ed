"""A GGUF written by gguf-py's own writer, for the Rust writer's byte-for-byte
check (`crates/gguf/src/write_tests.rs`, `matches_gguf_py_byte_for_byte`).

    tools/oracle/.venv/bin/python tools/oracle/gguf/write_reference.py

Writes `tests/fixtures/gguf/gguf_py_writer.gguf`: one key of every scalar
value type, arrays of strings, integers, floats and bools, and tensors of
F32, F16, Q8_0 (2-D and 3-D) and IQ2_XXS whose bytes are a fixed pattern
(the writer never looks inside a tensor), with gguf-py's default alignment.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "gguf" / "gguf_py_writer.gguf"


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint32) * 31) % 256 ^ seed).astype(np.uint8)


def main():
    OUT.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(OUT), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -32000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**64 - 2)
    w.add_int64("t.i64", -(2**63) + 1)
    w.add_float32("t.f32", -1.5e-7)
    w.add_float64("t.f64", 3.141592653589793)
    w.add_bool("t.bool", True)
    w.add_string("t.string", "ünïcode ｜end▁of▁sentence｜")
    w.add_array("t.strings", ["a", "", "bc"])
    w.add_key_value("t.ints", [0, 1, 2, 3, 4], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("t.floats", [1.0, -2.5], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.bools", [True, False], V.ARRAY, sub_type=V.BOOL)
    # (name, GGUF shape ne = row-major reversed, type, bytes)
    tensors = [
        ("a", (5, 3), Q.F32, 60),
        ("b.weight", (64, 2), Q.Q8_0, 136),
        ("c", (7,), Q.F16, 14),
        ("d", (256, 2), Q.IQ2_XXS, 132),
        ("e", (32, 3, 2), Q.Q8_0, 204),
    ]
    for i, (name, ne, ty, n) in enumerate(tensors):
        # gguf-py takes the row-major byte shape of a quantized tensor.
        rows = int(np.prod(ne[1:]))
        data = pattern(n, i).reshape(tuple(reversed(ne[1:])) + (n // rows,))
        w.add_tensor(name, data, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, OUT.stat().st_size)


if __name__ == "__main__":
    main()
