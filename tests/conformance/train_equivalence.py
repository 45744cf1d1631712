"""lode train: unmodified TensorFlow programs train on Lode with bit-identical losses.

Runs every fixture program (fixtures/programs/) plainly and under `lode train --workers 2`
and compares the per-step losses' float bits; then the same while data workers are SIGKILLed
every half second and replaced (workers started here from `--workers 0 --announce`), a program
killed and restarted from its last checkpoint, and the bad cases: DWRecv with no job
configured, a dispatcher that goes away, a stale job directory, `--strict` on a graph Lode
cannot cut. Needs the training-side package installed in this Python (`pip install ./python`).

    python tests/conformance/train_equivalence.py --lode target/debug/lode
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from losses import QUIET, compare, losses, run

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures"))
PROGRAMS = os.path.join(FIXTURES, "programs")

# name -> (script, arguments, whether Lode cuts it today)
CASES = {
    "wide_deep_session": (
        "wide_deep_session.py",
        ["--data", os.path.join(FIXTURES, "wide_deep", "data"), "--epochs", "20"],
        True,
    ),
    # The same with shuffle(64, seed=5) before batch: TensorFlow's order, reshuffled each epoch
    # within a pass and the same again after each re-initialization.
    "wide_deep_session_shuffled": (
        "wide_deep_session.py",
        ["--data", os.path.join(FIXTURES, "wide_deep", "data"), "--epochs", "20", "--shuffle", "64"],
        True,
    ),
    "regression_monitored": (
        "regression_monitored.py",
        ["--data", os.path.join(FIXTURES, "adam_resource", "data"), "--steps", "150"],
        True,
    ),
    # from_string_handle fed an initializable iterator's handle; an initializer made after the
    # session was created.
    "handle_session": (
        "handle_session.py",
        ["--data", os.path.join(FIXTURES, "adam_resource", "data"), "--steps", "150"],
        True,
    ),
    # The deepfm fixture's MetaGraph: three stages (CPU, the "/GPU:0" ops, CPU again).
    "import_meta_deepfm": (
        "import_meta.py",
        ["--model", os.path.join(FIXTURES, "deepfm"), "--steps", "150"],
        True,
    ),
    # The sgd_ref fixture: reference variables, a CSV header skipped by `skip(1)`.
    "import_meta_sgd_ref": (
        "import_meta.py",
        ["--model", os.path.join(FIXTURES, "sgd_ref"), "--steps", "150"],
        True,
    ),
    # Shuffled (buffer 100, seed 9) before map, `repeat()` after batch: a new order every epoch.
    "regression_monitored_shuffled": (
        "regression_monitored.py",
        ["--data", os.path.join(FIXTURES, "adam_resource", "data"), "--steps", "150", "--shuffle", "100"],
        True,
    ),
    # The session made before the pipeline (as Keras 2 in graph mode makes it): the graph is
    # cut in place at the first run after it gained an iterator, the variables the session
    # initialized kept; the training ops (an unseeded dropout) built after the cut.
    "session_before_pipeline": (
        "session_before_pipeline.py",
        ["--data", os.path.join(FIXTURES, "adam_resource", "data"), "--epochs", "10"],
        True,
    ),
    "session_before_pipeline_ref": (
        "session_before_pipeline.py",
        ["--data", os.path.join(FIXTURES, "adam_resource", "data"), "--epochs", "10", "--ref"],
        True,
    ),
    # A one-shot iterator (its dataset inside the iterator's dataset_factory) and string ops.
    "deepfm_monitored": (
        "deepfm_monitored.py",
        ["--data", os.path.join(FIXTURES, "deepfm", "data"), "--steps", "150"],
        True,
    ),
}

def plain(name, tmp):
    script, args, _ = CASES[name]
    path = os.path.join(tmp, f"{name}.plain.txt")
    run([sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path])
    return losses(path)


def check_cut(label, stderr, cut):
    said = [line for line in stderr.splitlines() if line.startswith("lode:")]
    trained = any("training on Lode" in line for line in said)
    if cut is True and not trained:
        return [f"{label}: expected the program to train on Lode; lode said {said}"]
    if cut is None and not trained:
        print(f"note  {label}: runs unchanged for now: {said}")
    return []


def equivalence(lode, name, expected, tmp):
    script, args, cut = CASES[name]
    path = os.path.join(tmp, f"{name}.lode.txt")
    done = run([lode, "train", "--workers", "2", "--journal", os.path.join(tmp, f"{name}.job"), "--",
                sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path])
    return check_cut(name, done.stderr, cut) + compare(f"{name} (lode train --workers 2)", expected, losses(path), 150)


def over_tls(lode, expected, tmp):
    """regression_monitored with every connection of the job over TLS (the test CA)."""
    tls = os.path.normpath(os.path.join(HERE, "..", "..", "proto", "testdata", "tls"))
    script, args, cut = CASES["regression_monitored"]
    path = os.path.join(tmp, "tls.lode.txt")
    done = run([lode, "train", "--workers", "2", "--tls-cert", os.path.join(tls, "server.crt"),
                "--tls-key", os.path.join(tls, "server.key"), "--tls-ca", os.path.join(tls, "ca.crt"),
                "--journal", os.path.join(tmp, "tls.job"), "--",
                sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path])
    return check_cut("tls", done.stderr, cut) + compare("regression_monitored over TLS", expected, losses(path), 150)


# A journal compacted every few KB: the runs below go through many compactions, and the
# restarted program's dispatcher replays a compacted journal.
COMPACT = ["--journal-compact", "4KiB"]


def compacted(job_dir):
    """Whether the job's dispatcher journal was compacted (its second line is a snapshot)."""
    with open(os.path.join(job_dir, "journal", "journal.jsonl")) as f:
        f.readline()
        return '"Snapshot"' in f.readline()


def with_worker_kills(lode, tmp):
    """wide_deep_session over 40 epochs while a data worker is SIGKILLed every half second."""
    name = "wide_deep_session"
    script, _, _ = CASES[name]
    args = ["--data", os.path.join(FIXTURES, "wide_deep", "data"), "--epochs", "40"]
    expected_path = os.path.join(tmp, "kills.plain.txt")
    run([sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", expected_path])
    announce = os.path.join(tmp, "jobs")
    path = os.path.join(tmp, "kills.lode.txt")
    program = subprocess.Popen(
        [lode, "train", "--workers", "0", "--announce", announce, "--name", "killed", "--lease-ms", "1000",
         *COMPACT, "--journal", os.path.join(tmp, "kills.job"), "--",
         sys.executable, os.path.join(PROGRAMS, script), *args, "--losses", path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=QUIET)
    card = os.path.join(announce, "killed.json")
    deadline = time.time() + 120
    while not os.path.exists(card):
        if program.poll() is not None or time.time() > deadline:
            raise AssertionError(f"no announcement appeared: {program.communicate()[1][-2000:]}")
        time.sleep(0.05)
    with open(card) as f:
        job = json.load(f)
    env = {**QUIET, "LODE_TOKEN": job["token"]}
    log = open(os.path.join(tmp, "kills.workers.log"), "w")

    def worker():
        return subprocess.Popen([lode, "worker", "--dispatcher", job["dispatcher"], "--job", str(job["job"])],
                                stdout=log, stderr=log, env=env)

    workers, kills = [worker(), worker()], 0
    while program.poll() is None:
        time.sleep(0.5)
        victim = workers.pop(kills % len(workers))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        workers.append(worker())
        kills += 1
    for w in workers:
        w.kill()
        w.wait()
    _, stderr = program.communicate()
    if program.returncode != 0:
        return [f"kills: lode train exited {program.returncode}: {stderr[-2000:]}"]
    if kills < 3:
        return [f"kills: only {kills} worker(s) were killed; the run was too short to judge"]
    if not compacted(os.path.join(tmp, "kills.job")):
        return ["kills: the dispatcher's journal was never compacted"]
    print(f"note  kills: {kills} data workers SIGKILLed and replaced")
    return check_cut("kills", stderr, True) + compare(
        f"wide_deep_session with a worker SIGKILLed every half second ({kills} kills)",
        losses(expected_path), losses(path), minimum=300)


def checkpoint_restart(lode, expected, tmp):
    """regression_monitored killed after step 70, restarted from its step-60 checkpoint, its
    journal compacted on the way (the restart replays a snapshot)."""
    script, args, _ = CASES["regression_monitored"]
    ckpt = os.path.join(tmp, "ckpt")
    job = os.path.join(tmp, "restart.job")
    path = os.path.join(tmp, "restart.lode.txt")
    cmd = [lode, "train", "--workers", "2", *COMPACT, "--journal", job, "--", sys.executable,
           os.path.join(PROGRAMS, script), *args, "--losses", path, "--checkpoint-dir", ckpt,
           "--save-steps", "20"]
    first = run(cmd + ["--crash-at", "70"], check=False)
    if first.returncode != 17:
        return [f"restart: the crashing run exited {first.returncode}, not 17: {first.stderr[-2000:]}"]
    if not compacted(job):
        return ["restart: the crashed run's journal was never compacted"]
    run(cmd)
    with open(path) as f:
        steps = [int(line.split(" ", 1)[0]) for line in f]
    restart_at = next((steps[i + 1] for i in range(len(steps) - 1) if steps[i + 1] <= steps[i]), None)
    if restart_at != 60 or steps[: 71] != list(range(71)):
        return [f"restart: the restarted program began at step {restart_at}, expected 60 (its checkpoint)"]
    print("note  restart: killed after step 70, restarted from the checkpoint of step 60")
    return compare("regression_monitored killed and restarted from its checkpoint", expected, losses(path), 150)


NO_JOB = """
import os, sys, time
import tensorflow as tf
import lode
tf.compat.v1.disable_eager_execution()
lode.load_ops()
gd = tf.compat.v1.GraphDef()
gd.ParseFromString(open(sys.argv[1], 'rb').read())
tf.graph_util.import_graph_def(gd, name='')
recv = tf.compat.v1.get_default_graph().get_operation_by_name(sys.argv[2])
started = time.time()
with tf.compat.v1.Session() as sess:
    # Far more steps than the probe reads before its dispatcher is killed: it must still be
    # reading when that happens.
    for step in range(10_000_000):
        try:
            sess.run(recv.outputs)
        except tf.errors.OpError as e:
            print(json.dumps({"steps": step, "seconds": time.time() - started, "error": e.message}))
            sys.exit(0)
print(json.dumps({"steps": 10_000_000, "seconds": time.time() - started, "error": None}))
""".replace("import os, sys, time", "import json, os, sys, time")


def first_line(text, needle):
    return next((line.strip() for line in text.splitlines() if needle in line), text[:200])


def bad_cases(lode, tmp):
    failures = []
    plan = os.path.join(tmp, "bad.plan")
    run([lode, "partition", os.path.join(FIXTURES, "adam_resource", "model.pb"), "-o", plan], check=False)
    with open(os.path.join(plan, "plan.json")) as f:
        recv = json.load(f)["training"]["recv"][0]["node"]
    probe = os.path.join(tmp, "probe.py")
    with open(probe, "w") as f:
        f.write(NO_JOB)
    training = os.path.join(plan, "training.pb")

    # DWRecv in a process with no job: a clear error naming the variables, not a hang.
    env = {k: v for k, v in QUIET.items() if not k.startswith("LODE_")}
    out = json.loads(run([sys.executable, probe, training, recv], env=env, timeout=120).stdout.splitlines()[-1])
    if not out["error"] or "LODE_DISPATCHER" not in out["error"] or out["steps"] != 0:
        failures.append(f"no job: expected an error naming LODE_DISPATCHER at once, got {out}")
    else:
        print(f"ok    no job configured: {first_line(out['error'], 'LODE_DISPATCHER')}")

    # A dispatcher that goes away: DWRecv fails within the patience, naming the dispatcher.
    # The job is made long (--epochs), so that it is still running when the dispatcher dies.
    journal = os.path.join(tmp, "gone.journal")
    addr_file = os.path.join(tmp, "gone.addr")
    cwd = os.path.join(FIXTURES, "adam_resource")
    dispatcher = subprocess.Popen([lode, "dispatcher", "--plan", plan, "--journal", journal, "--listen",
                                   "127.0.0.1:0", "--addr-file", addr_file, "--token", "t0ken",
                                   "--epochs", "100000"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=QUIET)
    while not os.path.exists(addr_file):
        time.sleep(0.05)
    with open(addr_file) as f:
        url = f.read().strip()
    worker = subprocess.Popen([lode, "worker", "--dispatcher", url, "--data-root", cwd],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**QUIET, "LODE_TOKEN": "t0ken"})
    probe_env = {**env, "LODE_DISPATCHER": url, "LODE_TOKEN": "t0ken", "LODE_PATIENCE_SECS": "2"}
    client = subprocess.Popen([sys.executable, probe, training, recv], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=probe_env)
    time.sleep(4)
    worker.kill()
    dispatcher.kill()
    killed = time.time()
    try:
        stdout, _ = client.communicate(timeout=60)
        out = json.loads(stdout.splitlines()[-1])
        after = time.time() - killed
        if not out["error"] or url not in out["error"]:
            failures.append(f"dispatcher gone: expected an error naming {url}, got {out}")
        elif after > 30:
            failures.append(f"dispatcher gone: the error took {after:.1f} s")
        else:
            print(f"ok    dispatcher gone: DWRecv failed {after:.1f} s after the kill: {first_line(out['error'], url)}")
    except subprocess.TimeoutExpired:
        client.kill()
        failures.append("dispatcher gone: DWRecv still waits 60 s after the dispatcher died")
    worker.wait()
    dispatcher.wait()

    # Ctrl-C while DWRecv waits for data (a job without workers): the program stops promptly.
    announce = os.path.join(tmp, "ctrlc.jobs")
    script, args, _ = CASES["regression_monitored"]
    train = subprocess.Popen([lode, "train", "--workers", "0", "--announce", announce, "--name", "ctrlc",
                              "--journal", os.path.join(tmp, "ctrlc.job"), "--", sys.executable,
                              os.path.join(PROGRAMS, script), *args, "--losses", os.path.join(tmp, "c.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=QUIET)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(announce, "ctrlc.json")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(3)  # the program's first run is now waiting in DWRecv
    children = run(["pgrep", "-P", str(train.pid)], check=False).stdout.split()
    for child in children:
        os.kill(int(child), signal.SIGINT)
    interrupted = time.time()
    try:
        train.wait(timeout=30)
        after = time.time() - interrupted
        if not children or train.returncode == 0 or after > 10:
            failures.append(f"ctrl-c: {len(children)} program(s) interrupted, status {train.returncode} "
                            f"after {after:.1f} s")
        else:
            print(f"ok    Ctrl-C while DWRecv waits: the program stopped {after:.1f} s later "
                  f"(status {train.returncode})")
    except subprocess.TimeoutExpired:
        train.kill()
        failures.append("ctrl-c: the program still waits 30 s after SIGINT")

    # A stale job directory of another graph: refused, named, status 2.
    job = os.path.join(tmp, "stale.job")
    first = CASES["regression_monitored"]
    run([lode, "train", "--workers", "1", "--journal", job, "--", sys.executable,
         os.path.join(PROGRAMS, first[0]), *first[1], "--steps", "10", "--losses", os.path.join(tmp, "s1.txt")])
    other = CASES["wide_deep_session"]
    done = run([lode, "train", "--workers", "1", "--journal", job, "--", sys.executable,
                os.path.join(PROGRAMS, other[0]), *other[1], "--epochs", "1", "--losses", os.path.join(tmp, "s2.txt")],
               check=False)
    if done.returncode != 2 or "journal of another graph" not in done.stderr:
        failures.append(f"stale journal: expected status 2 naming it, got {done.returncode}: {done.stderr[-800:]}")
    else:
        print("ok    stale job directory of another graph: refused with status 2")

    # A graph Lode cannot cut (no variables): runs unchanged with one line; --strict: status 2.
    novars = os.path.join(tmp, "novars.py")
    with open(novars, "w") as f:
        f.write("import tensorflow as tf\ntf.compat.v1.disable_eager_execution()\n"
                "x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(3)).get_next()\n"
                "with tf.compat.v1.Session() as s:\n    print(s.run(x))\n")
    done = run([lode, "train", "--workers", "1", "--", sys.executable, novars])
    said = [line for line in done.stderr.splitlines() if line.startswith("lode:")]
    if done.stdout.strip() != "0" or not any("no variables" in line for line in said):
        failures.append(f"no variables: expected the program's own output and one line why, got {done.stdout!r} {said}")
    else:
        print(f"ok    a graph without variables runs unchanged: {said[0]}")
    strict = run([lode, "train", "--strict", "--workers", "1", "--", sys.executable, novars], check=False)
    if strict.returncode != 2:
        failures.append(f"--strict: expected status 2, got {strict.returncode}: {strict.stderr[-500:]}")
    else:
        print("ok    --strict on a graph without variables: status 2")

    # A TF1 program with a second graph with a pipeline (one job per TF1 program): the first
    # graph trains on Lode, the second runs unchanged with one line, every loss as plain
    # TensorFlow's; --strict: status 2, naming it.
    twice = os.path.join(tmp, "twice.py")
    with open(twice, "w") as f:
        f.write("import runpy, sys\nimport tensorflow as tf\n"
                "prog, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
                "tf.compat.v1.disable_eager_execution()\n"
                "for k in range(2):\n"
                "    with tf.Graph().as_default():\n"
                "        sys.argv = [prog, *rest, '--losses', f'{out}.{k}']\n"
                "        runpy.run_path(prog, run_name='__main__')\n")
    script, args, _ = CASES["regression_monitored"]
    program = [twice, os.path.join(PROGRAMS, script)]
    short = [a if a != "150" else "30" for a in args]
    run([sys.executable, *program, os.path.join(tmp, "twice.plain"), *short], env=QUIET)
    done = run([lode, "train", "--workers", "1", "--", sys.executable, *program,
                os.path.join(tmp, "twice.lode"), *short])
    said = [line for line in done.stderr.splitlines() if line.startswith("lode:")]
    same = all(losses(os.path.join(tmp, f"twice.plain.{k}")) == losses(os.path.join(tmp, f"twice.lode.{k}"))
               and losses(os.path.join(tmp, f"twice.plain.{k}")) for k in range(2))
    if not same or not any("training on Lode" in line for line in said) \
            or not any("second graph" in line for line in said):
        failures.append(f"second graph: expected both graphs' losses equal, the first served and one line for "
                        f"the second, got equal={same} {said}")
    else:
        print(f"ok    a second graph with a pipeline runs unchanged, losses equal: {said[-1]}")
    strict = run([lode, "train", "--strict", "--workers", "1", "--", sys.executable, *program,
                  os.path.join(tmp, "twice.strict"), *short], check=False)
    if strict.returncode != 2 or "second graph" not in strict.stderr:
        failures.append(f"--strict second graph: expected status 2 naming it, got {strict.returncode}: "
                        f"{strict.stderr[-500:]}")
    else:
        print("ok    --strict on a second graph with a pipeline: status 2")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lode", required=True)
    parser.add_argument("--only", action="append", help="a program name, kills, restart, tls or bad")
    args = parser.parse_args()
    lode = os.path.abspath(args.lode)
    wanted = set(args.only or list(CASES) + ["kills", "restart", "tls", "bad"])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        expected = {}
        for name in CASES:
            if name in wanted or (name == "regression_monitored" and wanted & {"restart", "tls"}):
                expected[name] = plain(name, tmp)
            if name in wanted:
                failures += equivalence(lode, name, expected[name], tmp)
        if "kills" in wanted:
            failures += with_worker_kills(lode, tmp)
        if "restart" in wanted:
            failures += checkpoint_restart(lode, expected["regression_monitored"], tmp)
        if "tls" in wanted:
            failures += over_tls(lode, expected["regression_monitored"], tmp)
        if "bad" in wanted:
            failures += bad_cases(lode, tmp)
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for f in failures:
            print("FAIL ", f)
        sys.exit(1)
    print("\nlode train: every program trains bit-identically")


if __name__ == "__main__":
    main()
