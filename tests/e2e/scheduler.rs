//! `lode scheduler --backend local` against two real jobs (`lode run --announce`) of different
//! appetite on this machine, each started with one worker: a synthetic stage of 40 ms per step
//! feeding a training side of 10 ms per step, and one of 2 ms per step feeding 20 ms. With room
//! for four workers, every policy must give the two spare workers to the 40 ms job (one worker
//! reaches a quarter of its consumption; another adds as much) and none to the 2 ms job (one
//! worker feeds it several times over, even when the machine is loaded and a step's measured
//! compute time grows), and the workers it started must be drained when it stops.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{lode, ok, stderr, tls_file};

/// A child killed (SIGINT first, then SIGKILL) when dropped, so a failing test leaves nothing.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_job(plan: &Path, jobs: &Path, name: &str, step_time: &str) -> Job {
    start_job_with(plan, jobs, name, step_time, &[])
}

fn start_job_with(plan: &Path, jobs: &Path, name: &str, step_time: &str, extra: &[&str]) -> Job {
    let child = Command::new(env!("CARGO_BIN_EXE_lode"))
        .env_remove("LODE_TOKEN")
        .args(["run", plan.to_str().expect("UTF-8")])
        .args([
            "--workers",
            "1",
            "--steps",
            "10000000",
            "--step-time",
            step_time,
        ])
        .args(["--announce", jobs.to_str().expect("UTF-8"), "--name", name])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lode run");
    Job(child)
}

fn synthetic(dir: &Path, name: &str, latency: &str) -> std::path::PathBuf {
    synthetic_with(dir, name, latency, &[])
}

fn synthetic_with(dir: &Path, name: &str, latency: &str, extra: &[&str]) -> std::path::PathBuf {
    let plan = dir.join(name);
    let mut args = vec![
        "synthetic",
        "-o",
        plan.to_str().expect("UTF-8"),
        "--latency",
        latency,
        "--records",
        "400000",
        "--batch",
        "8",
    ];
    args.extend_from_slice(extra);
    ok(&lode(&args));
    plan
}

/// The scheduler's output (it must have succeeded) and its rounds, one JSON object a line.
fn json_rounds(out: &std::process::Output) -> (String, Vec<Value>) {
    let text = ok(out);
    let rounds = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per round"))
        .collect();
    (text, rounds)
}

/// Waits until every named job has announced itself in `jobs`.
fn wait_for_announcements(jobs: &Path, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !names
        .iter()
        .all(|n| jobs.join(format!("{n}.json")).is_file())
    {
        assert!(
            Instant::now() < deadline,
            "the jobs did not announce themselves"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Active workers of an announced job, by `lode status`.
fn active_workers(jobs: &Path, name: &str) -> usize {
    active_workers_with(jobs, name, &[])
}

fn active_workers_with(jobs: &Path, name: &str, extra: &[&str]) -> usize {
    let a: Value = serde_json::from_str(
        &std::fs::read_to_string(jobs.join(format!("{name}.json"))).expect("announcement"),
    )
    .expect("JSON");
    let out = Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["status", a["dispatcher"].as_str().expect("address")])
        .args(["--job", &a["job"].to_string(), "--format", "json"])
        .args(extra)
        .env("LODE_TOKEN", a["token"].as_str().expect("token"))
        .output()
        .expect("lode status");
    let status: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status JSON: {e}: {}", stderr(&out)));
    status["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter(|w| w["status"] == "active")
        .count()
}

#[test]
fn the_scheduler_moves_workers_to_the_job_that_gains_more() {
    let tmp = tempfile::tempdir().expect("tmp");
    let jobs = tmp.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir");
    let heavy = synthetic(tmp.path(), "heavy", "40ms");
    let light = synthetic(tmp.path(), "light", "2ms");
    let _heavy_job = start_job(&heavy, &jobs, "heavy", "10ms");
    let _light_job = start_job(&light, &jobs, "light", "20ms");
    wait_for_announcements(&jobs, &["heavy", "light"]);

    for policy in ["maxtp", "srtf", "fair"] {
        let out = lode(&[
            "scheduler",
            "--policy",
            policy,
            "--backend",
            "local",
            "--jobs",
            jobs.to_str().expect("UTF-8"),
            "--interval",
            "2s",
            "--max-workers",
            "4",
            "--rounds",
            "4",
            "--format",
            "json",
        ]);
        let (text, rounds) = json_rounds(&out);
        assert_eq!(rounds.len(), 4, "{policy}: {text}");
        let decisions: Vec<&Value> = rounds
            .iter()
            .flat_map(|r| r["decisions"].as_array().expect("decisions"))
            .collect();
        let count = |action: &str, job: &str| {
            decisions
                .iter()
                .filter(|d| d["action"] == action && d["job"] == job)
                .count()
        };
        assert_eq!(count("add", "heavy"), 2, "{policy}: {text}");
        assert_eq!(count("add", "light"), 0, "{policy}: {text}");
        assert_eq!(
            count("remove", "heavy") + count("remove", "light"),
            0,
            "{policy}: {text}"
        );
        // Every add carries the metric that chose it, and the rates it came from are shown.
        assert!(
            decisions.iter().all(|d| d["metric"].is_f64()),
            "{policy}: {text}"
        );
        let last = rounds.last().expect("a round");
        let job = |name: &str| {
            last["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .find(|j| j["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{policy}: {name} missing in {text}"))
        };
        assert_eq!(job("heavy")["workers"], 3, "{policy}: {text}");
        assert_eq!(job("light")["workers"], 1, "{policy}: {text}");
        let per_worker = job("heavy")["per_worker"].as_f64().expect("measured");
        assert!(
            (10.0..26.0).contains(&per_worker),
            "{policy}: a 40 ms worker makes at most 25 steps/s, got {per_worker}"
        );
        // After the scheduler stopped, the workers it started were drained and have left.
        let deadline = Instant::now() + Duration::from_secs(30);
        while active_workers(&jobs, "heavy") != 1 {
            assert!(
                Instant::now() < deadline,
                "{policy}: the scheduler's workers were not drained"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn the_scheduler_reaches_a_tls_job_and_its_workers_join_it_over_tls() {
    let tmp = tempfile::tempdir().expect("tmp");
    let jobs = tmp.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir");
    let (cert, key, ca) = (
        tls_file("server.crt"),
        tls_file("server.key"),
        tls_file("ca.crt"),
    );
    let heavy = synthetic(tmp.path(), "heavy", "40ms");
    let _job = start_job_with(
        &heavy,
        &jobs,
        "heavy",
        "10ms",
        &["--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca],
    );
    wait_for_announcements(&jobs, &["heavy"]);
    let scheduler = |extra: &[&str]| {
        let mut args = vec![
            "scheduler",
            "--policy",
            "maxtp",
            "--jobs",
            jobs.to_str().expect("UTF-8"),
            "--interval",
            "2s",
            "--max-workers",
            "3",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        lode(&args)
    };
    // Without the CA the job cannot be read: no reading, no decision.
    let blind = ok(&scheduler(&["--rounds", "1"]));
    assert!(blind.contains("\"jobs\":[]"), "{blind}");
    // With it, the scheduler measures the job and its workers join it over TLS.
    let text = ok(&scheduler(&["--rounds", "4", "--tls-ca", &ca]));
    let last: Value = serde_json::from_str(text.lines().last().expect("a round")).expect("JSON");
    let workers = last["jobs"][0]["workers"].as_u64().expect("measured");
    assert!(workers > 1, "the scheduler's workers joined: {text}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while active_workers_with(&jobs, "heavy", &["--tls-ca", &ca]) != 1 {
        assert!(
            Instant::now() < deadline,
            "the scheduler's workers were not drained"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `lode scheduler --tune`: one job whose step is 80 ms of work in two parallel parts (`lode
/// synthetic --parallelism 2`), fed by one one-thread worker of its own (12.5 steps/s) to a
/// training side of 5 ms per step (200 steps/s). The job-level tuner probes workers of 1, 2
/// and 3 threads, measures their production (about 12.5, 25 and 25 steps/s: speedups 1x, 2x,
/// 2x), sizes the job's workers at 2 threads because a third adds nothing, and the policy then
/// adds 2-thread workers; every decision is logged with the speedup it measured, and every
/// worker the scheduler started (probes included) is drained when it stops. (80 ms rather
/// than less so that a loaded machine's few milliseconds of thread wake-up per step do not
/// blur a speedup of two.)
#[test]
fn the_tuner_sizes_a_jobs_workers_from_measured_speedups() {
    let tmp = tempfile::tempdir().expect("tmp");
    let jobs = tmp.path().join("jobs");
    std::fs::create_dir(&jobs).expect("mkdir");
    let plan = synthetic_with(tmp.path(), "split", "80ms", &["--parallelism", "2"]);
    let _job = start_job(&plan, &jobs, "split", "5ms");
    wait_for_announcements(&jobs, &["split"]);
    let out = lode(&[
        "scheduler",
        "--policy",
        "maxtp",
        "--tune",
        "--jobs",
        jobs.to_str().expect("UTF-8"),
        "--interval",
        "1s",
        "--max-workers",
        "6",
        "--rounds",
        "24",
        "--format",
        "json",
    ]);
    let (text, rounds) = json_rounds(&out);
    let tuning: Vec<&Value> = rounds
        .iter()
        .flat_map(|r| r["tuning"].as_array().expect("tuning"))
        .collect();
    let record = |kind: &str, threads: u64| {
        tuning
            .iter()
            .find(|t| t["kind"] == kind && t["threads"] == threads)
            .copied()
            .unwrap_or_else(|| panic!("no {kind} record of {threads} threads: {text}"))
    };
    let rate = |t: &Value| t["rate"].as_f64().expect("rate");
    let speedup = |t: &Value| t["speedup"].as_f64().expect("speedup");
    assert!(tuning.iter().all(|t| t["job"] == "split"), "{text}");
    // One thread: 80 ms per step.
    let one = record("probe", 1);
    assert!((8.0..13.5).contains(&rate(one)), "{text}");
    // Two threads run the two parts at once: about twice as fast.
    let two = record("probe", 2);
    assert!((1.6..2.3).contains(&speedup(two)), "{text}");
    // A third thread has no third part to run.
    let three = record("probe", 3);
    assert!(rate(three) / rate(two) < 1.25, "{text}");
    let sized = record("sized", 2);
    assert_eq!(sized["stage"], 0, "{text}");
    assert!(tuning.iter().any(|t| t["kind"] == "helps"), "{text}");
    // The policy's workers have the tuned size, and there are some.
    let adds: Vec<&Value> = rounds
        .iter()
        .flat_map(|r| r["decisions"].as_array().expect("decisions"))
        .filter(|d| d["action"] == "add")
        .collect();
    assert!(!adds.is_empty(), "{text}");
    assert!(
        adds.iter()
            .all(|d| d["job"] == "split" && d["threads"] == 2),
        "{text}"
    );
    // After the scheduler stopped, its workers (probes included) were drained and have left.
    let deadline = Instant::now() + Duration::from_secs(30);
    while active_workers(&jobs, "split") != 1 {
        assert!(
            Instant::now() < deadline,
            "the scheduler's workers were not drained: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn each_backend_refuses_what_it_cannot_use_with_status_2() {
    let local = lode(&["scheduler", "--policy", "maxtp"]);
    assert_eq!(local.status.code(), Some(2), "{}", stderr(&local));
    assert!(stderr(&local).contains("--jobs"), "{}", stderr(&local));
    let selector = lode(&[
        "scheduler",
        "--backend",
        "kubernetes",
        "--policy",
        "fair",
        "--node-selector",
        "nokey",
    ]);
    assert_eq!(selector.status.code(), Some(2), "{}", stderr(&selector));
    assert!(
        stderr(&selector).contains("KEY=VALUE"),
        "{}",
        stderr(&selector)
    );
}
