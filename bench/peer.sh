#!/usr/bin/env bash
# The peer benchmark: tf.data service against Lode on the same data and the same pipeline
# (issue 17 item 4). See bench/README.md, "Peer benchmark".
#
#   bench/peer.sh [--rounds R] [--records N] [--models "wide_deep deepfm"] [--workers "1 2"]
#                 [--warmup S] [--window S] [--engines "tf lode exec eff"] [--pin] [--short]
#
# Engines: tf (tf.data service), lode (Lode's cuts), exec (`lode exec --threads 1`, run after
# each one-worker Lode run), eff (one worker against `lode exec` in alternating windows on one
# running job, `peer.py worker-eff`: R rounds per cut after the other rounds). --pin: eff
# with the worker and exec on CPU 0, the dispatcher and the consumer on CPU 1.
# --short (what CI runs): 1 round, wide_deep, 1 worker, 4096 records, a 0.5 s window; it
# fails when a configuration fails or delivers nothing, and asserts no speed.
# Environment: LODE (the lode binary, default target/release/lode), LODE_TF_PYTHON (default
# ~/.cache/lode/tf-2.18.1/bin/python), BENCH_DATA (default target/bench-data/peer, with
# --short target/bench-data/peer-short).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=5
RECORDS=163840
MODELS="wide_deep deepfm"
WORKERS="1 2"
WARMUP=1
WINDOW=2
SHORT=0
TIMEOUT=120
ENGINES="tf lode exec eff"
PIN=()

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --records) RECORDS="$2"; shift 2 ;;
        --models) MODELS="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --window) WINDOW="$2"; shift 2 ;;
        --engines) ENGINES="$2"; shift 2 ;;
        --pin) PIN=(--pin); shift ;;
        --short) SHORT=1; ROUNDS=1; RECORDS=4096; MODELS=wide_deep; WORKERS=1; WARMUP=0.5; WINDOW=0.5
                 TIMEOUT=60
                 shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "peer.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
die() { echo "peer.sh: $*" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer (got '$ROUNDS')"
[[ "$RECORDS" =~ ^[1-9][0-9]*$ ]] || die "--records must be a positive integer (got '$RECORDS')"
for m in $MODELS; do [[ "$m" == wide_deep || "$m" == deepfm ]] || die "--models: '$m' is not wide_deep or deepfm"; done
for e in $ENGINES; do [[ "$e" =~ ^(tf|lode|exec|eff)$ ]] || die "--engines: '$e' is not tf, lode, exec or eff"; done
for n in $WORKERS; do [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "--workers: '$n' is not a worker count"; done

TF_PY="${LODE_TF_PYTHON:-$HOME/.cache/lode/tf-2.18.1/bin/python}"
[[ -x "$TF_PY" ]] || die "no python at $TF_PY: create the TensorFlow venv as .ci/run does
  (python3 -m venv ~/.cache/lode/tf-2.18.1 && ~/.cache/lode/tf-2.18.1/bin/pip install -r fixtures/gen/requirements.txt)
  or point LODE_TF_PYTHON at a python with tensorflow-cpu 2.18.1"
export TF_CPP_MIN_LOG_LEVEL=2
TF_VERSION="$("$TF_PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" \
    || die "$TF_PY cannot import tensorflow"
LODE="${LODE:-$REPO/target/release/lode}"
[[ -x "$LODE" ]] || die "no lode binary at $LODE (cargo build --release, or set LODE)"
LODE="$(cd "$(dirname "$LODE")" && pwd)/$(basename "$LODE")"
PEER=("$TF_PY" "$REPO/bench/peer.py")

if [[ $SHORT == 1 ]]; then DATA="${BENCH_DATA:-$REPO/target/bench-data/peer-short}"
else DATA="${BENCH_DATA:-$REPO/target/bench-data/peer}"; fi
mkdir -p "$DATA"
DATA="$(cd "$DATA" && pwd)"
OUT="$DATA/run-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

# Everything this script starts is stopped by process id when it ends, however it ends.
STARTED=()
stop_started() {
    local pid
    for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
    STARTED=()
}
trap stop_started EXIT
trap 'exit 130' INT TERM

wait_file() { # file seconds what
    local deadline=$((SECONDS + $2))
    while [[ ! -s "$1" ]]; do
        ((SECONDS < deadline)) || { echo "peer.sh: $3 not ready after $2 s" >&2; return 1; }
        sleep 0.1
    done
}

FAILED=()
fail() { # label log...
    local label="$1"; shift
    FAILED+=("$label")
    echo "peer.sh: FAILED: $label" >&2
    local f
    for f in "$@"; do [[ -s "$f" ]] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    return 0
}

# --- data, plans and the pipeline check --------------------------------------------------
ROUNDED=$(( (RECORDS + 31) / 32 * 32 ))
for m in $MODELS; do
    if [[ "$(cat "$DATA/$m/.bench_records" 2>/dev/null)" != "$ROUNDED" ]]; then
        python3 "$REPO/bench/make_data.py" --out "$DATA" --records "$RECORDS" --only "$m" >&2
        "${PEER[@]}" prepare "$DATA/$m" 2>"$OUT/prepare.err" >&2 || { cat "$OUT/prepare.err" >&2; die "prepare $m failed"; }
    fi
    for cut in simple full; do
        rm -rf "$DATA/$m/plan-$cut" "$DATA/$m/dump-$cut"
        flag=(); [[ $cut == simple ]] && flag=(--simple)
        "$LODE" partition "$DATA/$m/model_peer.pb" -o "$DATA/$m/plan-$cut" "${flag[@]}" > "$DATA/$m/partition-$cut.txt" 2>"$OUT/partition.err" \
            || { cat "$OUT/partition.err" >&2; die "lode partition failed for $m ($cut cut)"; }
        "$LODE" exec "$DATA/$m/plan-$cut" --steps 2 --dump "$DATA/$m/dump-$cut" -q >/dev/null 2>"$OUT/exec.err" \
            || { cat "$OUT/exec.err" >&2; die "lode exec --dump failed for $m ($cut cut)"; }
        "${PEER[@]}" check --model-dir "$DATA/$m" --plan "$DATA/$m/plan-$cut" --dump "$DATA/$m/dump-$cut" 2>"$OUT/check.err" \
            || { tail -20 "$OUT/check.err" >&2; die "the tf.data pipeline is not Lode's for $m ($cut cut)"; }
    done
done

# --- one configuration each ----------------------------------------------------------------
run_tf() { # round workers
    local r="$1" n="$2" dir="$OUT/tf-r$1-n$2" i pids configs=()
    mkdir -p "$dir"
    "${PEER[@]}" tf-dispatcher --ready "$dir/dispatcher.addr" 2>"$dir/dispatcher.err" &
    STARTED+=($!); pids="dispatcher=$!"
    wait_file "$dir/dispatcher.addr" 120 "the tf.data dispatcher" || { fail "tf.data service, $n worker(s), round $r" "$dir/dispatcher.err"; stop_started; return; }
    for ((i = 1; i <= n; i++)); do
        "${PEER[@]}" tf-worker --dispatcher "$(cat "$dir/dispatcher.addr")" --ready "$dir/worker$i.ready" 2>"$dir/worker$i.err" &
        STARTED+=($!); pids="$pids,worker$i=$!"
    done
    for ((i = 1; i <= n; i++)); do
        wait_file "$dir/worker$i.ready" 120 "tf.data worker $i" || { fail "tf.data service, $n worker(s), round $r" "$dir/worker$i.err"; stop_started; return; }
    done
    for m in $MODELS; do for cut in simple full; do for mode in parallel_epochs distributed_epoch; do for loop in function python; do
        configs+=(--config "$m:$cut:$mode:$loop")
    done; done; done; done
    echo "round $r: tf.data service, N = $n" >&2
    "${PEER[@]}" tf-consume --dispatcher "$(cat "$dir/dispatcher.addr")" --data "$DATA" "${configs[@]}" \
        --pids "$pids" --workers "$n" --round "$r" --warmup "$WARMUP" --window "$WINDOW" --timeout "$TIMEOUT" --out "$RESULTS" \
        > /dev/null 2>"$dir/consumer.err" || fail "tf.data service, $n worker(s), round $r" "$dir/consumer.err"
    stop_started
}

run_lode() { # round workers model cut
    local r="$1" n="$2" m="$3" cut="$4" dir="$OUT/lode-r$1-n$2-$3-$4" i pids label
    label="Lode $cut cut, $n worker"; ((n == 1)) || label+=s
    mkdir -p "$dir/journal"
    "$LODE" dispatcher --plan "$DATA/$m/plan-$cut" --journal "$dir/journal" --token peer-bench \
        --addr-file "$dir/dispatcher.addr" -q >/dev/null 2>"$dir/dispatcher.err" &
    STARTED+=($!); pids="dispatcher=$!"
    wait_file "$dir/dispatcher.addr" 60 "lode dispatcher" || { fail "$label, $m, round $r" "$dir/dispatcher.err"; stop_started; return; }
    for ((i = 1; i <= n; i++)); do
        "$LODE" worker --dispatcher "$(cat "$dir/dispatcher.addr")" --token peer-bench --name "worker$i" -q \
            >/dev/null 2>"$dir/worker$i.err" &
        STARTED+=($!); pids="$pids,worker$i=$!"
    done
    "$LODE" consume --dispatcher "$(cat "$dir/dispatcher.addr")" --token peer-bench --log "$dir/consumer.jsonl" \
        --step-time 0 -q >/dev/null 2>"$dir/consumer.err" &
    STARTED+=($!); pids="$pids,consumer=$!"
    echo "round $r: $label, $m" >&2
    "${PEER[@]}" lode-sample --log "$dir/consumer.jsonl" --pids "$pids" --label "$label" --model "$m" --cut "$cut" \
        --workers "$n" --round "$r" --warmup "$WARMUP" --window "$WINDOW" --timeout "$TIMEOUT" --out "$RESULTS" >/dev/null 2>"$dir/sample.err" \
        || fail "$label, $m, round $r" "$dir/sample.err" "$dir/dispatcher.err" "$dir/worker1.err" "$dir/consumer.err"
    stop_started
    rm -rf "$dir/journal" "$dir/consumer.jsonl"
}

run_exec() { # round model cut
    echo "round $1: lode exec --threads 1, $2 $3 cut" >&2
    "${PEER[@]}" exec-cpu --lode "$LODE" --plan "$DATA/$2/plan-$3" --model "$2" --cut "$3" --round "$1" \
        --steps $((SHORT ? 100 : 40000)) --out "$RESULTS" >/dev/null 2>"$OUT/exec-r$1-$2-$3.err" \
        || fail "lode exec, $2 $3 cut, round $1" "$OUT/exec-r$1-$2-$3.err"
}

run_eff() { # model cut
    echo "worker efficiency: $1 $2 cut, $ROUNDS round(s) of worker and exec windows" >&2
    "${PEER[@]}" worker-eff --lode "$LODE" --plan "$DATA/$1/plan-$2" --model "$1" --cut "$2" \
        --rounds "$ROUNDS" --warmup "$WARMUP" --window "$WINDOW" --out "$OUT/eff.jsonl" "${PIN[@]}" \
        >>"$OUT/eff.txt" 2>"$OUT/eff-$1-$2.err" || fail "worker efficiency, $1 $2 cut" "$OUT/eff-$1-$2.err"
}

# --- rounds: every configuration once per round, tf.data service and Lode alternating first ---
# The tree's head describes the binary only when the binary is this tree's build.
TREE="tree at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$([[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null | head -1)" ]] && echo ' dirty' || true)"
case "$LODE" in
    "$REPO"/target/*) ;;
    *) TREE="not this tree's target/ (the $TREE)" ;;
esac
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "machine: $(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*:[[:space:]]*//'), nproc $(nproc)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "lode: $LODE (built $(date -u -r "$LODE" '+%Y-%m-%d %H:%M UTC'); $TREE)"
    echo "tensorflow: $TF_VERSION"
    echo "workload: $ROUNDED records per model, batch 32; $ROUNDS round(s); warmup ${WARMUP} s, window ${WINDOW} s"
} > "$OUT/meta.txt"
cat "$OUT/meta.txt" >&2
for ((r = 1; r <= ROUNDS; r++)); do
    lode_round() {
        # With one worker and exec both asked for, each `lode exec` runs right after the one-worker
        # run of its plan: the worker's efficiency is a ratio of the two, and this machine's
        # speed drifts over minutes.
        local paired=0
        [[ " $ENGINES " == *" lode "* && " $ENGINES " == *" exec "* && " $WORKERS " == *" 1 "* ]] && paired=1
        if [[ " $ENGINES " == *" lode "* ]]; then
            for n in $WORKERS; do for m in $MODELS; do for cut in simple full; do
                run_lode "$r" "$n" "$m" "$cut"
                if ((paired && n == 1)); then run_exec "$r" "$m" "$cut"; fi
            done; done; done
        fi
        if [[ " $ENGINES " == *" exec "* ]] && ((paired == 0)); then
            for m in $MODELS; do for cut in simple full; do run_exec "$r" "$m" "$cut"; done; done
        fi
    }
    tf_round() { [[ " $ENGINES " != *" tf "* ]] || for n in $WORKERS; do run_tf "$r" "$n"; done; }
    if ((r % 2)); then tf_round; lode_round; else lode_round; tf_round; fi
done
if [[ " $ENGINES " == *" eff "* ]]; then
    for m in $MODELS; do for cut in simple full; do run_eff "$m" "$cut"; done; done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/meta.txt"

# --- the table -----------------------------------------------------------------------------
{
    cat "$OUT/meta.txt"
    echo
    # The table of the tf, lode and exec rows (an eff-only run has none).
    if [[ -s "$RESULTS" ]]; then
        "${PEER[@]}" table "$RESULTS" || die "no table: $RESULTS"
    fi
    if [[ -s "$OUT/eff.txt" ]]; then
        echo
        echo "worker efficiency in alternating windows (peer.py worker-eff; the ratio of each round's"
        echo "worker samples per CPU-s to its exec run's, target >= 0.90):"
        echo
        sed 's/^/    /' "$OUT/eff.txt"
    fi
} > "$OUT/table.md"
echo
cat "$OUT/table.md"
echo
echo "results: $RESULTS"
if ((${#FAILED[@]})); then
    echo "peer.sh: ${#FAILED[@]} configuration(s) failed:" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    exit 1
fi
