//! What every long-running Lode process shares: the stop request (SIGINT, or SIGTERM on
//! Unix) as a future for async services and as a flag for synchronous loops, and fresh job
//! tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Resolves on SIGINT, or SIGTERM on Unix: the shutdown argument of every service's `serve`.
pub async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A flag that SIGINT or SIGTERM sets, watched by a thread of its own (for loops that do not
/// run on tokio, e.g. the training side's consumer).
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let set = flag.clone();
    std::thread::Builder::new()
        .name("lode-signals".into())
        .spawn(move || {
            rt.block_on(stop_requested());
            set.store(true, Ordering::SeqCst);
        })?;
    Ok(flag)
}

/// A fresh random token (32 hex digits) from the OS's randomness, drawn through std's
/// per-process hasher seeds.
pub fn generate_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (generate_token(), generate_token());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}
