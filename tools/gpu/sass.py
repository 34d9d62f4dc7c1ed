# Compile the kernel set with NVRTC for sm_90a, as the backend does (same
# source order and options), and print the SASS instruction histogram of the
# kernels whose name contains KERNEL; the whole disassembly goes to
# /tmp/sass/k.sass. No GPU needed: NVRTC and nvdisasm come from PyPI wheels
# (docs/GPU.md, "Reading the SASS here"), found under $NVRTC_ROOT
# (default /tmp/nvd/nvidia/cu13). Run with LD_LIBRARY_PATH=$NVRTC_ROOT/lib.
# Usage: python3 tools/gpu/sass.py crates/engine/src/backend/cuda/kernels KERNEL
import ctypes, sys, subprocess, os, re
root = os.environ.get("NVRTC_ROOT", "/tmp/nvd/nvidia/cu13")
os.makedirs("/tmp/sass", exist_ok=True)
kd = sys.argv[1]
# The backend's own source order (nvrtc.rs SOURCES), so this never goes stale.
nvrtc_rs = os.path.join(os.path.dirname(os.path.abspath(kd)), "nvrtc.rs")
order = re.findall(r'\("([\w.]+\.cuh?)", include_str!', open(nvrtc_rs).read())
text = "".join(f"// ---- {n}\n" + open(os.path.join(kd, n)).read() for n in order)
lib = ctypes.CDLL(root + "/lib/libnvrtc.so.13")
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"k.cu", 0, None, None) == 0
opts = [b"--gpu-architecture=sm_90a", b"--fmad=false"]
arr = (ctypes.c_char_p * len(opts))(*opts)
r = lib.nvrtcCompileProgram(prog, len(opts), arr)
if r != 0:
    n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, b); print(b.value.decode()); sys.exit(1)
n = ctypes.c_size_t(); lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
b = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, b)
open("/tmp/sass/k.cubin","wb").write(b.raw)
out = subprocess.run([root + "/bin/nvdisasm","-c","/tmp/sass/k.cubin"],capture_output=True,text=True).stdout
open("/tmp/sass/k.sass","w").write(out)
if len(sys.argv) > 2:
    pat = sys.argv[2]
    funcs = re.split(r"\n(?=\s*\.text\.)", out)
    for f in funcs:
        m = re.search(r"\.text\.(\S+):", f)
        if m and pat in m.group(1):
            body = f
            ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", body)
            ops = {}
            for i in ins:
                op = i.split()[0] if not i.startswith("@") else i.split()[1]
                op = op.split(".")[0]
                ops[op] = ops.get(op, 0) + 1
            print(m.group(1), len(ins), sorted(ops.items(), key=lambda x:-x[1])[:25])
