"""A LodeJob's rendered objects run: lode train in a "pod", its data workers in others.

Two checks, each a fixture program (fixtures/programs/wide_deep_session.py) trained with losses
bit-identical to plain TensorFlow:

1. `lode train --workers 0 --listen 0.0.0.0:PORT --advertise 127.0.0.1` with its token from
   LODE_TOKEN, and two `lode worker`s started here dialing it (no namespaces needed).
2. The objects `lode controller --render` makes for a LodeJob, run as processes on this
   machine: every "pod" (the training pod of a training Job shaped as
   deploy/samples/training-job.yaml, and each replica of each rendered worker Deployment) in
   a network namespace of its own, the namespaces joined by a bridge that itself lives in a
   namespace (nothing is added to this machine's own network), addresses in a private /24. A
   container's command, args and env come from the rendered objects as Kubernetes would run
   them: `secretKeyRef` resolved from the rendered Secret, `fieldRef` (metadata.name,
   status.podIP) from the "pod", `$(VAR)` expanded. The Service's DNS names resolve to the
   training pod's address through `ip netns exec`'s per-namespace /etc/netns/NAME/hosts. The
   stage count the controller would read from the dispatcher's Status RPC is read from the
   job directory's plan. Then again while one data-worker pod is SIGKILLed and replaced by a
   new pod (new namespace, new address, new name), as its Deployment would.

Needs root (network namespaces) and the training-side package installed in this Python.
Every namespace is named lodek-<pid>-… and removed on exit, also on failure or a signal.

    sudo python tests/conformance/k8s_pods.py --lode target/debug/lode
"""

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from losses import QUIET, compare, losses, run
from netns import Hosts, closing_on_signals

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures"))
PROGRAM = os.path.join(FIXTURES, "programs", "wide_deep_session.py")
DATA = os.path.join(FIXTURES, "wide_deep", "data")
# A program and its arguments (each also takes --losses FILE), and the directory its input
# paths resolve against: the data volume's mount path in every pod.
WIDE_DEEP = ([PROGRAM, "--data", DATA, "--epochs", "20"], FIXTURES)
WIDE_DEEP_LONG = ([PROGRAM, "--data", DATA, "--epochs", "40"], FIXTURES)
# The deepfm fixture's MetaGraph: three stages, so three worker Deployments; its input path is
# relative to the model's directory.
DEEPFM = ([os.path.join(FIXTURES, "programs", "import_meta.py"), "--model", os.path.join(FIXTURES, "deepfm"),
           "--steps", "150"], os.path.join(FIXTURES, "deepfm"))
# The pods' environment: this one (the image's) without a job token of its own.
QUIET = {k: v for k, v in QUIET.items() if k != "LODE_TOKEN"}

PREFIX = f"lodek-{os.getpid()}-"
# A private /24 of its own per run (the pid picks it), only ever inside the namespaces.
SUBNET = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
PORT = 7070


def logged(path):
    """The losses a program has logged so far ({} before its loss file exists)."""
    return losses(path) if os.path.exists(path) else {}


def plain(tmp, name, program):
    path = os.path.join(tmp, f"plain-{name}.txt")
    run([sys.executable, *program[0], "--losses", path])
    return losses(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(ss):
    """Whether `ss -Hltn` output (from `ss`) lists a listening socket."""
    return "LISTEN" in ss()


def listen_and_separate_workers(lode, tmp, expected):
    """Check 1: --workers 0 --listen, the token from LODE_TOKEN, workers dialing the port."""
    port, token = free_port(), "k8s2-check-token-" + os.urandom(8).hex()
    path = os.path.join(tmp, "listen.txt")
    env = {**QUIET, "LODE_TOKEN": token}
    program = subprocess.Popen(
        [lode, "train", "--workers", "0", "--listen", f"0.0.0.0:{port}", "--advertise", "127.0.0.1",
         "--lease-ms", "1000", "--journal", os.path.join(tmp, "listen.job"), "--",
         sys.executable, *WIDE_DEEP[0], "--losses", path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 180
    while not listening(lambda: subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                                               text=True).stdout):
        if program.poll() is not None or time.time() > deadline:
            program.kill()
            return [f"listen: the dispatcher never listened on port {port}: {program.communicate()[1][-2000:]}"]
        time.sleep(0.1)
    log = open(os.path.join(tmp, "listen.workers.log"), "w")
    workers = [subprocess.Popen([lode, "worker", "--dispatcher", f"http://127.0.0.1:{port}"],
                                stdout=log, stderr=log, env=env) for _ in range(2)]
    try:
        out, err = program.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        program.kill()
        out, err = program.communicate()
        with open(os.path.join(tmp, "listen.workers.log")) as f:
            return [f"listen: lode train did not finish in 600 s: {err[-1500:]}\nworkers: {f.read()[-1500:]}"]
    finally:
        for w in workers:
            w.kill()
            w.wait()
    failures = []
    if program.returncode != 0:
        return [f"listen: lode train exited {program.returncode}: {err[-2000:]}"]
    if token in out or token in err:
        failures.append("listen: lode train printed the job's token")
    if "training on Lode" not in err:
        failures.append(f"listen: the program did not train on Lode: {err[-1000:]}")
    return failures + compare("lode train --workers 0 --listen 0.0.0.0:PORT, two lode workers dialing it",
                              expected, logged(path), 150)


def expand(value, env):
    """Kubernetes' $(VAR) expansion: a defined VAR is replaced, $$ is a literal $."""
    out, i = "", 0
    while i < len(value):
        if value.startswith("$$", i):
            out, i = out + "$", i + 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2:end]
            out += env.get(name, value[i:end + 1])
            i = end + 1
        else:
            out, i = out + value[i], i + 1
    return out


def container_env(container, secrets, pod_name, pod_ip):
    """A container's environment as the kubelet builds it, over this process's (the image's)."""
    env = dict(QUIET)
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = expand(var.get("value", ""), env)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
        elif "fieldRef" in source:
            field = source["fieldRef"]["fieldPath"]
            env[var["name"]] = {"metadata.name": pod_name, "status.podIP": pod_ip}[field]
        else:
            raise AssertionError(f"env {var['name']}: no stand-in for {source}")
    return env


def argv_of(container, env):
    return [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]


def render(lode, lodejob, status=None):
    cmd = [lode, "controller", "--render", lodejob, "--format", "json"] + (["--status", status] if status else [])
    return json.loads(run(cmd).stdout)


def lodejob_yaml(tmp, data_root):
    """The LodeJob of this test: the sample's shape, its data volume mounted at `data_root`
    (a pod's mount of the data claim, at the same path as on this machine)."""
    job = {
        "apiVersion": "lode.dev/v1alpha1",
        "kind": "LodeJob",
        "metadata": {"name": "wide-deep", "namespace": "default"},
        "spec": {
            "trainingSelector": {"app": "wide-deep-train"},
            "dispatcherPort": PORT,
            "workers": {"image": "lode:test", "cpu": "1", "memory": "1Gi", "threads": 1,
                        "data": {"claimName": "wide-deep-data", "mountPath": data_root}},
            "minWorkers": 2,
            "maxWorkers": 4,
        },
    }
    path = os.path.join(tmp, "lodejob.yaml")  # JSON is YAML
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def training_container(journal, losses_path, program):
    """The training pod's container, as deploy/samples/training-job.yaml writes it."""
    return {
        "name": "train",
        "command": [os.path.abspath(ARGS.lode)],
        "args": ["train", "--workers", "0", "--listen", f"0.0.0.0:{PORT}", "--lease-ms", "1000",
                 "--journal", journal, "--", sys.executable, *program[0], "--losses", losses_path],
        "env": [
            {"name": "LODE_TOKEN", "valueFrom": {"secretKeyRef": {"name": "wide-deep-lode-token", "key": "token"}}},
            {"name": "LODE_ADVERTISE", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
    }


def rendered_pods(lode, tmp, cluster, run_name, program, expected, kill):
    lodejob = lodejob_yaml(tmp, program[1])
    first = render(lode, lodejob)
    secrets = {o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
               for o in first if o["kind"] == "Secret"}
    services = [o for o in first if o["kind"] == "Service"]
    if len(services) != 1 or not secrets:
        return [f"{run_name}: expected one Service and the token Secret, got {[o['kind'] for o in first]}"]
    service = services[0]
    for p in service["spec"]["ports"]:
        if p["port"] != p.get("targetPort", p["port"]):
            return [f"{run_name}: Service port {p['port']} != targetPort {p['targetPort']} (no kube-proxy here)"]
    name, ns = service["metadata"]["name"], service["metadata"]["namespace"]

    train_ns, train_ip = cluster.pod(f"{run_name}-train")
    cluster.set_hosts(f"{train_ip} {name} {name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.cluster.local\n")
    journal = os.path.join(tmp, f"{run_name}.job")
    path = os.path.join(tmp, f"{run_name}.txt")
    container = training_container(journal, path, program)
    env = container_env(container, secrets, f"{run_name}-train", train_ip)
    train_log = open(os.path.join(tmp, f"{run_name}.train.log"), "w+")
    program = cluster.start(train_ns, argv_of(container, env), env, stdout=train_log, stderr=subprocess.STDOUT)

    # The controller reads the stage count from the dispatcher's Status RPC; here, from the plan
    # the dispatcher serves, once the program has built its graph.
    plan = os.path.join(journal, "plan", "plan.json")
    deadline = time.time() + 180
    while not os.path.exists(plan):
        if program.poll() is not None or time.time() > deadline:
            train_log.seek(0)
            return [f"{run_name}: the training pod served no plan: {train_log.read()[-2000:]}"]
        time.sleep(0.1)
    while not listening(lambda: run(["ip", "netns", "exec", train_ns, "ss", "-Hltn", f"sport = :{PORT}"]).stdout):
        if program.poll() is not None or time.time() > deadline:
            train_log.seek(0)
            return [f"{run_name}: the training pod's dispatcher never listened: {train_log.read()[-2000:]}"]
        time.sleep(0.1)
    with open(plan) as f:
        stages = len(json.load(f)["stages"])
    status = os.path.join(tmp, f"{run_name}.status.json")
    with open(status, "w") as f:
        json.dump({"stages": stages, "epoch": 0, "stepsConsumed": 0}, f)
    deployments = [o for o in render(lode, lodejob, status) if o["kind"] == "Deployment"]
    if len(deployments) != stages:
        return [f"{run_name}: {stages} stage(s) but {len(deployments)} worker Deployment(s) rendered"]

    worker_log = open(os.path.join(tmp, f"{run_name}.workers.log"), "w")
    workers, started = [], []

    def start_worker(deployment, pod_name):
        pod_ns, pod_ip = cluster.pod(pod_name)
        c = deployment["spec"]["template"]["spec"]["containers"][0]
        env = container_env(c, secrets, pod_name, pod_ip)
        argv = argv_of(c, env)
        if argv[0] == "lode":
            argv[0] = os.path.abspath(lode)  # the image's PATH
        proc = cluster.start(pod_ns, argv, env, stdout=worker_log, stderr=worker_log)
        started.append(proc)
        return proc

    for d in deployments:
        for r in range(d["spec"]["replicas"]):
            workers.append((d, start_worker(d, f"{run_name}-{d['metadata']['name'][-7:]}-{r}")))
    pods = len(workers)
    killed = None
    if kill:
        # One second into training (the program's loss file is written in blocks, so its
        # length is no clock), while the program still runs.
        started_at = time.time()
        while time.time() - started_at < 1.0 and program.poll() is None:
            time.sleep(0.05)
        deployment, victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed = None if program.poll() is not None else len(logged(path))
        time.sleep(1.0)
        start_worker(deployment, f"{run_name}-{deployment['metadata']['name'][-7:]}-new")
    try:
        program.wait(timeout=900)
    except subprocess.TimeoutExpired:
        program.kill()
        program.wait()
    for proc in started:
        proc.kill()
        proc.wait()
    train_log.seek(0)
    said = train_log.read()
    failures = []
    if program.returncode != 0:
        return [f"{run_name}: the training pod exited {program.returncode}: {said[-2000:]}"]
    if "training on Lode" not in said:
        failures.append(f"{run_name}: the program did not train on Lode: {said[-1000:]}")
    if any(t in said for s in secrets.values() for t in s.values()):
        failures.append(f"{run_name}: the training pod printed the job's token")
    label = f"rendered objects: a training pod and {pods} worker pod(s) over {stages} stage(s)"
    if kill:
        if killed is None:
            failures.append(f"{run_name}: the worker pod was killed only after training ended")
        label += f", one worker pod SIGKILLed 1 s in ({killed} losses logged by then) and replaced"
    return failures + compare(label, expected, logged(path), 150)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lode", default="target/debug/lode")
    ARGS = parser.parse_args()
    lode = os.path.abspath(ARGS.lode)
    if os.geteuid() != 0:
        print("k8s_pods.py needs root: it makes network namespaces for its pods", file=sys.stderr)
        return 2
    failures = []
    with tempfile.TemporaryDirectory(prefix="lode-k8s-pods-") as tmp:
        expected = plain(tmp, "wide-deep", WIDE_DEEP)
        failures += listen_and_separate_workers(lode, tmp, expected)
        cluster = None
        closing_on_signals(lambda: cluster)
        try:
            cluster = Hosts(PREFIX, SUBNET)
            failures += rendered_pods(lode, tmp, cluster, "calm", WIDE_DEEP, expected, kill=False)
            failures += rendered_pods(lode, tmp, cluster, "stages", DEEPFM, plain(tmp, "deepfm", DEEPFM),
                                      kill=False)
            failures += rendered_pods(lode, tmp, cluster, "kill", WIDE_DEEP_LONG,
                                      plain(tmp, "wide-deep-long", WIDE_DEEP_LONG), kill=True)
        finally:
            if cluster is not None:
                cluster.close()
    for f in failures:
        print(f"FAIL  {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
