"""Hosts made of network namespaces on one machine, for the conformance scripts that run Lode's
processes on "other machines" (k8s_pods.py's pods, hosts_train.py's hosts).

Every host is a namespace of its own with one veth link (`eth0`, an address in a private /24)
to a bridge that itself lives in a namespace (`PREFIX + "switch"`): nothing is added to this
machine's own network namespace, and no address outside the namespaces is ever used. A host's
link can be shaped (`tc tbf`, both directions) and cut (`ip link set … down` on the bridge's
end: the host keeps its carrier-less link and its open sockets, as behind a cut cable).
`close()` kills every process started here and removes every namespace (and with them every
link); callers run it on failure and on SIGTERM/SIGINT too (`closing_on_signals`).

Needs root.
"""

import os
import shutil
import signal
import subprocess
import sys

from losses import run


class Hosts:
    """Network namespaces named `prefix + NAME` on one bridge; everything removed by close().

    `subnet` is the /24's first three octets; hosts get .10, .11, … in the order made."""

    def __init__(self, prefix, subnet):
        self.prefix = prefix
        self.subnet = subnet
        self.switch = prefix + "switch"
        self.pods = {}  # namespace -> address
        self.ports = {}  # namespace -> its link's name on the bridge's side
        self.procs = []
        self.hosts = ""
        self.next_ip = 10
        self.ip("netns", "add", self.switch)
        self.ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self.ns(self.switch, "ip", "link", "set", "br0", "up")

    @staticmethod
    def ip(*args):
        run(["ip", *args], timeout=30)

    @staticmethod
    def ns(name, *cmd):
        return run(["ip", "netns", "exec", name, *cmd], timeout=30)

    def pod(self, name):
        """A new host namespace: eth0 on the bridge with the next address; returns (ns, ip)."""
        ns = self.prefix + name
        address = f"{self.subnet}.{self.next_ip}"
        port = f"p{self.next_ip}"
        self.next_ip += 1
        self.ip("netns", "add", ns)
        self.pods[ns] = address
        self.ports[ns] = port
        self.ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
        self.ns(self.switch, "ip", "link", "set", port, "master", "br0", "up")
        self.ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        self.ns(ns, "ip", "link", "set", "eth0", "up")
        self.ns(ns, "ip", "link", "set", "lo", "up")
        self.write_hosts(ns)
        return ns, address

    def shape(self, ns, rate):
        """Shapes both directions of host `ns`'s link to `rate` (tc's units, e.g. `1gbit`)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "20ms"]
        self.ns(ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        self.ns(self.switch, "tc", "qdisc", "replace", "dev", self.ports[ns], *tbf)

    def link(self, ns, up):
        """Cuts host `ns`'s link at the bridge's end, or brings it back."""
        self.ns(self.switch, "ip", "link", "set", self.ports[ns], "up" if up else "down")

    def set_hosts(self, text):
        """Every host's /etc/hosts (the cluster DNS of a test)."""
        self.hosts = text
        for ns in self.pods:
            self.write_hosts(ns)

    def write_hosts(self, ns):
        d = os.path.join("/etc/netns", ns)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.pods[ns]} {ns}\n{self.hosts}")

    def start(self, ns, argv, env, **kw):
        """Starts `argv` in host `ns` (`ip netns exec` execs it: the pid is the program's)."""
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=env, **kw)
        self.procs.append(proc)
        return proc

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in [*self.pods, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)


def closing_on_signals(current):
    """SIGTERM and SIGINT close the Hosts that `current()` returns (if any), then exit."""

    def stop(signum, _frame):
        hosts = current()
        if hosts is not None:
            hosts.close()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
