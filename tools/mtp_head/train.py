"""Steps 2-4 (GPU): generate the training replies, self-distil the MTP
head, evaluate it on the held-out split, write the head file.

    python train.py MODEL.gguf PROMPTS.json OUTDIR [--steps N] [--subset S] ...

The head (what crates/engine/src/families/llama/mtp.rs runs): row p reads
the trunk's last hidden of position p (before the final norm) and the token
at p + 1, and predicts the token at p + 2:

    x = eh_proj . [ enorm(embed(tok_{p+1})) | hnorm(h_p) ]
    x = decoder_layer(x)            (its own KV cache; RoPE at position p)
    logits_S = embed[S] . norm(x)   (the tied head, rows of the subset S)

Depth d > 1 feeds the previous depth's x (before the norm) in place of h_p.
Training is self-distillation: the target of row p is the teacher's own
next-token distribution at position p + 1 (temperature 1), restricted to S;
loss = cross-entropy of the head's distribution over S against it, summed
over depths 1..3 (weights 1, 1/2, 1/4). A depth-d row p attends to the
depth-1 rows up to p - d + 1 and to its own chain's rows, exactly the
history the decode loop builds (true rows, then the drafts of this cycle).
"""

import argparse
import hashlib
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import gguf_io
import teacher as T

PAD = 2  # <|im_end|>: never a loss target here (masked)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---------------------------------------------------------------- data


def generate(teach, prompts, seeds, batch, max_new):
    """Replies to every prompt: greedy once, then sampled (T=0.7,
    top_p=0.95) once per seed. Returns [{split, kind, prompt_len, ids,
    mode}]."""
    out = []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]["ids"]))
    for mode in ["greedy"] + [f"t0.7-s{s}" for s in seeds]:
        temp = 0.0 if mode == "greedy" else 0.7
        seed = 0 if mode == "greedy" else int(mode.split("-s")[1])
        t0 = time.time()
        ntok = 0
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            reps = teach.generate([prompts[i]["ids"] for i in idx], max_new, temp, 0.95,
                                  [0, 2], seed + b)
            for i, r in zip(idx, reps):
                p = prompts[i]
                out.append({"split": p["split"], "kind": p["kind"], "mode": mode,
                            "prompt_len": len(p["ids"]), "ids": p["ids"] + r + [2]})
                ntok += len(r)
        log(f"generated {mode}: {ntok} reply tokens in {time.time() - t0:.1f}s")
    return out


def batches(seqs, bsz, max_len, rng):
    """Right-padded batches: tokens, valid mask, loss mask (reply region;
    every position of plain text)."""
    order = rng.permutation(len(seqs))
    for b in range(0, len(order) - bsz + 1, bsz):
        yield pad([seqs[i] for i in order[b:b + bsz]], max_len)


def pad(group, max_len):
    L = min(max_len, max(len(s["ids"]) for s in group))
    toks = np.full((len(group), L), PAD, dtype=np.int64)
    lossm = np.zeros((len(group), L), dtype=bool)
    for j, s in enumerate(group):
        ids = s["ids"][:L]
        toks[j, :len(ids)] = ids
        # row p predicts token p + 2; keep rows whose target lies in the
        # reply (or anywhere in plain text)
        first = max(0, s.get("prompt_len", 0) - 2)
        lossm[j, first:len(ids) - 2] = True
    return torch.from_numpy(toks), torch.from_numpy(lossm)


# ---------------------------------------------------------------- head


class Head(torch.nn.Module):
    def __init__(self, teach, subset):
        super().__init__()
        c = teach.cfg
        self.cfg = c
        last = teach.layers[-1].w
        P = torch.nn.Parameter
        self.enorm = P(torch.ones(c.hidden, device=teach.device))
        self.hnorm = P(torch.ones(c.hidden, device=teach.device))
        eh = torch.zeros(c.hidden, 2 * c.hidden, device=teach.device)
        eh[:, :c.hidden] = torch.randn(c.hidden, c.hidden, device=teach.device) / math.sqrt(c.hidden)
        eh[:, c.hidden:] = torch.eye(c.hidden, device=teach.device)
        self.eh = P(eh)
        # warm start: the trunk's last layer and final norm
        self.w = torch.nn.ParameterDict({k: P(v.detach().float().clone()) for k, v in last.items()})
        self.norm = P(teach.norm.detach().float().clone())
        self.register_buffer("subset", subset)
        self.layer = T.Layer(self.w, c)

    def inputs(self, emb, hidden):
        c = self.cfg
        e = T.rms_norm(emb.float(), self.enorm, c.eps)
        h = T.rms_norm(hidden.float(), self.hnorm, c.eps)
        return torch.cat([e, h], -1) @ self.eh.T

    def logits(self, x, table):
        return T.rms_norm(x, self.norm, self.cfg.eps) @ table.T


def depth_mask(L, d, device):
    """Depth-d query p sees depth-1 keys j <= p - d + 1 and depth-k keys at
    p - d + k (k = 2..d): `[L, d*L]` bool."""
    p = torch.arange(L, device=device)
    parts = [torch.arange(L, device=device)[None, :] <= (p - d + 1)[:, None]]
    for k in range(2, d + 1):
        parts.append(torch.arange(L, device=device)[None, :] == (p - d + k)[:, None])
    m = torch.cat(parts, 1)
    m[torch.arange(L), (d - 1) * L + torch.arange(L)] = True  # itself (first rows)
    return m


def head_forward(head, teach, toks, hidden, depths):
    """Head outputs x for depths 1..depths: list of `[B, L, H]`."""
    B, L = toks.shape
    c = teach.cfg
    dev = toks.device
    pos = torch.arange(L, device=dev).expand(B, L)
    cos, sin = T.rope_tables(pos, c.head_dim, c.theta, dev)
    cos, sin = cos[:, None], sin[:, None]
    nxt = torch.cat([toks[:, 1:], toks[:, -1:]], 1)  # token at p + 1
    emb = teach.embed[nxt]
    outs, ks, vs = [], [], []
    prev = hidden
    for d in range(1, depths + 1):
        x = head.inputs(emb, prev)
        q, k, v = head.layer.qkv(x, cos, sin)
        ks.append(k)
        vs.append(v)
        mask = depth_mask(L, d, dev)[None, None]
        x = head.layer.attend(x, q, torch.cat(ks, 2), torch.cat(vs, 2), mask)
        outs.append(x)
        # depth d + 1 at row p reads depth d's output at row p - 1
        prev = torch.cat([x[:, :1], x[:, :-1]], 1)
    return outs


def run_batch(head, teach, toks, lossm, depths, weights, train=True, with_stats=True):
    """Loss of one batch, and per depth (rows, greedy hits, T = 0.7
    acceptance, subset mass, cross-entropy) when `with_stats`: those cost
    full-vocabulary softmaxes and host syncs, so training asks for them only
    on the steps it logs (the loss is the same either way)."""
    toks, lossm = toks.to(teach.device), lossm.to(teach.device)
    B, L = toks.shape
    with torch.no_grad():
        hidden, tlog = teach.forward(toks)
        # target of row p: teacher row p + 1
        tgt = torch.cat([tlog[:, 1:], tlog[:, -1:]], 1).float()
        p_full = torch.softmax(tgt, -1)
        p_sub = p_full[..., head.subset]
        t_arg = tgt.argmax(-1)
    table = teach.embed[head.subset].float()
    with torch.autocast(teach.device.type, dtype=torch.bfloat16):
        outs = head_forward(head, teach, toks, hidden.float(), depths)
    loss = 0.0
    stats = []
    for d, x in enumerate(outs, 1):
        # depth d row p is valid when its chain start p - d + 1 >= 0
        m = lossm.clone()
        m[:, :d - 1] = False
        z = head.logits(x.float(), table)
        logq = torch.log_softmax(z, -1)
        ce = -(p_sub * logq).sum(-1)
        loss = loss + weights[d - 1] * (ce * m).sum() / m.sum().clamp(min=1)
        if not with_stats:
            continue
        with torch.no_grad():
            n = m.sum().item()
            greedy = ((head.subset[z.argmax(-1)] == t_arg) & m).sum().item()
            # sampled acceptance at T = 0.7: sum min(p, q) over the subset
            p7 = torch.softmax(tgt / 0.7, -1)[..., head.subset]
            q7 = torch.softmax(z / 0.7, -1)
            acc7 = (torch.minimum(p7, q7).sum(-1) * m).sum().item()
            mass = (p_sub.sum(-1) * m).sum().item()
            stats.append((n, greedy, acc7, mass, (ce * m).sum().item()))
    return loss, stats


def load_head(path, teach):
    """A head file as written by `export` (Q8_0 weights dequantized), to
    evaluate an earlier head on this run's held-out data."""
    g = gguf_io.Gguf(path)
    dev = teach.device

    def t(name):
        return torch.from_numpy(g.f32(name)).to(dev)

    subset = t("mtp.vocab_subset").round().long()
    head = Head(teach, subset)
    with torch.no_grad():
        head.enorm.copy_(t("mtp.enorm.weight"))
        head.hnorm.copy_(t("mtp.hnorm.weight"))
        head.eh.copy_(t("mtp.eh_proj.weight"))
        head.norm.copy_(t("mtp.output_norm.weight"))
        for k, n in T.LAYER_NAMES.items():
            head.w[k].copy_(t(f"mtp.{n}"))
    return head


def evaluate(head, teach, evals, a, weights):
    """Held-out acceptance per depth (teacher-forced chains)."""
    head.eval()
    tot = np.zeros((a.depths, 5))
    with torch.no_grad():
        for b in range(0, len(evals), a.batch):
            toks, lossm = pad(evals[b:b + a.batch], a.max_len)
            _, st = run_batch(head, teach, toks, lossm, a.depths, weights, train=False)
            tot += np.array(st)
    return [{"depth": d + 1, "rows": int(t[0]), "greedy_accept": t[1] / t[0],
             "t0.7_accept": t[2] / t[0], "teacher_mass_in_subset": t[3] / t[0],
             "cross_entropy": t[4] / t[0]} for d, t in enumerate(tot)]


# ---------------------------------------------------------------- export


def export(path, head, gguf, subset, meta):
    def q8(t):
        return gguf_io.quantize_q8_0(t.detach().float().cpu().numpy())

    def f32(t):
        return t.detach().float().cpu().numpy().astype("<f4").tobytes()

    H = head.cfg.hidden
    w = head.w
    S = len(subset)
    t_emb, shape, raw = gguf.raw("token_embd.weight")
    assert t_emb == gguf_io.T_Q8_0 and shape[1] % 32 == 0
    row = shape[1] // 32 * 34
    rows = b"".join(bytes(raw[i * row:(i + 1) * row]) for i in subset.tolist())
    tensors = [
        ("mtp.enorm.weight", gguf_io.T_F32, (H,), f32(head.enorm)),
        ("mtp.hnorm.weight", gguf_io.T_F32, (H,), f32(head.hnorm)),
        ("mtp.eh_proj.weight", gguf_io.T_Q8_0, (H, 2 * H), q8(head.eh)),
        ("mtp.attn_norm.weight", gguf_io.T_F32, (H,), f32(w["attn_norm"])),
        ("mtp.attn_q.weight", gguf_io.T_Q8_0, tuple(w["q"].shape), q8(w["q"])),
        ("mtp.attn_k.weight", gguf_io.T_Q8_0, tuple(w["k"].shape), q8(w["k"])),
        ("mtp.attn_v.weight", gguf_io.T_Q8_0, tuple(w["v"].shape), q8(w["v"])),
        ("mtp.attn_output.weight", gguf_io.T_Q8_0, tuple(w["o"].shape), q8(w["o"])),
        ("mtp.ffn_norm.weight", gguf_io.T_F32, (H,), f32(w["ffn_norm"])),
        ("mtp.ffn_gate.weight", gguf_io.T_Q8_0, tuple(w["gate"].shape), q8(w["gate"])),
        ("mtp.ffn_up.weight", gguf_io.T_Q8_0, tuple(w["up"].shape), q8(w["up"])),
        ("mtp.ffn_down.weight", gguf_io.T_Q8_0, tuple(w["down"].shape), q8(w["down"])),
        ("mtp.output_norm.weight", gguf_io.T_F32, (H,), f32(head.norm)),
        # ids as f32 (exact below 2^24): candle reads no I32 GGUF tensors
        ("mtp.vocab_subset", gguf_io.T_F32, (S,), np.asarray(subset.cpu(), dtype="<f4").tobytes()),
        # the tied output head's rows for the subset, the trunk's Q8_0
        # blocks copied byte for byte
        ("mtp.output_subset.weight", gguf_io.T_Q8_0, (S, shape[1]), rows),
    ]
    gguf_io.write(path, meta, tensors)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--max-new", type=int, default=320)
    ap.add_argument("--subset", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--depths", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=300.0,
                    help="seconds of training at most in this invocation")
    ap.add_argument("--train-seconds", type=float, default=0.0,
                    help="total training seconds over all invocations (the cosine schedule's "
                         "length; 0: schedule by --steps, as the first shipped head was trained)")
    ap.add_argument("--state", default=None,
                    help="directory that keeps the replies and a checkpoint between invocations: "
                         "a run that stops before --train-seconds is resumed by the same command")
    ap.add_argument("--eval-modes", default="greedy,t0.7-s1,t0.7-s2,t0.7-s3,text",
                    help="reply modes of the eval split that the held-out evaluation reads")
    ap.add_argument("--wall-budget", type=float, default=0.0,
                    help="seconds this invocation may run in all (generation included); training "
                         "stops in time to write the checkpoint (0: no limit)")
    ap.add_argument("--init-head", default=None,
                    help="start from this head file (e.g. the shipped one) instead of the "
                         "trunk's last layer")
    ap.add_argument("--compare-head", default=None,
                    help="an earlier head file, evaluated on the same held-out rows")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for the smoke run")
    ap.add_argument("--ref-logits", default=None)
    ap.add_argument("--max-ppl", type=float, default=0.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    t_all = time.time()
    g = gguf_io.Gguf(a.model)
    teach = T.Teacher(g, dev)
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    log(f"teacher loaded: {gpu}")
    data = json.load(open(a.prompts))

    if a.ref_logits:
        ref = np.load(a.ref_logits)
        ids = torch.tensor(ref["tokens"], device=dev)[None]
        _, lg = teach.forward(ids)
        lg = lg[0].float().cpu().numpy()
        agree = float((lg.argmax(-1) == ref["logits"].argmax(-1)).mean())
        err = float(np.abs(lg - ref["logits"]).max())
        log(f"teacher vs ds4server logits: top-1 agreement {agree:.3f}, max |diff| {err:.3f}")
        if agree < 0.9:
            raise SystemExit("teacher disagrees with ds4server: stopping")

    # sanity: the teacher's perplexity on the public-domain text (a wrong
    # RoPE layout or dequantization shows up as a perplexity in the hundreds)
    nll, cnt = 0.0, 0
    for t in data["text"]:
        ids = torch.tensor(t["ids"], device=dev)[None]
        _, lg = teach.forward(ids)
        lp = torch.log_softmax(lg[0, :-1].float(), -1)
        nll -= lp.gather(-1, ids[0, 1:, None]).sum().item()
        cnt += ids.shape[1] - 1
    ppl = math.exp(nll / max(cnt, 1))
    log(f"teacher perplexity on the public-domain text: {ppl:.2f}")
    if a.max_ppl and ppl > a.max_ppl:
        raise SystemExit("teacher perplexity too high: stopping")

    seqs_path = os.path.join(a.state, "seqs.json") if a.state else None
    if seqs_path and os.path.exists(seqs_path):
        seqs = json.load(open(seqs_path))
        log(f"replies read from {seqs_path}: {len(seqs)} sequences")
    else:
        seqs = generate(teach, data["prompts"], [int(s) for s in a.seeds.split(",")], a.gen_batch,
                        a.max_new)
        if seqs_path:
            os.makedirs(a.state, exist_ok=True)
            json.dump(seqs, open(seqs_path + ".tmp", "w"))
            os.replace(seqs_path + ".tmp", seqs_path)
    for t in data["text"]:
        # plain text in windows of max_len
        ids = t["ids"]
        seqs.append({"split": t["split"], "kind": "text", "mode": "text", "prompt_len": 0, "ids": ids})
    train = [s for s in seqs if s["split"] == "train"]
    eval_modes = set(a.eval_modes.split(","))
    evals = [s for s in seqs if s["split"] == "eval" and s["mode"] in eval_modes]
    with open(os.path.join(a.out, "replies_sample.txt"), "w") as f:
        for s in seqs[:3]:
            f.write(json.dumps(s) + "\n")

    # the subset: tokens ranked by how often the model emits them in the
    # training replies (ties to the lower id)
    counts = np.zeros(teach.cfg.vocab, dtype=np.int64)
    for s in train:
        np.add.at(counts, np.asarray(s["ids"][s["prompt_len"]:]), 1)
    rank = np.lexsort((np.arange(teach.cfg.vocab), -counts))
    ev = np.zeros(teach.cfg.vocab, dtype=np.int64)
    for s in evals:
        np.add.at(ev, np.asarray(s["ids"][s["prompt_len"]:]), 1)
    cover = {S: float(ev[rank[:S]].sum() / ev.sum()) for S in (1024, 2048, 4096, 8192, 16384)}
    log(f"eval reply tokens covered by the top-S training tokens: {cover}")
    subset = torch.tensor(np.sort(rank[:a.subset]), device=dev)
    ntrain = sum(len(s["ids"]) for s in train)
    neval = sum(len(s["ids"]) for s in evals)
    log(f"train: {len(train)} sequences, {ntrain} tokens; eval: {len(evals)} sequences, {neval} tokens")

    if a.init_head:
        # go on from an earlier head (its weights, dequantized from Q8_0,
        # and its own vocabulary subset) instead of the warm start
        head = load_head(a.init_head, teach)
        head.train()
        if not torch.equal(head.subset, subset):
            log(f"{a.init_head}: its subset differs from this run's ranking; keeping the head's")
        subset = head.subset
        log(f"initialised from {a.init_head}")
    else:
        head = Head(teach, subset)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    weights = [1.0, 0.5, 0.25][:a.depths]
    rng = np.random.default_rng(0)
    step, trained = 0, 0.0
    ckpt_path = os.path.join(a.state, "checkpoint.pt") if a.state else None
    if ckpt_path and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=dev, weights_only=False)
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        rng.bit_generator.state = ck["rng"]
        step, trained = ck["step"], ck["trained"]
        log(f"resumed at step {step} after {trained:.0f}s of training")

    def lr_at(step, trained):
        # 100-step warm-up, then a cosine over --train-seconds of training
        # time (or over --steps when that is 0)
        frac = trained / a.train_seconds if a.train_seconds else step / a.steps
        return a.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    def finished(step, trained):
        return step >= a.steps or (a.train_seconds and trained >= a.train_seconds)

    t0 = time.time()
    base = trained
    budget = a.time_budget
    if a.wall_budget:
        # leave 90 s for the checkpoint, the evaluation and the export
        budget = min(budget, a.wall_budget - (t0 - t_all) - 90)
    while not finished(step, trained) and time.time() - t0 < budget:
        for toks, lossm in batches(train, a.batch, a.max_len, rng):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, trained)
            loss, st = run_batch(head, teach, toks, lossm, a.depths, weights,
                                 with_stats=(step + 1) % 100 == 0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            trained = base + time.time() - t0
            if step % 100 == 0:
                acc = " ".join(f"d{d+1}:{s[1]/max(s[0],1):.3f}" for d, s in enumerate(st))
                log(f"step {step} loss {loss.item():.4f} greedy-acc {acc} "
                    f"lr {lr_at(step, trained):.2e} ({trained:.0f}s)")
            if finished(step, trained) or time.time() - t0 >= budget:
                break
    train_s = trained
    log(f"trained {step} steps in {train_s:.1f}s")
    if ckpt_path:
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
                    "step": step, "trained": trained}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)
        if not finished(step, trained):
            log(f"checkpoint written ({trained:.0f}s of {a.train_seconds:.0f}s): run the same "
                "command again to go on")
            return

    report = {
        "train_sequences": len(train), "train_tokens": ntrain,
        "eval_sequences": len(evals), "eval_tokens": neval,
        "steps": step, "train_seconds": train_s, "subset": a.subset, "coverage": cover,
        "gpu": gpu,
        "eval": evaluate(head, teach, evals, a, weights),
        "args": vars(a),
    }
    if a.compare_head:
        # the earlier head on the same held-out rows, side by side
        report["compare_head"] = {
            "path": a.compare_head,
            "sha256": hashlib.sha256(open(a.compare_head, "rb").read()).hexdigest(),
            "eval": evaluate(load_head(a.compare_head, teach), teach, evals, a, weights),
        }
        log("earlier head: " + json.dumps(report["compare_head"]["eval"], indent=1))
    log(json.dumps(report["eval"], indent=1))
    meta = [
        ("general.architecture", gguf_io.STR, "llama-mtp-head"),
        ("mtp.trunk", gguf_io.STR, "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("mtp.trunk_sha256", gguf_io.STR, hashlib.sha256(g.buf).hexdigest()),
        ("mtp.hidden", gguf_io.STR, "trunk last hidden before the final norm"),
        ("mtp.subset_size", gguf_io.U32, a.subset),
        ("mtp.train_steps", gguf_io.U32, step),
    ]
    path = os.path.join(a.out, "SmolLM2-135M-Instruct.mtp.gguf")
    export(path, head, g, subset, meta)
    report["sha256"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    report["total_seconds"] = time.time() - t_all
    json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=1)
    log(f"wrote {path} ({os.path.getsize(path)} bytes, sha256 {report['sha256']})")


if __name__ == "__main__":
    main()
