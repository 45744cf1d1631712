//! The calling thread's CPU clock: what a piece of work cost in CPU, whatever else ran on the
//! machine meanwhile (the wall clock counts the waits for a CPU too).

use std::time::Duration;

/// The calling thread's CPU time so far (a system call; the wall clock is not one).
pub fn thread_cpu() -> Duration {
    lode_proto::cpu::thread_cpu().unwrap_or_default()
}

/// What a pair of [`thread_cpu`] reads counts by itself (the way out of the first system
/// call and into the second): the least of a few pairs back to back, measured once.
pub fn thread_clock_cost() -> Duration {
    static COST: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *COST.get_or_init(|| {
        (0..16)
            .map(|_| {
                let before = thread_cpu();
                thread_cpu().saturating_sub(before)
            })
            .min()
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_clock_counts_work_and_not_sleep() {
        let before = thread_cpu();
        std::thread::sleep(Duration::from_millis(20));
        let slept = thread_cpu().saturating_sub(before);
        assert!(slept < Duration::from_millis(5), "asleep, yet {slept:?}");
        let before = thread_cpu();
        let mut x = 0u64;
        while thread_cpu().saturating_sub(before) < Duration::from_millis(5) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(x > 0);
    }
}
