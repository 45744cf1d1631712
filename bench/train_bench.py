#!/usr/bin/env python3
"""The train benchmark: a real TensorFlow program trained under each input configuration.

    python3 bench/train_bench.py [--rounds 3] [--steps 3000] [--warmup 500] [--pin]
        [--models wide_deep,deepfm] [--configs plain,service,simple,full,cached]

For each round (interleaved: every model and configuration once per round), the training
program bench/train_program.py runs --steps steps and reports its rate over the steps after
--warmup and its own CPU per sample over the same window. Configurations:

    plain    plain TensorFlow, the pipeline in the training process
    service  tf.data service: a dispatcher and --workers workers started here (bench/peer.py
             tf-dispatcher / tf-worker, as the peer benchmark starts them); the program's parsed
             dataset `distribute`d to it (parallel_epochs)
    simple   `lode train --simple --workers N` (the cut at IteratorGetNext), unchanged program
    full     `lode train --workers N` (the full stateless cut), unchanged program
    cached   the input nearly free: the first parsed batch as constants every step, in process

--variant NAME=DIR adds, in every round, the Lode configurations run again with DIR first on
the training program's PYTHONPATH (another build of Lode's package, `pip install --target DIR
./python`): a paired before/after of a change to the training side.

--pin puts the training process on CPU 0 and everything else (Lode's dispatcher and workers,
tf.data service's dispatcher and workers) on CPU 1; without it nothing is pinned. Lode's runs
are checked against the plain run of the same round: their losses must be bit-identical (a
difference is reported and makes the exit status 1).

Data: bench/make_data.py enlarges the fixtures' data to (--steps + 200) x 32 records, once
(BENCH_DATA, default target/bench-data/train). Environment: PYTHON (a Python with
tensorflow-cpu 2.18.1 and Lode's package installed, default ~/.cache/lode/venv-train/bin/python),
LODE (default target/release/lode). Every run's row goes to --out (JSON lines); the summary is
a markdown table of medians and ranges.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "bench", "train_program.py")
PEER = os.path.join(REPO, "bench", "peer.py")
CONFIGS = ["plain", "service", "simple", "full", "cached"]
MODELS = ["wide_deep", "deepfm"]
LABELS = {
    "plain": "plain TensorFlow",
    "service": "tf.data service",
    "simple": "lode train --simple",
    "full": "lode train (full cut)",
    "cached": "input nearly free",
}
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def die(message):
    sys.stderr.write(f"train_bench: {message}\n")
    sys.exit(2)


def pinned(cpu, cmd, pin):
    return ["taskset", "-c", str(cpu), *cmd] if pin else cmd


def prepare(data_root, records):
    stamp = os.path.join(data_root, "wide_deep", ".bench_records")
    want = f"{-(-records // 32) * 32}\n"
    fresh = all(os.path.exists(os.path.join(data_root, m, ".bench_records")) and
                open(os.path.join(data_root, m, ".bench_records")).read() == want for m in MODELS)
    if not fresh:
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "make_data.py"), "--out", data_root,
                        "--records", str(records), "--only", "wide_deep", "--only", "deepfm"], check=True)
    return stamp


def wait_for(path, procs, what, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: a process exited with status {p.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout} s")
        time.sleep(0.05)


class Service:
    """A tf.data service dispatcher and its workers, stopped on exit."""

    def __init__(self, python, workers, pin, tmp):
        self.procs, self.logs = [], []
        tmp = tempfile.mkdtemp(prefix="service-", dir=tmp)  # no ready file of an earlier run
        ready = os.path.join(tmp, "dispatcher.addr")
        self.spawn(pinned(1, [python, PEER, "tf-dispatcher", "--ready", ready], pin), tmp, "dispatcher")
        wait_for(ready, self.procs, "tf.data service dispatcher")
        with open(ready) as f:
            self.target = f.read().strip()
        readies = []
        for i in range(workers):
            r = os.path.join(tmp, f"worker{i}.ready")
            self.spawn(pinned(1, [python, PEER, "tf-worker", "--dispatcher", self.target, "--ready", r], pin),
                       tmp, f"worker{i}")
            readies.append(r)
        for r in readies:
            wait_for(r, self.procs, "tf.data service worker")
        if "://" not in self.target:
            self.target = "grpc://" + self.target

    def spawn(self, cmd, tmp, name):
        log = open(os.path.join(tmp, f"{name}.log"), "w")
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=QUIET))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        for log in self.logs:
            log.close()


def run_one(args, model, config, data, tmp, path=None):
    losses = os.path.join(tmp, f"{model}.{config}.losses")
    env = QUIET if path is None else {**QUIET, "PYTHONPATH": os.pathsep.join(
        p for p in (path, QUIET.get("PYTHONPATH")) if p)}
    program = [args.python, PROGRAM, "--model", model, "--data", data, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--losses", losses]
    service = None
    if config == "cached":
        program.append("--cached")
    if config in ("plain", "cached"):
        cmd = pinned(0, program, args.pin)
    elif config == "service":
        service = Service(args.python, args.workers, args.pin, tmp)
        cmd = pinned(0, program + ["--service", service.target], args.pin)
    else:
        lode = [args.lode, "train", "--workers", str(args.workers), "--journal", os.path.join(tmp, "job")]
        if config == "simple":
            lode.append("--simple")
        cmd = pinned(1, lode + ["--", *pinned(0, program, args.pin)], args.pin)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    finally:
        if service is not None:
            service.__exit__()
        shutil.rmtree(os.path.join(tmp, "job"), ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    if config in ("simple", "full") and "training on Lode" not in done.stderr:
        said = [line for line in done.stderr.splitlines() if line.startswith("lode:")]
        raise RuntimeError(f"{model} {config}: the program did not train on Lode: {said}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{done.stdout[-2000:]}")
    return json.loads(lines[-1]), losses


def same_losses(a, b):
    with open(a) as fa, open(b) as fb:
        return [line.split(" ", 2)[:2] for line in fa] == [line.split(" ", 2)[:2] for line in fb]


def label(row):
    return LABELS[row["config"]] + (f" [{row['variant']}]" if row.get("variant") else "")


def summary(rows, models):
    out = ["| model | configuration | samples/s median [range] | x tf.data service | x plain TF "
           "| training CPU us/sample median [range] | CPU x plain |",
           "|---|---|---|---|---|---|---|"]
    for model in models:
        med = {}
        for key in dict.fromkeys(label(r) for r in rows if r["model"] == model):
            rs = [r for r in rows if r["model"] == model and label(r) == key]
            med[key] = (statistics.median(r["samples_per_s"] for r in rs),
                        statistics.median(r["cpu_us_per_sample"] for r in rs), rs)
        for key, (rate, cpu, rs) in med.items():
            rates = [r["samples_per_s"] for r in rs]
            cpus = [r["cpu_us_per_sample"] for r in rs]

            def ratio(base, value, i):
                base = LABELS[base]
                return f"{value / med[base][i]:.2f}x" if base in med else "-"

            out.append(f"| {model} | {key} | {rate:,.0f} [{min(rates):,.0f}-{max(rates):,.0f}] "
                       f"| {ratio('service', rate, 0)} | {ratio('plain', rate, 0)} "
                       f"| {cpu:.2f} [{min(cpus):.2f}-{max(cpus):.2f}] | {ratio('plain', cpu, 1)} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="also run the Lode configurations with DIR first on PYTHONPATH")
    ap.add_argument("--pin", action="store_true", help="the training process on CPU 0, the rest on CPU 1")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(REPO, "target", "bench-data", "train-results.jsonl"))
    ap.add_argument("--python", default=os.environ.get(
        "PYTHON", os.path.expanduser("~/.cache/lode/venv-train/bin/python")))
    ap.add_argument("--lode", default=os.environ.get("LODE", os.path.join(REPO, "target", "release", "lode")))
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    for m in models:
        if m not in MODELS:
            die(f"--models: {m!r} is not one of {', '.join(MODELS)}")
    for c in configs:
        if c not in CONFIGS:
            die(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")
    variants = []
    for v in args.variant:
        name, sep, path = v.partition("=")
        if not sep or not name or not os.path.isdir(os.path.join(path, "lode")):
            die(f"--variant {v!r}: expected NAME=DIR, DIR holding a `lode` package")
        variants.append((name, os.path.abspath(path)))
    if args.rounds < 1 or args.workers < 1 or not 0 < args.warmup < args.steps:
        die("--rounds and --workers must be positive, --warmup between 0 and --steps")
    if not os.access(args.python, os.X_OK):
        die(f"no python at {args.python}: set PYTHON to a Python with tensorflow-cpu 2.18.1 and "
            f"Lode's package (pip install ./python)")
    if any(c in ("simple", "full") for c in configs) and not os.access(args.lode, os.X_OK):
        die(f"no lode binary at {args.lode}: cargo build --release, or set LODE")
    data_root = os.environ.get("BENCH_DATA", os.path.join(REPO, "target", "bench-data", "train"))
    prepare(data_root, (args.steps + 200) * 32)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows, failures = [], []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="lode-train-bench-") as tmp, open(args.out, "a") as out:
        for rnd in range(1, args.rounds + 1):
            for model in models:
                data = os.path.join(data_root, model, "data")
                plain_losses = None
                runs = [(c, None, None) for c in configs] + [
                    (c, name, path) for name, path in variants for c in configs if c in ("simple", "full")]
                for config, variant, path in runs:
                    what = f"{model} {config}" + (f" [{variant}]" if variant else "")
                    try:
                        row, losses = run_one(args, model, config, data, tmp, path)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        failures.append(f"round {rnd} {what}: {e}")
                        print(f"FAILED round {rnd} {what}: {e}", file=sys.stderr)
                        continue
                    row.update(config=config, variant=variant, round=rnd, pin=args.pin, workers=args.workers, started=started)
                    if config == "plain":
                        plain_losses = losses + ".plain"
                        os.replace(losses, plain_losses)
                    elif config in ("simple", "full") and plain_losses is not None:
                        row["losses_identical"] = same_losses(plain_losses, losses)
                        if not row["losses_identical"]:
                            failures.append(f"round {rnd} {what}: losses differ from plain TF's")
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"round {rnd} {model:9} {label(row):28} {row['samples_per_s']:9,.0f} samples/s "
                          f"{row['cpu_us_per_sample']:6.2f} us CPU/sample"
                          + (f" losses {'identical' if row['losses_identical'] else 'DIFFER'}"
                             if "losses_identical" in row else ""), flush=True)
    pin = "pinned (training CPU 0, the rest CPU 1)" if args.pin else "unpinned"
    print(f"\n{started}, {args.rounds} rounds, {args.steps} steps (steady after {args.warmup}), "
          f"{args.workers} workers, {pin}\n")
    print(summary(rows, models))
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
