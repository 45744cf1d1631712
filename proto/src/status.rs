//! A job's status (`StatusResponse`) as people and scripts read it: `lode status`'s text and
//! JSON. The Prometheus form is `metrics::render_dispatcher`.

use std::fmt::Write as _;

use crate::service::v1::{StatusResponse, WorkerStatus};

/// A worker's status as a word.
pub fn worker_status(status: i32) -> &'static str {
    match WorkerStatus::try_from(status) {
        Ok(WorkerStatus::Active) => "active",
        Ok(WorkerStatus::Draining) => "draining",
        _ => "unknown",
    }
}

/// The status as JSON (the keys are `lode status --format json`'s documented output).
pub fn to_json(status: &StatusResponse) -> serde_json::Value {
    let workers: Vec<serde_json::Value> = status
        .workers
        .iter()
        .map(|w| {
            serde_json::json!({
                "id": w.id,
                "name": w.name,
                "stage": w.stage,
                "status": worker_status(w.status),
                "leases": w.leases,
                "last_seen_ms": w.last_seen_ms,
            })
        })
        .collect();
    serde_json::json!({
        "epoch": status.epoch,
        "watermark": status.watermark.map(|w| serde_json::json!({"epoch": w.epoch, "step": w.step})),
        "end_of_data": status.end_of_data,
        "workers": workers,
        "leases": status.leases.len(),
        "steps_consumed": status.steps_consumed,
        "steps_per_epoch": status.steps_per_epoch,
        "epochs": status.epochs,
        "steps_computed": status.steps_computed,
        "compute_us": status.compute_us,
        "consumer_busy_us": status.consumer_busy_us,
        "journal_bytes": status.journal_bytes,
        "journal_compactions": status.journal_compactions,
    })
}

/// The status of job `job` as lines of text.
pub fn to_text(job: u64, status: &StatusResponse) -> String {
    let mut out = String::new();
    let watermark = status.watermark.map_or_else(
        || "none".to_owned(),
        |w| format!("epoch {} step {}", w.epoch, w.step),
    );
    let end = if status.end_of_data {
        ", end of data"
    } else {
        ""
    };
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "job-{job} epoch {}, watermark {watermark}{end}",
        status.epoch
    );
    let _ = writeln!(
        out,
        "steps consumed {}, steps per epoch {}",
        status.steps_consumed, status.steps_per_epoch
    );
    let _ = writeln!(out, "workers {}:", status.workers.len());
    for w in &status.workers {
        let _ = writeln!(
            out,
            "  worker-{} {:?} stage {} {} leases {} last seen {} ms",
            w.id,
            w.name,
            w.stage,
            worker_status(w.status),
            w.leases,
            w.last_seen_ms
        );
    }
    let _ = writeln!(out, "leases {}", status.leases.len());
    let _ = writeln!(
        out,
        "journal {} bytes, {} compaction(s) since the dispatcher started",
        status.journal_bytes, status.journal_compactions
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::v1::{StepRef, WorkerEntry};

    fn status() -> StatusResponse {
        StatusResponse {
            epoch: 2,
            watermark: Some(StepRef { epoch: 1, step: 7 }),
            steps_consumed: 19,
            steps_per_epoch: 12,
            workers: vec![WorkerEntry {
                id: 3,
                name: "w".into(),
                stage: 0,
                status: WorkerStatus::Draining as i32,
                leases: 2,
                last_seen_ms: 40,
                ..WorkerEntry::default()
            }],
            journal_bytes: 4096,
            journal_compactions: 3,
            ..StatusResponse::default()
        }
    }

    #[test]
    fn text_names_the_watermark_and_each_worker() {
        let text = to_text(5, &status());
        assert!(
            text.starts_with("job-5 epoch 2, watermark epoch 1 step 7\n"),
            "{text}"
        );
        assert!(
            text.contains("steps consumed 19, steps per epoch 12"),
            "{text}"
        );
        assert!(
            text.contains("  worker-3 \"w\" stage 0 draining leases 2 last seen 40 ms"),
            "{text}"
        );
        assert!(
            text.contains("journal 4096 bytes, 3 compaction(s) since the dispatcher started"),
            "{text}"
        );
    }

    #[test]
    fn json_keeps_the_documented_keys() {
        let json = to_json(&status());
        assert_eq!(json["watermark"]["step"], 7);
        assert_eq!(json["steps_consumed"], 19);
        assert_eq!(json["journal_bytes"], 4096);
        assert_eq!(json["journal_compactions"], 3);
        assert_eq!(json["workers"][0]["status"], "draining");
        assert_eq!(worker_status(99), "unknown");
    }
}
