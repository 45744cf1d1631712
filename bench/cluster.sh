#!/usr/bin/env bash
# The cluster fault table (docs/cluster.md): a calm run and each single fault (a worker host's
# link down, a worker frozen, a worker killed and replaced, a slow worker) on four hosts made of
# network namespaces, 2,000 steps, the consumer at 10 ms a step, faults of 6 s. Needs root and
# iproute2. Prints the table as Markdown; LODE_CLUSTER_TABLE=FILE also writes it there.
# Any LODE_CLUSTER_* setting given in the environment wins (see tests/e2e/cluster.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export LODE_CLUSTER_STEPS="${LODE_CLUSTER_STEPS:-2000}"
export LODE_CLUSTER_FAULT_MS="${LODE_CLUSTER_FAULT_MS:-6000}"
export LODE_CLUSTER_FAULT_AT_MS="${LODE_CLUSTER_FAULT_AT_MS:-5000}"
exec cargo nextest run --test e2e cluster_faults --no-capture --success-output immediate
