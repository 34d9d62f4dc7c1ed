#!/usr/bin/env python3
"""Compares two llama.cpp GGUF importance matrices (ours and llama-imatrix's).

Prints the key set and tensor shapes of each, then per entry the largest
relative difference of in_sum2 / counts (the values quantize reads), and a
summary: entries only in one file, counts that differ, the distribution of
per-entry max relative differences. Usage: imatrix-compare.py OURS THEIRS
(run with tools/oracle/.venv/bin/python, which has gguf-py).
"""
import sys

import numpy as np
from gguf import GGUFReader


def load(path):
    r = GGUFReader(path)
    keys = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        keys[k] = f.contents()
    t = {x.name: x for x in r.tensors}
    entries = {}
    for name, x in t.items():
        if not name.endswith(".in_sum2"):
            continue
        w = name[: -len(".in_sum2")]
        c = t[w + ".counts"]
        sums = np.array(x.data, dtype=np.float64).reshape(-1)
        counts = np.array(c.data, dtype=np.float64).reshape(-1)
        entries[w] = (sums, counts, list(x.shape), list(c.shape))
    return keys, entries


def main():
    ours_path, theirs_path = sys.argv[1], sys.argv[2]
    ok, oe = load(ours_path)
    tk, te = load(theirs_path)
    print(f"ours   {ours_path}: keys {sorted(ok)}; {len(oe)} entries")
    print(f"theirs {theirs_path}: keys {sorted(tk)}; {len(te)} entries")
    for k in sorted(set(ok) | set(tk)):
        a, b = ok.get(k), tk.get(k)
        if k == "imatrix.datasets":
            print(f"  {k}: ours {a} / theirs {b}")
        elif a != b:
            print(f"  {k}: ours {a!r} / theirs {b!r}")
        else:
            print(f"  {k}: {a!r} (same)")
    only_o = sorted(set(oe) - set(te))
    only_t = sorted(set(te) - set(oe))
    print(f"entries only ours: {only_o}")
    print(f"entries only theirs: {only_t}")
    rows = []
    shape_diff = count_diff = 0
    for w in sorted(set(oe) & set(te)):
        so, co, sho, cso = oe[w]
        st, ct, sht, cst = te[w]
        if sho != sht or cso != cst:
            shape_diff += 1
        if not np.array_equal(co, ct):
            count_diff += 1
        n = len(so) // len(co)
        vo = so / np.repeat(np.where(co > 0, co, 1), n)
        vt = st / np.repeat(np.where(ct > 0, ct, 1), n)
        rel = np.abs(vo - vt) / np.maximum(np.abs(vt), 1e-30)
        tot = abs(so.sum() - st.sum()) / st.sum()
        rows.append((w, rel.max(), np.median(rel), tot))
    print(f"entries in both: {len(rows)}; shapes differ: {shape_diff}; counts differ: {count_diff}")
    mx = np.array([r[1] for r in rows])
    md = np.array([r[2] for r in rows])
    tot = np.array([r[3] for r in rows])
    print(
        "per entry, max over columns of |ours - theirs| / theirs: "
        f"median {np.median(mx):.3e}, 90% {np.quantile(mx, 0.9):.3e}, max {mx.max():.3e}"
    )
    print(f"per entry, median over columns: median {np.median(md):.3e}, max {md.max():.3e}")
    print(f"per entry, relative difference of the column total: median {np.median(tot):.3e}, max {tot.max():.3e}")
    print("| entry | max rel diff | median rel diff | total rel diff |")
    print("| --- | ---: | ---: | ---: |")
    for w, a, b, c in sorted(rows, key=lambda r: -r[1])[:12]:
        print(f"| {w} | {a:.3e} | {b:.3e} | {c:.3e} |")


if __name__ == "__main__":
    main()
