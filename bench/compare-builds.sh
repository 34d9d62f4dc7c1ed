#!/usr/bin/env bash
# Compare two ds4server binaries (e.g. before and after a refactor) on the
# same model, prompt length, generation length and thread count,
# interleaved (A B A B ...) so that machine noise hits both alike. Prints
# per-pair ratios (B / A) and their medians.
#   bench/compare-builds.sh OLD_BINARY NEW_BINARY [--model F] [--prompt N]
#                           [--gen N] [--threads N] [--pairs N]
set -euo pipefail
a="$1" b="$2"; shift 2
model="" prompt=512 gen=64 threads=2 pairs=5
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
[ -n "$model" ] || model="$("$b" pull 2>/dev/null | tail -n 1)"

# One run: prints "prefill_tps decode_tps".
run() {
  "$1" bench -m "$model" --ctx-start "$prompt" --ctx-max "$prompt" --step "$prompt" \
    --gen "$gen" --threads "$threads" 2>/dev/null |
    python3 -c '
import csv, sys
row = next(csv.DictReader(sys.stdin))
print(row["prefill_tps"], row["gen_tps"])'
}

printf "pair  A_prefill  B_prefill  ratio   A_decode  B_decode  ratio\n"
pre=() dec=()
for i in $(seq 1 "$pairs"); do
  read -r a_pp a_tg < <(run "$a")
  read -r b_pp b_tg < <(run "$b")
  rp=$(python3 -c "print(f'{$b_pp/$a_pp:.3f}')")
  rd=$(python3 -c "print(f'{$b_tg/$a_tg:.3f}')")
  pre+=("$rp") dec+=("$rd")
  printf "%4d  %9.1f  %9.1f  %5s   %8.1f  %8.1f  %5s\n" "$i" "$a_pp" "$b_pp" "$rp" "$a_tg" "$b_tg" "$rd"
done
median() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "median ratio (B / A): prefill $(median "${pre[@]}"), decode $(median "${dec[@]}")"
echo "(prompt $prompt tokens, $gen generated at depth $prompt, $threads threads)"
