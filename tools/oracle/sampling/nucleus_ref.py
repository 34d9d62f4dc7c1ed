"""Reference implementation of the nucleus law (shared/specs/sampling.md s.2).

Written from the spec, independently of the Rust code: plain Python floats
(IEEE f64, libm exp), a full sort for the rank order, the support exactly as
the spec defines it (zero-probability members included), and the draw done
by NumPy itself: ``rng.choice(ids, p=probs)`` on ``numpy.random.default_rng``.

Floating-point operation order (normative for exactness, see the crate's
src/nucleus.rs): penalised ``l - (freq*count + pres)``; ``s = l/T``;
``e = exp(s - max(s))``; ``Z`` sequential sum in id order; ``p = e/Z``;
nucleus mass sequential in rank order; support mass sequential in id order.
"""

import math

import numpy as np


class NonFiniteLogits(Exception):
    pass


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


def nucleus_support(logits, temperature, top_p, top_k, presence, frequency, counts):
    """Return ("greedy", token) or ("draw", ids, probs). Raises NonFiniteLogits."""
    v = len(logits)
    nan = sum(1 for x in logits if math.isnan(x))
    pos = sum(1 for x in logits if x == math.inf)
    neg = sum(1 for x in logits if x == -math.inf)
    if v == 0 or nan or pos or neg == v:
        raise NonFiniteLogits((nan, pos, neg))
    l = [float(x) for x in logits]
    presence = clamp(presence, -2.0, 2.0)
    frequency = clamp(frequency, -2.0, 2.0)
    if (presence != 0.0 or frequency != 0.0) and counts:
        for tok, c in counts.items():
            if c > 0 and tok < v:
                l[tok] = l[tok] - (frequency * c + presence)
    if temperature <= 0.0:
        best = 0
        for i in range(v):
            if l[i] > l[best]:
                best = i
        return ("greedy", best)
    scaled = [x / temperature for x in l]
    m = max(scaled)
    if math.isfinite(m):
        e = [math.exp(s - m) for s in scaled]
    else:
        # Overflowed l/T (tiny T): the T -> 0+ limit, uniform over the maxima.
        lmax = max(l)
        e = [1.0 if x == lmax else 0.0 for x in l]
    z = 0.0
    for x in e:
        z += x
    p = [x / z for x in e]
    ranked = sorted(range(v), key=lambda i: (-p[i], i))
    if 0 < top_k < v:
        ranked = ranked[:top_k]
    keep = set(ranked)
    if 0.0 < top_p < 1.0:
        kept = set()
        before = 0.0
        for i in ranked:
            if before < top_p:
                kept.add(i)
            before += p[i]
        keep = kept
    ids = sorted(keep)
    mass = 0.0
    for i in ids:
        mass += p[i]
    if mass <= 0.0:
        best = max(range(v), key=lambda i: (p[i], -i))
        return ("draw", [best], [1.0])
    return ("draw", ids, [p[i] / mass for i in ids])


def draws_consumed(seed, rng):
    """Count the 64-bit outputs `rng` took since default_rng(seed), by
    stepping a fresh generator until the states agree (measured, not assumed)."""
    fresh = np.random.default_rng(seed).bit_generator
    target = rng.bit_generator.state["state"]
    for n in range(100000):
        if fresh.state["state"] == target:
            return n
        fresh.random_raw()
    raise RuntimeError("draw count not found")


def run_case(case):
    """Expected replay output line for one nucleus case."""
    rng = np.random.default_rng(case["seed"])
    logits = [parse_logit(x) for x in case["logits"]]
    counts = {int(k): v for k, v in case.get("counts", {}).items()}
    try:
        plan = nucleus_support(
            logits,
            case["temperature"],
            case["top_p"],
            case["top_k"],
            case["presence_penalty"],
            case["frequency_penalty"],
            counts,
        )
    except NonFiniteLogits:
        return {"id": case["id"], "error": "non_finite_logits"}
    tokens = []
    for _ in range(case["draws"]):
        if plan[0] == "greedy":
            tokens.append(plan[1])
        else:
            _, ids, probs = plan
            tokens.append(int(rng.choice(np.array(ids, dtype=np.int64), p=np.array(probs))))
    return {"id": case["id"], "tokens": tokens, "draws": draws_consumed(case["seed"], rng)}


def parse_logit(x):
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}[x]
    return float(x)
