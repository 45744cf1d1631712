#!/usr/bin/env bash
# The goodput table of docs/cluster.md: a worker on one network-namespace host pushing a
# synthetic job's 1 MiB steps to `lode consume` on another, over a link shaped to 1 Gbit/s
# each way (`tc tbf`) and over an unshaped one, with --compression off, lz4 and auto, for
# compressible steps (int64 feature ids) and incompressible ones (float32 from a hash).
# Each round runs the three settings in turn, starting from a different one each round; the
# table gives the median goodput (and every run's), the bytes on the worker's link over the
# payload, and the load average at the runs' starts. Needs root and iproute2.
# Settings: LODE_LINKS_STEPS (1,200 steps on the shaped link), LODE_LINKS_UNSHAPED_STEPS
# (4,000), LODE_LINKS_ROUNDS (3), LODE_LINKS_TABLE=FILE, LODE_LINKS_ONLY (one link, "1 Gbit/s" or
# "unshaped", or one kind, "ids" or "floats"). The table also gives auto against the better
# of off and lz4 round by round (paired: the three run back to back), and its median.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo nextest run --release --test e2e links::goodput_by_compression_and_link \
    --run-ignored ignored-only --test-threads 1 --no-capture "$@"
