"""Write tiny checkpoints as GGUF files in Hugging Face names (this
project's layout for families without a llama.cpp / ds4 GGUF layout:
docs/GGUF-LAYOUTS.md), plus the same weights dequantized to f32 as a
safetensors directory, so a test can check that the GGUF loads and gives
the logits of its own dequantized weights.

Tensor types rotate over the block types whose 32-value blocks fit each
2-D weight (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) and F16 / BF16 for the
rest, chosen by a hash of the name, so one forward exercises every type;
vectors stay F32. Quantized and dequantized with gguf-py (the NumPy
reference the dequantizer fixtures are also checked against).

    tools/oracle/.venv/bin/python tools/oracle/hf_gguf/write.py
"""

import hashlib
import json
import pathlib
import shutil

import gguf
import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures"
T = gguf.GGMLQuantizationType
BLOCK32 = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.MXFP4]
HALF = [T.F16, T.BF16]
KEY = "ds4server.hf_config"


def pick(name: str, arr: np.ndarray):
    h = int(hashlib.sha256(name.encode()).hexdigest(), 16)
    if arr.dtype != np.float32 or arr.ndim < 2:
        return None  # kept as is (f32 vectors, int64 buffers)
    if arr.shape[-1] % 32 == 0:
        return BLOCK32[h % len(BLOCK32)]
    return HALF[h % len(HALF)]


def convert(src: pathlib.Path, out_gguf: pathlib.Path, out_dir: pathlib.Path):
    config_text = (src / "config.json").read_text()
    config = json.loads(config_text)
    tensors = load_file(str(src / "model.safetensors"))
    writer = gguf.GGUFWriter(str(out_gguf), arch=config["model_type"])
    writer.add_string(KEY, config_text)
    deq = {}
    counts = {}
    for name in sorted(tensors):
        arr = tensors[name]
        ty = pick(name, arr)
        if ty is None:
            writer.add_tensor(name, arr)
            deq[name] = arr
            k = "F32" if arr.dtype == np.float32 else str(arr.dtype)
            counts[k] = counts.get(k, 0) + 1
            continue
        q = gguf.quants.quantize(arr, ty)
        writer.add_tensor(name, q, raw_dtype=ty)
        d = gguf.quants.dequantize(q, ty).astype(np.float32).reshape(arr.shape)
        deq[name] = np.ascontiguousarray(d)
        counts[ty.name] = counts.get(ty.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(config_text)
    save_file(deq, str(out_dir / "model.safetensors"))
    print(out_gguf.relative_to(ROOT), dict(sorted(counts.items())))


def main():
    out = FIX / "hf_gguf"
    out.mkdir(exist_ok=True)
    for family in ["qwen4_exp", "glm5_next"]:
        convert(
            FIX / family / "tiny_a",
            out / f"{family}_tiny_a.gguf",
            out / f"{family}_tiny_a_dequantized",
        )


if __name__ == "__main__":
    main()
