//! Running the binary and finding fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures() -> PathBuf {
    repo().join("fixtures")
}

/// A file of the test-only TLS material in `proto/testdata/tls/`, as an argument.
pub fn tls_file(file: &str) -> String {
    repo()
        .join("proto/testdata/tls")
        .join(file)
        .to_str()
        .expect("UTF-8 test path")
        .to_owned()
}

/// Every fixture directory (those holding a facts.json), sorted.
pub fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures/ exists")
        .map(|e| e.expect("readable fixtures/ entry").path())
        .filter(|p| p.join("facts.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 6, "expected the six fixtures, found {dirs:?}");
    dirs
}

pub fn lode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(args)
        .env_remove("LODE_TAGS")
        .env_remove("LODE_FORMAT")
        .output()
        .expect("the lode binary runs")
}

/// `lode partition MODEL -o DIR EXTRA...`.
pub fn partition_into(model: &Path, dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "partition",
        model.to_str().expect("UTF-8 path"),
        "-o",
        dir.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    lode(&args)
}

pub fn lode_path(args: &[&str], path: &Path) -> Output {
    let path = path.to_str().expect("UTF-8 test path");
    let mut all = args.to_vec();
    all.push(path);
    lode(&all)
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "lode failed with {:?}: {}",
        output.status.code(),
        stderr(output)
    );
    stdout(output)
}
