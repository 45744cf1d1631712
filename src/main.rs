//! `lode`: parse the command line, start logging, run, and map the outcome to an exit status.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use lode::cli::Cli;
use tracing_subscriber::EnvFilter;

/// The data worker's kernels allocate many small tensors per step; mimalloc serves them
/// about a third faster than glibc's allocator (measured with `lode exec`, see README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("LODE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let stdout = std::io::stdout();
    let mut out: Box<dyn std::io::Write> = if cli.quiet && lode::reports_work(&cli.command) {
        // -q: only errors, on stderr; a command's answer (inspect, status, …) still prints.
        Box::new(std::io::sink())
    } else {
        Box::new(stdout.lock())
    };
    match lode::run(cli.command, &mut out).and_then(|()| Ok(out.flush()?)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<lode::train::ProgramExit>().is_some() => {
            // `lode train` passes the program's own status on, without a message of its own.
            let code = err
                .downcast_ref::<lode::train::ProgramExit>()
                .map_or(2, |e| e.0);
            ExitCode::from(u8::try_from(code).unwrap_or(2))
        }
        Err(err) if err.downcast_ref::<lode::NegativeAnswer>().is_some() => {
            eprintln!("lode: {err}");
            ExitCode::from(1)
        }
        Err(err) => {
            let chain: Vec<String> = err.chain().map(ToString::to_string).collect();
            eprintln!("lode: error: {}", dedup_chain(&chain));
            ExitCode::from(2)
        }
    }
}

/// Joins an error chain into one line, skipping causes already spelled out by their parent.
fn dedup_chain(chain: &[String]) -> String {
    let mut line = String::new();
    for cause in chain {
        if line.contains(cause.as_str()) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(cause);
    }
    line
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
