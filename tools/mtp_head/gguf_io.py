"""GGUF v3 reading (metadata, F32/F16/Q8_0/Q4_1 tensors) and writing.

Only what the SmolLM2 default model and the MTP head file use. Layout from
ggml's `gguf.md`: header, metadata key/values, tensor infos (name, dims in
ggml order -- fastest first --, type, offset), alignment padding, data.
Dequantization follows ggml exactly: Q8_0 blocks are (f16 d, 32 x i8 q),
x = d * q; Q4_1 blocks are (f16 d, f16 m, 16 bytes of nibbles), element j < 16
is the low nibble of byte j, element j >= 16 the high nibble of byte j - 16,
x = d * u + m.
"""

import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
T_F32, T_F16, T_Q4_1, T_Q8_0, T_I32 = 0, 1, 3, 8, 26
BLOCK = {T_Q4_1: (32, 20), T_Q8_0: (32, 34)}

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
          F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


class Reader:
    def __init__(self, buf):
        self.b = buf
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = bytes(self.b[self.o:self.o + n]).decode("utf-8", errors="replace")
        self.o += n
        return s

    def value(self, t):
        if t == STR:
            return self.string()
        if t == ARR:
            et = self.take("<I")
            n = self.take("<Q")
            if et in SCALAR and et != BOOL:
                dt = np.dtype(SCALAR[et])
                a = np.frombuffer(self.b, dtype=dt, count=n, offset=self.o)
                self.o += n * dt.itemsize
                return a
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


class Gguf:
    """A GGUF file in memory: `meta` (dict) and `tensors` (name -> (type, shape, bytes))."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        r = Reader(self.buf)
        if bytes(self.buf[:4]) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        r.o = 4
        version = r.take("<I")
        if version != 3:
            raise ValueError(f"{path}: GGUF version {version}, expected 3")
        n_tensors = r.take("<Q")
        n_kv = r.take("<Q")
        self.meta = {}
        for _ in range(n_kv):
            k = r.string()
            t = r.take("<I")
            self.meta[k] = r.value(t)
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.take("<I")
            dims = [r.take("<Q") for _ in range(nd)]
            t = r.take("<I")
            off = r.take("<Q")
            infos.append((name, dims, t, off))
        align = int(self.meta.get("general.alignment", 32))
        start = (r.o + align - 1) // align * align
        self.tensors = {}
        for name, dims, t, off in infos:
            shape = tuple(reversed(dims))  # row-major: last ggml dim first
            n = int(np.prod(dims))
            if t in BLOCK:
                bs, bb = BLOCK[t]
                size = n // bs * bb
            elif t in (T_F32, T_I32):
                size = 4 * n
            elif t == T_F16:
                size = 2 * n
            else:
                raise ValueError(f"{name}: ggml type {t} not supported here")
            raw = memoryview(self.buf)[start + off:start + off + size]
            self.tensors[name] = (t, shape, raw)

    def raw(self, name):
        return self.tensors[name]

    def f32(self, name):
        """The tensor dequantized to a float32 array of its row-major shape."""
        t, shape, raw = self.tensors[name]
        return dequantize(t, raw, shape)


def dequantize(t, raw, shape):
    n = int(np.prod(shape))
    if t == T_F32:
        return np.frombuffer(raw, dtype="<f4", count=n).reshape(shape).copy()
    if t == T_F16:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32).reshape(shape)
    if t == T_I32:
        return np.frombuffer(raw, dtype="<i4", count=n).reshape(shape).copy()
    if t == T_Q8_0:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 34)
        d = b[:, :2].copy().view("<f2").astype(np.float32)
        q = b[:, 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    if t == T_Q4_1:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 20)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        m = b[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = b[:, 4:]
        u = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * u + m).reshape(shape)
    raise ValueError(f"ggml type {t}")


def quantize_q8_0(x):
    """ggml's reference Q8_0: d = max|x| / 127 (as f16), q = round(x / d)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_1(x):
    """ggml's reference Q4_1 (`quantize_row_q4_1_ref`): per block of 32,
    m = min, d = (max - min) / 15, u = min(15, trunc((x - min) / d + 0.5))
    with the f32 d; d and m stored as f16 (the dequantization reads those)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15.0)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), 0).astype(np.float32)
    u = np.minimum(15, ((x - lo) * inv + np.float32(0.5)).astype(np.int32)).astype(np.uint8)
    out = np.empty((x.shape[0], 20), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = lo.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 4:] = u[:, :16] | (u[:, 16:] << 4)
    return out.tobytes()


def meta_items(g):
    """`g.meta` as `write`'s (key, type, value) list (alignment left to
    `write`): strings, integers as U32, floats as F32."""
    meta = []
    for k, v in g.meta.items():
        if k == "general.alignment":
            continue
        if isinstance(v, str):
            meta.append((k, STR, v))
        elif isinstance(v, int):
            meta.append((k, U32, v))
        elif isinstance(v, float):
            meta.append((k, F32, v))
        else:
            raise ValueError(f"{k}: metadata type not handled")
    return meta


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write(path, meta, tensors, align=32):
    """`meta`: list of (key, type, value) with type in {STR, U32, F32};
    `tensors`: list of (name, ggml type, row-major shape, bytes)."""
    out = bytearray(GGUF_MAGIC + struct.pack("<IQQ", 3, len(tensors), len(meta) + 1))
    out += _str("general.alignment") + struct.pack("<II", U32, align)
    for k, t, v in meta:
        out += _str(k) + struct.pack("<I", t)
        out += _str(v) if t == STR else struct.pack(SCALAR[t], v)
    off = 0
    offsets = []
    for name, t, shape, data in tensors:
        offsets.append(off)
        dims = list(reversed(shape))
        out += _str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, off)
        off += (len(data) + align - 1) // align * align
    out += b"\0" * ((-len(out)) % align)
    for (_, _, _, data), o in zip(tensors, offsets):
        out += data
        out += b"\0" * ((-len(data)) % align)
    with open(path, "wb") as f:
        f.write(out)
