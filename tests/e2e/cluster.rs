//! A cluster on one machine: hosts made of network namespaces this test creates, joined by
//! veth links on a bridge in a namespace of its own, Lode's real binaries on them, and the
//! faults of a real cluster injected (a host's link down, a worker frozen, killed, slowed).
//! Every run is checked for exactly-once in order against the calm run's digests, and
//! measured: wall time, stall (the longest gap between two steps the consumer received),
//! steps leased more than once (from the dispatcher's journal), bytes on each host's link.
//! The partitions have tests of their own: the dispatcher's host cut off (the workers deliver
//! what they hold, register again, and the journal agrees with what was delivered), and a
//! worker host back from a partition with stale leases (its late frames dropped and counted).
//!
//! Nothing here touches the machine's own network: every namespace, link and address (in
//! 10.77.0.0/24, inside the namespaces only) is the test's, named `lodeh-<pid>-…` (another
//! prefix than `lodeh` with LODE_CLUSTER_PREFIX), and removed when the [`Cluster`] drops, also
//! when the test fails. The test needs root and `ip` (CI runs
//! as root); without them it fails saying so, it does not pass.
//!
//! The CI test runs a short job; the benchmark is the same code with a longer one:
//! `bench/cluster.sh` (see docs/cluster.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::ok;

const TOKEN: &str = "cluster-token";

/// Runs `ip` with `args`, failing the test with what `ip` said.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("the cluster harness needs `ip` (iproute2) and root: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (the cluster harness needs root and network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs `tc` inside namespace `ns`.
fn tc(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, "tc"];
    all.extend_from_slice(args);
    ip(&all);
}

/// A process killed when dropped.
pub(crate) struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// The CPU time the process has used so far (user and system, from /proc/PID/stat), or
    /// None once it is gone.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).ok()?;
        // The fields after the command's closing parenthesis: state is the first, utime the
        // 12th and stime the 13th (stat(5)'s fields 14 and 15).
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / clock_ticks())
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal}: {status}");
    }
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 when it cannot be read).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// `hosts` hosts, each a network namespace with one link (`eth0`, 10.77.0.N/24 for host N,
/// from 1) to a bridge in a namespace of its own. Dropping it kills what it started and
/// removes every namespace (and with them their links).
pub(crate) struct Cluster {
    prefix: String,
    hosts: usize,
    pub(crate) procs: Vec<Proc>,
    namespaces: Vec<String>,
}

impl Cluster {
    fn new(hosts: usize) -> Self {
        let tag = std::env::var("LODE_CLUSTER_PREFIX").unwrap_or_else(|_| "lodeh".to_owned());
        Cluster::named(&tag, hosts)
    }

    /// A cluster whose namespaces are named `<tag>-<pid>-…` (each test its own tag).
    pub(crate) fn named(tag: &str, hosts: usize) -> Self {
        let prefix = format!("{tag}-{}-", std::process::id());
        let mut cluster = Cluster {
            prefix,
            hosts,
            procs: Vec::new(),
            namespaces: Vec::new(),
        };
        let bridge = cluster.bridge_ns();
        ip(&["netns", "add", &bridge]);
        cluster.namespaces.push(bridge.clone());
        ip(&["-n", &bridge, "link", "set", "lo", "up"]);
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        for host in 1..=hosts {
            let ns = cluster.ns(host);
            ip(&["netns", "add", &ns]);
            cluster.namespaces.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let port = format!("h{host}");
            ip(&[
                "-n", &bridge, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            ip(&["-n", &bridge, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &bridge, "link", "set", &port, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", cluster.addr(host)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        cluster
    }

    fn bridge_ns(&self) -> String {
        format!("{}br", self.prefix)
    }

    fn ns(&self, host: usize) -> String {
        assert!((1..=self.hosts).contains(&host), "no host {host}");
        format!("{}h{host}", self.prefix)
    }

    pub(crate) fn addr(&self, host: usize) -> String {
        format!("10.77.0.{host}")
    }

    /// Shapes both directions of `host`'s link to `rate` (tc's units, e.g. `1gbit`).
    pub(crate) fn shape(&self, host: usize, rate: &str) {
        let args = [
            "qdisc", "replace", "dev", "", "root", "tbf", "rate", rate, "burst", "256kb",
            "latency", "20ms",
        ];
        let mut inner = args;
        inner[3] = "eth0";
        tc(&self.ns(host), &inner);
        let port = format!("h{host}");
        let mut outer = args;
        outer[3] = &port;
        tc(&self.bridge_ns(), &outer);
    }

    /// Takes `host`'s link down (the bridge's end: the host sees its carrier go, its sockets
    /// stay open), or brings it back up.
    fn link(&self, host: usize, up: bool) {
        let port = format!("h{host}");
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.bridge_ns(), "link", "set", &port, state]);
    }

    /// Bytes received and sent on `host`'s link, as its kernel counts them.
    pub(crate) fn link_bytes(&self, host: usize) -> (u64, u64) {
        let read = |what: &str| -> u64 {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns(host), "cat"])
                .arg(format!("/sys/class/net/eth0/statistics/{what}"))
                .output()
                .expect("read link statistics");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{what} of host {host}: {out:?}"))
        };
        (read("rx_bytes"), read("tx_bytes"))
    }

    /// The `lode` binary on `host`. LODE_CLUSTER_BIN names another build for the dispatcher
    /// and the workers, to compare with (the consumer stays this one: its log times steps).
    pub(crate) fn lode(&self, host: usize, args: &[&str]) -> Command {
        let this = env!("CARGO_BIN_EXE_lode").to_owned();
        let bin = match std::env::var("LODE_CLUSTER_BIN") {
            Ok(other) if args.first() != Some(&"consume") => other,
            _ => this,
        };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(host), &bin])
            .args(args)
            .env_remove("LODE_TOKEN")
            .env_remove("LODE_FORMAT");
        c
    }

    /// Starts `command` and keeps it to be killed with the cluster; returns its index. With
    /// LODE_CLUSTER_LOGS=DIR, its stderr goes to DIR/<host>-<n>.log.
    pub(crate) fn start(&mut self, mut command: Command) -> usize {
        if let Ok(dir) = std::env::var("LODE_CLUSTER_LOGS") {
            static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let file = Path::new(&dir).join(format!("{n:03}.log"));
            command.stderr(std::fs::File::create(file).expect("a process's log file"));
        }
        // `ip netns exec` execs the program: the child's pid is lode's own, so signals reach it.
        self.procs
            .push(Proc(command.spawn().expect("start a process")));
        self.procs.len() - 1
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The processes first: a namespace lives on while a process is in it.
        self.procs.clear();
        for ns in self.namespaces.drain(..).rev() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// A fault injected into a run, `at` after the consumer's first step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Worker host's link down for the duration.
    LinkDown(Duration),
    /// A worker SIGSTOPped for the duration, then SIGCONTed.
    Frozen(Duration),
    /// A worker SIGKILLed, and a new one started on its host.
    Killed,
    /// The dispatcher's host (the consumer then on a host of its own, 5) cut off from
    /// everyone for the duration: its workers are lost and register again, and the workers
    /// deliver what they hold; late frames of their old leases are dropped.
    DispatcherCut(Duration),
    /// One worker 4x slower than the others (one thread for a stage its peers split over
    /// four: [`SLOW_THREADS`] against [`THREADS`]).
    Slow,
    /// Stale leases: host 4's link down, then (its worker having computed what it holds
    /// meanwhile, unable to send it) the worker frozen; once the dispatcher declared it lost
    /// and the consumer received every step it held from the others (waited for at most the
    /// duration), the link back up and the worker thawed: its late frames of the revoked
    /// leases arrive, and it registers again.
    StaleLeases(Duration),
}

impl Fault {
    fn name(&self) -> &'static str {
        match self {
            Fault::None => "calm",
            Fault::LinkDown(_) => "link down",
            Fault::Frozen(_) => "frozen",
            Fault::Killed => "killed",
            Fault::Slow => "slow worker",
            Fault::DispatcherCut(_) => "dispatcher cut off",
            Fault::StaleLeases(_) => "stale leases",
        }
    }
}

/// Hosts of a run: the dispatcher's (and the consumer's) on 1, workers on 2 to 4, and 5 for
/// the consumer when the dispatcher's host is cut off.
const HOSTS: usize = 5;

/// Threads of a healthy worker: the synthetic stage splits its latency over four.
const THREADS: &str = "4";

/// Threads of the slow worker: its steps take four times as long.
const SLOW_THREADS: &str = "1";

/// The job every run executes.
struct Job {
    plan: PathBuf,
    steps: u64,
    step_time: Duration,
    /// The fault's start, after the consumer's first step.
    at: Duration,
}

/// What one run measured.
#[derive(Debug)]
struct Report {
    fault: &'static str,
    wall: Duration,
    stall: Duration,
    leased_twice: u64,
    /// Per host: (received, sent) bytes on its link during the run.
    bytes: Vec<(u64, u64)>,
    log: Vec<Value>,
    /// The fault's start and end on the harness's clock (from just before the consumer was
    /// started; the consumer's own clock, `at_us`, starts a little later), as the harness saw
    /// them: after the `ip` or `kill` that made them returned.
    fault_window: Option<(Duration, Duration)>,
    /// When the harness first saw a step in the consumer's log, on its clock: against that
    /// step's `at_us`, a bound on how much later the consumer's clock started.
    first_seen: Duration,
    /// The consumer's closing line (`consumed … dropped …`).
    consumed: String,
    /// The dispatcher's journal (kept with the run's directory).
    journal: PathBuf,
    _dir: tempfile::TempDir,
}

/// The consumer's log lines (complete ones).
pub(crate) fn lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect()
}

/// The dispatcher journal's records, in order (complete lines only: it may be being written).
fn journal_records(journal: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(journal.join("journal.jsonl")).expect("the journal");
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    let mut out = Vec::new();
    // Each line is `CRC JSON`; the first is the header.
    for line in complete.lines().skip(1) {
        let json = line.get(9..).expect("a journal line: CRC, space, JSON");
        let record: Value = serde_json::from_str(json).expect("a journal line's JSON");
        // A line holds one batch of records, or one.
        match record.get("records").and_then(Value::as_array) {
            Some(records) => out.extend(records.iter().cloned()),
            None => out.push(record),
        }
    }
    out
}

/// A journal step (`{"epoch", "step"}`) of a one-epoch job: its step.
fn step_of(step: &Value) -> u64 {
    assert_eq!(
        step["epoch"].as_u64(),
        Some(0),
        "a one-epoch job's step: {step}"
    );
    step["step"].as_u64().expect("a journal step's number")
}

/// What the journal says of the workers, in journal order.
#[derive(Debug, Default)]
struct Workers {
    /// (record index, worker) of each registration.
    registered: Vec<(usize, u64)>,
    /// (record index, worker) of each worker declared lost.
    lost: Vec<(usize, u64)>,
    /// Steps revoked from each worker (it was lost holding them).
    revoked: BTreeMap<u64, Vec<u64>>,
    /// Steps granted to each worker.
    granted: BTreeMap<u64, Vec<u64>>,
    /// Steps done under each worker's lease: completed (reported), or retired (consumed by
    /// the training side while still leased, before the report came).
    done: BTreeMap<u64, Vec<u64>>,
}

fn workers_of(records: &[Value]) -> Workers {
    let mut w = Workers::default();
    let id = |v: &Value| v["worker"].as_u64().expect("a worker id");
    let run = |r: &Value, n: u64| step_of(&r["first"])..step_of(&r["first"]) + n;
    for (i, r) in records.iter().enumerate() {
        if let Some(g) = r.get("Granted") {
            let n = g["batches"].as_array().map_or(1, Vec::len) as u64;
            w.granted.entry(id(g)).or_default().extend(run(g, n));
        } else if let Some(c) = r.get("Completed").or_else(|| r.get("Retired")) {
            let n = c["count"].as_u64().expect("a run's count");
            w.done.entry(id(c)).or_default().extend(run(c, n));
        } else if let Some(e) = r.get("Event") {
            if let Some(g) = e.get("LeaseGranted") {
                w.granted
                    .entry(id(g))
                    .or_default()
                    .push(step_of(&g["step"]));
            } else if let Some(c) = e.get("StepCompleted").or_else(|| e.get("LeaseRetired")) {
                w.done.entry(id(c)).or_default().push(step_of(&c["step"]));
            } else if let Some(v) = e.get("LeaseRevoked") {
                w.revoked
                    .entry(id(v))
                    .or_default()
                    .push(step_of(&v["step"]));
            } else if let Some(v) = e.get("WorkerRegistered") {
                w.registered.push((i, id(v)));
            } else if let Some(v) = e.get("WorkerLost") {
                w.lost.push((i, id(v)));
            }
        }
    }
    w
}

/// Steps granted more than once, from the dispatcher's journal (its grant records).
fn leased_twice(journal: &Path) -> u64 {
    let mut grants: BTreeMap<u64, u64> = BTreeMap::new();
    for steps in workers_of(&journal_records(journal)).granted.values() {
        for &s in steps {
            *grants.entry(s).or_default() += 1;
        }
    }
    grants.values().filter(|&&n| n > 1).count() as u64
}

/// Runs `job` on a fresh cluster of [`HOSTS`] hosts (dispatcher and consumer on host 1, a worker on
/// each of `worker_hosts`, from 2 to 4) with `fault` injected into the worker of host 4 (the
/// slow one of [`Fault::Slow`] too).
fn run(job: &Job, fault: Fault, worker_hosts: &[usize], extra_dispatcher: &[&str]) -> Report {
    let mut cluster = Cluster::new(HOSTS);
    let consumer_host = if matches!(fault, Fault::DispatcherCut(_)) {
        5
    } else {
        1
    };
    for host in 1..=HOSTS {
        cluster.shape(host, "1gbit");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let journal = tmp.path().join("journal");
    let log = tmp.path().join("steps.jsonl");
    let listen = format!("{}:7000", cluster.addr(1));
    let mut disp = cluster.lode(
        1,
        &["dispatcher", "--plan", job.plan.to_str().expect("UTF-8")],
    );
    disp.args(["--journal", journal.to_str().expect("UTF-8")])
        .args(["--listen", &listen, "--token", TOKEN, "--epochs", "1", "-q"])
        .args(extra_dispatcher)
        .stdout(Stdio::null());
    cluster.start(disp);
    let addr = format!("http://{listen}");
    wait_listening(&cluster, &journal);
    let before: Vec<(u64, u64)> = (1..=HOSTS).map(|h| cluster.link_bytes(h)).collect();
    let step_ms = format!("{}ms", job.step_time.as_millis());
    let mut consume = cluster.lode(
        consumer_host,
        &["consume", "--dispatcher", &addr, "--token", TOKEN],
    );
    let consumed = tmp.path().join("consumed.txt");
    consume
        .args(["--step-time", &step_ms, "--capacity", "32"])
        .args(["--listen", &format!("{}:7001", cluster.addr(consumer_host))])
        .args(["--log", log.to_str().expect("UTF-8")])
        // Its closing line (not -q, which leaves it out) counts the receiver's drops.
        .stdout(std::fs::File::create(&consumed).expect("the consumer's output file"));
    let started = Instant::now();
    let consumer = cluster.start(consume);
    // Workers start once the consumer registered: a lease granted before is revoked when it
    // registers (and leased again), which would count as leased twice in a calm run.
    wait_registered(&journal, started);
    let worker = |cluster: &Cluster, host: usize, name: &str| {
        let mut w = cluster.lode(host, &["worker", "--dispatcher", &addr, "--token", TOKEN]);
        let slow = fault == Fault::Slow && host == 4;
        let threads = if slow { SLOW_THREADS } else { THREADS };
        w.args(["--name", name, "--threads", threads, "-q"])
            .stdout(Stdio::null());
        w
    };
    let mut workers = BTreeMap::new();
    for &host in worker_hosts {
        let w = worker(&cluster, host, &format!("w{host}"));
        workers.insert(host, cluster.start(w));
    }
    // The fault, once the job runs.
    let limit = Duration::from_secs(300);
    while lines(&log).is_empty() {
        assert!(started.elapsed() < limit, "no step in {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_seen = started.elapsed();
    std::thread::sleep(job.at);
    let fault_start = started.elapsed();
    match fault {
        Fault::None | Fault::Slow => {}
        Fault::StaleLeases(limit) => {
            // Its held steps are computed while the link is down (20 ms each) and cannot be
            // sent; frozen, it sends nothing either once the link is back, until thawed.
            cluster.link(4, false);
            std::thread::sleep(Duration::from_millis(300));
            cluster.procs[workers[&4]].signal("STOP");
            let frozen = Instant::now();
            loop {
                let known = workers_of(&journal_records(&journal));
                let delivered = lines(&log).last().and_then(|l| l["step"].as_u64());
                // Declared lost, and every step it held delivered by the others.
                let done = known.lost.first().is_some_and(|&(_, lost)| {
                    let revoked = known.revoked.get(&lost).map_or(&[][..], Vec::as_slice);
                    revoked
                        .iter()
                        .max()
                        .is_none_or(|&last| delivered > Some(last))
                });
                if done {
                    break;
                }
                assert!(
                    frozen.elapsed() < limit,
                    "stale leases: host 4's worker not declared lost, or its steps not \
                     delivered by the others, within {limit:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            cluster.link(4, true);
            std::thread::sleep(Duration::from_millis(200));
            cluster.procs[workers[&4]].signal("CONT");
        }
        Fault::DispatcherCut(d) => {
            cluster.link(1, false);
            std::thread::sleep(d);
            cluster.link(1, true);
        }
        Fault::LinkDown(d) => {
            cluster.link(4, false);
            std::thread::sleep(d);
            cluster.link(4, true);
        }
        Fault::Frozen(d) => {
            cluster.procs[workers[&4]].signal("STOP");
            std::thread::sleep(d);
            cluster.procs[workers[&4]].signal("CONT");
        }
        Fault::Killed => {
            cluster.procs[workers[&4]].signal("KILL");
            let w = worker(&cluster, 4, "w4-again");
            workers.insert(4, cluster.start(w));
        }
    }
    let fault_window =
        (fault != Fault::None && fault != Fault::Slow).then(|| (fault_start, started.elapsed()));
    wait_exited(&mut cluster, consumer, started, limit);
    let wall = started.elapsed();
    let bytes = (1..=HOSTS)
        .map(|h| {
            let (rx, tx) = cluster.link_bytes(h);
            (rx - before[h - 1].0, tx - before[h - 1].1)
        })
        .collect();
    drop(cluster);
    if let Ok(dir) = std::env::var("LODE_CLUSTER_LOGS") {
        let keep = |from: &Path, name: &str| {
            let _ = std::fs::copy(
                from,
                Path::new(&dir).join(format!("{}-{name}", fault.name())),
            );
        };
        keep(&journal.join("journal.jsonl"), "journal.jsonl");
        keep(&log, "steps.jsonl");
    }
    let log = lines(&log);
    assert_eq!(
        log.len() as u64,
        job.steps,
        "{}: steps consumed",
        fault.name()
    );
    let stall = log
        .windows(2)
        .map(|w| {
            let at = |v: &Value| v["at_us"].as_u64().expect("a step's arrival time");
            Duration::from_micros(at(&w[1]).saturating_sub(at(&w[0])))
        })
        .max()
        .unwrap_or_default();
    Report {
        fault: fault.name(),
        wall,
        stall,
        leased_twice: leased_twice(&journal),
        bytes,
        log,
        fault_window,
        first_seen,
        consumed: std::fs::read_to_string(&consumed).unwrap_or_default(),
        journal,
        _dir: tmp,
    }
}

/// Waits (30 s at most from `started`) until the dispatcher's journal says the consumer
/// registered.
pub(crate) fn wait_registered(journal: &Path, started: Instant) {
    while !std::fs::read_to_string(journal.join("journal.jsonl"))
        .unwrap_or_default()
        .contains("\"Consumer\"")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the consumer did not register"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (until `limit` from `started`) for the consumer, process `consumer` of `cluster`, to
/// exit at the end of data, and checks that it succeeded.
pub(crate) fn wait_exited(
    cluster: &mut Cluster,
    consumer: usize,
    started: Instant,
    limit: Duration,
) {
    loop {
        if let Some(status) = cluster.procs[consumer].0.try_wait().expect("wait") {
            assert!(status.success(), "the consumer exited with {status}");
            return;
        }
        assert!(
            started.elapsed() < limit,
            "the job did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) until the dispatcher has written its journal, i.e. it serves.
pub(crate) fn wait_listening(_cluster: &Cluster, journal: &Path) {
    let start = Instant::now();
    while !journal.join("journal.jsonl").is_file() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the dispatcher did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its journal is created before it binds; give the bind its moment by probing the port.
    std::thread::sleep(Duration::from_millis(200));
}

/// Every record of the epoch once, in order, and the calm run's digests.
fn assert_exactly_once(got: &Report, calm: &[Value], batch: u64) {
    assert_eq!(got.log.len(), calm.len(), "{}: steps", got.fault);
    let mut next = 0u64;
    for (i, (line, want)) in got.log.iter().zip(calm).enumerate() {
        assert_eq!(line["step"], i as u64, "{}: step order", got.fault);
        let records = line["records"].as_array().expect("records");
        assert_eq!(
            records.len() as u64,
            batch,
            "{}: step {i}'s records",
            got.fault
        );
        for r in records {
            assert_eq!(
                r.as_u64(),
                Some(next),
                "{}: step {i}: each record once, in order",
                got.fault
            );
            next += 1;
        }
        assert_eq!(
            line["digest"], want["digest"],
            "{}: step {i}'s digest",
            got.fault
        );
    }
}

fn table(reports: &[Report]) -> String {
    let calm = reports.first().map_or(Duration::ZERO, |r| r.stall);
    let mut out = String::from(
        "| run | time (s) | stall (s) | extra stall (s) | leased twice | MB in/out per host (h1 … h5) |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in reports {
        let mb = |b: u64| b as f64 / 1e6;
        let links: Vec<String> = r
            .bytes
            .iter()
            .map(|(rx, tx)| format!("{:.1}/{:.1}", mb(*rx), mb(*tx)))
            .collect();
        out.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.2} | {} | {} |\n",
            r.fault,
            r.wall.as_secs_f64(),
            r.stall.as_secs_f64(),
            r.stall.saturating_sub(calm).as_secs_f64(),
            r.leased_twice,
            links.join(", ")
        ));
    }
    out
}

/// A synthetic plan of `steps` steps of 32 records, each taking 80 ms of one thread's time on
/// a worker, in four parts (20 ms on a worker of [`THREADS`]).
fn synthetic(dir: &Path, steps: u64) -> PathBuf {
    let plan = dir.join("plan");
    ok(&crate::support::lode(&[
        "synthetic",
        "-o",
        plan.to_str().expect("UTF-8"),
        "--latency",
        "80ms",
        "--parallelism",
        "4",
        "--records",
        &(steps * 32).to_string(),
        "--batch",
        "32",
        "--width",
        "256",
    ]));
    plan
}

pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// Extra arguments of the dispatcher (LODE_CLUSTER_DISPATCHER_ARGS, split at spaces).
fn dispatcher_args() -> Vec<String> {
    std::env::var("LODE_CLUSTER_DISPATCHER_ARGS")
        .map(|a| a.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The job of the fault runs and the faults' length: the CI job, or `bench/cluster.sh`'s
/// (LODE_CLUSTER_STEPS, LODE_CLUSTER_FAULT_MS, LODE_CLUSTER_FAULT_AT_MS). Its plan goes in `dir`.
fn fault_job(dir: &Path) -> (Job, Duration) {
    let steps = env_u64("LODE_CLUSTER_STEPS", 400);
    let job = Job {
        plan: synthetic(dir, steps),
        steps,
        step_time: Duration::from_millis(10),
        at: Duration::from_millis(env_u64("LODE_CLUSTER_FAULT_AT_MS", 1000)),
    };
    (
        job,
        Duration::from_millis(env_u64("LODE_CLUSTER_FAULT_MS", 3000)),
    )
}

/// The fault table: the calm run, then each single fault, each checked for exactly-once and
/// its extra stall over the calm run. CI runs a short job; `bench/cluster.sh` a long one
/// (LODE_CLUSTER_STEPS, LODE_CLUSTER_FAULT_MS).
#[test]
fn cluster_faults_cost_little_and_lose_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (job, fault) = fault_job(tmp.path());
    let extra = dispatcher_args();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let all = [2, 3, 4];
    let mut reports = vec![run(&job, Fault::None, &all, &extra)];
    for f in std::env::var("LODE_CLUSTER_ONLY").map_or(
        vec![
            Fault::LinkDown(fault),
            Fault::Frozen(fault),
            Fault::Killed,
            Fault::Slow,
        ],
        |only| match only.as_str() {
            "link" => vec![Fault::LinkDown(fault)],
            "frozen" => vec![Fault::Frozen(fault)],
            "killed" => vec![Fault::Killed],
            _ => vec![Fault::Slow],
        },
    ) {
        let report = run(&job, f, &all, &extra);
        assert_exactly_once(&report, &reports[0].log, 32);
        reports.push(report);
    }
    let table = table(&reports);
    eprintln!("{table}");
    if let Ok(out) = std::env::var("LODE_CLUSTER_TABLE") {
        std::fs::write(out, &table).expect("write the table");
    }
    // No second lease in a calm run: nothing is leased twice unless a worker was lost.
    assert_eq!(
        reports[0].leased_twice, 0,
        "the calm run leased a step twice\n{table}"
    );
    // Each fault is noticed in about a second, not at the lease deadline (10 s): its extra
    // stall stays under the bound (2 s here, under a shared CI machine's noise; the benchmark
    // reports the figures against the issue's 1 s).
    let bound = Duration::from_millis(env_u64("LODE_CLUSTER_MAX_EXTRA_STALL_MS", 2000));
    for r in &reports[1..] {
        assert!(
            r.stall.saturating_sub(reports[0].stall) < bound,
            "{}: extra stall over {bound:?}\n{table}",
            r.fault
        );
    }
}

/// A straggler: with one of three workers 4x slower, a job its workers hold back (the
/// consumer takes no time) runs at least as fast as on the two healthy workers alone.
#[test]
fn a_slow_worker_does_not_hold_back_the_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let steps = env_u64("LODE_CLUSTER_STEPS", 400);
    let job = Job {
        plan: synthetic(tmp.path(), steps),
        steps,
        step_time: Duration::ZERO,
        at: Duration::ZERO,
    };
    let extra = dispatcher_args();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut two = run(&job, Fault::None, &[2, 3], &extra);
    two.fault = "two healthy workers";
    let mut three = run(&job, Fault::Slow, &[2, 3, 4], &extra);
    three.fault = "two healthy + one 4x slow";
    assert_exactly_once(&three, &two.log, 32);
    // At least as fast as the two alone, within the noise of a shared machine (before slow
    // workers held fewer steps: 26% slower).
    let ratio = three.wall.as_secs_f64() / two.wall.as_secs_f64();
    let table = table(&[two, three]);
    eprintln!("{table}with the slow worker: {ratio:.2}x the time of the two alone");
    if let Ok(out) = std::env::var("LODE_CLUSTER_STRAGGLER_TABLE") {
        std::fs::write(
            out,
            format!("{table}\nwith the slow worker: {ratio:.2}x the time\n"),
        )
        .expect("write the table");
    }
    assert!(
        ratio < 1.15,
        "with the slow worker {ratio:.2}x the time\n{table}"
    );
}

/// The settings of a partition test: the CI job (or `bench/cluster.sh`'s), a calm run to
/// compare with, and the faulty run.
fn calm_and(fault: impl Fn(Duration) -> Fault) -> (Report, Report, Job, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (job, length) = fault_job(tmp.path());
    let extra = dispatcher_args();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let calm = run(&job, Fault::None, &[2, 3, 4], &extra);
    let faulty = run(&job, fault(length), &[2, 3, 4], &extra);
    assert_exactly_once(&faulty, &calm.log, 32);
    (calm, faulty, job, tmp)
}

/// The receiver's drops, from the consumer's closing line: (duplicates, stale).
fn dropped(report: &Report) -> (u64, u64) {
    let line = &report.consumed;
    let count = |what: &str| -> u64 {
        let end = line
            .find(&format!(" {what} "))
            .unwrap_or_else(|| panic!("no count of {what} messages in {line:?}"));
        let start = line[..end].rfind(' ').map_or(0, |i| i + 1);
        line[start..end]
            .parse()
            .unwrap_or_else(|_| panic!("the count of {what} messages in {line:?}"))
    };
    (count("duplicate"), count("stale"))
}

/// Steps the consumer received while the fault lasted, for certain: after its start, and
/// before its end however late the consumer's clock started.
fn delivered_during_fault(report: &Report) -> u64 {
    let (start, end) = report.fault_window.expect("a fault's window");
    let at = |v: &Value| Duration::from_micros(v["at_us"].as_u64().expect("a step's arrival"));
    let lag = report
        .first_seen
        .saturating_sub(report.log.first().map_or(Duration::ZERO, at));
    report
        .log
        .iter()
        .map(at)
        .filter(|&t| t > start && t + lag < end)
        .count() as u64
}

/// A dispatcher restarted from `report`'s journal after the run (here, on loopback): what it
/// says was consumed must be what the consumer received.
fn assert_restart_agrees(report: &Report, job: &Job) {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr_file = dir.path().join("addr");
    let mut restarted = Proc(
        Command::new(env!("CARGO_BIN_EXE_lode"))
            .args(["dispatcher", "--plan", job.plan.to_str().expect("UTF-8")])
            .args(["--journal", report.journal.to_str().expect("UTF-8")])
            .args(["--listen", "127.0.0.1:0", "--token", TOKEN, "--epochs", "1"])
            .args(["--addr-file", addr_file.to_str().expect("UTF-8")])
            .args(["--keep-serving", "-q"])
            .args(dispatcher_args())
            .env_remove("LODE_TOKEN")
            .stdout(Stdio::null())
            .spawn()
            .expect("restart the dispatcher"),
    );
    let started = Instant::now();
    let addr = loop {
        match std::fs::read_to_string(&addr_file) {
            // Written whole (atomically), once it serves.
            Ok(a) if !a.is_empty() => break a.trim().to_owned(),
            _ => {}
        }
        if let Some(status) = restarted.0.try_wait().expect("wait") {
            panic!(
                "{}: the dispatcher restarted from its journal exited {status}",
                report.fault
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the restarted dispatcher did not serve"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let status: Value = serde_json::from_str(&ok(&crate::support::lode(&[
        "status", &addr, "--token", TOKEN, "--format", "json",
    ])))
    .expect("status JSON");
    let last = report.log.last().and_then(|l| l["step"].as_u64());
    assert_eq!(
        status["steps_consumed"].as_u64(),
        Some(report.log.len() as u64),
        "{}: the restarted dispatcher's consumed steps against the consumer's log: {status}",
        report.fault
    );
    assert_eq!(
        status["watermark"]["step"].as_u64(),
        last,
        "{}: the restarted dispatcher's watermark: {status}",
        report.fault
    );
    assert_eq!(
        status["end_of_data"],
        Value::Bool(true),
        "{}: {status}",
        report.fault
    );
    let _ = restarted.0.kill();
}

/// The dispatcher's host cut off from the workers and the consumer (on a host of their own)
/// for a few seconds. The workers keep delivering what they hold to the consumer (as far as
/// their leases go: each holds at most 150 ms of its steps, so the job stalls for about the
/// cut less what they and the receiver's window held), are declared lost by the dispatcher,
/// and register again once the link is back; every record is delivered once, in order, and a
/// dispatcher restarted from the journal afterwards agrees with what the consumer received.
#[test]
fn the_dispatchers_host_cut_off_delivers_what_is_held_and_loses_nothing() {
    let (calm, cut, job, _tmp) = calm_and(Fault::DispatcherCut);
    let (start, end) = cut.fault_window.expect("the cut's window");
    let length = end - start;
    let during = delivered_during_fault(&cut);
    let known = workers_of(&journal_records(&cut.journal));
    let (stall, drops) = (cut.stall, dropped(&cut));
    // The first step after the cut, on the consumer's clock (at most `first_seen` late).
    let resumed = cut
        .log
        .iter()
        .map(|l| Duration::from_micros(l["at_us"].as_u64().expect("a step's arrival")))
        .find(|&t| t >= end)
        .map(|t| t.saturating_sub(end));
    let reports = [calm, cut];
    let table = table(&reports);
    eprintln!(
        "{table}{during} steps delivered during the {length:?} cut; the first after it \
         {resumed:?} after the link was back; receiver drops (duplicate, stale) {drops:?}; \
         workers lost {:?}, registered {:?}",
        known.lost, known.registered
    );
    assert!(
        during > 0,
        "no step delivered during the cut: the workers did not deliver what they held\n{table}"
    );
    // Every worker the dispatcher lost during the cut registered again and leased anew.
    assert!(
        !known.lost.is_empty(),
        "no worker was declared lost in a {length:?} cut"
    );
    let first_lost = known.lost[0].0;
    let back: Vec<u64> = known
        .registered
        .iter()
        .filter(|&&(at, id)| at > first_lost && known.granted.contains_key(&id))
        .map(|&(_, id)| id)
        .collect();
    assert!(
        back.len() >= known.lost.len(),
        "{} worker(s) lost, {} registered again and leased: {known:?}",
        known.lost.len(),
        back.len()
    );
    // Back within about two seconds of the link (the channels' keepalive and connect
    // timeouts, then a heartbeat).
    assert!(
        stall < length + Duration::from_secs(2),
        "the job stalled {stall:?} for a {length:?} cut\n{table}"
    );
    assert_restart_agrees(&reports[1], &job);
}

/// Stale leases: host 4's worker cut off and frozen holding computed steps, declared lost,
/// its steps leased again to the others and delivered; then its link back and the worker
/// thawed. The late frames of its revoked leases are dropped by the receiver (counted), no
/// step is delivered twice, its late reports complete nothing, and it registers again and
/// goes on with fresh leases.
#[test]
fn a_workers_stale_leases_are_dropped_never_delivered_twice() {
    let (calm, stale, _job, _tmp) =
        calm_and(|length| Fault::StaleLeases(length + Duration::from_secs(5)));
    let known = workers_of(&journal_records(&stale.journal));
    let (calm_drops, stale_drops) = (dropped(&calm), dropped(&stale));
    let reports = [calm, stale];
    let table = table(&reports);
    eprintln!(
        "{table}receiver drops (duplicate, stale): calm {calm_drops:?}, stale leases \
         {stale_drops:?}; workers lost {:?}, revoked {:?}",
        known.lost, known.revoked
    );
    let &[(lost_at, old)] = known.lost.as_slice() else {
        panic!("expected host 4's worker alone lost: {known:?}");
    };
    let revoked = known.revoked.get(&old).cloned().unwrap_or_default();
    assert!(
        !revoked.is_empty(),
        "host 4's worker held nothing when it was lost: {known:?}"
    );
    // Each revoked step went to another worker and was done under its lease; the old
    // worker's late reports completed none of them.
    for step in &revoked {
        let by: Vec<u64> = known
            .done
            .iter()
            .filter(|(_, steps)| steps.contains(step))
            .map(|(&id, _)| id)
            .collect();
        assert!(
            !by.is_empty() && !by.contains(&old),
            "revoked step {step}: done under the leases of {by:?} (the lost worker was {old})"
        );
    }
    // Its late frames were dropped by the receiver: the calm run drops nothing, so every
    // drop is of a step leased twice.
    assert_eq!(
        calm_drops,
        (0, 0),
        "the calm run's receiver dropped messages\n{table}"
    );
    let (duplicates, stale) = stale_drops;
    assert!(
        duplicates + stale > 0,
        "the receiver dropped no late frame of the revoked leases\n{table}"
    );
    // It registered again and went on with fresh leases, none of the revoked steps.
    let again: Vec<u64> = known
        .registered
        .iter()
        .filter(|&&(at, _)| at > lost_at)
        .map(|&(_, id)| id)
        .collect();
    let [new] = again.as_slice() else {
        panic!("expected host 4's worker to register again, once: {known:?}");
    };
    let fresh = known.granted.get(new).cloned().unwrap_or_default();
    assert!(
        !fresh.is_empty() && fresh.iter().all(|s| !revoked.contains(s)),
        "the worker registered again as {new}: granted {fresh:?} (revoked {revoked:?})"
    );
    assert!(
        known.done.get(new).is_some_and(|c| !c.is_empty()),
        "the worker registered again as {new} delivered nothing"
    );
}
