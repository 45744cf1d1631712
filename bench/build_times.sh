#!/usr/bin/env bash
# Build times of two commits, each in a worktree of its own with an empty target dir: a cold
# `cargo build --workspace --timings` (debug), then the incremental rebuild after a change to
# one kernel file and one service file (a comment appended, timed twice each). Prints one line
# a measurement; keeps each cold build's cargo-timing.html in OUT.
#   bench/build_times.sh OUT "NAME REV KERNEL_FILE SERVICE_FILE" ...
# The split of the data-worker crate (issue 48), as measured in docs/build-times.md:
#   bench/build_times.sh /tmp/bt \
#     "before 794c890 dataworker/src/kernels/strings.rs dataworker/src/service/worker.rs" \
#     "after 9b834ba runtime/src/kernels/strings.rs dataworker/src/worker.rs"
set -euo pipefail
repo="$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
out="$1"; shift
mkdir -p "$out"
now() { date +%s.%N; }
for spec in "$@"; do
  read -r name rev kernel service <<<"$spec"
  dir="$out/worktree-$name"
  rm -rf "$dir"
  git -C "$repo" worktree add --detach "$dir" "$rev" >/dev/null 2>&1
  (
    cd "$dir"
    export CARGO_TARGET_DIR="$dir/target"
    s=$(now); cargo build --workspace --locked --timings >/dev/null 2>&1; e=$(now)
    echo "$name $rev cold: $(echo "$e - $s" | bc) s"
    cp target/cargo-timings/cargo-timing.html "$out/timing-$name.html"
    for f in "$kernel" "$service"; do
      for i in 1 2; do
        echo "// touched" >> "$f"
        s=$(now); cargo build --workspace --locked >/dev/null 2>&1; e=$(now)
        echo "$name $rev after a change to $f (run $i): $(echo "$e - $s" | bc) s"
        git checkout -q -- "$f"
        cargo build --workspace --locked >/dev/null 2>&1
      done
    done
  )
  git -C "$repo" worktree remove --force "$dir"
done
