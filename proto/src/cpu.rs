//! The CPU clocks of this process and of the calling thread: what the worker's stage, `lode
//! exec` and the metrics count CPU time with. Plain code over rustix, with no service
//! dependency, so that the synchronous crates can read it too.

use std::time::Duration;

/// This process's CPU time so far (user and system, every thread), from its CPU clock: to the
/// nanosecond, where `/proc/self/stat` counts 10 ms ticks (a 2-second window read from ticks
/// is off by up to 1%). None where the clock cannot be read as a duration.
pub fn process_cpu() -> Option<Duration> {
    cpu_clock(rustix::time::ClockId::ProcessCPUTime)
}

/// The calling thread's CPU time so far, from its CPU clock (a system call; the wall clock is
/// not one). None where the clock cannot be read as a duration.
pub fn thread_cpu() -> Option<Duration> {
    cpu_clock(rustix::time::ClockId::ThreadCPUTime)
}

fn cpu_clock(id: rustix::time::ClockId) -> Option<Duration> {
    let t = rustix::time::clock_gettime(id);
    Some(Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_cpu_clock_counts_this_threads_work_finer_than_a_tick() {
        let thread_now = || thread_cpu().expect("the thread CPU clock");
        let before = process_cpu().expect("the process CPU clock");
        let thread_before = thread_now();
        let spent = || thread_now().saturating_sub(thread_before);
        let mut x = 0u64;
        while spent() < Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = process_cpu().expect("the process CPU clock");
        // This thread's 3 ms are in it (other threads of the test process may add more).
        assert!(
            after.saturating_sub(before) >= Duration::from_millis(3),
            "{before:?} -> {after:?}"
        );
        // Finer than /proc's 10 ms ticks: two reads apart by a little work differ by less.
        let (mut a, mut b) = (after, after);
        for _ in 0..1000 {
            a = process_cpu().expect("clock");
            b = process_cpu().expect("clock");
            if b > a {
                break;
            }
        }
        assert!(b > a && b - a < Duration::from_millis(1), "{a:?} -> {b:?}");
    }
}
