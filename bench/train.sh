#!/usr/bin/env bash
# lode train against plain TensorFlow on the wide & deep fixture program, the training process
# pinned to core 0 in both runs; Lode's dispatcher and data worker on core 1.
#   PYTHON: a Python with tensorflow-cpu 2.18.1 and Lode's package (pip install ./python)
#   LODE:   the lode binary (release build)
#   EPOCHS: passes of 8 steps (default 200), ROUNDS: interleaved rounds (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$HOME/.cache/lode/tf-2.18.1/bin/python}"
LODE="${LODE:-target/release/lode}"
EPOCHS="${EPOCHS:-200}"
ROUNDS="${ROUNDS:-3}"
PROGRAM=(fixtures/programs/wide_deep_session.py --data fixtures/wide_deep/data --epochs "$EPOCHS")
export TF_CPP_MIN_LOG_LEVEL=2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$ROUNDS"); do
  plain=$(taskset -c 0 "$PYTHON" "${PROGRAM[@]}" --losses "$tmp/plain.txt" | tail -1)
  lode=$(taskset -c 1 "$LODE" train --workers 1 -- taskset -c 0 "$PYTHON" "${PROGRAM[@]}" --losses "$tmp/lode.txt" 2>/dev/null | tail -1)
  cmp -s "$tmp/plain.txt" "$tmp/lode.txt" && same="losses bit-identical" || same="LOSSES DIFFER"
  echo "round $round: plain TF: $plain | lode train: $lode | $same"
done
taskset -c 1 "$LODE" train --workers 1 -- taskset -c 0 "$PYTHON" bench/dwrecv_cost.py --data fixtures/wide_deep/data 2>/dev/null | tail -1
