#!/usr/bin/env bash
# Compare ds4server with llama.cpp on the same GGUF, prompt length,
# generation length and thread count, interleaved (A B A B ...) so that
# machine noise hits both engines alike. Prints per-pair ratios and medians.
#
# llama.cpp is built from the source vendored in the llama-cpp-python sdist,
# in a cache directory (never in the repository):
#   bench/compare-llamacpp.sh [--model F.gguf] [--prompts N,N,...] [--gen N]
#                             [--threads N] [--pairs N] [--kv-cache f32|f16]
#                             [--kernels reference|fast]
# Each prompt length N gives a row: prefill of an N-token prompt from an
# empty context (llama-bench -p N) and decode of --gen tokens at depth N
# (llama-bench -n GEN -d N). `--prompt N` is `--prompts N`. `--kv-cache T`
# (default f16, llama.cpp's own default) is passed to both engines:
# `ds4server bench --kv-cache T` and `llama-bench -ctk T -ctv T` (llama-bench
# has no f32 cache: with f32, llama.cpp stays at f16). `--kernels SET` is
# ds4server's kernel set (default: what DS4_KERNELS or the build defaults
# to; printed in the summary).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cache="${DS4SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ds4server}/llamacpp"
model="" prompts=512 gen=64 threads=2 pairs=3 kv=f16 sdist_version=0.3.36 kernels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prompt|--prompts) prompts="$2"; shift 2 ;;
    --gen) gen="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --kv-cache) kv="$2"; shift 2 ;;
    --kernels) kernels="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

ours="$root/target/release/ds4server"
[ -x "$ours" ] || (cd "$root" && cargo build --release -p ds4server)
[ -n "$model" ] || model="$("$ours" pull 2>/dev/null | tail -n 1)"

# The CPU's own instruction sets, named as ggml's CMake options, instead of
# GGML_NATIVE: `-march=native` also enables AMX wherever the CPU advertises
# it, and a VM may advertise AMX that it cannot run (llama-bench died of
# SIGILL on such an Intel VM). AMX stays off; everything else the CPU says it
# has is on, so llama.cpp gets the same ISA as our run-time detected kernels.
isa_flags() {
  local have
  have=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  on() { case "$have" in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
  local avx512=OFF
  if [ "$(on avx512f)$(on avx512cd)$(on avx512vl)$(on avx512dq)$(on avx512bw)" = ONONONONON ]; then
    avx512=ON
  fi
  echo -DGGML_NATIVE=OFF -DGGML_SSE42="$(on sse4_2)" -DGGML_AVX="$(on avx)" \
    -DGGML_AVX2="$(on avx2)" -DGGML_BMI2="$(on bmi2)" -DGGML_FMA="$(on fma)" \
    -DGGML_F16C="$(on f16c)" -DGGML_AVX_VNNI="$(on avx_vnni)" -DGGML_AVX512="$avx512" \
    -DGGML_AVX512_VBMI="$([ $avx512 = ON ] && on avx512vbmi || echo OFF)" \
    -DGGML_AVX512_VNNI="$([ $avx512 = ON ] && on avx512_vnni || echo OFF)" \
    -DGGML_AVX512_BF16="$([ $avx512 = ON ] && on avx512_bf16 || echo OFF)" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
}
# llama-bench takes f16 (its default), q8_0, … but not f32 for -ctk/-ctv:
# with `--kv-cache f32` ours runs f32 against llama.cpp's f16 (said below).
llama_kv="$kv"
if [ "$kv" = f32 ]; then
  echo "llama-bench has no f32 KV cache: llama.cpp runs f16, ds4server f32" >&2
  llama_kv=f16
fi
flags="$(isa_flags)"
# One build per flag set (a different CPU gets its own), beside the source.
build="$cache/llama.cpp/build-$(printf "%s" "$flags" | sha256sum | cut -c1-12)"
bench_bin="$build/bin/llama-bench"
if [ ! -x "$bench_bin" ]; then
  mkdir -p "$cache"
  if [ ! -d "$cache/llama.cpp" ]; then
    python3 -m pip download --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$sdist_version" -d "$cache/sdist" >&2
    tar -xzf "$cache/sdist/llama_cpp_python-$sdist_version.tar.gz" -C "$cache/sdist"
    cp -r "$cache/sdist/llama_cpp_python-$sdist_version/vendor/llama.cpp" "$cache/llama.cpp"
  fi
  python3 -m pip install --quiet cmake ninja >&2
  echo "building llama-bench in $build (about 8 minutes on 2 cores) with: $flags" >&2
  # shellcheck disable=SC2086 # $flags is a list of -D options
  (cd "$cache/llama.cpp" &&
    cmake -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF $flags >&2 &&
    cmake --build "$build" --target llama-bench -j"$(nproc)" >&2)
fi
echo "llama-bench: $bench_bin ($flags)" >&2

# One llama-bench measurement at prompt length $1: prints "prefill_tps
# decode_tps". Prefill starts from an empty context; decode runs at depth $1,
# as ds4server's does (it decodes after the prompt), so attention costs the
# same for both.
llamacpp() {
  { "$bench_bin" -m "$model" -p "$1" -n 0 -t "$threads" -ctk "$llama_kv" -ctv "$llama_kv" -r 1 -o csv 2>/dev/null
    "$bench_bin" -m "$model" -p 0 -n "$gen" -d "$1" -t "$threads" -ctk "$llama_kv" -ctv "$llama_kv" -r 1 -o csv 2>/dev/null |
      tail -n +2
  } | python3 -c '
import csv, sys
pp = tg = None
for row in csv.DictReader(sys.stdin):
    if int(row["n_prompt"]) > 0 and int(row["n_gen"]) == 0: pp = float(row["avg_ts"])
    if int(row["n_gen"]) > 0 and int(row["n_prompt"]) == 0: tg = float(row["avg_ts"])
print(pp, tg)'
}

# One ds4server run, a cold prompt of $1 tokens: prints "prefill_tps decode_tps".
ds4() {
  "$ours" bench -m "$model" --prompts "$1" --gen "$gen" --threads "$threads" --kv-cache "$kv" \
    ${kernels:+--kernels "$kernels"} 2>/dev/null |
    python3 -c '
import csv, sys
row = next(csv.DictReader(sys.stdin))
print(row["prefill_tps"], row["gen_tps"])'
}

IFS=, read -r -a lengths <<< "$prompts"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min), $(nproc) cores"
printf "pair  prompt  ds4_prefill  llama_prefill  ratio   ds4_decode  llama_decode  ratio\n"
declare -A pre_ratios dec_ratios
for i in $(seq 1 "$pairs"); do
  for n in "${lengths[@]}"; do
    read -r a_pp a_tg < <(ds4 "$n")
    read -r b_pp b_tg < <(llamacpp "$n")
    rp=$(python3 -c "print(f'{$a_pp/$b_pp:.3f}')")
    rd=$(python3 -c "print(f'{$a_tg/$b_tg:.3f}')")
    pre_ratios[$n]+="$rp " dec_ratios[$n]+="$rd "
    printf "%4d  %6d  %11.1f  %13.1f  %5s   %10.1f  %12.1f  %5s\n" "$i" "$n" "$a_pp" "$b_pp" "$rp" "$a_tg" "$b_tg" "$rd"
  done
done
median() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for n in "${lengths[@]}"; do
  # shellcheck disable=SC2086 # the ratios are a space-separated list
  echo "prompt $n: median ratio (ds4server / llama.cpp): prefill $(median ${pre_ratios[$n]}), decode $(median ${dec_ratios[$n]})"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min)"
echo "($gen generated at depth N, $threads threads, $pairs pairs, kv cache: ds4server $kv, llama.cpp $llama_kv, ds4server kernels: ${kernels:-${DS4_KERNELS:-default}})"
