//! The receiver's Prometheus exposition (served by `lode_proto::metrics::serve_metrics`).

use lode_proto::metrics::{count_sample as count, write_metric};

use crate::ReceiverMetrics;

/// The receiver's queue state.
pub fn render_prometheus(job: u64, m: &ReceiverMetrics) -> String {
    let mut out = String::new();
    let rows: [(&str, &str, &str, f64); 15] = [
        (
            "lode_receiver_next_step",
            "gauge",
            "The next step to deliver.",
            count(m.next_step),
        ),
        (
            "lode_receiver_depth",
            "gauge",
            "Steps buffered, partial or complete.",
            count(m.depth),
        ),
        (
            "lode_receiver_ready",
            "gauge",
            "Complete steps buffered.",
            count(m.ready),
        ),
        (
            "lode_receiver_capacity",
            "gauge",
            "Steps the buffer may hold ahead, at most.",
            count(m.capacity),
        ),
        (
            "lode_receiver_window",
            "gauge",
            "Steps it accepts ahead now: bounded in steps and in bytes.",
            count(m.window),
        ),
        (
            "lode_receiver_enqueue_rate",
            "gauge",
            "Steps completed per second (rate window).",
            m.enqueue_rate,
        ),
        (
            "lode_receiver_dequeue_rate",
            "gauge",
            "Steps consumed per second (rate window).",
            m.dequeue_rate,
        ),
        (
            "lode_receiver_wait_seconds_mean",
            "gauge",
            "Mean time from completion to consumption.",
            m.mean_wait.as_secs_f64(),
        ),
        (
            "lode_receiver_wait_seconds_max",
            "gauge",
            "Longest time from completion to consumption.",
            m.max_wait.as_secs_f64(),
        ),
        (
            "lode_receiver_delivered_total",
            "counter",
            "Steps delivered.",
            count(m.delivered),
        ),
        (
            "lode_receiver_duplicates_total",
            "counter",
            "Messages dropped as duplicates.",
            count(m.duplicates),
        ),
        (
            "lode_receiver_rejected_total",
            "counter",
            "Messages rejected.",
            count(m.rejected),
        ),
        (
            "lode_receiver_accepted_total",
            "counter",
            "Messages accepted.",
            count(m.accepted),
        ),
        (
            "lode_receiver_too_far_ahead_total",
            "counter",
            "Pushes answered RETRY: too far ahead of the training side's window.",
            count(m.too_far_ahead),
        ),
        (
            "lode_receiver_stale_total",
            "counter",
            "Messages dropped as stale (below the next step).",
            count(m.stale),
        ),
    ];
    for (name, kind, help, value) in rows {
        write_metric(&mut out, name, kind, help, job, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_receiver_metric_is_a_labelled_sample() {
        let receiver =
            crate::SharedReceiver::new(crate::ReceiverConfig::new(3, [0], 0, 8)).expect("receiver");
        let text = render_prometheus(3, &receiver.metrics());
        assert!(
            text.contains("# TYPE lode_receiver_delivered_total counter\nlode_receiver_delivered_total{job=\"3\"} 0\n"),
            "{text}"
        );
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 15);
    }
}
