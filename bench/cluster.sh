#!/usr/bin/env bash
# The cluster tables (docs/cluster.md), one run after the other: a calm run and each single
# fault (a worker host's link down, a worker frozen, a worker killed and replaced, a 4x-slow
# worker) on four hosts made of network namespaces, 2,000 steps, the consumer at 10 ms a step,
# faults of 6 s; then the straggler table (two healthy workers alone, and with a third 4x
# slower, the consumer taking no time); then the partitions, each beside a calm run: the
# dispatcher's host cut off, and a worker host back with stale leases. Needs root and
# iproute2. Prints the tables as Markdown; LODE_CLUSTER_TABLE=FILE and
# LODE_CLUSTER_STRAGGLER_TABLE=FILE also write the first two.
# LODE_CLUSTER_BIN=PATH runs the dispatcher and workers of another build (to compare).
# Any LODE_CLUSTER_* setting given in the environment wins (see tests/e2e/cluster.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export LODE_CLUSTER_STEPS="${LODE_CLUSTER_STEPS:-2000}"
export LODE_CLUSTER_FAULT_MS="${LODE_CLUSTER_FAULT_MS:-6000}"
export LODE_CLUSTER_FAULT_AT_MS="${LODE_CLUSTER_FAULT_AT_MS:-5000}"
export LODE_CLUSTER_MAX_EXTRA_STALL_MS="${LODE_CLUSTER_MAX_EXTRA_STALL_MS:-1000}"
exec cargo nextest run --test e2e cluster:: --test-threads 1 --no-capture "$@"
