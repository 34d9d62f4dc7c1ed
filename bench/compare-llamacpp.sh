#!/usr/bin/env bash
# Compare ds4server with llama.cpp on the same GGUF, prompt length,
# generation length and thread count, interleaved (A B A B ...) so that
# machine noise hits both engines alike. Prints per-pair ratios and medians.
#
# llama.cpp is built from the source vendored in the llama-cpp-python sdist,
# in a cache directory (never in the repository):
#   bench/compare-llamacpp.sh [--model F.gguf] [--prompt N] [--gen N]
#                             [--threads N] [--pairs N]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cache="${DS4SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ds4server}/llamacpp"
model="" prompt=512 gen=64 threads=2 pairs=3 sdist_version=0.3.36
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --gen) gen="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

ours="$root/target/release/ds4server"
[ -x "$ours" ] || (cd "$root" && cargo build --release -p ds4server)
[ -n "$model" ] || model="$("$ours" pull 2>/dev/null | tail -n 1)"

bench_bin="$cache/llama.cpp/build/bin/llama-bench"
if [ ! -x "$bench_bin" ]; then
  mkdir -p "$cache"
  echo "building llama-bench in $cache (about 8 minutes on 2 cores)" >&2
  python3 -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$sdist_version" -d "$cache/sdist" >&2
  python3 -m pip install --quiet cmake ninja >&2
  tar -xzf "$cache/sdist/llama_cpp_python-$sdist_version.tar.gz" -C "$cache/sdist"
  rm -rf "$cache/llama.cpp"
  cp -r "$cache/sdist/llama_cpp_python-$sdist_version/vendor/llama.cpp" "$cache/llama.cpp"
  (cd "$cache/llama.cpp" &&
    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF >&2 &&
    cmake --build build --target llama-bench -j"$(nproc)" >&2)
fi

# One llama-bench measurement: prints "prefill_tps decode_tps". Prefill
# starts from an empty context; decode runs at depth `prompt`, as ds4server's
# does (it decodes after the prompt), so attention costs the same for both.
llamacpp() {
  { "$bench_bin" -m "$model" -p "$prompt" -n 0 -t "$threads" -r 1 -o csv 2>/dev/null
    "$bench_bin" -m "$model" -p 0 -n "$gen" -d "$prompt" -t "$threads" -r 1 -o csv 2>/dev/null | tail -n +2
  } | python3 -c '
import csv, sys
pp = tg = None
for row in csv.DictReader(sys.stdin):
    if int(row["n_prompt"]) > 0 and int(row["n_gen"]) == 0: pp = float(row["avg_ts"])
    if int(row["n_gen"]) > 0 and int(row["n_prompt"]) == 0: tg = float(row["avg_ts"])
print(pp, tg)'
}

# One ds4server run at the same prompt length: prints "prefill_tps decode_tps".
ds4() {
  "$ours" bench -m "$model" --ctx-start "$prompt" --ctx-max "$prompt" --step "$prompt" \
    --gen "$gen" --threads "$threads" 2>/dev/null |
    python3 -c '
import csv, sys
row = next(csv.DictReader(sys.stdin))
print(row["prefill_tps"], row["gen_tps"])'
}

printf "pair  ds4_prefill  llama_prefill  ratio   ds4_decode  llama_decode  ratio\n"
pre_ratios=() dec_ratios=()
for i in $(seq 1 "$pairs"); do
  read -r a_pp a_tg < <(ds4)
  read -r b_pp b_tg < <(llamacpp)
  rp=$(python3 -c "print(f'{$a_pp/$b_pp:.3f}')")
  rd=$(python3 -c "print(f'{$a_tg/$b_tg:.3f}')")
  pre_ratios+=("$rp") dec_ratios+=("$rd")
  printf "%4d  %11.1f  %13.1f  %5s   %10.1f  %12.1f  %5s\n" "$i" "$a_pp" "$b_pp" "$rp" "$a_tg" "$b_tg" "$rd"
done
median() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "median ratio (ds4server / llama.cpp): prefill $(median "${pre_ratios[@]}"), decode $(median "${dec_ratios[@]}")"
echo "(prompt $prompt tokens, $gen generated at depth $prompt, $threads threads)"
