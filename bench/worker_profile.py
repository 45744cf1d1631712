#!/usr/bin/env python3
"""Where a `lode worker`'s CPU goes, part by part, on a running job (issue 17's last target).

    python3 bench/worker_profile.py --plan target/bench-data/peer/deepfm/plan-simple \
        [--lode BIN] [--seconds 5] [--warmup 2] [--no-perf] [--keep perf.data] \
        [--step-time D] [--journal-compact SIZE] [--restart]

Starts one job (`lode dispatcher`, one `lode worker --metrics`, `lode consume --step-time 0`),
lets it warm up, then over a window reads the worker's counters at both edges and its CPU
(`/proc/PID/stat`), and prints per step: the worker's CPU, its stage, the freeing of the sent
tensors, the rest (overhead), and the stage and the freeing over the worker's CPU (the steady
figure of `peer.py worker-eff`); and the dispatcher's CPU and the journal's growth. With
perf (the default), the window is also sampled (`perf record -g`, 2999 Hz) and every sample is put in the first part whose function is on
its stack, in this order: the stage, the freeing, the frame encoder, the data-plane send, the
push answers, the lease answers, the dispatcher RPCs (tonic, h2, hyper, prost: the lease
requests with their reports and the heartbeat), the rest of `compute_step`, the worker's
loop, and what is left (the runtime: the I/O driver, timers). Build with frame pointers for
whole stacks:

    RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=/work/tprof \
        cargo build --profile profiling --bin lode

With --restart, the dispatcher is SIGKILLed after the window and a new one started on its
journal: the journal's size, and the restart's CPU and peak RSS until it serves (its replay).

Only the standard library; perf must be installed for the split (not for the counters).
"""

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer import TICK, cpu_ticks, spawn_logged, stop_all, worker_counters  # noqa: E402 (stdlib only at import)

# (part, substrings of a function's name): a sample goes to the first part with a match
# anywhere on its stack.
PARTS = [
    ("stage", ["Stage::run_step"]),
    ("freeing", ["drop_in_place<lode_transfer::codec::StepMessage>"]),
    ("encoder", ["encode_owned_for"]),
    ("send", ["worker::send_flight", "send_frames"]),
    ("push answers", ["worker::settle"]),
    ("lease answers", ["worker::absorb"]),
    ("dispatcher RPCs", ["tonic::", "h2::", "hyper::", "prost::", "DispatcherClient"]),
    ("compute_step, besides the stage", ["worker::compute_step"]),
    ("the worker's loop", ["worker::run_registration"]),
]


def die(msg):
    print(f"worker_profile: {msg}", file=sys.stderr)
    sys.exit(2)


def wait_for(what, ready, procs, work, seconds=60):
    deadline = time.monotonic() + seconds
    while not ready():
        for name, p in procs:
            if p.poll() is not None:
                with open(os.path.join(work, f"{name}.err"), "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                die(f"the {name} exited ({p.returncode}) before {what}: {tail}")
        if time.monotonic() > deadline:
            die(f"no {what} after {seconds} s")
        time.sleep(0.02)


def split(perf_data):
    """Samples by part, and the leaf functions of those in no part."""
    script = subprocess.run(["perf", "script", "-i", perf_data, "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    parts, rest, total = collections.Counter(), collections.Counter(), 0
    for block in script.split("\n\n"):
        frames = [line.strip().split(" ", 1)[1] for line in block.strip().splitlines()
                  if " " in line.strip()]
        if not frames:
            continue
        total += 1
        for name, keys in PARTS:
            if any(k in f for f in frames for k in keys):
                parts[name] += 1
                break
        else:
            parts["the rest (runtime, kernel)"] += 1
            rest[frames[0][:90]] += 1
    return parts, rest, total


def restart(args, dispatcher, journal, work):
    """Kills the dispatcher, then restarts one on its journal: the replay's CPU and memory."""
    dispatcher.kill()
    dispatcher.wait()
    with open(journal, "rb") as f:
        data = f.read()
    lines = data.count(b"\n")
    print(f"  restart: the journal holds {len(data)} bytes in {lines} lines")
    log = os.path.join(work, "restarted.err")
    cmd = [args.lode, "dispatcher", "--plan", args.plan, "--journal", os.path.dirname(journal),
           "--token", "profile"]
    if args.journal_compact:
        cmd += ["--journal-compact", args.journal_compact]
    started = time.monotonic()
    env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)

    def logged(what):
        with open(log, "rb") as f:
            return what in f.read()

    # Its address is printed before the replay; "dispatcher serving" is logged after it.
    while not logged(b"dispatcher serving"):
        if p.poll() is not None:
            die(f"the restarted dispatcher exited ({p.returncode}) before serving")
        if time.monotonic() - started > 120:
            p.kill()
            die("the restarted dispatcher did not serve within 120 s")
        time.sleep(0.01)
    serving = time.monotonic() - started
    # SIGINT until it stops: one sent before it watches for signals is lost.
    while True:
        os.kill(p.pid, 2)  # not p.send_signal: it would reap the child before wait4 does
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.2)
    print(f"  restart: serving after {serving:.2f} s; {usage.ru_utime:.2f} s user, "
          f"{usage.ru_stime:.2f} s sys, {usage.ru_maxrss / 1024:.0f} MB peak RSS "
          f"(exit status {os.waitstatus_to_exitcode(status)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--lode", default=os.path.join(os.path.dirname(__file__), "..", "target",
                                                   "release", "lode"))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--step-time", default="0",
                    help="the consumer's --step-time (default 0: as fast as it can)")
    ap.add_argument("--journal-compact", metavar="SIZE",
                    help="the dispatcher's --journal-compact (default: its own)")
    ap.add_argument("--restart", action="store_true",
                    help="after the window, SIGKILL the dispatcher and time a restart on its "
                         "journal (CPU and peak RSS until it serves, then SIGINT)")
    ap.add_argument("--keep", metavar="PATH",
                    help="keep perf's recording at PATH (for perf report), instead of deleting it")
    args = ap.parse_args()
    if not os.access(args.lode, os.X_OK):
        die(f"no lode binary at {args.lode} (cargo build --release, or --lode)")
    if not os.path.isdir(args.plan):
        die(f"no plan directory at {args.plan}")
    perf = not args.no_perf
    if perf and shutil.which("perf") is None:
        die("perf is not installed (apt-get install linux-perf), or pass --no-perf")

    work = tempfile.mkdtemp(prefix="lode-profile-")
    procs = []

    def spawn(name, cmd, stdout=subprocess.DEVNULL):
        return spawn_logged(procs, work, name, cmd, stdout)

    try:
        addr_file = os.path.join(work, "dispatcher.addr")
        journal = os.path.join(work, "journal", "journal.jsonl")
        dispatcher = spawn("dispatcher", [args.lode, "dispatcher", "--plan", args.plan,
                                          "--journal", os.path.dirname(journal), "--token",
                                          "profile", "--addr-file", addr_file, "-q"]
                           + (["--journal-compact", args.journal_compact]
                              if args.journal_compact else []))
        wait_for("dispatcher address", lambda: os.path.exists(addr_file)
                 and os.path.getsize(addr_file) > 0, procs, work)
        with open(addr_file) as f:
            addr = f.read().strip()
        worker_out = os.path.join(work, "worker.out")
        worker = spawn("worker", [args.lode, "worker", "--dispatcher", addr, "--token",
                                  "profile", "--name", "profile", "--metrics", "127.0.0.1:0"],
                       stdout=open(worker_out, "wb"))
        spawn("consumer", [args.lode, "consume", "--dispatcher", addr, "--token", "profile",
                           "--log", os.devnull, "--step-time", args.step_time, "-q"])

        def url():
            with open(worker_out) as f:
                return next((w for w in f.read().split() if w.startswith("http://")), None)

        wait_for("metrics address from the worker", lambda: url() is not None, procs, work)
        metrics = url()
        wait_for("step computed", lambda: worker_counters(metrics).get(
            "lode_worker_steps_computed_total", 0) > 0, procs, work)
        time.sleep(args.warmup)
        m0, c0, t0 = worker_counters(metrics), cpu_ticks(worker.pid) / TICK, time.monotonic()
        d0, j0, i0 = cpu_ticks(dispatcher.pid) / TICK, os.path.getsize(journal), os.stat(journal).st_ino
        perf_data = os.path.join(work, "perf.data")
        if perf:
            record = subprocess.run(["perf", "record", "-F", "2999", "-g", "-p",
                                     str(worker.pid), "-o", perf_data, "--", "sleep",
                                     str(args.seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if record.returncode != 0:
                die(f"perf record failed ({record.returncode}; kernel.perf_event_paranoid "
                    f"may forbid it, or pass --no-perf): {record.stderr[-1000:]}")
        else:
            time.sleep(args.seconds)
        m1, c1, t1 = worker_counters(metrics), cpu_ticks(worker.pid) / TICK, time.monotonic()
        d1, j1, i1 = cpu_ticks(dispatcher.pid) / TICK, os.path.getsize(journal), os.stat(journal).st_ino
        for name, p in procs:
            if p.poll() is not None:
                die(f"the {name} exited ({p.returncode}) during the window")

        def delta(key):
            return m1[key] - m0[key]

        steps = delta("lode_worker_steps_computed_total")
        if steps <= 0:
            die("the worker computed nothing in the window")
        us = 1e6 / steps
        cpu, stage = (c1 - c0) * us, delta("lode_worker_compute_seconds_total") * us
        freeing = delta("lode_worker_release_seconds_total") * us
        sent = delta("lode_worker_sent_bytes_total") / steps
        print(f"{args.plan}: {steps:.0f} steps in {t1 - t0:.1f} s; per step: the worker's CPU "
              f"{cpu:.1f} us, stage {stage:.1f} us, freeing {freeing:.1f} us, overhead "
              f"{cpu - stage - freeing:.1f} us, {sent:.0f} bytes sent; stage and freeing over "
              f"the worker's CPU {(stage + freeing) / cpu:.3f}")
        # The journal grows in the window by what the dispatcher's writer thread wrote (a
        # line or two may still be on their way at either edge).
        # A compaction in the window replaces the file: its growth says nothing then.
        growth = (f"{(j1 - j0) / steps:.0f} journal bytes a step" if i1 == i0 else
                  f"a journal compacted in the window ({j0} -> {j1} bytes)")
        print(f"  the dispatcher: {(d1 - d0) * us:.2f} us of CPU and {growth}")
        sampled = m1.get("lode_worker_stage_cpu_steps_total", 0) - m0.get(
            "lode_worker_stage_cpu_steps_total", 0)
        if sampled > 0:
            # perf's sampling interrupts the worker too, and its own process takes a CPU:
            # the stage's wall time can read high here, its CPU clock less so.
            print(f"  the stage by its thread's CPU clock ({sampled:.0f} steps): "
                  f"{delta('lode_worker_stage_cpu_seconds_total') / sampled * 1e6:.1f} us a "
                  f"step, against {delta('lode_worker_stage_cpu_wall_seconds_total') / sampled * 1e6:.1f}"
                  f" us of wall time on the same steps")
        if perf:
            parts, rest, total = split(perf_data)
            print(f"perf: {total} samples of the worker's threads; share of them and µs per "
                  f"step (at the worker's CPU per step)")
            for name, n in parts.most_common():
                print(f"  {100 * n / total:5.1f}%  {cpu * n / total:5.2f} us  {name}")
            print("  leaves of the rest:")
            for leaf, n in rest.most_common(8):
                print(f"    {100 * n / total:5.2f}%  {leaf}")
            if args.keep:
                shutil.move(perf_data, args.keep)
                print(f"perf's recording: {args.keep}")
        if args.restart:
            restart(args, dispatcher, journal, work)
    finally:
        stop_all(procs, work)


if __name__ == "__main__":
    main()
