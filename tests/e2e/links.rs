//! Goodput across a link between two hosts, by compression setting: a worker on one network
//! namespace host pushing a synthetic job's steps to `lode consume` on another, over a veth
//! link shaped to a rate with `tc tbf` or left unshaped, with `--compression off`, `lz4` and
//! `auto`. Goodput is the payload of the steps the consumer received over the time between
//! the first one and the last (the emulator's `at_us`), against the link's rate.
//!
//! Two hosts of the cluster harness (`super::cluster::Cluster`, namespaces
//! `lodel-<pid>-…`, addresses in 10.77.0.0/24 inside them only, removed when it drops): the
//! dispatcher and the consumer on host 1, the worker on host 2. Two job kinds, 1 MiB a step
//! in the benchmark (32 records): `ids`, int64 feature ids hashed into 10,000 buckets (compressible, as parsed
//! categorical features are), and `floats`, float32 from each record's hash (incompressible).
//!
//! The CI test checks the decision over a real link without timing anything: on a link much
//! slower than the worker, `auto` sends compressible steps compressed (fewer bytes on the
//! link than their payload) and incompressible ones raw. The benchmark (`bench/links.sh`: the
//! ignored test `goodput_by_compression_and_link`) measures the goodput table of
//! docs/cluster.md: every setting, on the shaped and the unshaped link, for both kinds, in
//! rounds that interleave the settings.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::cluster::{env_u64, lines, wait_exited, wait_listening, wait_registered, Cluster};
use crate::support::ok;

const TOKEN: &str = "links-token";

/// Records per step.
const BATCH: u64 = 32;

/// A step's payload in the benchmark.
const STEP_BYTES: u64 = 1 << 20;

/// The job kinds (`lode synthetic --values`) and their values' bytes.
const KINDS: [(&str, u64); 2] = [("ids", 8), ("floats", 4)];

/// The values per record that make a step of `step_bytes` of values `width` bytes wide.
fn values_per_record(step_bytes: u64, width: u64) -> u64 {
    step_bytes / BATCH / width
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Run {
    /// Payload bytes delivered per second, first step to last.
    goodput: f64,
    /// Bytes the worker's host sent on its link over the payload delivered.
    wire_ratio: f64,
    /// The worker's CPU seconds per GB of payload delivered (its whole life: start, stage
    /// load and every step; the same start for every setting).
    worker_cpu: f64,
    /// The 1-minute load average when the run started.
    load: f64,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A synthetic plan of `steps` steps of `kind`.
fn plan(dir: &Path, name: &str, kind: &str, width: u64, steps: u64) -> PathBuf {
    let plan = dir.join(format!("plan-{name}"));
    ok(&crate::support::lode(&[
        "synthetic",
        "-o",
        plan.to_str().expect("UTF-8"),
        "--latency",
        "0ms",
        "--records",
        &(steps * BATCH).to_string(),
        "--batch",
        &BATCH.to_string(),
        "--width",
        &width.to_string(),
        "--values",
        kind,
    ]));
    plan
}

/// Runs the job of `plan` once on `cluster` (dispatcher and consumer on host 1, one worker
/// with `compression` on host 2) and measures it.
fn run(cluster: &mut Cluster, plan: &Path, steps: u64, step_bytes: u64, compression: &str) -> Run {
    let tmp = tempfile::tempdir().expect("tempdir");
    let journal = tmp.path().join("journal");
    let log = tmp.path().join("steps.jsonl");
    let listen = format!("{}:7000", cluster.addr(1));
    let load = load_average();
    let mut disp = cluster.lode(1, &["dispatcher", "--plan", plan.to_str().expect("UTF-8")]);
    disp.args(["--journal", journal.to_str().expect("UTF-8")])
        .args(["--listen", &listen, "--token", TOKEN, "--epochs", "1", "-q"])
        .stdout(Stdio::null());
    cluster.start(disp);
    wait_listening(cluster, &journal);
    let addr = format!("http://{listen}");
    let mut consume = cluster.lode(1, &["consume", "--dispatcher", &addr, "--token", TOKEN]);
    consume
        .args(["--step-time", "0ms", "--capacity", "64"])
        .args(["--listen", &format!("{}:7001", cluster.addr(1))])
        .args(["--log", log.to_str().expect("UTF-8"), "-q"])
        .stdout(Stdio::null());
    let started = Instant::now();
    let consumer = cluster.start(consume);
    wait_registered(&journal, started);
    let before = cluster.link_bytes(2);
    let mut worker = cluster.lode(2, &["worker", "--dispatcher", &addr, "--token", TOKEN]);
    worker
        .args([
            "--name",
            "w2",
            "--threads",
            "1",
            "--compression",
            compression,
            "-q",
        ])
        .stdout(Stdio::null());
    let worker = cluster.start(worker);
    wait_exited(cluster, consumer, started, Duration::from_secs(300));
    // The worker has sent every step; it stays until the dispatcher's job ends or it is killed.
    let worker_cpu = cluster.procs[worker]
        .cpu_seconds()
        .expect("the worker's CPU time");
    let sent = cluster.link_bytes(2).1 - before.1;
    // The dispatcher and the worker of this run go; the links stay for the next.
    cluster.procs.clear();
    let log = lines(&log);
    assert_eq!(log.len() as u64, steps, "steps consumed");
    for (i, line) in log.iter().enumerate() {
        assert_eq!(line["step"], i as u64, "step order");
    }
    let at = |i: usize| log[i]["at_us"].as_u64().expect("a step's arrival time");
    let span = Duration::from_micros(at(log.len() - 1) - at(0));
    let delivered = (steps - 1) * step_bytes;
    Run {
        goodput: delivered as f64 / span.as_secs_f64(),
        wire_ratio: sent as f64 / (steps * step_bytes) as f64,
        worker_cpu: worker_cpu / ((steps * step_bytes) as f64 / 1e9),
        load,
    }
}

/// Two hosts, their links shaped to `rate` (tc's units) or left as they are (None).
fn hosts(rate: Option<&str>) -> Cluster {
    let cluster = Cluster::named("lodel", 2);
    if let Some(rate) = rate {
        for host in 1..=2 {
            cluster.shape(host, rate);
        }
    }
    cluster
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// On a link much slower than the worker (20 Mbit/s, slower than even a debug build's worker
/// makes 64 KiB steps), `auto` compresses compressible steps (the link carries fewer bytes
/// than their payload) and sends incompressible ones raw. Decided by bytes on the link, not
/// by time.
#[test]
fn auto_compresses_on_a_slow_link_and_not_what_does_not_shrink() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let steps = env_u64("LODE_LINKS_CI_STEPS", 300);
    let step_bytes = 64 << 10;
    let mut cluster = hosts(Some("20mbit"));
    let [(ids, ids_width), (floats, floats_width)] = KINDS;
    let ids = plan(
        tmp.path(),
        ids,
        ids,
        values_per_record(step_bytes, ids_width),
        steps,
    );
    let floats = plan(
        tmp.path(),
        floats,
        floats,
        values_per_record(step_bytes, floats_width),
        steps,
    );
    let compressible = run(&mut cluster, &ids, steps, step_bytes, "auto");
    let raw = run(&mut cluster, &floats, steps, step_bytes, "auto");
    eprintln!("auto on 20 Mbit/s: ids {compressible:?}, floats {raw:?}");
    // LZ4 makes these steps about two thirds of their size; raw frames (and the first ones,
    // sent while the first probe and window run) are about their payload.
    assert!(
        compressible.wire_ratio < 0.85,
        "compressible steps went {:.2} of their payload on the link",
        compressible.wire_ratio
    );
    assert!(
        raw.wire_ratio > 0.98,
        "incompressible steps went {:.2} of their payload on the link",
        raw.wire_ratio
    );
}

/// The goodput table: every compression setting on a 1 Gbit/s link and an unshaped one, for
/// both job kinds, `LODE_LINKS_ROUNDS` rounds (each round runs the three settings in turn,
/// starting from a different one each round). `bench/links.sh` runs it.
#[test]
#[ignore = "a benchmark of several minutes: bench/links.sh runs it"]
fn goodput_by_compression_and_link() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rounds = usize::try_from(env_u64("LODE_LINKS_ROUNDS", 3)).expect("a round count");
    let settings = ["off", "lz4", "auto"];
    // About 10 s a run on either link (the unshaped one is several times faster).
    let links = [
        ("1 Gbit/s", Some("1gbit"), env_u64("LODE_LINKS_STEPS", 1200)),
        ("unshaped", None, env_u64("LODE_LINKS_UNSHAPED_STEPS", 4000)),
    ];
    // LODE_LINKS_ONLY=unshaped (or "1 Gbit/s", ids, floats) runs only the rows it names.
    let only = std::env::var("LODE_LINKS_ONLY").unwrap_or_default();
    let wanted = |link: &str, kind: &str| only.is_empty() || only == link || only == kind;
    let mut table = String::from(
        "| link | job | off MB/s | lz4 MB/s | auto MB/s | auto vs better | auto vs the round's better | wire bytes / payload (off, lz4, auto) | worker CPU s/GB (off, lz4, auto) | load |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (link, rate, steps) in links {
        if !KINDS.iter().any(|(kind, _)| wanted(link, kind)) {
            continue;
        }
        let mut cluster = hosts(rate);
        for (kind, width) in KINDS {
            if !wanted(link, kind) {
                continue;
            }
            let per_record = values_per_record(STEP_BYTES, width);
            let plan = plan(
                tmp.path(),
                &format!("{kind}-{steps}"),
                kind,
                per_record,
                steps,
            );
            let mut runs: Vec<Vec<Run>> = vec![Vec::new(); settings.len()];
            for round in 0..rounds {
                for k in 0..settings.len() {
                    let s = (round + k) % settings.len();
                    let r = run(&mut cluster, &plan, steps, STEP_BYTES, settings[s]);
                    eprintln!("{link} {kind} {} round {round}: {r:?}", settings[s]);
                    runs[s].push(r);
                }
            }
            let good: Vec<f64> = runs
                .iter()
                .map(|rs| median(rs.iter().map(|r| r.goodput).collect()))
                .collect();
            let wire: Vec<String> = runs
                .iter()
                .map(|rs| format!("{:.2}", median(rs.iter().map(|r| r.wire_ratio).collect())))
                .collect();
            let cpu: Vec<String> = runs
                .iter()
                .map(|rs| format!("{:.2}", median(rs.iter().map(|r| r.worker_cpu).collect())))
                .collect();
            let loads: Vec<f64> = runs.iter().flatten().map(|r| r.load).collect();
            let better = good[0].max(good[1]);
            // Paired: each round's auto against the better of that round's off and lz4 (the
            // three ran back to back, so a slow stretch of the machine weighs on all three).
            let paired: Vec<f64> = (0..rounds)
                .map(|i| runs[2][i].goodput / runs[0][i].goodput.max(runs[1][i].goodput))
                .collect();
            let paired_all: Vec<String> = paired
                .iter()
                .map(|r| format!("{:+.0}", (r - 1.0) * 100.0))
                .collect();
            let mb = |b: f64| b / 1e6;
            let all = |s: usize| {
                let v: Vec<String> = runs[s]
                    .iter()
                    .map(|r| format!("{:.0}", mb(r.goodput)))
                    .collect();
                format!("**{:.1}** ({})", mb(good[s]), v.join(", "))
            };
            table.push_str(&format!(
                "| {link} | {kind}, {steps} steps | {} | {} | {} | {:+.1}% | **{:+.1}%** ({}) | {} | {} | {:.1}–{:.1} |\n",
                all(0),
                all(1),
                all(2),
                (good[2] / better - 1.0) * 100.0,
                (median(paired) - 1.0) * 100.0,
                paired_all.join(", "),
                wire.join(", "),
                cpu.join(", "),
                loads.iter().copied().fold(f64::INFINITY, f64::min),
                loads.iter().copied().fold(0.0, f64::max),
            ));
        }
    }
    eprintln!("{table}");
    if let Ok(out) = std::env::var("LODE_LINKS_TABLE") {
        std::fs::write(out, &table).expect("write the table");
    }
}
