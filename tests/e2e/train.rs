//! `lode train` without TensorFlow: what it checks before and around the program. Training a
//! real program (bit-identical losses, kills, restarts) is judged against TensorFlow by
//! tests/conformance/train_equivalence.py.

use crate::support::{lode, stderr};

/// `lode train --workers 0 --listen 0.0.0.0:0 -- true` with LODE_TOKEN set to `token`.
fn train_in_a_pod(token: &str) -> std::process::Output {
    let args = [
        "train",
        "--workers",
        "0",
        "--listen",
        "0.0.0.0:0",
        "--",
        "true",
    ];
    std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(args)
        .env("LODE_TOKEN", token)
        .output()
        .unwrap_or_else(|e| panic!("cannot run lode: {e}"))
}

#[test]
fn the_program_runs_with_the_hook_on_its_path_and_its_status_is_passed_on() {
    // `sh -c` stands in for the program: it sees the sitecustomize directory and the socket,
    // and its exit status becomes lode train's.
    let out = lode(&[
        "train",
        "--workers",
        "1",
        "--",
        "sh",
        "-c",
        "test -f \"${PYTHONPATH%%:*}/sitecustomize.py\" && test -S \"$LODE_TRAIN_SOCKET\" && exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let ok = lode(&["train", "--", "true"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
}

#[test]
fn settings_that_cannot_work_are_refused_with_status_2() {
    for (args, why) in [
        (vec!["train", "--workers", "0", "--", "true"], "--announce"),
        (
            vec!["train", "--tls-ca", "ca.crt", "--", "true"],
            "--tls-cert, --tls-key and --tls-ca together",
        ),
        (vec!["train", "--", "/nonexistent/program"], "cannot start"),
    ] {
        let out = lode(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
    }
    let missing = lode(&["train"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
}

#[test]
fn a_pod_token_is_taken_from_lode_token_and_never_shown() {
    // A token that cannot travel in a request header is refused without being shown.
    let bad = "s3cret value";
    let out = train_in_a_pod(bad);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("LODE_TOKEN"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(bad), "{}", stderr(&out));
    // A good one: the program runs (without a graph, lode train only passes its status on)
    // and the token appears nowhere in what lode train says.
    let good = "feedfacefeedface0123456789abcdef";
    let out = train_in_a_pod(good);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!said.contains(good), "{said}");
    // --workers 0 with a loopback --listen and no --announce: no worker could find the job.
    let out = lode(&[
        "train",
        "--workers",
        "0",
        "--listen",
        "127.0.0.1:0",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("other machines reach"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn strict_fails_a_program_that_ends_without_lode_serving_a_pipeline() {
    // `true` never asks the hook: without --strict it ran unchanged (status 0); with it,
    // lode train says that nothing was served and exits 2. A failing program keeps its own
    // status.
    let out = lode(&["train", "--strict", "--workers", "1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("without Lode serving an input pipeline"),
        "{}",
        stderr(&out)
    );
    let failed = lode(&[
        "train",
        "--strict",
        "--workers",
        "1",
        "--",
        "sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(failed.status.code(), Some(5), "{}", stderr(&failed));
}

/// Runs `lode train --workers 1 --journal JOURNAL` over a program (`sh`) that hands its hook
/// socket to `asks` through a FIFO and exits when `asks` is done (a line on a second FIFO):
/// the test speaks the hook's protocol in the program's place. Returns lode train's output and
/// what `asks` returned.
fn with_hook_socket<T>(
    journal: &std::path::Path,
    asks: impl FnOnce(&std::path::Path) -> T,
) -> (std::process::Output, T) {
    use std::io::{BufRead as _, Write as _};
    let fifos = tempfile::tempdir().expect("tempdir");
    let (socket_fifo, done_fifo) = (fifos.path().join("socket"), fifos.path().join("done"));
    for fifo in [&socket_fifo, &done_fifo] {
        let made = std::process::Command::new("mkfifo").arg(fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    }
    let program = "echo \"$LODE_TRAIN_SOCKET\" > \"$1\"; read line < \"$2\"";
    let train = std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["train", "--workers", "1", "--journal"])
        .arg(journal)
        .args(["--", "sh", "-c", program, "sh"])
        .args([&socket_fifo, &done_fifo])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lode train starts");
    let mut socket = String::new();
    let fifo = std::fs::File::open(&socket_fifo).expect("the program opens its FIFO");
    std::io::BufReader::new(fifo)
        .read_line(&mut socket)
        .expect("the program names its socket");
    let answers = asks(std::path::Path::new(socket.trim_end()));
    let mut done = std::fs::OpenOptions::new()
        .write(true)
        .open(&done_fifo)
        .expect("the program waits on its FIFO");
    writeln!(done, "done").expect("the program reads its FIFO");
    drop(done);
    (train.wait_with_output().expect("lode train ends"), answers)
}

/// One request on the hook's socket, as the training-side package sends it, and its reply.
fn ask(socket: &std::path::Path, model: &std::path::Path, kind: &str) -> serde_json::Value {
    use std::io::{BufRead as _, Write as _};
    let request = serde_json::json!({
        "graph": model.join("model.pb"),
        "cwd": model,
        "kind": kind,
    });
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    writeln!(stream, "{request}").expect("send");
    let mut reply = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut reply)
        .expect("reply");
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}"))
}

#[test]
fn each_dataset_of_a_program_is_a_job_with_its_own_directory_and_a_restart_meets_them_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let journal = tmp.path().join("job");
    let (wide, sgd) = (
        crate::support::fixtures().join("wide_deep"),
        crate::support::fixtures().join("sgd_ref"),
    );
    let three = |socket: &std::path::Path| {
        [
            ask(socket, &wide, "dataset"),
            ask(socket, &sgd, "dataset"),
            ask(socket, &wide, "session"),
        ]
    };
    let (out, [first, second, session]) = with_hook_socket(&journal, three);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (reply, k) in [(&first, 1), (&second, 2)] {
        assert_eq!(reply["ok"].as_bool(), Some(true), "{reply}");
        assert_eq!(reply["job"]["job"].as_u64(), Some(k), "{reply}");
    }
    assert_ne!(first["job"]["dispatcher"], second["job"]["dispatcher"]);
    // A TF1 session's graph after the datasets runs unchanged (one kind of job per program).
    assert_eq!(session["ok"].as_bool(), Some(false), "{session}");
    assert!(
        session["reason"]
            .as_str()
            .is_some_and(|r| r.contains("TF1 session")),
        "{session}"
    );
    // Job 1 keeps the job directory's layout; job 2 has the same in job-2/.
    for dir in [journal.clone(), journal.join("job-2")] {
        for entry in [
            "plan/plan.json",
            "plan/training.pb",
            "graph.json",
            "journal",
        ] {
            assert!(dir.join(entry).exists(), "{}/{entry}", dir.display());
        }
    }
    assert!(
        second["training"]
            .as_str()
            .is_some_and(|t| t.contains("job-2")),
        "{second}"
    );
    // The program restarted meets the same graphs in the same order: both jobs resume.
    let two =
        |socket: &std::path::Path| [ask(socket, &wide, "dataset"), ask(socket, &sgd, "dataset")];
    let (out, again) = with_hook_socket(&journal, two);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        again.iter().all(|r| r["ok"].as_bool() == Some(true)),
        "{again:?}"
    );
    // In another order, job 1's directory refuses the other graph's journal: fatal.
    let (_, [swapped]) = with_hook_socket(&journal, |socket| [ask(socket, &sgd, "dataset")]);
    assert_eq!(swapped["fatal"].as_bool(), Some(true), "{swapped}");
    assert!(
        swapped["reason"]
            .as_str()
            .is_some_and(|r| r.contains("another graph")),
        "{swapped}"
    );
}
