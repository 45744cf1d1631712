//! `lode train` without TensorFlow: what it checks before and around the program. Training a
//! real program (bit-identical losses, kills, restarts) is judged against TensorFlow by
//! tests/conformance/train_equivalence.py.

use crate::support::{lode, stderr};

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
