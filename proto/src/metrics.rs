//! Prometheus text endpoints (`GET /metrics`): an HTTP/1.1 server on hyper with the limits
//! every Lode server has (the one accept loop of [`crate::accept`] with its connection cap, a header timeout, a whole-connection timeout) and a
//! graceful shutdown, and the text format's writer. The dispatcher's exposition
//! ([`render_dispatcher`]) is here because it renders the protocol's `StatusResponse`; the
//! receiver's lives with the receiver.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};

use crate::accept::{accept_loop, Permit};

use crate::service::v1::StatusResponse;

/// Connections served at once; more wait in the listen backlog.
pub const MAX_METRICS_CONNECTIONS: usize = 16;
/// A client that has not sent its request head by then is disconnected.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection lives longer (one request each: keep-alive is off).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// On shutdown, requests in progress get this long to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The exposition format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// Serves `render()` at `GET /metrics` on `listener` until `shutdown` resolves, then drains.
/// Any other path is 404, any other method 405.
pub async fn serve_metrics<F, Fut>(
    listener: TcpListener,
    render: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let render = Arc::new(render);
    let graceful = GracefulShutdown::new();
    let handle = |stream: TcpStream, _peer, permit: Permit| {
        let render = Arc::clone(&render);
        let service = service_fn(move |request: Request<Incoming>| {
            let render = Arc::clone(&render);
            async move { Ok::<_, Infallible>(answer(&request, &*render).await) }
        });
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(false);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        async move {
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            drop(permit);
        }
    };
    accept_loop(listener, MAX_METRICS_CONNECTIONS, shutdown, handle).await;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await;
}

/// Serves job `job`'s dispatcher metrics on `listener`: each scrape reads the job's status
/// from the dispatcher at `url` (a `Status` call with `token`, trusting `ca` for https) and
/// renders it ([`render_dispatcher`]); an unreachable dispatcher gives an empty page.
pub async fn serve_dispatcher_metrics(
    listener: TcpListener,
    job: u64,
    url: String,
    token: String,
    ca: Option<crate::tls::ClientTls>,
    shutdown: impl Future<Output = ()>,
) {
    let render = move || {
        let (token, url, ca) = (token.clone(), url.clone(), ca.clone());
        async move {
            let status = async {
                let mut c = crate::service::connect(&url, &token, ca.as_ref())
                    .await
                    .ok()?;
                let request = crate::service::v1::StatusRequest { job_id: job };
                c.status(request).await.ok()
            };
            status
                .await
                .map_or_else(String::new, |s| render_dispatcher(job, s.get_ref()))
        }
    };
    serve_metrics(listener, render, shutdown).await;
}

async fn answer<F, Fut>(request: &Request<Incoming>, render: &F) -> Response<Full<Bytes>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, render().await),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET /metrics is served\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "only GET /metrics is served\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    response
}

/// A count as a sample value (exact below 2^53, which step counts stay under).
#[allow(clippy::cast_precision_loss)]
pub fn count_sample(n: impl TryInto<u64>) -> f64 {
    n.try_into().map_or(f64::MAX, |n: u64| n as f64)
}

/// One metric in the text format: help, type and a sample labelled with the job.
pub fn write_metric(out: &mut String, name: &str, kind: &str, help: &str, job: u64, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{job=\"{job}\"}} {value}");
}

/// The dispatcher's state, from its Status answer.
pub fn render_dispatcher(job: u64, s: &StatusResponse) -> String {
    let count = |n: u64| count_sample(n);
    let mut out = String::new();
    let watermark = s.watermark.map_or(-1.0, |w| {
        count(
            w.epoch
                .saturating_mul(s.steps_per_epoch.max(1))
                .saturating_add(w.step),
        )
    });
    let len = |n: usize| count(u64::try_from(n).unwrap_or(u64::MAX));
    let draining = s
        .workers
        .iter()
        .filter(|w| w.status == crate::service::v1::WorkerStatus::Draining as i32)
        .count();
    let rows: [(&str, &str, &str, f64); 12] = [
        (
            "lode_dispatcher_epoch",
            "gauge",
            "The current epoch.",
            count(s.epoch),
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
            len(s.workers.len()),
        ),
        (
            "lode_dispatcher_workers_draining",
            "gauge",
            "Workers being drained.",
            len(draining),
        ),
        (
            "lode_dispatcher_leases",
            "gauge",
            "Steps leased now.",
            len(s.leases.len()),
        ),
        (
            "lode_dispatcher_steps_consumed_total",
            "counter",
            "Steps consumed through the watermark.",
            count(s.steps_consumed),
        ),
        (
            "lode_dispatcher_steps_computed_total",
            "counter",
            "Step completions accepted (every stage) since the dispatcher started.",
            count(s.steps_computed),
        ),
        (
            "lode_dispatcher_compute_seconds_total",
            "counter",
            "Workers' compute time for those steps.",
            count(s.compute_us) / 1e6,
        ),
        (
            "lode_dispatcher_consumer_busy_seconds_total",
            "counter",
            "Time the training side reported training (not waiting for data).",
            count(s.consumer_busy_us) / 1e6,
        ),
        (
            "lode_dispatcher_journal_bytes",
            "gauge",
            "The journal file's length (a restart reads it all).",
            count(s.journal_bytes),
        ),
        (
            "lode_dispatcher_journal_compactions_total",
            "counter",
            "Journal compactions since the dispatcher started.",
            count(s.journal_compactions),
        ),
        (
            "lode_dispatcher_end_of_data",
            "gauge",
            "1 once every step was consumed.",
            f64::from(u8::from(s.end_of_data)),
        ),
    ];
    for (name, kind, help, value) in rows {
        write_metric(&mut out, name, kind, help, job, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[test]
    fn the_text_format_has_help_type_and_a_labelled_sample() {
        let s = StatusResponse {
            epoch: 2,
            steps_per_epoch: 8,
            steps_consumed: 3,
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

    async fn request(addr: std::net::SocketAddr, head: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(head.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn metrics_are_served_over_http_and_nothing_else_is() {
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
        let ok = request(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(ok.ends_with("lode_x{job=\"1\"} 1\n"), "{ok}");
        let missing = request(addr, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = request(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let garbage = request(addr, "\x16\x03\x01 not http\r\n\r\n").await;
        assert!(
            garbage.starts_with("HTTP/1.1 400") || garbage.is_empty(),
            "{garbage}"
        );
        let _ = stop.send(());
        server.await.expect("joined");
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the listener is closed once served"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_disconnected_after_the_header_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve_metrics(
            listener,
            || async { String::new() },
            std::future::pending(),
        ));
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut out = Vec::new();
        // Paused time advances to the next timer: the server's header timeout fires first and
        // it hangs up; without one, the outer timeout would.
        let read =
            tokio::time::timeout(2 * HEADER_READ_TIMEOUT, silent.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the silent connection was not closed");
        let answer = String::from_utf8_lossy(&out);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
        server.abort();
    }
}
