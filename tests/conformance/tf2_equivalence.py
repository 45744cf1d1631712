"""lode train: unmodified TensorFlow 2 and Keras programs train on Lode with bit-identical losses.

Runs every TF2 fixture program (fixtures/programs/tf2_*.py) plainly and under
`lode train --strict --workers 2` and compares the per-step losses' float bits: Keras 3 `fit`
over three epochs of a pipeline that reshuffles every epoch, Keras preprocessing layers in the
map, a custom loop with a `tf.function` step over eager epochs, and each epoch inside one
`tf.function` (AutoGraph's dataset loop), and a program with three pipelines (Keras `fit` with
`validation_data`, then `evaluate` on a third dataset: each dataset its own job, every loss,
`val_loss` and the `evaluate` result compared). Then the Keras fit, and the three-pipeline
program, over more epochs while a data worker is SIGKILLed every second and replaced, and
the three-pipeline program with remote workers that dial one address (`--workers 0`, no
`--announce`): its second pipeline runs on the program's side with one line, status 2 under
--strict; then
programs killed mid-epoch and restarted,
plainly and under `lode train` the same way: a custom loop restored from a
`tf.train.Checkpoint` holding its iterator (CheckpointManager, save/restore, write/read; one
checkpoint without the iterator), the same while a data worker is SIGKILLed every second,
and Keras `fit` with `BackupAndRestore`; then the fallbacks: programs Lode cannot serve
(py_function, from_generator, an unseeded random op, a distribution strategy, no pipeline at
all) run unchanged with one `lode:` line and exit 2 under --strict. Then Keras 2 in graph mode
(fixtures/programs/keras2_graph_fit.py, `tf_keras` with eager execution disabled: its session
exists before its iterator): bit-identical, also with a worker SIGKILLed every second; with
validation data or a second `fit` (a second pipeline of a TF1 graph, one job per TF1 program)
it trains on Lode, the second pipeline runs on the program's side with one line, and --strict
stops it with status 2.
Needs the training-side package installed in this Python (`pip install ./python`) and, for the
Keras 2 program, `tf_keras`.

    python tests/conformance/tf2_equivalence.py --lode target/debug/lode
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from losses import QUIET, compare, losses, run

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures"))
PROGRAMS = os.path.join(FIXTURES, "programs")
WIDE_DEEP = os.path.join(FIXTURES, "wide_deep", "data")
REGRESSION = os.path.join(FIXTURES, "adam_resource", "data")

# name -> (script, arguments, fewest steps the plain run must make)
CASES = {
    # Keras 3 fit, 3 epochs, shuffle(64, seed=5, reshuffle_each_iteration=True): each epoch's
    # iterator draws new seeds (8 steps an epoch).
    "keras_fit": ("tf2_keras_fit.py", ["--data", WIDE_DEEP, "--epochs", "3"], 24),
    "keras_preprocessing": ("tf2_keras_preprocessing.py", ["--data", WIDE_DEEP, "--epochs", "3"], 24),
    "custom_loop": ("tf2_custom_loop.py", ["--data", REGRESSION, "--epochs", "3"], 48),
    "custom_loop_in_function": ("tf2_custom_loop.py", ["--data", REGRESSION, "--epochs", "3", "--mode", "loop-in-function"], 48),
    "iter_in_function": ("tf2_custom_loop.py", ["--data", REGRESSION, "--epochs", "3", "--mode", "iter-in-function"], 48),
    "reduce_in_function": ("tf2_custom_loop.py", ["--data", REGRESSION, "--epochs", "3", "--mode", "reduce-in-function"], 48),
    # Three datasets, three jobs: fit's training data (8 steps an epoch, reshuffled), its
    # validation data (reshuffled too: each epoch validates on another sample, a new iterator
    # and the next pass of its job) and evaluate's test data (a partial last batch), which
    # predict then reads again (its job's second pass): 24 training losses, 3 val_loss, the
    # evaluate loss and the predictions' sum.
    "keras_validation": ("tf2_keras_validation.py", ["--data", WIDE_DEEP, "--epochs", "3"], 29),
}

# name -> how many jobs the program's datasets are (each its own job directory).
JOBS = {"keras_validation": 3, "validation_kills": 3}
VALIDATION_KILL_EPOCHS = 30

# name -> (script, arguments, the checkpoint directory's flag, the step after which the first
# run exits, the step the restarted run begins at, fewest steps of the two runs together). A
# custom loop of 3 epochs of 16 steps checkpointing every 10 steps, killed after step 25
# mid-epoch: its iterator restored, it goes on from step 20 of the job's order.
CHECKPOINT = ["--data", REGRESSION, "--epochs", "3", "--save-steps", "10"]
RESTARTS = {
    "checkpoint_manager": ("tf2_checkpoint.py", [*CHECKPOINT, "--api", "manager"], "--checkpoint-dir", 25, 20, 48),
    "checkpoint_save": ("tf2_checkpoint.py", [*CHECKPOINT, "--api", "save"], "--checkpoint-dir", 25, 20, 48),
    "checkpoint_write": ("tf2_checkpoint.py", [*CHECKPOINT, "--api", "write"], "--checkpoint-dir", 25, 20, 48),
    # An iterator per epoch, the checkpoint's in turn: the restarted program's first iterator
    # is restored into the second epoch's pass (its shuffle's seeds too), its next new
    # iterator is the third epoch's.
    "checkpoint_per_epoch": ("tf2_checkpoint.py", [*CHECKPOINT, "--per-epoch"], "--checkpoint-dir", 25, 20, 48),
    # The iterator left out of the checkpoint: TensorFlow's restarted program reads from the
    # data's start (a new iterator, the first seeds), its steps numbered on from 20.
    "checkpoint_without_iterator": ("tf2_checkpoint.py", [*CHECKPOINT, "--no-iterator"], "--checkpoint-dir", 25, 20, 68),
    # Keras 3 BackupAndRestore saves the weights and the epoch (every 3 batches here); `fit`
    # restarts at the beginning of the saved epoch (1: 8 steps an epoch, killed after step
    # 13), whose iterator is the restarted process's first: the shuffle's first seeds.
    "backup_and_restore": ("tf2_keras_fit.py", ["--data", WIDE_DEEP, "--epochs", "3", "--save-freq", "3"],
                           "--backup-dir", 13, 8, 24),
    "backup_and_restore_epoch": ("tf2_keras_fit.py", ["--data", WIDE_DEEP, "--epochs", "3"], "--backup-dir", 13, 8, 24),
}

# Keras 2 (tf_keras) in graph mode, 3 epochs of 16 steps: its session exists before its
# iterator, and Keras re-initializes the iterator every epoch.
KERAS2 = ("keras2_graph_fit.py", ["--data", REGRESSION, "--epochs", "3"], 48)
KERAS2_KILL_EPOCHS = 250

# case -> what the `lode:` line says
FALLBACKS = {
    "py_function": "py_function",
    "generator": "from_generator",
    "unseeded": "unseeded random op",
    "strategy": "distribution strategy",
    "none": "without Lode serving an input pipeline",
}

def said(stderr):
    return [line for line in stderr.splitlines() if line.startswith("lode:")]


def plain(script, args, path):
    run([sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path])
    return losses(path)


def equivalence(lode, name, tmp, case=None, never_rewound=False):
    """The program's losses under `lode train --strict --workers 2` equal its plain run's. With
    `never_rewound`, also: the job's order ran on from pass to pass (its journal holds no
    rewind of the training side, which would recompute steps already delivered)."""
    script, args, minimum = case or CASES[name]
    expected = plain(script, args, os.path.join(tmp, f"{name}.plain.txt"))
    path = os.path.join(tmp, f"{name}.lode.txt")
    job = os.path.join(tmp, f"{name}.job")
    done = run([lode, "train", "--strict", "--workers", "2", "--journal", job, "--",
                sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path])
    lines = said(done.stderr)
    if not any("training on Lode" in line for line in lines):
        return [f"{name}: expected the program to train on Lode; lode said {lines}"]
    failures = served_jobs(name, job, lines, JOBS.get(name, 1))
    if failures:
        return failures
    if never_rewound:
        with open(os.path.join(job, "journal", "journal.jsonl")) as f:
            rewinds = [line[:200] for line in f if '"Rewound"' in line]
        if rewinds:
            return [f"{name}: the job was rewound ({len(rewinds)} times, first: {rewinds[0]})"]
    return compare(f"{name} (lode train --strict --workers 2)", expected, losses(path), minimum)


def served_jobs(name, job, lines, expected):
    """[] when the program trained on `expected` jobs, each said once, job k > 1 in the job
    directory's `job-K/` with its own journal."""
    started = [line for line in lines if "training on Lode" in line]
    if len(started) != expected:
        return [f"{name}: expected {expected} job(s) to start, one line each; lode said {lines}"]
    missing = [k for k in range(2, expected + 1) if not os.path.isdir(os.path.join(job, f"job-{k}", "journal"))]
    if missing:
        return [f"{name}: no journal in {job}/job-K for jobs {missing}"]
    return []


def killing_workers(lode, tmp, name, program, journal):
    """Runs `program` under `lode train --workers 0` while a data worker is SIGKILLed every
    second and replaced (two workers started here from each job's announcement: the program's
    first job, `NAME.json`, and each later one, `NAME-jobK.json`, as it appears). Returns
    (status, stderr, kills)."""
    announce = os.path.join(tmp, f"{name}.jobs")
    train = subprocess.Popen(
        [lode, "train", "--strict", "--workers", "0", "--announce", announce, "--name", name,
         "--lease-ms", "1000", "--journal", journal, "--", *program],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=QUIET)
    card = os.path.join(announce, f"{name}.json")
    deadline = time.time() + 120
    while not os.path.exists(card):
        if train.poll() is not None or time.time() > deadline:
            train.kill()
            raise AssertionError(f"{name}: no announcement appeared: {train.communicate()[1][-2000:]}")
        time.sleep(0.05)
    log = open(os.path.join(tmp, f"{name}.workers.log"), "w")

    def worker(job):
        env = {**QUIET, "LODE_TOKEN": job["token"]}
        w = subprocess.Popen([lode, "worker", "--dispatcher", job["dispatcher"], "--job", str(job["job"])],
                             stdout=log, stderr=log, env=env)
        return job, w

    # (the worker's job, the worker), the oldest first; the cards followed so far.
    workers, kills, followed = [], 0, set()

    def follow():
        for file in sorted(os.listdir(announce)):
            if file in followed or not (file == f"{name}.json" or file.startswith(f"{name}-job")):
                continue
            with open(os.path.join(announce, file)) as f:
                job = json.load(f)
            followed.add(file)
            workers.extend([worker(job), worker(job)])

    follow()
    started = time.time()
    while train.poll() is None:
        if time.time() - started > 600:
            train.kill()
            break
        time.sleep(1.0)
        follow()
        job, victim = workers.pop(kills % len(workers))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        workers.append(worker(job))
        kills += 1
    for _, w in workers:
        w.kill()
        w.wait()
    _, stderr = train.communicate()
    log.close()
    return train.returncode, stderr, kills


def with_worker_kills(lode, tmp, name, script, args, minimum):
    """A program trained while a data worker is SIGKILLed every second and replaced."""
    expected = plain(script, args, os.path.join(tmp, f"{name}.plain.txt"))
    path = os.path.join(tmp, f"{name}.lode.txt")
    program = [sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path]
    job = os.path.join(tmp, f"{name}.job")
    status, stderr, kills = killing_workers(lode, tmp, name, program, job)
    if status != 0:
        return [f"{name}: lode train exited {status}: {stderr[-2000:]}"]
    if kills == 0:
        return [f"{name}: the program ended before a worker was killed"]
    failures = served_jobs(name, job, said(stderr), JOBS.get(name, 1))
    if failures:
        return failures
    return compare(f"{name}, {kills} workers SIGKILLed", expected, losses(path), minimum)


def with_remote_workers(lode, tmp, label, program, strict):
    """Runs `program` under `lode train --workers 0 --listen 0.0.0.0:PORT` (no --announce: the
    workers elsewhere dial the one address they were given) with two `lode worker`s dialing
    PORT, as pods would. Returns (status, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**QUIET, "LODE_TOKEN": "tf2-remote-" + os.urandom(8).hex()}
    train = subprocess.Popen(
        [lode, "train", *(["--strict"] if strict else []), "--workers", "0", "--listen", f"0.0.0.0:{port}",
         "--lease-ms", "1000", "--journal", os.path.join(tmp, f"{label}.job"), "--", *program],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 180
    while "LISTEN" not in subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout:
        if train.poll() is not None or time.time() > deadline:
            train.kill()
            return -1, f"the dispatcher never listened on port {port}: {train.communicate()[1][-2000:]}"
        time.sleep(0.1)
    log = open(os.path.join(tmp, f"{label}.workers.log"), "w")
    workers = [subprocess.Popen([lode, "worker", "--dispatcher", f"http://127.0.0.1:{port}"],
                                stdout=log, stderr=log, env=env) for _ in range(2)]
    try:
        _, stderr = train.communicate(timeout=600)
    finally:
        for w in workers:
            w.kill()
            w.wait()
        log.close()
    return train.returncode, stderr


def remote_second_pipeline(lode, tmp):
    """The three-pipeline program with workers that dial one address (`--workers 0`, no
    --announce): its training data trains on Lode, its validation and test data run on the
    program's side with one line (every loss still equal to the plain run's); --strict stops
    it with status 2."""
    script, args, minimum = CASES["keras_validation"]
    name = "remote_second_pipeline"
    expected = plain(script, args, os.path.join(tmp, f"{name}.plain.txt"))
    path = os.path.join(tmp, f"{name}.lode.txt")
    program = [sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path]
    status, stderr = with_remote_workers(lode, tmp, name, program, strict=False)
    lines = said(stderr)
    second = [line for line in lines if "second input pipeline" in line]
    started = [line for line in lines if "training on Lode" in line]
    if status != 0 or len(second) != 1 or len(started) != 1:
        return [f"{name}: expected one job on Lode and one line about the second pipeline; got status "
                f"{status}, {lines}: {stderr[-1500:]}"]
    failures = compare(f"{name} (validation and test data on the program's side)", expected, losses(path), minimum)
    status, stderr = with_remote_workers(lode, tmp, f"{name}_strict", program, strict=True)
    if status != 2 or "second input pipeline" not in stderr:
        failures.append(f"{name} --strict: expected status 2 naming the second pipeline, got {status}: "
                        f"{stderr[-1500:]}")
    else:
        print(f"ok    {name} --strict: status 2, the second pipeline named")
    return failures


def restart_step(path):
    """The step a restarted run began at: the first line whose step is not after the line
    before it (None: the file never goes back)."""
    with open(path) as f:
        steps = [int(line.split(" ", 1)[0]) for line in f]
    return next((steps[i + 1] for i in range(len(steps) - 1) if steps[i + 1] <= steps[i]), None)


def restarted(label, case, tmp, under_lode):
    """Runs `case` (script, arguments, the checkpoint directory's flag, the step after which
    the first run exits, the step the restart begins at, fewest steps) twice, plainly and with
    `under_lode(program, k)` (run k's status and stderr): killed after the step (status 17),
    then restarted from its checkpoint. Both restarts must begin at the expected step and the
    two runs' losses together equal plain TensorFlow's bit for bit."""
    script, args, flag, crash, resume, minimum = case
    paths = {}
    for how in ("plain", "lode"):
        path = paths[how] = os.path.join(tmp, f"{label}.{how}.txt")
        program = [sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path,
                   flag, os.path.join(tmp, f"{label}.{how}.ckpt")]
        for k, extra in enumerate([["--crash-at", str(crash)], []]):
            if how == "plain":
                done = run([*program, *extra], check=False)
                status, stderr = done.returncode, done.stderr
            else:
                status, stderr = under_lode([*program, *extra], k)
            wanted = 17 if extra else 0
            if status != wanted:
                return [f"{label} ({how}): run {k} exited {status}, expected {wanted}: {stderr[-2000:]}"]
            if how == "lode" and not any("training on Lode" in line for line in said(stderr)):
                return [f"{label}: expected run {k} to train on Lode; lode said {said(stderr)}"]
        began = restart_step(path)
        if began != resume:
            return [f"{label} ({how}): the restarted run began at step {began}, expected {resume}"]
    print(f"note  {label}: killed after step {crash}, restarted at step {resume} (plainly and on Lode)")
    return compare(f"{label} killed and restarted", losses(paths["plain"]), losses(paths["lode"]), minimum)


def restart(lode, name, tmp):
    """RESTARTS[name] under `lode train --strict --workers 2`, one job directory for both
    runs (a restarted job keeps its directory)."""
    def under_lode(program, _):
        done = run([lode, "train", "--strict", "--workers", "2", "--journal", os.path.join(tmp, f"{name}.job"),
                    "--", *program], check=False)
        return done.returncode, done.stderr

    return restarted(name, RESTARTS[name], tmp, under_lode)


def restart_with_kills(lode, tmp):
    """The checkpointed custom loop over 40 epochs (640 steps, a checkpoint every 50), killed
    after step 330 and restarted from step 300, while a data worker is SIGKILLed every second
    in both runs."""
    case = ("tf2_checkpoint.py", ["--data", REGRESSION, "--epochs", "40", "--save-steps", "50"],
            "--checkpoint-dir", 330, 300, 640)
    kills = []

    def under_lode(program, k):
        status, stderr, killed = killing_workers(lode, tmp, f"restart-kills-{k}", program,
                                                 os.path.join(tmp, "restart_kills.job"))
        kills.append(killed)
        return status, stderr

    failures = restarted("restart_kills", case, tmp, under_lode)
    if not failures and min(kills) == 0:
        return [f"restart_kills: a run ended before a worker was killed ({kills} kills)"]
    if not failures:
        print(f"note  restart_kills: {sum(kills)} data workers SIGKILLed and replaced ({kills[0]} + {kills[1]})")
    return failures


def fallbacks(lode, tmp):
    failures = []
    script = os.path.join(PROGRAMS, "tf2_fallbacks.py")
    for case, words in FALLBACKS.items():
        cmd = [sys.executable, script, "--data", REGRESSION, "--case", case]
        expected = run(cmd).stdout
        done = run([lode, "train", "--workers", "1", "--", *cmd], check=False)
        lines = said(done.stderr)
        # An unseeded random op draws anew in every run: only the status is compared.
        same = done.stdout == expected or (case == "unseeded" and done.stdout.startswith("sum "))
        if done.returncode != 0 or not same:
            failures.append(f"{case}: expected an unchanged run (status 0, {expected.strip()!r}); got status "
                            f"{done.returncode}, {done.stdout.strip()!r}: {done.stderr[-1500:]}")
        elif len(lines) != 1 or words not in lines[0]:
            failures.append(f"{case}: expected one lode: line naming {words!r}; got {lines}")
        strict = run([lode, "train", "--strict", "--workers", "1", "--", *cmd], check=False)
        if strict.returncode != 2 or words not in strict.stderr:
            failures.append(f"{case} --strict: expected status 2 naming {words!r}; got {strict.returncode}: "
                            f"{strict.stderr[-1500:]}")
        if not failures or not failures[-1].startswith(case):
            print(f"ok    {case}: runs unchanged with one line ({lines[0] if lines else ''}); --strict: status 2")
    return failures


def keras2_missing():
    try:
        import tf_keras  # noqa: F401
    except ImportError:
        return ["keras2: tf_keras is not installed in this Python (pip install tf_keras==2.18.0 --no-deps)"]
    return []


def keras2_second_pipeline(lode, tmp, flag, minimum):
    """Keras 2 `fit` with a second pipeline (`--validation`: validation data; `--second-fit`: a
    second `fit` on a new dataset), which Lode does not serve. It runs on the program's side
    with one line (the training losses still equal the plain run's); --strict stops the program
    with status 2."""
    script, args, _ = KERAS2
    args = [*args, flag]
    name = "keras2_" + flag.lstrip("-").replace("-", "_")
    expected = plain(script, args, os.path.join(tmp, f"{name}.plain.txt"))
    path = os.path.join(tmp, f"{name}.lode.txt")
    cmd = [sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path]
    done = run([lode, "train", "--workers", "2", "--", *cmd], check=False)
    lines = said(done.stderr)
    second = [line for line in lines if "second input pipeline" in line]
    failures = []
    if done.returncode != 0 or len(second) != 1 or not any("training on Lode" in line for line in lines):
        failures.append(f"{name}: expected training on Lode with one line about the second pipeline; "
                        f"got status {done.returncode}, {lines}: {done.stderr[-1500:]}")
    else:
        failures += compare(f"{name} (the second pipeline on the program's side)", expected, losses(path), minimum)
    strict = run([lode, "train", "--strict", "--workers", "2", "--", *cmd], check=False)
    if strict.returncode != 2 or "second input pipeline" not in strict.stderr:
        failures.append(f"{name} --strict: expected status 2 naming the second pipeline, got "
                        f"{strict.returncode}: {strict.stderr[-1500:]}")
    else:
        print(f"ok    {name} --strict: status 2, the second pipeline named")
    return failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lode", required=True)
    p.add_argument("--only", help="run one part: a case name, kills, validation_kills, remote_second_pipeline, "
                                  "a restart's name, "
                                  "restart_kills, fallbacks, keras2, keras2_kills, keras2_validation or "
                                  "keras2_second_fit")
    args = p.parse_args()
    lode = os.path.abspath(args.lode)
    failures = []
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="lode-tf2-") as tmp:
        parts = [(name, lambda name=name: equivalence(lode, name, tmp)) for name in CASES]
        parts += [("kills", lambda: with_worker_kills(lode, tmp, "kills", "tf2_keras_fit.py",
                                                  ["--data", WIDE_DEEP, "--epochs", "60"], 480))]
        # The three-pipeline program, its three jobs' workers killed in turn: 8 training
        # losses and a val_loss an epoch, the evaluate loss and the predictions' sum.
        parts += [("validation_kills", lambda: with_worker_kills(
            lode, tmp, "validation_kills", "tf2_keras_validation.py",
            ["--data", WIDE_DEEP, "--epochs", str(VALIDATION_KILL_EPOCHS)], 9 * VALIDATION_KILL_EPOCHS + 2))]
        # Workers that dial one address serve one job: the second pipeline runs unchanged.
        parts += [("remote_second_pipeline", lambda: remote_second_pipeline(lode, tmp))]
        parts += [(name, lambda name=name: restart(lode, name, tmp)) for name in RESTARTS]
        parts += [
            ("restart_kills", lambda: restart_with_kills(lode, tmp)),
            ("fallbacks", lambda: fallbacks(lode, tmp)),
            # Keras initialized the iterator before the cut: that pass must be the job's first,
            # so that the next initialization starts pass 1 rather than rewinding to step 0.
            ("keras2", lambda: keras2_missing() or equivalence(lode, "keras2", tmp, KERAS2, never_rewound=True)),
            ("keras2_kills", lambda: keras2_missing() or with_worker_kills(
                lode, tmp, "keras2_kills", KERAS2[0], ["--data", REGRESSION, "--epochs", str(KERAS2_KILL_EPOCHS)],
                16 * KERAS2_KILL_EPOCHS)),
            ("keras2_validation", lambda: keras2_missing() or keras2_second_pipeline(lode, tmp, "--validation", 48)),
            # The second fit's epoch is 16 steps more.
            ("keras2_second_fit", lambda: keras2_missing() or keras2_second_pipeline(lode, tmp, "--second-fit", 64)),
        ]
        for name, part in parts:
            if args.only and name != args.only:
                continue
            got = part()
            failures += got
            passed += not got
            failed += bool(got)
            for f in got:
                print(f"FAIL  {f}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
