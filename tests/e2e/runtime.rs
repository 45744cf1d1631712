//! The running system, as processes: `lode dispatcher`, `lode worker`s, `lode consume`, and
//! `lode run`. Exactly-once delivery is checked against the consumer's log: every record of
//! the epoch once, in the dispatcher's order, and every step's digest equal to a failure-free
//! run's. These tests start real processes and wait on them with deadlines.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{fixtures, lode, ok, stderr, tls_file};

const TOKEN: &str = "e2e-token";

/// sgd_ref with `rows` random CSV rows (header kept), partitioned; returns the plan dir.
fn big_sgd(dir: &Path, rows: usize) -> PathBuf {
    let model = dir.join("sgd");
    std::fs::create_dir_all(model.join("data")).expect("mkdir");
    std::fs::copy(fixtures().join("sgd_ref/model.pb"), model.join("model.pb")).expect("copy");
    let mut text = String::from("x0,x1,x2,x3,y\n");
    let mut x: u64 = 12345;
    for _ in 0..rows {
        let mut fields = Vec::new();
        for _ in 0..5 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            fields.push(format!(
                "{}",
                f64::from(u32::try_from(x >> 54).expect("10 bits")) / 8.0 - 50.0
            ));
        }
        text.push_str(&fields.join(","));
        text.push('\n');
    }
    std::fs::write(model.join("data/train.csv"), text).expect("write csv");
    let plan = dir.join("plan");
    ok(&lode(&[
        "partition",
        model.join("model.pb").to_str().expect("UTF-8"),
        "-o",
        plan.to_str().expect("UTF-8"),
    ]));
    plan
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lode"));
    c.env_remove("LODE_TOKEN").env_remove("LODE_FORMAT");
    c
}

/// Starts a dispatcher and returns it with its address, once it listens.
fn dispatcher(plan: &Path, journal: &Path, listen: &str) -> (Proc, String) {
    dispatcher_with(plan, journal, listen, &[])
}

/// [`dispatcher`] with more arguments (one epoch unless they give `--epochs`, 1.5 s leases
/// unless they give `--lease-ms`); the address is https when it serves TLS.
fn dispatcher_with(plan: &Path, journal: &Path, listen: &str, extra: &[&str]) -> (Proc, String) {
    let epochs: &[&str] = if extra.contains(&"--epochs") {
        &[]
    } else {
        &["--epochs", "1"]
    };
    let lease: &[&str] = if extra.contains(&"--lease-ms") {
        &[]
    } else {
        &["--lease-ms", "1500"]
    };
    let mut child = bin()
        .args(["dispatcher", "--plan", plan.to_str().expect("UTF-8")])
        .args(["--journal", journal.to_str().expect("UTF-8")])
        .args(["--listen", listen, "--token", TOKEN])
        .args(lease)
        .args(epochs)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the dispatcher");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the dispatcher prints its address");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (Proc(child), addr)
}

fn worker(addr: &str, name: &str) -> Proc {
    worker_with(addr, name, &[])
}

fn worker_with(addr: &str, name: &str, extra: &[&str]) -> Proc {
    Proc(
        bin()
            .args([
                "worker",
                "--dispatcher",
                addr,
                "--token",
                TOKEN,
                "--name",
                name,
                "-q",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker"),
    )
}

/// How a finished worker process ended (its summary line), or None while it runs or if it
/// was killed.
fn ending(w: &mut Proc) -> Option<String> {
    let status = w.0.try_wait().ok().flatten()?;
    if !status.success() {
        return None;
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut w.0.stdout.take()?, &mut out).ok()?;
    Some(out)
}

/// A `lode consume` that logs to `log`; its step time is 0 unless `extra` sets one.
fn consumer(addr: &str, log: &Path, extra: &[&str]) -> Proc {
    let step_time: &[&str] = if extra.contains(&"--step-time") {
        &[]
    } else {
        &["--step-time", "0ms"]
    };
    Proc(
        bin()
            .args(["consume", "--dispatcher", addr, "--token", TOKEN])
            .args(step_time)
            .args(["--log", log.to_str().expect("UTF-8")])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the consumer"),
    )
}

/// The job's consumed watermark (a global step), from `lode status`.
fn watermark(addr: &str) -> u64 {
    let status = ok(&lode(&[
        "status", addr, "--token", TOKEN, "--format", "json",
    ]));
    let status: Value = serde_json::from_str(&status).expect("status JSON");
    status["watermark"]["step"].as_u64().expect("a watermark")
}

/// Sends `signal` (STOP, CONT) to a child process.
fn signal(child: &Proc, signal: &str) {
    let status = Command::new("sh")
        .args(["-c", &format!("kill -{signal} {}", child.0.id())])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal}: {status}");
}

/// The ids of the workers `lode status` lists as active.
fn active_workers(addr: &str) -> Vec<u64> {
    let status = ok(&lode(&[
        "status", addr, "--token", TOKEN, "--format", "json",
    ]));
    let status: Value = serde_json::from_str(&status).expect("status JSON");
    status["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter(|w| w["status"] == "active")
        .filter_map(|w| w["id"].as_u64())
        .collect()
}

/// Keeps the log's first `n` lines: what a training side restored from a checkpoint taken
/// before step `n` has (it drops what it logged after).
fn keep_log_lines(log: &Path, n: u64) {
    let kept: Vec<String> = std::fs::read_to_string(log)
        .expect("log")
        .lines()
        .take(usize::try_from(n).expect("small"))
        .map(str::to_owned)
        .collect();
    std::fs::write(log, kept.join("\n") + "\n").expect("truncate the log");
}

/// The log's complete lines (a line still being written is left out).
fn lines(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect()
}

/// A child process killed when dropped, so that a failing test leaves nothing running.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded) until the log has at least `n` lines.
fn wait_for_lines(log: &Path, n: usize, limit: Duration) {
    let start = Instant::now();
    while lines(log).len() < n {
        assert!(
            start.elapsed() < limit,
            "the log did not reach {n} lines in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (bounded) for a process to exit successfully.
fn wait_ok(child: &mut Proc, limit: Duration, what: &str) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            assert!(status.success(), "{what} exited with {status}");
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{what} did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill(child: &mut Proc) {
    let _ = child.0.kill(); // SIGKILL on Unix
    let _ = child.0.wait();
}

/// The failure-free reference log of the plan's first epoch.
fn reference(plan: &Path, dir: &Path, steps: u64) -> Vec<Value> {
    let log = dir.join("reference.jsonl");
    ok(&lode(&[
        "run",
        plan.to_str().expect("UTF-8"),
        "--workers",
        "4",
        "--steps",
        &steps.to_string(),
        "--epochs",
        "1",
        "--log",
        log.to_str().expect("UTF-8"),
    ]));
    lines(&log)
}

/// Every record of the epoch once, in order (no shuffle: step s holds s·32 … s·32+31), and the
/// digests of a failure-free run.
fn assert_exactly_once(got: &[Value], reference: &[Value], records: u64) {
    assert_eq!(got.len(), reference.len(), "steps consumed");
    let mut next = 0u64;
    for (i, (line, want)) in got.iter().zip(reference).enumerate() {
        assert_eq!(line["step"], u64::try_from(i).expect("small"), "step order");
        for r in line["records"].as_array().expect("records") {
            assert_eq!(
                r.as_u64(),
                Some(next),
                "step {i}: records in order, each once"
            );
            next += 1;
        }
        assert_eq!(
            line["digest"], want["digest"],
            "step {i}: digest differs from the failure-free run"
        );
    }
    assert_eq!(next, records, "every record of the epoch");
}

#[test]
fn exactly_once_while_workers_scale_and_are_killed_every_half_second() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Enough steps that the job outlasts the chaos and the wait for the killed workers to be
    // declared lost (1 s) even when nothing holds the runtime back: the scale-in must find it
    // still running.
    let rows = 300_000;
    let steps = rows / 32;
    let plan = big_sgd(tmp.path(), usize::try_from(rows).expect("small"));
    let want = reference(&plan, tmp.path(), steps);
    assert_eq!(want.len() as u64, steps);

    let log = tmp.path().join("chaos.jsonl");
    let (mut disp, addr) = dispatcher(&plan, &tmp.path().join("journal"), "127.0.0.1:0");
    // Paced (2 ms a step, at least 19 s for the job) so that the chaos, the wait for the
    // killed workers to be declared lost and the scale-in all happen while it runs, however
    // fast the workers are.
    let mut cons = consumer(&addr, &log, &["--step-time", "2ms"]);
    // Scale out from 1 to 8 workers, kill one at random every half second (replacing it),
    // then scale back in to 1.
    let mut workers = vec![worker(&addr, "w0")];
    wait_for_lines(&log, 200, Duration::from_secs(120));
    for i in 1..8 {
        workers.push(worker(&addr, &format!("w{i}")));
    }
    let mut seed = 7u64;
    let started = Instant::now();
    let mut killed = 0;
    while cons.0.try_wait().expect("wait").is_none() && lines(&log).len() < 1200 {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the job did not finish"
        );
        std::thread::sleep(Duration::from_millis(500));
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let victim = usize::try_from(seed >> 33).expect("small") % workers.len();
        kill(&mut workers[victim]);
        workers[victim] = worker(&addr, &format!("r{killed}"));
        killed += 1;
    }
    // Scale in by draining every registered worker but one: each finishes what it holds and
    // exits by itself. First the killed ones must be declared lost (5 missed heartbeats), so
    // that the dispatcher's workers are exactly the live processes.
    let started = Instant::now();
    let active: Vec<u64> = loop {
        let active = active_workers(&addr);
        if active.len() == workers.len() {
            break active;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "active {active:?}, {} processes",
            workers.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        cons.0.try_wait().expect("wait").is_none(),
        "the job ended before the scale-in could be tested"
    );
    for id in &active[1..] {
        ok(&lode(&[
            "drain",
            &addr,
            "--token",
            TOKEN,
            "--worker",
            &id.to_string(),
        ]));
    }
    wait_ok(&mut cons, Duration::from_secs(240), "the consumer");
    assert!(
        killed >= 2,
        "workers were killed while the job ran ({killed})"
    );
    let endings: Vec<String> = workers.iter_mut().filter_map(ending).collect();
    let drained = endings.iter().filter(|e| e.contains("Drained")).count();
    assert_eq!(
        drained,
        active.len() - 1,
        "drained workers exit by themselves: {endings:?}"
    );
    for mut w in workers.drain(..) {
        kill(&mut w);
    }
    kill(&mut disp);
    assert_exactly_once(&lines(&log), &want, rows);
}

#[test]
fn dispatcher_and_consumer_restarts_lose_and_repeat_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rows = 32_000;
    let steps = rows / 32;
    let plan = big_sgd(tmp.path(), usize::try_from(rows).expect("small"));
    let want = reference(&plan, tmp.path(), steps);

    let port = crate::support::restartable_port();
    let listen = format!("127.0.0.1:{port}");
    let journal = tmp.path().join("journal");
    let log = tmp.path().join("restarts.jsonl");
    // A journal compacted every few KB: the restarted dispatcher reads a snapshot and what
    // followed it.
    let compact = ["--journal-compact", "4KiB"];
    let (mut disp, addr) = dispatcher_with(&plan, &journal, &listen, &compact);
    // The first consumer must die mid-job: at 2 ms a step it cannot reach the job's last step
    // (and end the job, and the dispatcher with it) between the log's 500th line and its kill
    // below. Its window (up to 1,024 steps) holds the whole epoch, so the workers finish their
    // stage long before: they must stay to redo what the killed consumer held.
    let mut cons = consumer(&addr, &log, &["--step-time", "2ms"]);
    let mut workers: Vec<Proc> = (0..4).map(|i| worker(&addr, &format!("w{i}"))).collect();

    // The dispatcher dies mid-epoch, three times, and comes back from its journal on the
    // same address.
    let second_line = |what: &str| {
        let text = std::fs::read_to_string(journal.join("journal.jsonl")).expect("journal");
        let line = text.lines().nth(1).unwrap_or_default().to_owned();
        assert!(
            line.contains("\"Snapshot\""),
            "{what}: no snapshot: {line:.200}"
        );
    };
    for lines in [150, 250, 350] {
        wait_for_lines(&log, lines, Duration::from_secs(120));
        kill(&mut disp);
        second_line(&format!("killed after {lines} steps"));
        let (d, _) = dispatcher_with(&plan, &journal, &listen, &compact);
        disp = d;
    }

    // The training side dies; it restarts from the dispatcher's consumed watermark, dropping
    // what it logged past it (a checkpointed trainer would not have those steps either).
    wait_for_lines(&log, 500, Duration::from_secs(120));
    kill(&mut cons);
    let watermark = watermark(&addr);
    keep_log_lines(&log, watermark + 1);
    let resume = (watermark + 1).to_string();
    let mut cons = consumer(&addr, &log, &["--resume-from", &resume]);
    wait_ok(
        &mut cons,
        Duration::from_secs(180),
        "the restarted consumer",
    );
    for mut w in workers.drain(..) {
        kill(&mut w);
    }
    kill(&mut disp);
    second_line("at the end");
    assert_exactly_once(&lines(&log), &want, rows);
}

/// A training side restarted from an older checkpoint (the watermark moves back 50 steps) with
/// a receiver window of 4 steps, while the workers hold leases far past it: the steps from the
/// checkpoint on are leased again (returned steps, behind the later ones in lease order), and
/// must not wait behind steps the receiver cannot take yet. Leases last 10 minutes, so a worker
/// that waited on its `RETRY` for a lease to expire (as one did, and hung the checkpoint-restart
/// conformance case) would not finish within the 3 minutes allowed.
#[test]
fn a_rewound_consumer_with_a_small_window_is_not_held_up_by_steps_past_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rows = 32_000;
    let steps = rows / 32;
    let plan = big_sgd(tmp.path(), usize::try_from(rows).expect("small"));
    let want = reference(&plan, tmp.path(), steps);
    let journal = tmp.path().join("journal");
    let log = tmp.path().join("rewound.jsonl");
    let (mut disp, addr) =
        dispatcher_with(&plan, &journal, "127.0.0.1:0", &["--lease-ms", "600000"]);
    let window = ["--capacity", "4"];
    let mut cons = consumer(
        &addr,
        &log,
        &[&window[..], &["--step-time", "1ms"]].concat(),
    );
    let mut workers: Vec<Proc> = (0..2).map(|i| worker(&addr, &format!("w{i}"))).collect();
    wait_for_lines(&log, 300, Duration::from_secs(120));
    kill(&mut cons);
    let resume = watermark(&addr) + 1 - 50;
    keep_log_lines(&log, resume);
    let resume = resume.to_string();
    let mut cons = consumer(
        &addr,
        &log,
        &[&window[..], &["--rewind-to", &resume]].concat(),
    );
    wait_ok(&mut cons, Duration::from_secs(180), "the rewound consumer");
    for mut w in workers.drain(..) {
        kill(&mut w);
    }
    kill(&mut disp);
    assert_exactly_once(&lines(&log), &want, rows);
}

/// Issue 17: `lode consume --steps N` on a job that would run for 50 epochs ends the job there,
/// and the dispatcher and every worker exit by themselves (status 0, the workers at end of
/// data); with `--leave-open` the job stays open for the next consumer.
#[test]
fn consume_steps_ends_the_job_and_every_process_exits_with_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = big_sgd(tmp.path(), 3_200); // 100 steps an epoch
    let (mut disp, addr) = dispatcher_with(
        &plan,
        &tmp.path().join("journal"),
        "127.0.0.1:0",
        &["--epochs", "50"],
    );
    let mut workers: Vec<Proc> = (0..2).map(|i| worker(&addr, &format!("w{i}"))).collect();
    let log = tmp.path().join("log.jsonl");

    // A consumer that leaves the job open: the job goes on (the watermark moves, no end).
    let mut open = consumer(&addr, &log, &["--steps", "30", "--leave-open"]);
    wait_ok(&mut open, Duration::from_secs(60), "the first consumer");
    let status: Value = serde_json::from_str(&ok(&lode(&[
        "status", &addr, "--token", TOKEN, "--format", "json",
    ])))
    .expect("status JSON");
    assert_eq!(status["end_of_data"], Value::Bool(false), "{status}");
    assert_eq!(status["watermark"]["step"].as_u64(), Some(29), "{status}");

    // The next consumer takes 120 more steps (into the second epoch) and ends the job.
    let mut last = consumer(&addr, &log, &["--steps", "120"]);
    wait_ok(&mut last, Duration::from_secs(60), "the last consumer");
    wait_ok(&mut disp, Duration::from_secs(30), "the dispatcher");
    for (i, w) in workers.iter_mut().enumerate() {
        let start = Instant::now();
        let end = loop {
            if let Some(end) = ending(w) {
                break end;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "worker {i} did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(end.contains("EndOfData"), "worker {i}: {end}");
    }
    let steps: Vec<u64> = lines(&log)
        .iter()
        .map(|l| l["step"].as_u64().expect("step"))
        .collect();
    assert_eq!(steps, (0..150).collect::<Vec<u64>>());
}

#[test]
fn lode_run_runs_the_bundled_example() {
    let out = ok(&lode(&[
        "run",
        fixtures()
            .join("wide_deep/model.pb")
            .to_str()
            .expect("UTF-8"),
        "--workers",
        "2",
        "--steps",
        "20",
    ]));
    assert!(out.contains("consumed: 20 steps, 640 samples"), "{out}");
    // What it did, in a few lines: the cut, the workers, and the log held to the order.
    assert!(
        out.contains("cut: 252 of the graph's 1225 nodes move to the data workers; 1 stage(s)"),
        "{out}"
    );
    assert!(
        out.contains("workers: 2 started, 2 still serving at the end"),
        "{out}"
    );
    assert!(
        out.contains("delivery: every step once and in order with the records of TensorFlow's order, no record twice in an epoch: 640 records, 2 whole epoch(s) of 256 records, 128 records of epoch 2"),
        "{out}"
    );
}

/// A plan of three stages needs a worker for each: fewer is refused before anything starts
/// (it used to wait forever), and without `--workers` each stage gets one.
#[test]
fn lode_run_starts_a_worker_for_every_stage_and_refuses_fewer() {
    let deepfm = fixtures().join("deepfm/model.pb");
    let deepfm = deepfm.to_str().expect("UTF-8");
    let refused = lode(&["run", deepfm, "--workers", "2", "--steps", "5"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("the plan has 3 data-worker stages and every stage needs a worker: give --workers 3 or more (got 2)"),
        "{}",
        stderr(&refused)
    );
    let out = ok(&lode(&["run", deepfm, "--steps", "5"]));
    assert!(out.contains("workers: 3 started"), "{out}");
    assert!(out.contains("consumed: 5 steps, 160 samples"), "{out}");
    assert!(
        out.contains("delivery: every step once and in order"),
        "{out}"
    );
}

/// `--journal` keeps the dispatcher's journal where the user says (and a second run of the
/// same plan resumes from it: the first run consumed 20 steps, so the next begins at step 20);
/// `-q` silences the report of work done.
#[test]
fn lode_run_keeps_its_journal_where_asked_and_q_is_quiet() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = tmp.path().join("plan");
    let model = fixtures().join("wide_deep/model.pb");
    let quiet = lode(&[
        "partition",
        model.to_str().expect("UTF-8"),
        "-o",
        plan.to_str().expect("UTF-8"),
        "-q",
    ]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(
        quiet.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stdout)
    );
    assert!(plan.join("plan.json").is_file());
    let journal = tmp.path().join("journal");
    let run = |log: &str| {
        let log = tmp.path().join(log);
        let out = ok(&lode(&[
            "run",
            plan.to_str().expect("UTF-8"),
            "--steps",
            "20",
            "--journal",
            journal.to_str().expect("UTF-8"),
            "--log",
            log.to_str().expect("UTF-8"),
        ]));
        assert!(
            out.contains(&format!("journal {}", journal.display())),
            "{out}"
        );
        let first: Value = serde_json::from_str(
            std::fs::read_to_string(&log)
                .expect("log")
                .lines()
                .next()
                .expect("a line"),
        )
        .expect("JSON");
        first["step"].as_u64().expect("step")
    };
    assert_eq!(run("a.jsonl"), 0);
    assert!(std::fs::read_dir(&journal).expect("journal dir").count() > 0);
    assert_eq!(
        run("b.jsonl"),
        20,
        "the second run resumes from the journal"
    );
}

#[test]
fn synthetic_plans_run_through_the_runtime_exactly_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = tmp.path().join("plan");
    let p = plan.to_str().expect("UTF-8");
    let out = ok(&lode(&[
        "synthetic",
        "-o",
        p,
        "--latency",
        "5ms",
        "--records",
        "803",
        "--batch",
        "8",
    ]));
    assert!(out.contains("100 steps per epoch"), "{out}");
    let run = |workers: &str, name: &str| {
        let log = tmp.path().join(name);
        let out = ok(&lode(&[
            "run",
            p,
            "--workers",
            workers,
            "--steps",
            "100",
            "--log",
            log.to_str().expect("UTF-8"),
        ]));
        assert!(out.contains("100 steps, 800 samples"), "{out}");
        lines(&log)
    };
    let one = run("1", "one.jsonl");
    let three = run("3", "three.jsonl");
    // The partial last batch (3 records) is dropped; every other record once, in order, and
    // the same tensors whichever worker computed them.
    assert_exactly_once(&three, &one, 800);

    // The plan directory is not written over.
    let again = lode(&["synthetic", "-o", p]);
    assert_eq!(again.status.code(), Some(2));
    let err = crate::support::stderr(&again);
    assert!(err.contains("refusing"), "{err}");
    assert!(plan.join("plan.json").is_file());
    let bad = lode(&[
        "synthetic",
        "-o",
        tmp.path().join("b").to_str().expect("UTF-8"),
        "--batch",
        "0",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(crate::support::stderr(&bad).contains("batch is 0"));
}

/// A job of 12,500 steps of 2 ms each (synthetic plan in `dir`), its dispatcher running:
/// the consumer log's path, the dispatcher and its address.
fn long_job(dir: &Path) -> (PathBuf, Proc, String) {
    let plan = dir.join("plan");
    ok(&lode(&[
        "synthetic",
        "-o",
        plan.to_str().expect("UTF-8"),
        "--latency",
        "2ms",
        "--records",
        "100000",
        "--batch",
        "8",
    ]));
    let (d, addr) = dispatcher(&plan, &dir.join("journal"), "127.0.0.1:0");
    (dir.join("log.jsonl"), d, addr)
}

#[test]
fn a_worker_whose_job_is_gone_exits_on_its_own() {
    // Dispatcher and consumer killed mid-run: the worker retries for its 30 s window, then
    // exits with an error instead of waiting for a receiver forever.
    let tmp = tempfile::tempdir().expect("tmp");
    let (log, mut d, addr) = long_job(tmp.path());
    let mut c = consumer(&addr, &log, &[]);
    let mut w = Proc(
        bin()
            .args(["worker", "--dispatcher", &addr, "--token", TOKEN, "-q"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a worker"),
    );
    wait_for_lines(&log, 20, Duration::from_secs(60));
    kill(&mut d);
    kill(&mut c);
    let gone = Instant::now();
    let status = loop {
        if let Some(status) = w.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            gone.elapsed() < Duration::from_secs(60),
            "the worker still runs 60 s after its job is gone"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut w.0.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    // Which request notices first varies (a lease, a push, a receiver connection); each
    // names what failed. The consumer's port is free once it is killed, and another test's
    // receiver may take it: the worker then meets a receiver that refuses its token (another
    // job's), which is final too.
    assert!(
        err.contains("lode: error:")
            && [
                "Unavailable",
                "unreachable",
                "the job is gone",
                "refused the connection: wrong token for this job",
            ]
            .iter()
            .any(|m| err.contains(m)),
        "{err}"
    );
}

#[test]
fn a_job_over_tls_delivers_every_record_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = tmp.path().join("plan");
    let p = plan.to_str().expect("UTF-8");
    ok(&lode(&[
        "synthetic",
        "-o",
        p,
        "--latency",
        "2ms",
        "--records",
        "803",
        "--batch",
        "8",
    ]));
    let (cert, key, ca) = (
        tls_file("server.crt"),
        tls_file("server.key"),
        tls_file("ca.crt"),
    );
    let server_tls = ["--tls-cert", &cert, "--tls-key", &key];
    let client_tls = ["--tls-ca", ca.as_str()];
    let run = |name: &str, tls: &[&str]| {
        let log = tmp.path().join(name);
        let mut args = vec![
            "run",
            p,
            "--workers",
            "2",
            "--steps",
            "100",
            "--log",
            log.to_str().expect("UTF-8"),
        ];
        args.extend_from_slice(tls);
        let out = ok(&lode(&args));
        assert!(out.contains("100 steps, 800 samples"), "{out}");
        lines(&log)
    };
    let plaintext = run("plain.jsonl", &[]);
    // `lode run` with TLS: dispatcher and receiver serve TLS, the workers it starts trust the CA.
    let all_tls = [server_tls.as_slice(), client_tls.as_slice()].concat();
    assert_exactly_once(&run("run-tls.jsonl", &all_tls), &plaintext, 800);

    // The same job as separate processes, every connection TLS: the dispatcher, a consumer
    // whose receiver serves TLS on every interface, registered as https://localhost:PORT
    // (--advertise; the workers check the certificate against that name), and two workers.
    // It keeps serving after the job, for the status and the refused consumer below.
    let (mut disp, addr) = dispatcher_with(
        &plan,
        &tmp.path().join("journal"),
        "127.0.0.1:0",
        &[server_tls.as_slice(), &["--keep-serving"]].concat(),
    );
    assert!(addr.starts_with("https://127.0.0.1:"), "{addr}");
    let log = tmp.path().join("processes.jsonl");
    let everywhere = ["--listen", "0.0.0.0:0", "--advertise", "localhost"];
    let mut cons = consumer(&addr, &log, &[all_tls.as_slice(), &everywhere].concat());
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| worker_with(&addr, &format!("w{i}"), &client_tls))
        .collect();
    wait_ok(&mut cons, Duration::from_secs(120), "the TLS consumer");
    let status = ok(&lode(&[
        "status", &addr, "--token", TOKEN, "--format", "json", "--tls-ca", &ca,
    ]));
    let status: Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(status["end_of_data"], true, "{status}");

    // A receiver on every interface without --advertise would be registered at an address
    // workers cannot dial: refused, status 2.
    let never = tmp.path().join("never.jsonl");
    let unreachable = lode(&[
        "consume",
        "--dispatcher",
        &addr,
        "--token",
        TOKEN,
        "--tls-ca",
        &ca,
        "--log",
        never.to_str().expect("UTF-8"),
        "--listen",
        "0.0.0.0:0",
    ]);
    assert_eq!(unreachable.status.code(), Some(2));
    assert!(
        stderr(&unreachable).contains("--advertise"),
        "{}",
        stderr(&unreachable)
    );

    // Without the CA, or with a file that holds none, a client stops with status 2 and says
    // why.
    let no_ca = lode(&["status", &addr, "--token", TOKEN]);
    assert_eq!(no_ca.status.code(), Some(2));
    assert!(stderr(&no_ca).contains("--tls-ca"), "{}", stderr(&no_ca));
    // An http:// address for the TLS dispatcher: told what to dial instead.
    let plain_addr = addr.replacen("https://", "http://", 1);
    let plain = lode(&["status", &plain_addr, "--token", TOKEN]);
    assert_eq!(plain.status.code(), Some(2));
    assert!(
        stderr(&plain).contains("TLS only") && stderr(&plain).contains(&addr),
        "{}",
        stderr(&plain)
    );
    let not_a_ca = lode(&["status", &addr, "--token", TOKEN, "--tls-ca", &key]);
    assert_eq!(not_a_ca.status.code(), Some(2));
    assert!(
        stderr(&not_a_ca).contains(&key) && stderr(&not_a_ca).contains("no certificate"),
        "{}",
        stderr(&not_a_ca)
    );
    for mut w in workers.drain(..) {
        kill(&mut w);
    }
    kill(&mut disp);
    assert_exactly_once(&lines(&log), &plaintext, 800);
}

/// Sends SIGTERM and waits (bounded) for the process to exit; its status.
#[cfg(unix)]
fn terminate(p: &mut Proc, limit: Duration) -> std::process::ExitStatus {
    let pid = p.0.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {pid}");
    let start = Instant::now();
    loop {
        if let Some(status) = p.0.try_wait().expect("wait") {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM (what a process manager or Kubernetes sends) stops a consumer, a worker and a
/// dispatcher as SIGINT does: each ends cleanly, and what the consumer logged stays exactly
/// once (a fresh consumer continues after it without a gap or a repeat).
#[cfg(unix)]
#[test]
fn sigterm_stops_every_long_running_command_cleanly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (log, mut d, addr) = long_job(tmp.path());
    let mut c = consumer(&addr, &log, &[]);
    let mut w = worker(&addr, "w0");
    wait_for_lines(&log, 20, Duration::from_secs(60));
    let limit = Duration::from_secs(20);
    assert!(terminate(&mut c, limit).success(), "the consumer");
    let logged = lines(&log);
    let mut c2 = consumer(&addr, &log, &[]);
    wait_for_lines(&log, logged.len() + 10, Duration::from_secs(60));
    // The worker drains (what it holds is delivered to the live consumer), then the rest.
    assert!(terminate(&mut w, limit).success(), "the worker");
    assert!(terminate(&mut c2, limit).success(), "the second consumer");
    let steps: Vec<u64> = lines(&log)
        .iter()
        .map(|l| l["step"].as_u64().expect("step"))
        .collect();
    let expected: Vec<u64> = (0..u64::try_from(steps.len()).expect("len")).collect();
    assert_eq!(
        steps, expected,
        "every step once, in order, across the SIGTERM"
    );
    assert!(terminate(&mut d, limit).success(), "the dispatcher");
}

#[test]
fn a_worker_paused_until_declared_lost_registers_again_and_nothing_is_lost_or_repeated() {
    // A stopped process (SIGSTOP: as a long pause, an overloaded host or a partition would)
    // misses its heartbeats; the dispatcher declares it lost and leases its steps again. When
    // it goes on, it learns that the dispatcher no longer knows it, registers again and
    // finishes the job, instead of failing.
    let tmp = tempfile::tempdir().expect("tempdir");
    let rows = 64_000;
    let steps = rows / 32;
    let plan = big_sgd(tmp.path(), usize::try_from(rows).expect("small"));
    let want = reference(&plan, tmp.path(), steps);
    let log = tmp.path().join("paused.jsonl");
    let (mut disp, addr) = dispatcher(&plan, &tmp.path().join("journal"), "127.0.0.1:0");
    // Paced (1 ms a step, 2 s for the job) so that the job is still running when the pause
    // ends, however fast the worker is.
    let mut cons = consumer(&addr, &log, &["--step-time", "1ms"]);
    let mut w = worker(&addr, "paused");
    wait_for_lines(&log, 100, Duration::from_secs(120));
    let first = active_workers(&addr);
    assert_eq!(first.len(), 1, "one registered worker");
    signal(&w, "STOP");
    // Declared lost after 5 missed heartbeats (200 ms apart).
    let stopped = Instant::now();
    while !active_workers(&addr).is_empty() {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "the stopped worker was not declared lost"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let at_pause = lines(&log).len();
    assert!(
        at_pause < usize::try_from(steps).expect("small"),
        "the job ended during the pause"
    );
    signal(&w, "CONT");
    wait_ok(&mut cons, Duration::from_secs(240), "the consumer");
    let start = Instant::now();
    let end = loop {
        if w.0.try_wait().expect("wait").is_some() {
            break ending(&mut w).expect("the worker ends successfully");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the worker did not end with its job"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        end.contains("EndOfData") && end.contains("registered again once"),
        "{end}"
    );
    // The new registration is a new worker id.
    assert!(!end.starts_with(&format!("worker {} ", first[0])), "{end}");
    kill(&mut disp);
    assert_exactly_once(&lines(&log), &want, rows);
}

/// The samples of a Prometheus text page at `url` (`http://host:port/metrics`), by name.
fn scrape(url: &str) -> std::collections::HashMap<String, f64> {
    use std::io::{Read as _, Write as _};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = std::net::TcpStream::connect(host).expect("connect to the metrics");
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut page = String::new();
    stream.read_to_string(&mut page).expect("answer");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let body = page.split_once("\r\n\r\n").expect("a body").1;
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name and value");
            let name = name.split('{').next().expect("a name").to_owned();
            (name, value.parse().expect("a number"))
        })
        .collect()
}

/// A worker of the job at `addr` serving its metrics on a free port, and their URL.
fn worker_with_metrics(addr: &str) -> (Proc, String) {
    let mut w = Proc(
        bin()
            .args(["worker", "--dispatcher", addr, "--token", TOKEN])
            .args(["--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker"),
    );
    let mut line = String::new();
    BufReader::new(w.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the worker prints its metrics address");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no metrics address in {line:?}"))
        .to_owned();
    (w, url)
}

/// Issue 17: the receiver's window is bounded in steps and in bytes, and the consumer's reports
/// say it as it learns its steps' size: on small steps it grows from 64 to `--capacity`
/// (1024 by default), and a lone worker's lease limit follows it; with `--capacity-bytes 1`
/// it shrinks to its least, 8.
#[test]
fn a_workers_lease_limit_follows_the_receivers_window_in_steps_and_bytes() {
    for (extra, want) in [(&[][..], 1024.0), (&["--capacity-bytes", "1"][..], 8.0)] {
        let tmp = tempfile::tempdir().expect("tmp");
        let (log, mut d, addr) = long_job(tmp.path());
        let mut c = consumer(&addr, &log, extra);
        let (mut w, url) = worker_with_metrics(&addr);
        wait_for_lines(&log, 20, Duration::from_secs(60));
        // The limit is read at each lease request, which follows the consumer's next report.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let limit = scrape(&url).get("lode_worker_lease_limit").copied();
            seen.push(limit);
            if limit == Some(want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{extra:?}: the lease limit never became {want}: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        kill(&mut w);
        kill(&mut c);
        kill(&mut d);
    }
}

#[test]
fn a_worker_serves_its_counters_and_the_stages_time_while_it_runs() {
    // Steps of 2 ms each: the stage's time per step must show them, and every step the
    // consumer logged was computed and sent by this one worker.
    let tmp = tempfile::tempdir().expect("tmp");
    let (log, mut d, addr) = long_job(tmp.path());
    let mut c = consumer(&addr, &log, &[]);
    let (mut w, url) = worker_with_metrics(&addr);
    wait_for_lines(&log, 40, Duration::from_secs(60));
    // Read before the scrape: every step logged by then was sent before it.
    let logged = lines(&log).len() as f64;
    let first = scrape(&url);
    let get = |m: &std::collections::HashMap<String, f64>, name: &str| {
        *m.get(name).unwrap_or_else(|| panic!("no {name} in {m:?}"))
    };
    assert_eq!(get(&first, "lode_worker_registrations_total"), 1.0);
    let computed = get(&first, "lode_worker_steps_computed_total");
    assert!(computed >= 40.0, "{first:?}");
    assert!(
        get(&first, "lode_worker_frames_sent_total") >= 40.0,
        "{first:?}"
    );
    assert!(
        get(&first, "lode_worker_bursts_sent_total") >= 1.0,
        "{first:?}"
    );
    assert!(
        get(&first, "lode_worker_sent_bytes_total") > 0.0,
        "{first:?}"
    );
    assert!(
        get(&first, "lode_worker_lease_requests_total") >= 1.0,
        "{first:?}"
    );
    assert!(get(&first, "lode_worker_lease_batch") >= 1.0, "{first:?}");
    // Steps are reported only once delivered; the consumer logged only what was sent.
    let reported = get(&first, "lode_worker_steps_reported_total");
    assert!(reported <= computed, "{first:?}");
    assert!(
        logged <= get(&first, "lode_worker_frames_sent_total"),
        "{first:?}"
    );
    let per_step = get(&first, "lode_worker_compute_seconds_total") / computed;
    assert!(
        (0.0019..0.5).contains(&per_step),
        "{per_step} s per 2 ms step"
    );
    assert!(
        get(&first, "lode_worker_step_seconds") >= 0.0019,
        "{first:?}"
    );
    // Freeing the answered steps' tensors is timed apart from the stage: some time, and
    // far less than the stage's 2 ms a step.
    let release = get(&first, "lode_worker_release_seconds_total");
    assert!(release > 0.0 && release / computed < 0.001, "{first:?}");
    if cfg!(target_os = "linux") {
        assert!(get(&first, "process_cpu_seconds_total") > 0.0, "{first:?}");
    }
    wait_for_lines(&log, lines(&log).len() + 20, Duration::from_secs(60));
    let second = scrape(&url);
    for name in first.keys().filter(|n| n.ends_with("_total")) {
        assert!(get(&second, name) >= get(&first, name), "{name} went back");
    }
    assert!(get(&second, "lode_worker_steps_computed_total") > computed);
    kill(&mut w);
    kill(&mut c);
    kill(&mut d);
}
