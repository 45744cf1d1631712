#!/usr/bin/env bash
# Throughput benchmark: Lode's native data-worker stages vs. TensorFlow running
# the same region of the original graph. See bench/README.md.
#
#   bench/run.sh [--records N] [--steps K] [--warmup W] [--models "m1 m2"]
#
# Environment: LODE (lode binary, default target/release/lode),
# LODE_TF_PYTHON (default ~/.cache/lode/tf-2.18.1/bin/python),
# BENCH_DATA (default target/bench-data).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RECORDS=65536
STEPS=1000
WARMUP=20
MODELS="wide_deep deepfm adam_resource sgd_ref"

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --records) RECORDS="$2"; shift 2 ;;
        --records=*) RECORDS="${1#*=}"; shift ;;
        --steps) STEPS="$2"; shift 2 ;;
        --steps=*) STEPS="${1#*=}"; shift ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --warmup=*) WARMUP="${1#*=}"; shift ;;
        --models) MODELS="$2"; shift 2 ;;
        --models=*) MODELS="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
for v in RECORDS STEPS WARMUP; do
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [[ "${!v}" -lt 1 && "$v" != WARMUP ]]; then
        echo "run.sh: --${v,,} must be a positive integer (got '${!v}')" >&2; exit 2
    fi
done

die() { echo "run.sh: $*" >&2; exit 1; }

# --- the pinned TensorFlow -------------------------------------------------
TF_PY="${LODE_TF_PYTHON:-$HOME/.cache/lode/tf-2.18.1/bin/python}"
tf_missing() {
    cat >&2 <<EOF
run.sh: $1
The TensorFlow half of the benchmark needs the pinned TensorFlow 2.18.1 venv at
  ${TF_PY%/bin/python}
Create it as described in fixtures/README.md ("Regenerating"):
  python3 -m venv ~/.cache/lode/tf-2.18.1 \\
    && ~/.cache/lode/tf-2.18.1/bin/pip install -r fixtures/gen/requirements.txt
(or point LODE_TF_PYTHON at a python that has tensorflow==2.18.1).
EOF
    exit 1
}
[[ -x "$TF_PY" ]] || tf_missing "no python at $TF_PY"
TF_VERSION="$(TF_CPP_MIN_LOG_LEVEL=3 "$TF_PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" \
    || tf_missing "$TF_PY cannot import tensorflow"
[[ "$TF_VERSION" == "2.18.1" ]] || echo "run.sh: warning: TensorFlow is $TF_VERSION, the fixtures pin 2.18.1" >&2

# --- the lode binary -------------------------------------------------------
LODE="${LODE:-$REPO/target/release/lode}"
if [[ ! -x "$LODE" ]]; then
    echo "run.sh: $LODE missing; building it (cargo build --release)" >&2
    (cd "$REPO" && cargo build --release) || die "cargo build --release failed"
    LODE="${CARGO_TARGET_DIR:-$REPO/target}/release/lode"
    [[ -x "$LODE" ]] || die "no lode binary at $LODE after the build"
fi

# --- data --------------------------------------------------------------------
DATA="${BENCH_DATA:-$REPO/target/bench-data}"
ROUNDED=$(( (RECORDS + 31) / 32 * 32 ))
fresh=1
for m in $MODELS; do
    [[ "$(cat "$DATA/$m/.bench_records" 2>/dev/null)" == "$ROUNDED" ]] || fresh=0
done
if [[ $fresh == 1 ]]; then
    echo "data: $DATA already holds $ROUNDED records per model, kept" >&2
else
    only=(); for m in $MODELS; do only+=(--only "$m"); done
    "$TF_PY" "$REPO/bench/make_data.py" --out "$DATA" --records "$RECORDS" "${only[@]}" >&2 \
        || die "make_data.py failed"
fi
if (( (STEPS + WARMUP) * 32 > ROUNDED )); then
    echo "run.sh: note: $((STEPS + WARMUP)) steps x 32 > $ROUNDED records; the pipelines wrap around (repeat())" >&2
fi

# --- machine facts -----------------------------------------------------------
CPU="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^model name[[:space:]]*:[[:space:]]*//')"
NPROC="$(nproc 2>/dev/null || echo '?')"
REV="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null | head -1)" ]]; then REV="$REV (dirty)"; fi

RESULTS="$DATA/results.jsonl"
: > "$RESULTS"
ROWS="$(mktemp)"
ERR="$(mktemp)"
trap 'rm -f "$ROWS" "$ERR"' EXIT

# Reads a command's stdout on stdin, prints the samples_per_sec of its last JSON
# line (nothing if there is none) and appends that line, with "model" and
# "engine" added, to $RESULTS (a line without samples_per_sec is kept as an
# error record).
RECORD_PY='
import json, sys
results, model, engine, stage = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
obj = None
for line in sys.stdin.read().splitlines():
    line = line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            pass
if obj is None:
    obj = {"stage": stage, "error": "no JSON result line"}
if "samples_per_sec" not in obj:
    obj.setdefault("error", "no samples_per_sec in the result line")
obj = {"model": model, "engine": engine, **obj}
with open(results, "a") as f:
    f.write(json.dumps(obj) + "\n")
if "samples_per_sec" in obj:
    print(obj["samples_per_sec"])
'
record() { "$TF_PY" -c "$RECORD_PY" "$RESULTS" "$@"; } # model engine stage
# Appends an error record holding the tail of $ERR (the failed command's stderr).
record_error() { # model engine stage
    "$TF_PY" -c 'import json, sys; print(json.dumps({"stage": int(sys.argv[1]), "error": sys.stdin.read().strip()[-2000:]}))' "$3" < "$ERR" \
        | record "$@" > /dev/null
}

for m in $MODELS; do
    plan="$DATA/$m/plan"
    rm -rf "$plan"
    "$LODE" partition "$DATA/$m/model.pb" -o "$plan" > "$DATA/$m/partition.txt" 2> "$ERR" \
        || { cat "$ERR" >&2; die "lode partition failed for $m"; }
    nstages="$("$TF_PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["stages"]))' "$plan/plan.json")"
    for ((i = 0; i < nstages; i++)); do
        echo "== $m stage $i: lode exec" >&2
        lode_sps=""
        if out="$("$LODE" exec "$plan" --stage "$i" --steps "$STEPS" --threads 1 \
                   --data-root "$DATA/$m" --format json 2> "$ERR")"; then
            lode_sps="$(printf '%s\n' "$out" | record "$m" lode "$i")"
            [[ -n "$lode_sps" ]] || { echo "lode exec printed no JSON result:" >&2; printf '%s\n' "$out" >&2; }
        else
            echo "lode exec failed for $m stage $i:" >&2
            sed 's/^/    /' "$ERR" >&2
            record_error "$m" lode "$i"
        fi
        echo "== $m stage $i: tensorflow" >&2
        tf_sps=""
        if out="$("$TF_PY" "$REPO/bench/tf_region.py" --model-dir "$DATA/$m" --plan "$plan" \
                   --stage "$i" --steps "$STEPS" --warmup "$WARMUP" 2> "$ERR")"; then
            tf_sps="$(printf '%s\n' "$out" | record "$m" tensorflow "$i")"
        else
            echo "tf_region.py failed for $m stage $i:" >&2
            sed 's/^/    /' "$ERR" >&2
            record_error "$m" tensorflow "$i"
        fi
        printf '%s\t%s\t%s\t%s\n' "$m" "$i" "${lode_sps:-n/a}" "${tf_sps:-n/a}" >> "$ROWS"
    done
done

echo
echo "Machine: ${CPU:-unknown CPU}, nproc $NPROC; TensorFlow $TF_VERSION; lode $REV"
echo "Workload: $ROUNDED records per data file, $STEPS steps x 32 samples; TF after $WARMUP warmup steps"
echo
echo "| model | stage | Lode samples/s (1 thread) | TF samples/s (1+1 threads) | ratio |"
echo "| --- | ---: | ---: | ---: | ---: |"
ROW_PY='
import sys
m, i, l, t = sys.argv[1:]
fmt = lambda v: "n/a" if v == "n/a" else f"{float(v):,.0f}"
ratio = "n/a" if "n/a" in (l, t) else f"{float(l) / float(t):.2f}x"
print(f"| {m} | {i} | {fmt(l)} | {fmt(t)} | {ratio} |")
'
while IFS=$'\t' read -r m i l t; do
    "$TF_PY" -c "$ROW_PY" "$m" "$i" "$l" "$t"
done < "$ROWS"
echo
echo "raw results: $RESULTS"
