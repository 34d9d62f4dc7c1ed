"""Builds tools/oracle/deepseek_v4/ds4_oracle.c against an antirez/ds4 checkout.

The engine functions the oracle's paths call (think-mode helpers and the Think Max prefix) are
copied verbatim out of ds4.c into think_shim.h, so the oracle uses ds4's own text and rules.
"""
import pathlib
import re
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
# The ds4 commit every fixture here was generated from (docs: shared/research/ds4.md).
DS4_COMMIT = "8d57664"

SHIM_FUNCTIONS = [
    "bool ds4_think_mode_enabled(",
    "const char *ds4_think_mode_name(",
    "const char *ds4_think_max_prefix(",
    "uint32_t ds4_think_max_min_context(",
    "ds4_think_mode ds4_think_mode_for_context(",
]


def shim(ds4_c: str) -> str:
    out = []
    m = re.search(r"static const char DS4_REASONING_EFFORT_MAX_PREFIX\[\] =.*?;\n", ds4_c, re.S)
    out.append(m.group(0))
    m = re.search(r"#define DS4_THINK_MAX_MIN_CONTEXT [^\n]*\n", ds4_c)
    out.append(m.group(0))
    for sig in SHIM_FUNCTIONS:
        start = ds4_c.index("\n" + sig) + 1
        end = ds4_c.index("\n}\n", start) + 3
        out.append(ds4_c[start:end])
    return "\n".join(out)


def build(src: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if head and head != DS4_COMMIT:
        raise SystemExit(f"{src} is at {head}; the fixtures are pinned to ds4 {DS4_COMMIT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "think_shim.h").write_text(shim((src / "ds4.c").read_text()))
    exe = out_dir / "ds4_oracle"
    flags = ["-std=c99", "-D_GNU_SOURCE", "-O1", "-w", "-pthread", f"-I{src}", f"-I{out_dir}"]
    objs = []
    for c in [HERE / "ds4_oracle.c", src / "ds4_kvstore.c", src / "rax.c"]:
        o = out_dir / (c.stem + ".o")
        subprocess.run(["cc", *flags, "-c", str(c), "-o", str(o)], check=True)
        objs.append(o)
    # The engine entry points these paths never reach get stubs that abort, so a path that
    # does reach one fails loudly instead of computing something.
    undefined = set()
    for o in objs:
        nm = subprocess.run(["nm", "-u", str(o)], capture_output=True, text=True, check=True)
        undefined |= {l.split()[-1] for l in nm.stdout.splitlines() if l.split()[-1].startswith("ds4_")}
    defined = set()
    for o in objs:
        nm = subprocess.run(["nm", "--defined-only", str(o)], capture_output=True, text=True, check=True)
        defined |= {l.split()[-1] for l in nm.stdout.splitlines()}
    stubs = out_dir / "stubs.c"
    stubs.write_text("#include <stdlib.h>\n" + "".join(
        f"void {name}(void) {{ abort(); }}\n" for name in sorted(undefined - defined)))
    subprocess.run(["cc", *flags, "-o", str(exe), *map(str, objs), str(stubs), "-lm"], check=True)
    return exe
