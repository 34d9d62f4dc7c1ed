"""SmolLM2 (the default model) in plain torch, from its Q4_1 GGUF.

The forward is the Rust engine's llama family: RMSNorm, RoPE on interleaved
pairs (GGUF stores q/k permuted for that layout), grouped-query attention,
SwiGLU, tied output head. Weights are the GGUF's blocks dequantized exactly
(gguf_io.dequantize); activations run in bfloat16 on the GPU (teacher
distributions for distillation, not bit-exact logits: the check in
`check_teacher` bounds the difference to ds4server's own logits).
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

import gguf_io


class Config:
    def __init__(self, meta):
        self.layers = int(meta["llama.block_count"])
        self.hidden = int(meta["llama.embedding_length"])
        self.ffn = int(meta["llama.feed_forward_length"])
        self.heads = int(meta["llama.attention.head_count"])
        self.kv_heads = int(meta["llama.attention.head_count_kv"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.theta = float(meta["llama.rope.freq_base"])
        self.vocab = int(meta["llama.vocab_size"])


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def rope_tables(positions, head_dim, theta, device):
    """cos/sin `[..., head_dim/2]` for integer `positions`."""
    inv = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    ang = positions.to(torch.float64)[..., None] * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x `[B, H, T, D]`, pairs (2i, 2i+1) rotated; cos/sin `[B, 1, T, D/2]`."""
    xf = x.float()
    a, b = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


class Layer:
    """One llama decoder layer's weights (torch tensors on `device`)."""

    def __init__(self, w, cfg):
        self.w = w
        self.cfg = cfg

    def qkv(self, x, cos, sin):
        c, w = self.cfg, self.w
        B, T, _ = x.shape
        h = rms_norm(x, w["attn_norm"], c.eps)
        q = (h @ w["q"].T).view(B, T, c.heads, c.head_dim).transpose(1, 2)
        k = (h @ w["k"].T).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = (h @ w["v"].T).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, x, q, k, v, mask):
        """Residual attention + MLP given queries and the keys/values to see.
        `mask`: bool, broadcastable to `[B, H, Tq, Tk]`, True = may attend."""
        c, w = self.cfg, self.w
        B, _, T, _ = q.shape
        rep = c.heads // c.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = a.transpose(1, 2).reshape(B, T, c.heads * c.head_dim)
        x = x + a @ w["o"].T
        h = rms_norm(x, w["ffn_norm"], c.eps)
        return x + (F.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T


LAYER_NAMES = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
    "v": "attn_v.weight", "o": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
}


class Teacher:
    def __init__(self, gguf, device, dtype=torch.bfloat16):
        self.cfg = Config(gguf.meta)
        self.device, self.dtype = device, dtype

        def t(name, dt=dtype):
            return torch.from_numpy(gguf.f32(name)).to(device=device, dtype=dt)

        self.embed = t("token_embd.weight")
        self.norm = t("output_norm.weight", torch.float32)
        self.layers = []
        for i in range(self.cfg.layers):
            w = {k: t(f"blk.{i}.{n}", torch.float32 if "norm" in k else dtype)
                 for k, n in LAYER_NAMES.items()}
            self.layers.append(Layer(w, self.cfg))

    @torch.no_grad()
    def forward(self, tokens, valid=None):
        """Full sequences `[B, T]` (right-padded; `valid` `[B, T]` bool).
        Returns (pre-norm last hidden `[B, T, H]`, logits `[B, T, V]`)."""
        B, T = tokens.shape
        pos = torch.arange(T, device=self.device).expand(B, T)
        cos, sin = rope_tables(pos, self.cfg.head_dim, self.cfg.theta, self.device)
        cos, sin = cos[:, None], sin[:, None]
        mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()[None, None]
        x = self.embed[tokens]
        for layer in self.layers:
            q, k, v = layer.qkv(x, cos, sin)
            x = layer.attend(x, q, k, v, mask)
        return x, self.logits(x)

    def logits(self, x):
        return rms_norm(x, self.norm, self.cfg.eps).to(self.dtype) @ self.embed.T

    @torch.no_grad()
    def generate(self, prompts, max_new, temperature, top_p, stop_ids, seed):
        """Batched decoding with a KV cache. `prompts`: lists of ids (left
        padded here). Temperature 0 is greedy; otherwise temperature then
        nucleus (top_p) sampling. Returns the new ids of each row, stop
        token excluded, cut at the first stop."""
        c, dev = self.cfg, self.device
        g = torch.Generator(device=dev).manual_seed(seed)
        B = len(prompts)
        P = max(len(p) for p in prompts)
        L = P + max_new
        toks = torch.zeros(B, P, dtype=torch.long, device=dev)
        keyok = torch.zeros(B, L, dtype=torch.bool, device=dev)
        for i, p in enumerate(prompts):
            toks[i, P - len(p):] = torch.tensor(p, device=dev)
            keyok[i, P - len(p):P] = True
        start = (P - torch.tensor([len(p) for p in prompts], device=dev))
        kc = [torch.zeros(B, c.kv_heads, L, c.head_dim, dtype=self.dtype, device=dev) for _ in self.layers]
        vc = [torch.zeros_like(kc[0]) for _ in self.layers]
        out = torch.zeros(B, max_new, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        stops = torch.tensor(stop_ids, device=dev)
        cur, t0 = toks, 0
        for step in range(max_new + 1):
            T = cur.shape[1]
            pos = (torch.arange(t0, t0 + T, device=dev)[None] - start[:, None]).clamp(min=0)
            cos, sin = rope_tables(pos, c.head_dim, c.theta, dev)
            cos, sin = cos[:, None], sin[:, None]
            causal = torch.ones(T, t0 + T, dtype=torch.bool, device=dev).tril(t0)
            mask = causal[None] & keyok[:, None, :t0 + T]
            # every query sees itself, so a padding row never attends to
            # nothing (a NaN row would leak through its masked values)
            mask[:, torch.arange(T), t0 + torch.arange(T)] = True
            mask = mask[:, None]
            x = self.embed[cur]
            for i, layer in enumerate(self.layers):
                q, k, v = layer.qkv(x, cos, sin)
                kc[i][:, :, t0:t0 + T] = k
                vc[i][:, :, t0:t0 + T] = v
                x = layer.attend(x, q, kc[i][:, :, :t0 + T], vc[i][:, :, :t0 + T], mask)
            if step == max_new:
                break
            logits = self.logits(x[:, -1]).float()
            if temperature <= 0:
                nxt = logits.argmax(-1)
            else:
                probs = torch.softmax(logits / temperature, -1)
                sp, si = probs.sort(-1, descending=True)
                keep = (sp.cumsum(-1) - sp) < top_p
                sp = sp * keep
                nxt = si.gather(-1, torch.multinomial(sp, 1, generator=g)).squeeze(-1)
            nxt = torch.where(done, torch.zeros_like(nxt), nxt)
            out[:, step] = nxt
            keyok[:, t0 + T] = True
            done |= torch.isin(nxt, stops)
            t0 += T
            cur = nxt[:, None]
            if bool(done.all()):
                break
        res = []
        for i in range(B):
            row = out[i].tolist()
            cut = len(row)
            for j, tkn in enumerate(row):
                if tkn in stop_ids:
                    cut = j
                    break
            res.append(row[:cut])
        return res


def load(path, device):
    return Teacher(gguf_io.Gguf(path), device)
