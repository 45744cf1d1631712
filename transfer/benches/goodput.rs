//! Goodput of the step transfer on loopback, against a plain TCP copy of the same bytes.
//!
//! A receiver service (`serve_receiver` over a [`SharedReceiver`] with a wide window) on
//! 127.0.0.1; N pusher tasks, each on its own connection, encode and push their share of the
//! steps (pusher k sends steps k, k+N, ...) and retry on `RETRY`; a consumer thread pops the
//! steps in order. Each step carries 1 MiB of float32 tensors: four [65536] tensors, two of
//! uniform values in [0, 1) (poorly compressible) and two of values on a 1/16 grid (bucketized
//! features, compressible). Goodput counts tensor payload bytes delivered to the consumer per
//! second of wall time, encoding, transport, decoding and reordering included.
//!
//! Transports: `lode off` / `lode lz4` push through the receiver's data plane (what a worker
//! uses: the frame written from the tensors' memory with vectored writes, one answer per
//! frame; over loopback an uncompressed frame goes without its checksum, as a worker's does);
//! `lode off summed` is `lode off` with the checksum kept (what a remote receiver gets);
//! `grpc off` / `grpc lz4` through gRPC `Push` as before the data plane; `wide off`
//! through gRPC on a server and channels with large HTTP/2 flow-control windows.
//!
//! The baseline is N tokio `TcpStream`s over loopback, each sending its share of the same number
//! of frames of the same size (`write_all` of a length prefix and the bytes, `read_exact` on the
//! other side), with no encoding, no answers and no allocation per frame.
//!
//! A plain `harness = false` main: the measured unit is a whole concurrent transfer with its
//! own setup, and the interesting figure is the ratio of two such transfers. One unmeasured
//! round of every transport comes first; then each of the measured rounds runs the TCP copy
//! and every transport in turn, so that load from elsewhere on the machine weighs on both
//! sides of a ratio alike. `vs tcp` is the median rate over the median TCP rate; `paired` the
//! median of each round's own ratio; `cpu us/MiB` the whole process's CPU time (every thread:
//! senders, receiver, consumer) per MiB of payload over the measured rounds, from the
//! process's CPU clock.
//!
//! Run with `cargo bench -p lode-transfer --bench goodput` (`-- --quick` for fewer steps;
//! `LODE_BENCH_STEPS=<n>` and `LODE_BENCH_PUSHERS=<n>` override the defaults;
//! `LODE_BENCH_ONLY=<text>` runs only the transports whose name contains it, beside TCP).
//!
//! Figures (2 vCPU AMD EPYC, shared with other builds): see docs/benchmarks.md (goodput).

use std::sync::Arc;

use std::time::{Duration, Instant};

use lode_proto::cpu::process_cpu;
use lode_proto::service::v1::receiver_client::ReceiverClient;
use lode_proto::service::v1::receiver_server::ReceiverServer;
use lode_proto::service::v1::{PushRequest, PushStatus};
use lode_proto::service::{connect_receiver, BearerAuth, MAX_MESSAGE_BYTES};
use lode_runtime::{Tensor, TensorData};
use lode_transfer::data_plane::DataPlaneClient;
use lode_transfer::service::{serve_receiver, ReceiverService};
use lode_transfer::{
    CodecConfig, Compression, ReceiverConfig, SharedReceiver, StepEncoder, StepMessage,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const JOB: u64 = 3;
const TOKEN: &str = "bench-token";
const TENSOR_VALUES: usize = 1 << 16;
const TENSORS: usize = 4;
const PAYLOAD_BYTES: usize = TENSORS * TENSOR_VALUES * 4;
/// Steps the receiver buffers ahead of the consumer (256 MiB of payload).
const WINDOW: u64 = 256;
const REPEATS: usize = 3;
/// HTTP/2 flow-control windows of the `wide windows` variant (h2's default is 64 KiB).
const WIDE_STREAM_WINDOW: u32 = 8 << 20;
const WIDE_CONNECTION_WINDOW: u32 = 32 << 20;

/// A small deterministic generator (xorshift64*), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float in [0, 1) from the top 24 bits.
    fn unit(&mut self) -> f32 {
        // 24 bits convert to f32 exactly.
        #[allow(clippy::cast_precision_loss)]
        let top = (self.next() >> 40) as f32;
        top / 16_777_216.0
    }
}

/// The tensors of one step; pushers vary only the step number.
fn step_tensors(seed: u64) -> Vec<Tensor> {
    let mut rng = Rng(seed | 1);
    (0..TENSORS)
        .map(|i| {
            let values = (0..TENSOR_VALUES)
                .map(|_| {
                    let u = rng.unit();
                    if i % 2 == 0 {
                        u
                    } else {
                        (u * 16.0).floor() / 16.0
                    }
                })
                .collect();
            Tensor::new(vec![TENSOR_VALUES], TensorData::Float32(values)).expect("valid tensor")
        })
        .collect()
}

fn message(step: u64, tensors: Vec<Tensor>) -> StepMessage {
    StepMessage {
        job: JOB,
        stage: 0,
        step,
        epoch: 0,
        records: (step * 32..step * 32 + 32).collect(),
        tensors,
    }
}

fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let mib = bytes as f64 / f64::from(1u32 << 20);
    mib / elapsed.as_secs_f64()
}

/// How the pushers reach the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// The data plane on the receiver's port: what a worker uses; `sum_local` keeps the
    /// frame checksum over loopback.
    DataPlane { sum_local: bool },
    /// gRPC `Push`, with the given HTTP/2 settings.
    Grpc(Windows),
}

/// A pusher's connection.
enum Pusher {
    DataPlane(DataPlaneClient),
    Grpc(lode_proto::service::ReceiverClient),
}

impl Pusher {
    /// Encodes and pushes one step as a worker would; returns the wire bytes, the status, the
    /// retry pause and the reason. The data plane writes the frame in parts (values from the
    /// tensors' memory); gRPC takes the encoded frame's buffer (no copy into the request).
    async fn push(
        &mut self,
        encoder: &mut StepEncoder,
        msg: &StepMessage,
    ) -> (u64, PushStatus, u64, String) {
        match self {
            Pusher::DataPlane(client) => {
                let frame = encoder
                    .encode_parts_for(msg, client.is_loopback())
                    .expect("encodes");
                let len = u64::try_from(frame.len()).expect("fits");
                let a = client.push_parts(&frame).await.expect("push");
                (len, a.status, a.retry_after_ms, a.reason)
            }
            Pusher::Grpc(client) => {
                let frame = encoder.encode(msg).expect("encodes");
                let len = u64::try_from(frame.len()).expect("fits");
                let request = PushRequest {
                    job_id: JOB,
                    frame: frame.into(),
                };
                let answer = client.push(request).await.expect("push").into_inner();
                let status = PushStatus::try_from(answer.status).expect("a known status");
                (len, status, answer.retry_after_ms, answer.reason)
            }
        }
    }
}

/// Gives `msg` the number `step` and that step's records.
fn renumber(msg: &mut StepMessage, step: u64) {
    msg.step = step;
    msg.records = (step * 32..step * 32 + 32).collect();
}

/// Pushes `msg` until the receiver takes it (waiting as told on `RETRY`); the wire bytes and
/// the retries.
async fn push_until_taken(
    client: &mut Pusher,
    encoder: &mut StepEncoder,
    msg: &StepMessage,
) -> (u64, u64) {
    let mut retries = 0;
    loop {
        let (len, status, retry_after_ms, reason) = client.push(encoder, msg).await;
        match status {
            PushStatus::Accepted => return (len, retries),
            PushStatus::Retry => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
            }
            other => panic!("push answered {other:?}: {reason}"),
        }
    }
}

/// The HTTP/2 settings of a gRPC run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Windows {
    /// What `serve_receiver` and `connect_receiver` use.
    Default,
    /// The same service on a server and channels with large flow-control windows.
    Wide,
}

/// One transfer of `steps` steps through the receiver service; returns the wall time, the wire
/// bytes pushed and the retries.
async fn service_transfer(
    steps: u64,
    pushers: u64,
    compression: Compression,
    transport: Transport,
) -> (Duration, u64, u64) {
    let windows = match transport {
        Transport::Grpc(w) => w,
        Transport::DataPlane { .. } => Windows::Default,
    };
    let buffer = Arc::new(
        SharedReceiver::new(ReceiverConfig::new(JOB, [0u32], 0, WINDOW)).expect("receiver"),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = ReceiverService::new(JOB, TOKEN, buffer.clone());
    let shutdown = async {
        let _ = stopped.await;
    };
    let server = match windows {
        Windows::Default => tokio::spawn(serve_receiver(listener, service, None, shutdown)),
        Windows::Wide => tokio::spawn(async move {
            tonic::transport::Server::builder()
                .initial_stream_window_size(WIDE_STREAM_WINDOW)
                .initial_connection_window_size(WIDE_CONNECTION_WINDOW)
                .add_service(
                    ReceiverServer::new(service)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    shutdown,
                )
                .await
                .expect("wide server");
            Ok(())
        }),
    };
    let mut clients = Vec::new();
    for _ in 0..pushers {
        clients.push(match transport {
            Transport::DataPlane { .. } => Pusher::DataPlane(
                DataPlaneClient::connect(&addr, JOB, TOKEN, None)
                    .await
                    .expect("connect"),
            ),
            Transport::Grpc(Windows::Default) => {
                Pusher::Grpc(connect_receiver(&addr, TOKEN, None).await.expect("connect"))
            }
            Transport::Grpc(Windows::Wide) => {
                let channel = tonic::transport::Endpoint::from_shared(addr.clone())
                    .expect("endpoint")
                    .initial_stream_window_size(WIDE_STREAM_WINDOW)
                    .initial_connection_window_size(WIDE_CONNECTION_WINDOW)
                    .connect()
                    .await
                    .expect("connect");
                Pusher::Grpc(
                    ReceiverClient::with_interceptor(
                        channel,
                        BearerAuth::new(TOKEN).expect("token"),
                    )
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
        });
    }

    let start = Instant::now();
    let consumer = {
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            let mut payload = 0u64;
            for expected in 0..steps {
                let step = buffer
                    .pop(Duration::from_secs(60))
                    .expect("a step within a minute");
                assert_eq!(step.step, expected, "delivered in order");
                payload += step.parts[0]
                    .tensors
                    .iter()
                    .map(|t| u64::try_from(t.num_elements() * 4).expect("small"))
                    .sum::<u64>();
                // Done with it, as the training side is once it copied the step out.
                buffer.recycle(step);
            }
            (start.elapsed(), payload)
        })
    };
    let tasks: Vec<_> = clients
        .into_iter()
        .zip(0u64..)
        .map(|(mut client, k)| {
            tokio::spawn(async move {
                // One message per pusher, renumbered for each step: the bench should not
                // copy the payload more often than a worker would.
                let mut msg = message(k, step_tensors(k + 1));
                let mut encoder = StepEncoder::new(CodecConfig {
                    compression,
                    max_message_bytes: u64::try_from(MAX_MESSAGE_BYTES).expect("fits"),
                });
                encoder.sum_local(transport == Transport::DataPlane { sum_local: true });
                let mut wire = 0u64;
                let mut retries = 0u64;
                // The frame sent and not yet answered: its step and length.
                let mut unanswered: Option<(u64, u64)> = None;
                for step in (k..steps).step_by(usize::try_from(pushers).expect("fits")) {
                    renumber(&mut msg, step);
                    let Pusher::DataPlane(plane) = &mut client else {
                        let (w, r) = push_until_taken(&mut client, &mut encoder, &msg).await;
                        wire += w;
                        retries += r;
                        continue;
                    };
                    // As a worker does: the next frame goes out before the answer to the one
                    // before it is read (one frame in flight).
                    let frame = encoder
                        .encode_parts_for(&msg, plane.is_loopback())
                        .expect("encodes");
                    plane.send_parts(&frame).await.expect("send");
                    let sent = (step, u64::try_from(frame.len()).expect("fits"));
                    let Some((earlier, len)) = unanswered.replace(sent) else {
                        continue;
                    };
                    let a = plane.read_answer().await.expect("answer");
                    match a.status {
                        PushStatus::Accepted => wire += len,
                        PushStatus::Retry => {
                            // Rare (the window is wide): settle the later frame too, then
                            // push each one not taken again, one at a time.
                            let later = plane.read_answer().await.expect("answer");
                            unanswered = None;
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(a.retry_after_ms)).await;
                            let mut again = vec![earlier];
                            if later.status == PushStatus::Accepted {
                                wire += sent.1;
                            } else {
                                again.push(step);
                            }
                            for s in again {
                                renumber(&mut msg, s);
                                let (w, r) =
                                    push_until_taken(&mut client, &mut encoder, &msg).await;
                                wire += w;
                                retries += r;
                            }
                        }
                        other => panic!("push answered {other:?}: {}", a.reason),
                    }
                }
                if let (Some((_, len)), Pusher::DataPlane(plane)) = (unanswered, &mut client) {
                    let a = plane.read_answer().await.expect("answer");
                    assert_eq!(
                        a.status,
                        PushStatus::Accepted,
                        "the last frame: {}",
                        a.reason
                    );
                    wire += len;
                }
                (wire, retries)
            })
        })
        .collect();
    let mut wire = 0;
    let mut retries = 0;
    for task in tasks {
        let (w, r) = task.await.expect("pusher");
        wire += w;
        retries += r;
    }
    let (elapsed, payload) = tokio::task::spawn_blocking(move || consumer.join())
        .await
        .expect("join")
        .expect("consumer");
    assert_eq!(payload, steps * u64::try_from(PAYLOAD_BYTES).expect("fits"));
    let _ = stop.send(());
    server.await.expect("server task").expect("served");
    (elapsed, wire, retries)
}

/// A plain TCP copy of `steps` frames of `frame_len` bytes over `pushers` connections.
async fn tcp_transfer(steps: u64, pushers: u64, frame_len: usize) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let share = |k: u64| {
        (k..steps)
            .step_by(usize::try_from(pushers).expect("fits"))
            .count()
    };
    let readers = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..pushers {
            let (mut stream, _) = listener.accept().await.expect("accept");
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; frame_len];
                let mut got = 0u64;
                loop {
                    let mut len = [0u8; 4];
                    if stream.read_exact(&mut len).await.is_err() {
                        break;
                    }
                    let n = usize::try_from(u32::from_le_bytes(len)).expect("fits");
                    stream.read_exact(&mut buf[..n]).await.expect("read frame");
                    got += 1;
                }
                got
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("reader");
        }
        total
    });
    let mut streams = Vec::new();
    for _ in 0..pushers {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        streams.push(stream);
    }
    let start = Instant::now();
    let writers: Vec<_> = streams
        .into_iter()
        .zip(0u64..)
        .map(|(mut stream, k)| {
            let frames = share(k);
            tokio::spawn(async move {
                let frame = vec![0x5au8; frame_len];
                let len = u32::try_from(frame_len).expect("fits").to_le_bytes();
                for _ in 0..frames {
                    stream.write_all(&len).await.expect("write len");
                    stream.write_all(&frame).await.expect("write frame");
                }
                stream.shutdown().await.expect("shutdown");
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }
    let got = readers.await.expect("readers");
    let elapsed = start.elapsed();
    assert_eq!(got, steps);
    elapsed
}

/// CPU microseconds per MiB of payload, over every measured run of a transport.
fn cpu_us_per_mib(cpu: Option<Duration>, bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    cpu.map_or_else(
        || "-".to_string(),
        |c| {
            format!(
                "{:.0}",
                c.as_secs_f64() * 1e6 / (bytes as f64 / 1_048_576.0)
            )
        },
    )
}

/// Runs `f`, and adds the CPU time it took (when known) to `total`.
fn counting_cpu<T>(total: &mut Option<Duration>, f: impl FnOnce() -> T) -> T {
    let before = process_cpu();
    let out = f();
    *total = match (*total, before, process_cpu()) {
        (Some(t), Some(b), Some(a)) => Some(t + a.saturating_sub(b)),
        _ => None,
    };
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let steps = env("LODE_BENCH_STEPS", if quick { 256 } else { 1024 });
    let pushers = env("LODE_BENCH_PUSHERS", 4);
    let only = std::env::var("LODE_BENCH_ONLY").ok();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let payload = steps * u64::try_from(PAYLOAD_BYTES).expect("fits");
    let raw_frame_len = StepEncoder::new(CodecConfig {
        compression: Compression::Off,
        max_message_bytes: u64::try_from(MAX_MESSAGE_BYTES).expect("fits"),
    })
    .encode(&message(0, step_tensors(1)))
    .expect("encodes")
    .len();

    println!(
        "goodput bench: {steps} steps of {} KiB payload (frame {raw_frame_len} B), {pushers} pushers, median of {REPEATS}",
        PAYLOAD_BYTES / 1024
    );
    let transports: Vec<(&str, Compression, Transport)> = [
        (
            "lode off",
            Compression::Off,
            Transport::DataPlane { sum_local: false },
        ),
        (
            "lode off summed",
            Compression::Off,
            Transport::DataPlane { sum_local: true },
        ),
        (
            "lode lz4",
            Compression::Lz4,
            Transport::DataPlane { sum_local: false },
        ),
        (
            "grpc off",
            Compression::Off,
            Transport::Grpc(Windows::Default),
        ),
        (
            "grpc lz4",
            Compression::Lz4,
            Transport::Grpc(Windows::Default),
        ),
        ("wide off", Compression::Off, Transport::Grpc(Windows::Wide)),
    ]
    .into_iter()
    .filter(|(name, _, _)| only.as_deref().is_none_or(|only| name.contains(only)))
    .collect();
    // Rounds interleave the baseline and every transport, so that load from elsewhere on
    // the machine weighs on both sides of each ratio alike.
    let mut tcp = Vec::new();
    let mut rates = vec![Vec::new(); transports.len()];
    let mut wire_ratio = vec![0.0; transports.len()];
    let mut retries = vec![0u64; transports.len()];
    // One unmeasured round first: what is measured is the steady state, not the process's
    // first touch of its memory (the allocator keeps freed memory for a while, so later
    // rounds reuse it).
    runtime.block_on(tcp_transfer(steps, pushers, raw_frame_len));
    for &(_, compression, transport) in &transports {
        runtime.block_on(service_transfer(steps, pushers, compression, transport));
    }
    // CPU time of the whole process (every thread: pushers, receiver, consumer) per transport.
    let mut tcp_cpu = Some(Duration::ZERO);
    let mut cpu = vec![Some(Duration::ZERO); transports.len()];
    for _ in 0..REPEATS {
        let elapsed = counting_cpu(&mut tcp_cpu, || {
            runtime.block_on(tcp_transfer(steps, pushers, raw_frame_len))
        });
        tcp.push(mib_per_s(payload, elapsed));
        for (i, &(_, compression, transport)) in transports.iter().enumerate() {
            let (elapsed, wire, r) = counting_cpu(&mut cpu[i], || {
                runtime.block_on(service_transfer(steps, pushers, compression, transport))
            });
            rates[i].push(mib_per_s(payload, elapsed));
            #[allow(clippy::cast_precision_loss)]
            {
                wire_ratio[i] = wire as f64 / payload as f64;
            }
            retries[i] += r;
        }
    }
    let tcp_median = median(tcp.clone());
    println!(
        "{:<12} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10}   runs MiB/s",
        "transport", "MiB/s", "vs tcp", "paired", "wire/raw", "retries", "cpu us/MiB"
    );
    let measured = payload * REPEATS as u64;
    println!(
        "{:<12} {:>10.0} {:>7.0}% {:>7.0}% {:>8} {:>8} {:>10}   {:?}",
        "tcp copy",
        tcp_median,
        100.0,
        100.0,
        "-",
        "-",
        cpu_us_per_mib(tcp_cpu, measured),
        tcp.iter().map(|x| x.round()).collect::<Vec<_>>()
    );
    for (i, (name, _, _)) in transports.iter().enumerate() {
        let rate = median(rates[i].clone());
        // The median of each round's ratio to the TCP copy of the same round.
        let paired = median(rates[i].iter().zip(&tcp).map(|(r, t)| r / t).collect());
        println!(
            "{:<12} {:>10.0} {:>7.0}% {:>7.0}% {:>8.3} {:>8} {:>10}   {:?}",
            name,
            rate,
            100.0 * rate / tcp_median,
            100.0 * paired,
            wire_ratio[i],
            retries[i],
            cpu_us_per_mib(cpu[i], measured),
            rates[i].iter().map(|x| x.round()).collect::<Vec<_>>()
        );
    }
}
