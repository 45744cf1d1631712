"""lode train with its data workers on two other hosts: losses bit-identical to plain TensorFlow.

Three hosts made of network namespaces (tests/conformance/netns.py: veth links on a bridge that
lives in a namespace of its own, each link shaped to 1 Gbit/s with `tc tbf`): `lode train
--workers 0 --listen` on the first, a `lode worker` on each of the other two, dialing it. The
fixture program (fixtures/programs/wide_deep_session.py, checkpointing at every fifth epoch's
start) trains with the plain run's loss bits:

1. calm;
2. with the first worker host's link cut (`ip link set … down`) for 5 s mid-run: the job goes
   on with the other worker, the cut one is declared lost, and comes back when the link does;
3. with the training program SIGKILLed mid-run (after its first checkpoint) and started again
   on the same job directory and checkpoints: it restores the last checkpoint and goes on from
   there, while the data workers stay up on their hosts (the same processes) and serve the
   restarted program's dispatcher.

Needs root (network namespaces) and the training-side package installed in this Python. Every
namespace is named lodeh2-<pid>-… and removed on exit, also on failure or a signal.

    sudo python tests/conformance/hosts_train.py --lode target/debug/lode
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from losses import QUIET, compare, losses
from netns import Hosts, closing_on_signals

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures"))
PROGRAM = os.path.join(FIXTURES, "programs", "wide_deep_session.py")
DATA = os.path.join(FIXTURES, "wide_deep", "data")
# Long enough for a 5 s cut mid-run with time left after it (8 steps an epoch).
EPOCHS = int(os.environ.get("LODE_HOSTS_EPOCHS", "250"))
SAVE_EPOCHS = 5
STEPS_PER_EPOCH = 8

PREFIX = f"lodeh2-{os.getpid()}-"
# A private /24 of its own per run (the pid picks it), only ever inside the namespaces.
SUBNET = f"10.{78 + os.getpid() % 100}.{os.getpid() % 250}"
PORT = 7070
CUT_SECONDS = 5.0
# The pause between the program's death and its restart (the workers wait for a dispatcher).
RESTART_PAUSE = 1.0


def program(losses_path, checkpoints):
    return [sys.executable, PROGRAM, "--data", DATA, "--epochs", str(EPOCHS), "--losses", losses_path,
            "--checkpoint-dir", checkpoints, "--save-epochs", str(SAVE_EPOCHS)]


def logged(path):
    """The losses a program has logged so far ({} before its loss file exists)."""
    return losses(path) if os.path.exists(path) else {}


def steps_logged(path):
    """Lines in the loss file so far (the program flushes one a step)."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.endswith("\n"))


def wait_for(what, done, proc, timeout, log=None):
    """Polls `done()` every 20 ms until it holds; fails naming `what` if `proc` exits or
    `timeout` passes first."""
    deadline = time.time() + timeout
    while not done():
        if proc.poll() is not None or time.time() > deadline:
            said = ""
            if log is not None:
                log.flush()
                with open(log.name) as f:
                    said = f.read()[-2000:]
            raise AssertionError(f"{what}: not within {timeout} s (status {proc.poll()}): {said}")
        time.sleep(0.02)


class Job:
    """One job on the hosts: the training host's `lode train` (started, restarted) and the two
    worker hosts' `lode worker`s."""

    def __init__(self, lode, tmp, hosts, name):
        self.lode, self.tmp, self.hosts, self.name = lode, tmp, hosts, name
        self.train_ns, self.train_ip = hosts.pod(f"{name}-t")
        self.worker_ns = [hosts.pod(f"{name}-w{i}")[0] for i in (1, 2)]
        for ns in [self.train_ns, *self.worker_ns]:
            hosts.shape(ns, "1gbit")
        self.env = {**QUIET, "LODE_TOKEN": "hosts-check-" + os.urandom(8).hex()}
        self.journal = os.path.join(tmp, f"{name}.job")
        self.checkpoints = os.path.join(tmp, f"{name}.ckpt")
        self.losses = os.path.join(tmp, f"{name}.txt")
        self.train_log = open(os.path.join(tmp, f"{name}.train.log"), "w+")
        self.worker_log = [open(os.path.join(tmp, f"{name}.w{i}.log"), "w+") for i in (1, 2)]
        self.workers = []

    def train(self):
        """Starts `lode train` on the training host; returns once its dispatcher listens."""
        argv = [self.lode, "train", "--workers", "0", "--listen", f"0.0.0.0:{PORT}", "--advertise", self.train_ip,
                "--journal", self.journal, "--", *program(self.losses, self.checkpoints)]
        proc = self.hosts.start(self.train_ns, argv, self.env, stdout=self.train_log, stderr=subprocess.STDOUT)
        wait_for(f"{self.name}: lode train's dispatcher listening", lambda: self.listening(), proc, 180,
                 self.train_log)
        return proc

    def listening(self):
        ss = Hosts.ns(self.train_ns, "ss", "-Hltn", f"sport = :{PORT}").stdout
        return "LISTEN" in ss

    def start_workers(self):
        for i, ns in enumerate(self.worker_ns):
            argv = [self.lode, "worker", "--dispatcher", f"http://{self.train_ip}:{PORT}", "--name", f"w{i + 1}"]
            log = self.worker_log[i]
            self.workers.append(self.hosts.start(ns, argv, self.env, stdout=log, stderr=subprocess.STDOUT))

    def said(self, log):
        log.flush()
        with open(log.name) as f:
            return f.read()

    def finish(self, proc, label):
        """Waits for the program; [] when it exited 0 having trained on Lode, else failures."""
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return [f"{label}: lode train did not finish in 600 s: {self.said(self.train_log)[-2000:]}"]
        said = self.said(self.train_log)
        if proc.returncode != 0:
            return [f"{label}: lode train exited {proc.returncode}: {said[-2000:]}"]
        if "training on Lode" not in said:
            return [f"{label}: the program did not train on Lode: {said[-1000:]}"]
        if self.env["LODE_TOKEN"] in said:
            return [f"{label}: lode train printed the job's token"]
        return []

    def stop_workers(self):
        for w in self.workers:
            if w.poll() is None:
                w.kill()
            w.wait()


def calm(lode, tmp, hosts, expected):
    job = Job(lode, tmp, hosts, "calm")
    proc = job.train()
    job.start_workers()
    failures = job.finish(proc, "calm")
    job.stop_workers()
    return failures or compare("lode train, its two data workers on other hosts (1 Gbit/s links)", expected,
                               logged(job.losses), 300)


def link_cut(lode, tmp, hosts, expected):
    job = Job(lode, tmp, hosts, "cut")
    proc = job.train()
    job.start_workers()
    # Mid-run: once both workers have had time to deliver (ten epochs in).
    wait_for("cut: ten epochs trained", lambda: steps_logged(job.losses) >= 10 * STEPS_PER_EPOCH, proc, 300,
             job.train_log)
    cut_ns = job.worker_ns[0]
    hosts.link(cut_ns, False)
    at_cut = steps_logged(job.losses)
    time.sleep(CUT_SECONDS)
    at_end = steps_logged(job.losses)
    running = proc.poll() is None
    hosts.link(cut_ns, True)
    failures = job.finish(proc, "cut")
    cut_worker = job.workers[0]
    # The cut worker lived through the cut: still running, or ended with the job (status 0).
    alive = cut_worker.poll() is None or cut_worker.returncode == 0
    job.stop_workers()
    if failures:
        return failures
    if not running:
        return [f"cut: the program ended during the {CUT_SECONDS} s cut: too short to judge"]
    if at_end <= at_cut:
        failures.append(f"cut: no step trained during the {CUT_SECONDS} s cut ({at_cut} before, {at_end} after)")
    if not alive:
        failures.append(f"cut: the cut worker exited {cut_worker.returncode}: "
                        f"{job.said(job.worker_log[0])[-1500:]}")
    rejoined = "registering again" in job.said(job.worker_log[0])
    print(f"note  cut: worker host 1's link down for {CUT_SECONDS:.0f} s from step {at_cut}; {at_end - at_cut} "
          f"steps trained meanwhile; the cut worker {'was declared lost and registered again' if rejoined else 'kept its registration'}")
    return failures + compare(f"lode train, one worker host's link cut for {CUT_SECONDS:.0f} s mid-run",
                              expected, logged(job.losses), 300)


def restart(lode, tmp, hosts, expected):
    job = Job(lode, tmp, hosts, "restart")
    first = job.train()
    job.start_workers()
    # The program (lode train's child) is killed mid-epoch after its first checkpoint (the
    # start of epoch 5), at once: it runs a few hundred steps a second.
    children = subprocess.run(["pgrep", "-P", str(first.pid)], capture_output=True, text=True).stdout.split()
    if len(children) != 1:
        return [f"restart: expected one program under lode train, found {children}"]
    ckpt = os.path.join(job.checkpoints, "checkpoint")
    wait_for("restart: a checkpoint and steps after it",
             lambda: os.path.exists(ckpt) and steps_logged(job.losses) > SAVE_EPOCHS * STEPS_PER_EPOCH + 2, first,
             300, job.train_log)
    os.kill(int(children[0]), signal.SIGKILL)
    first.wait(timeout=60)
    killed_at = steps_logged(job.losses)
    if killed_at >= EPOCHS * STEPS_PER_EPOCH:
        return ["restart: the program finished before it was killed: too short to judge"]
    time.sleep(RESTART_PAUSE)
    workers_up = [w.poll() is None for w in job.workers]
    second = job.train()
    failures = job.finish(second, "restart")
    job.stop_workers()
    if failures:
        return failures
    if not all(workers_up):
        return [f"restart: a data worker exited when the program died: "
                f"{[job.said(log)[-800:] for log in job.worker_log]}"]
    with open(job.losses) as f:
        steps = [int(line.split(" ", 1)[0]) for line in f]
    # The killed program's lines, then the restarted one's from its checkpoint's step on.
    restart_at = steps[killed_at] if len(steps) > killed_at else None
    if steps[:killed_at] != list(range(killed_at)):
        return [f"restart: the killed program's losses are not steps 0..{killed_at - 1}"]
    if (restart_at is None or restart_at == 0 or restart_at > killed_at
            or restart_at % (SAVE_EPOCHS * STEPS_PER_EPOCH) != 0
            or steps[killed_at:] != list(range(restart_at, EPOCHS * STEPS_PER_EPOCH))):
        return [f"restart: the restarted program began at step {restart_at}, not at a checkpoint, or did not go "
                f"on from there to the end (killed after {killed_at} steps; {len(steps)} lines)"]
    print(f"note  restart: the program SIGKILLed after step {killed_at - 1} (status {first.returncode}), "
          f"restarted from its checkpoint of step {restart_at}; its two data workers stayed up")
    return compare("lode train, the program killed mid-run and restarted from its checkpoint, its data workers "
                   "staying up on their hosts", expected, logged(job.losses), 300)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lode", default="target/debug/lode")
    parser.add_argument("--only", action="append", choices=["calm", "cut", "restart"])
    args = parser.parse_args()
    lode = os.path.abspath(args.lode)
    if os.geteuid() != 0:
        print("hosts_train.py needs root: it makes network namespaces for its hosts", file=sys.stderr)
        return 2
    wanted = args.only or ["calm", "cut", "restart"]
    failures = []
    with tempfile.TemporaryDirectory(prefix="lode-hosts-train-") as tmp:
        plain_losses = os.path.join(tmp, "plain.txt")
        started = time.time()
        subprocess.run(program(plain_losses, os.path.join(tmp, "plain.ckpt")), check=True, capture_output=True,
                       env=QUIET, timeout=600)
        print(f"note  plain TensorFlow: {steps_logged(plain_losses)} steps in {time.time() - started:.1f} s")
        expected = losses(plain_losses)
        hosts = None
        closing_on_signals(lambda: hosts)
        try:
            hosts = Hosts(PREFIX, SUBNET)
            for name, check in [("calm", calm), ("cut", link_cut), ("restart", restart)]:
                if name in wanted:
                    started = time.time()
                    failures += check(lode, tmp, hosts, expected)
                    print(f"note  {name}: {time.time() - started:.1f} s")
        finally:
            if hosts is not None:
                hosts.close()
    for f in failures:
        print(f"FAIL  {f}", file=sys.stderr)
    if not failures:
        print("lode train across hosts: every run trains bit-identically")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
