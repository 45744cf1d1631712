//! Prometheus text endpoints (`GET /metrics`) for the dispatcher and the receiver: a minimal
//! HTTP/1.1 responder (one request per connection, bounded request size), since the exposition
//! format is plain text and pulling in an HTTP framework for it would be heavier than this.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use lode_dataworker::transfer::ReceiverMetrics;
use lode_proto::service::v1::StatusResponse;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The largest request head read before answering.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Serves `render()` at `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve_metrics<F, Fut>(
    listener: TcpListener,
    render: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send,
{
    let render = Arc::new(render);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => a,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut head = vec![0u8; MAX_REQUEST_BYTES];
            let mut used = 0;
            while used < head.len() {
                match stream.read(&mut head[used..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => used += n,
                }
                if head[..used].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let request = String::from_utf8_lossy(&head[..used]);
            let (status, body) = if request.starts_with("GET /metrics ") {
                ("200 OK", render().await)
            } else {
                ("404 Not Found", "only GET /metrics is served\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, job: u64, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{job=\"{job}\"}} {value}");
}

/// The receiver's queue state.
pub fn render_receiver(job: u64, m: &ReceiverMetrics) -> String {
    let mut out = String::new();
    let rows: [(&str, &str, &str, f64); 11] = [
        (
            "lode_receiver_next_step",
            "gauge",
            "The next step to deliver.",
            m.next_step as f64,
        ),
        (
            "lode_receiver_depth",
            "gauge",
            "Steps buffered, partial or complete.",
            m.depth as f64,
        ),
        (
            "lode_receiver_ready",
            "gauge",
            "Complete steps buffered.",
            m.ready as f64,
        ),
        (
            "lode_receiver_capacity",
            "gauge",
            "Steps the buffer may hold ahead.",
            m.capacity as f64,
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
            m.delivered as f64,
        ),
        (
            "lode_receiver_duplicates_total",
            "counter",
            "Messages dropped as duplicates.",
            m.duplicates as f64,
        ),
        (
            "lode_receiver_rejected_total",
            "counter",
            "Messages rejected.",
            m.rejected as f64,
        ),
    ];
    for (name, kind, help, value) in rows {
        metric(&mut out, name, kind, help, job, value);
    }
    out
}

/// The dispatcher's state, from its Status answer.
pub fn render_dispatcher(job: u64, s: &StatusResponse) -> String {
    let mut out = String::new();
    let watermark = s.watermark.map_or(-1.0, |w| {
        (w.epoch * s.steps_per_epoch.max(1) + w.step) as f64
    });
    let draining = s.workers.iter().filter(|w| w.status == 2).count();
    let rows: [(&str, &str, &str, f64); 10] = [
        (
            "lode_dispatcher_epoch",
            "gauge",
            "The current epoch.",
            s.epoch as f64,
        ),
        (
            "lode_dispatcher_watermark_step",
            "gauge",
            "The last consumed global step (-1: none).",
            watermark,
        ),
        (
            "lode_dispatcher_workers",
            "gauge",
            "Registered data workers.",
            s.workers.len() as f64,
        ),
        (
            "lode_dispatcher_workers_draining",
            "gauge",
            "Workers being drained.",
            draining as f64,
        ),
        (
            "lode_dispatcher_leases",
            "gauge",
            "Steps leased now.",
            s.leases.len() as f64,
        ),
        (
            "lode_dispatcher_steps_consumed_total",
            "counter",
            "Steps consumed through the watermark.",
            s.steps_completed as f64,
        ),
        (
            "lode_dispatcher_steps_computed_total",
            "counter",
            "Step completions accepted (every stage) since the dispatcher started.",
            s.steps_computed as f64,
        ),
        (
            "lode_dispatcher_compute_seconds_total",
            "counter",
            "Workers' compute time for those steps.",
            s.compute_us as f64 / 1e6,
        ),
        (
            "lode_dispatcher_consumer_busy_seconds_total",
            "counter",
            "Time the training side reported training (not waiting for data).",
            s.consumer_busy_us as f64 / 1e6,
        ),
        (
            "lode_dispatcher_end_of_data",
            "gauge",
            "1 once every step was consumed.",
            f64::from(u8::from(s.end_of_data)),
        ),
    ];
    for (name, kind, help, value) in rows {
        metric(&mut out, name, kind, help, job, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_has_help_type_and_a_labelled_sample() {
        let s = StatusResponse {
            epoch: 2,
            steps_per_epoch: 8,
            steps_completed: 3,
            ..StatusResponse::default()
        };
        let text = render_dispatcher(7, &s);
        assert!(
            text.contains(
                "# TYPE lode_dispatcher_epoch gauge\nlode_dispatcher_epoch{job=\"7\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("lode_dispatcher_watermark_step{job=\"7\"} -1\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.split_once(' ').expect("name value");
            assert!(
                name.starts_with("lode_") && name.ends_with("{job=\"7\"}"),
                "{line}"
            );
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[tokio::test]
    async fn metrics_are_served_over_http_and_other_paths_are_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_metrics(
            listener,
            || async { "lode_x{job=\"1\"} 1\n".to_owned() },
            async {
                let _ = stopped.await;
            },
        ));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.ends_with("lode_x{job=\"1\"} 1\n"), "{ok}");
        let missing = get("/other").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let _ = stop.send(());
        server.await.expect("joined");
    }
}
