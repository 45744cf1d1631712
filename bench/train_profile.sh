#!/usr/bin/env bash
# Where the training process's CPU goes per step: bench/train_program.py under `lode train`
# (or plainly), sampled by `perf record -e cpu-clock` (software sampling: no hardware counters
# needed) for --seconds once its steady window has begun (the program writes its pid then), and
# split by shared object and by symbol.
#
#   bench/train_profile.sh [--model wide_deep|deepfm] [--config plain|simple|full] [--steps N]
#                          [--seconds S] [--pythonpath DIR] [--out DIR]
#
# --pythonpath: another build of Lode's package, first on the program's PYTHONPATH (`pip install
# --target DIR ./python`). perf.data stays in --out (default target/bench-data/profile).
# Environment: PYTHON (default ~/.cache/lode/venv-train/bin/python), LODE (target/release/lode),
# BENCH_DATA (the data bench/train_bench.py made; --steps must fit one wide_deep epoch of it).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=wide_deep
CONFIG=full
STEPS=20000
SECONDS_=3
PYPATH=""
OUT="$REPO/target/bench-data/profile"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --config) CONFIG="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --seconds) SECONDS_="$2"; shift 2 ;;
        --pythonpath) PYPATH="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "train_profile.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
die() { echo "train_profile.sh: $*" >&2; exit 2; }
[[ "$MODEL" == wide_deep || "$MODEL" == deepfm ]] || die "--model: '$MODEL' is not wide_deep or deepfm"
[[ "$CONFIG" =~ ^(plain|simple|full)$ ]] || die "--config: '$CONFIG' is not plain, simple or full"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer"
[[ "$SECONDS_" =~ ^[1-9][0-9]*$ ]] || die "--seconds must be a positive integer"
command -v perf >/dev/null || die "perf is not installed (Debian: linux-perf)"
PYTHON="${PYTHON:-$HOME/.cache/lode/venv-train/bin/python}"
LODE="${LODE:-$REPO/target/release/lode}"
DATA="${BENCH_DATA:-$REPO/target/bench-data/train}"
[[ -d "$DATA/$MODEL/data" ]] || die "no data in $DATA/$MODEL/data: run bench/train_bench.py once (it makes it)"
mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=2
[[ -n "$PYPATH" ]] && export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}"
data="$OUT/$MODEL-$CONFIG.perf.data"
steady="$OUT/steady.pid"
rm -f "$steady"
program=("$PYTHON" "$REPO/bench/train_program.py" --model "$MODEL" --data "$DATA/$MODEL/data"
         --steps "$STEPS" --warmup 500 --steady-file "$steady")
case "$CONFIG" in
    plain) "${program[@]}" >"$OUT/stdout.txt" 2>"$OUT/stderr.txt" & ;;
    simple) "$LODE" train --workers 2 --simple -- "${program[@]}" >"$OUT/stdout.txt" 2>"$OUT/stderr.txt" & ;;
    full) "$LODE" train --workers 2 -- "${program[@]}" >"$OUT/stdout.txt" 2>"$OUT/stderr.txt" & ;;
esac
run=$!
while [[ ! -s "$steady" ]]; do
    kill -0 "$run" 2>/dev/null || die "the program ended before its steady window: see $OUT/stderr.txt"
    sleep 0.1
done
perf record -e cpu-clock -F 1999 -g -p "$(cat "$steady")" -o "$data" -- sleep "$SECONDS_" 2>/dev/null
wait "$run" || die "the program failed: see $OUT/stderr.txt"
tail -1 "$OUT/stdout.txt"
echo "== samples by shared object ($data)"
perf report -i "$data" --no-children --sort dso -g none --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -12
echo "== top symbols"
perf report -i "$data" --no-children --sort dso,sym -g none --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -30
