#!/usr/bin/env bash
# Compare the two kernel sets of one ds4server binary on the same model:
# `--kernels reference` against `--kernels fast`, interleaved (R F R F ...)
# so that machine noise hits both alike, as compare-builds.sh does for two
# binaries. For each prompt length: cold prefill and decode tok/s of each
# set and the fast / reference ratios (medians over the pairs). Then the
# NLL of each set on a held-out text (bench --nll; default
# bench/heldout.txt) and their relative difference.
#   bench/compare-kernels.sh [BINARY] [--model F] [--prompts 512,4096]
#                            [--gen 64] [--pairs 2] [--threads 2]
#                            [--nll FILE] [--nll-window N] [--no-nll]
# BINARY defaults to target/release/ds4server (build it first:
# cargo build --release).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$here/../target/release/ds4server"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then bin="$1"; shift; fi
model="" prompts="512,4096" gen=64 pairs=2 threads=2
nll="$here/heldout.txt" nll_window=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --gen) gen="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --nll) nll="$2"; shift 2 ;;
    --nll-window) nll_window="$2"; shift 2 ;;
    --no-nll) nll=""; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release)" >&2; exit 2; }
[ -n "$model" ] || model="$("$bin" pull 2>/dev/null | tail -n 1)"
# Neither run may inherit a set from the environment.
unset DS4_KERNELS

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Run ds4server with the given arguments; its CSV on stdout, its stderr in
# $log, shown when it fails (the caller reads nothing and the script stops).
ds4() {
  if ! "$bin" "$@" 2>"$log"; then
    echo "failed: $bin $*" >&2
    tail -n 20 "$log" >&2
    return 1
  fi
}

# The named columns of the first CSV row on stdin, space-separated.
columns() {
  python3 -c '
import csv, sys
row = next(csv.DictReader(sys.stdin), None)
if row is None:
    sys.exit(1)
print(" ".join(row[c] for c in sys.argv[1:]))' "$@"
}

# One speed run of set $1 at cold prompt length $2: prints
# "prefill_tps decode_tps backend".
speed() {
  ds4 bench -m "$model" --kernels "$1" --prompts "$2" --gen "$gen" --threads "$threads" |
    columns prefill_tps gen_tps backend
}

median() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }

summary=()
IFS=, read -r -a lens <<< "$prompts"
for len in "${lens[@]}"; do
  echo "== prompt $len tokens, $gen generated at depth $len, $threads threads"
  printf "pair  ref_prefill  fast_prefill  ratio   ref_decode  fast_decode  ratio\n"
  rp=() fp=() rd=() fd=() pre=() dec=()
  for i in $(seq 1 "$pairs"); do
    read -r r_pp r_tg r_id < <(speed reference "$len")
    read -r f_pp f_tg f_id < <(speed fast "$len")
    p=$(ratio "$f_pp" "$r_pp") d=$(ratio "$f_tg" "$r_tg")
    rp+=("$r_pp") fp+=("$f_pp") rd+=("$r_tg") fd+=("$f_tg") pre+=("$p") dec+=("$d")
    printf "%4d  %11.1f  %12.1f  %5s   %10.2f  %11.2f  %5s\n" \
      "$i" "$r_pp" "$f_pp" "$p" "$r_tg" "$f_tg" "$d"
  done
  echo "backends: reference $r_id, fast $f_id"
  line=$(printf "prompt %6s: prefill %8.1f -> %8.1f tok/s (x%s), decode %7.2f -> %7.2f tok/s (x%s)" \
    "$len" "$(median "${rp[@]}")" "$(median "${fp[@]}")" "$(median "${pre[@]}")" \
    "$(median "${rd[@]}")" "$(median "${fd[@]}")" "$(median "${dec[@]}")")
  echo "median: ${line#prompt *: }"
  summary+=("$line")
done

if [ -n "$nll" ]; then
  echo "== NLL on $nll (windows of $nll_window tokens, $threads threads)"
  # One NLL run of set $1: prints "mean_nll perplexity tokens_scored backend".
  nll_of() {
    ds4 bench -m "$model" --kernels "$1" --nll "$nll" --nll-window "$nll_window" \
      --threads "$threads" | columns mean_nll perplexity tokens_scored backend
  }
  read -r r_nll r_ppl r_n r_id < <(nll_of reference)
  read -r f_nll f_ppl f_n f_id < <(nll_of fast)
  printf "reference (%s): mean NLL %s nats/token, perplexity %s, %s tokens\n" "$r_id" "$r_nll" "$r_ppl" "$r_n"
  printf "fast      (%s): mean NLL %s nats/token, perplexity %s, %s tokens\n" "$f_id" "$f_nll" "$f_ppl" "$f_n"
  nll_line="NLL: reference $r_nll, fast $f_nll nats/token ($(python3 -c "print(f'{100*($f_nll-$r_nll)/$r_nll:+.3f}')")% relative; perplexity $r_ppl -> $f_ppl)"
fi

echo
echo "== summary (fast vs reference, medians of $pairs pairs; model $(basename "$model"))"
printf "%s\n" "${summary[@]}"
[ -z "${nll_line:-}" ] || echo "$nll_line"
