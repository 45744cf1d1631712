//! The worker's Prometheus exposition (served by `lode_proto::metrics::serve_metrics`).

use std::sync::atomic::Ordering;

use lode_proto::cpu::process_cpu;
use lode_proto::metrics::{count_sample as count, write_metric};

use crate::worker::WorkerStats;

/// A worker's counters and its process's CPU time (where Linux gives it): the stage's
/// seconds against the process's split what the worker spends into compute and the rest.
pub fn render_worker(job: u64, stats: &WorkerStats) -> String {
    let get = |c: &std::sync::atomic::AtomicU64| count(c.load(Ordering::Relaxed));
    let seconds = |c: &std::sync::atomic::AtomicU64| get(c) / 1e9;
    let mut out = String::new();
    let rows: [(&str, &str, &str, f64); 16] = [
        (
            "lode_worker_registrations_total",
            "counter",
            "Registrations with the dispatcher (more than one after being declared lost).",
            get(&stats.registrations),
        ),
        (
            "lode_worker_steps_computed_total",
            "counter",
            "Steps the stage computed.",
            get(&stats.steps_computed),
        ),
        (
            "lode_worker_compute_seconds_total",
            "counter",
            "The stage's wall time over the steps computed (with any waits for a CPU).",
            seconds(&stats.compute_ns),
        ),
        (
            "lode_worker_stage_cpu_seconds_total",
            "counter",
            "The stage's CPU time (its thread's clock, without waits for a CPU) on the sampled steps.",
            seconds(&stats.stage_cpu_ns),
        ),
        (
            "lode_worker_stage_cpu_steps_total",
            "counter",
            "The steps whose stage is timed by its thread's CPU clock (a sample of the steps computed).",
            get(&stats.stage_cpu_steps),
        ),
        (
            "lode_worker_stage_cpu_wall_seconds_total",
            "counter",
            "The wall time of the steps whose stage is timed by its thread's CPU clock.",
            seconds(&stats.stage_cpu_wall_ns),
        ),
        (
            "lode_worker_release_seconds_total",
            "counter",
            "Time spent freeing each step's tensors once its frame is encoded (lode exec's step frees its tensors too).",
            seconds(&stats.release_ns),
        ),
        (
            "lode_worker_frames_sent_total",
            "counter",
            "Frames written to the receiver.",
            get(&stats.frames_sent),
        ),
        (
            "lode_worker_bursts_sent_total",
            "counter",
            "Vectored writes of frames to the receiver.",
            get(&stats.bursts_sent),
        ),
        (
            "lode_worker_sent_bytes_total",
            "counter",
            "Bytes of the frames written to the receiver.",
            get(&stats.bytes_sent),
        ),
        (
            "lode_worker_lease_requests_total",
            "counter",
            "Lease requests to the dispatcher (each may carry a report).",
            get(&stats.lease_requests),
        ),
        (
            "lode_worker_report_requests_total",
            "counter",
            "Complete requests to the dispatcher (reports sent alone).",
            get(&stats.report_requests),
        ),
        (
            "lode_worker_steps_reported_total",
            "counter",
            "Steps reported delivered to the dispatcher.",
            get(&stats.steps_reported),
        ),
        (
            "lode_worker_step_seconds",
            "gauge",
            "The stage's moving-average step time (0 before the first step).",
            seconds(&stats.step_time_ns),
        ),
        (
            "lode_worker_lease_batch",
            "gauge",
            "The lease batch k at the last request (steps asked for, room permitting).",
            get(&stats.lease_batch),
        ),
        (
            "lode_worker_lease_limit",
            "gauge",
            "The lease limit at the last request (the worker's share of the receiver's window).",
            get(&stats.lease_limit),
        ),
    ];
    for (name, kind, help, value) in rows {
        write_metric(&mut out, name, kind, help, job, value);
    }
    if let Some(cpu) = process_cpu() {
        write_metric(
            &mut out,
            "process_cpu_seconds_total",
            "counter",
            "The worker process's CPU time, user and system, every thread (its CPU clock).",
            job,
            cpu.as_secs_f64(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_counter_is_a_labelled_sample_with_its_value() {
        let stats = WorkerStats::default();
        stats.steps_computed.store(40, Ordering::Relaxed);
        stats.compute_ns.store(2_500_000_000, Ordering::Relaxed);
        stats.release_ns.store(250_000_000, Ordering::Relaxed);
        stats.stage_cpu_ns.store(30_000_000, Ordering::Relaxed);
        stats.stage_cpu_steps.store(3, Ordering::Relaxed);
        stats.stage_cpu_wall_ns.store(40_000_000, Ordering::Relaxed);
        stats.lease_batch.store(32, Ordering::Relaxed);
        stats.lease_limit.store(1024, Ordering::Relaxed);
        let text = render_worker(7, &stats);
        assert!(
            text.contains("# TYPE lode_worker_steps_computed_total counter\nlode_worker_steps_computed_total{job=\"7\"} 40\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_compute_seconds_total{job=\"7\"} 2.5\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_release_seconds_total{job=\"7\"} 0.25\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_stage_cpu_seconds_total{job=\"7\"} 0.03\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_stage_cpu_steps_total{job=\"7\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_stage_cpu_wall_seconds_total{job=\"7\"} 0.04\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_lease_batch{job=\"7\"} 32\n"),
            "{text}"
        );
        assert!(
            text.contains("lode_worker_lease_limit{job=\"7\"} 1024\n"),
            "{text}"
        );
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        let cpu = usize::from(process_cpu().is_some());
        assert_eq!(samples, 16 + cpu, "{text}");
        assert_eq!(text.contains("process_cpu_seconds_total"), cpu == 1);
    }
}
