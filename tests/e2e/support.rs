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

/// A loopback port that is free now and outside the kernel's ephemeral range, for a test
/// that restarts a server on the same address: a port the kernel hands out (to `bind(0)` or
/// to an outgoing connection of a test running beside it) may be taken while the server is
/// down; one below the range is taken only by an explicit bind.
pub fn restartable_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let floor = 10_000u16.min(low.saturating_sub(1000));
    let span = u32::from(low.saturating_sub(floor)).max(1);
    // Start from a point that differs between test processes, then walk the range.
    let start = (std::process::id().wrapping_mul(7919)) % span;
    (0..span)
        .map(|i| floor + u16::try_from((start + i) % span).expect("below the range"))
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free port below the ephemeral range")
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
