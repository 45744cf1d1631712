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
