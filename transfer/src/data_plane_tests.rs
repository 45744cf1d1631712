use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use lode_proto::tls::{ClientTls, ServerTls};

use super::*;
use crate::service::serve_receiver;
use crate::test_frames::{frame, message};
use crate::{ReceiverConfig, SharedReceiver};

const JOB: u64 = 5;
const TOKEN: &str = "right";

/// A receiver (window of 4 steps) on 127.0.0.1:0, stopped by dropping the returned sender.
struct Served {
    addr: String,
    buffer: Arc<SharedReceiver>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), crate::service::ServeError>>,
}

impl Served {
    async fn start() -> Served {
        Served::start_with(None).await
    }

    /// A receiver that serves TLS only when `tls` is given (its address is then https).
    async fn start_with(tls: Option<ServerTls>) -> Served {
        let buffer = Arc::new(
            SharedReceiver::new(ReceiverConfig::new(JOB, [0u32], 0, 4)).expect("receiver"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let addr = format!("{scheme}://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_receiver(
            listener,
            ReceiverService::new(JOB, TOKEN, buffer.clone()),
            tls,
            async {
                let _ = stopped.await;
            },
        ));
        Served {
            addr,
            buffer,
            stop: Some(stop),
            server,
        }
    }

    async fn raw(&self) -> TcpStream {
        TcpStream::connect(host_port(&self.addr))
            .await
            .expect("connect")
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.server.await.expect("joined").expect("served");
    }
}

fn hello(version: u32, job: u64, token: &[u8]) -> Vec<u8> {
    let mut out = DATA_PLANE_MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&job.to_le_bytes());
    out.extend_from_slice(&u16::try_from(token.len()).expect("short").to_le_bytes());
    out.extend_from_slice(token);
    out
}

/// Reads a refusal (verdict, reason) or a welcome (verdict, "") from the server.
async fn verdict(stream: &mut TcpStream) -> (u8, String) {
    let v = stream.read_u8().await.expect("a verdict");
    if v == WELCOME || v == WELCOME_LOCAL {
        return (v, String::new());
    }
    (v, read_reason(stream).await.expect("a reason"))
}

/// Whether the server closed the connection without saying more (EOF, or a reset when it
/// closed with our bytes unread).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    match tokio::time::timeout(HELLO_TIMEOUT, stream.read_to_end(&mut rest)).await {
        Ok(Ok(_)) => rest.is_empty(),
        Ok(Err(_)) => true,
        Err(_) => false,
    }
}

/// A connection past a good hello.
async fn welcomed(served: &Served) -> TcpStream {
    let mut s = served.raw().await;
    s.write_all(&hello(PROTOCOL_VERSION, JOB, TOKEN.as_bytes()))
        .await
        .expect("write");
    assert_eq!(
        verdict(&mut s).await.0,
        WELCOME_LOCAL,
        "a peer on this machine is welcomed as local"
    );
    s
}

/// The answer to step `step` of stage 0 pushed over `client`.
async fn pushed(client: &mut DataPlaneClient, step: u64) -> PushStatus {
    client
        .push(&frame(&message(JOB, 0, step)))
        .await
        .expect("answer")
        .status
}

/// Pushes step `step` of stage 0 by gRPC to the receiver at `addr` (a new connection); the
/// error is the connection's or the call's.
async fn grpc_push(
    addr: &str,
    tls: Option<&ClientTls>,
    step: u64,
) -> Result<lode_proto::service::v1::PushResponse, String> {
    let mut grpc = lode_proto::service::connect_receiver(addr, TOKEN, tls)
        .await
        .map_err(|e| e.to_string())?;
    let request = lode_proto::service::v1::PushRequest {
        job_id: JOB,
        frame: frame(&message(JOB, 0, step)).into(),
    };
    match grpc.push(request).await {
        Ok(answer) => Ok(answer.into_inner()),
        Err(status) => Err(status.to_string()),
    }
}

/// Reads one push answer (status, reason).
async fn answer(s: &mut TcpStream) -> (u8, String) {
    let code = s.read_u8().await.expect("status");
    let _retry = s.read_u32_le().await.expect("retry");
    (code, read_reason(s).await.expect("reason"))
}

#[tokio::test]
async fn hellos_with_wrong_credentials_are_refused_before_the_buffer() {
    let served = Served::start().await;
    let refused = |r: Result<DataPlaneClient, DataPlaneError>| match r {
        Err(DataPlaneError::Refused { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let wrong_token = refused(DataPlaneClient::connect(&served.addr, JOB, "wrong", None).await);
    assert!(wrong_token.contains("token"), "{wrong_token}");
    let other_job = refused(DataPlaneClient::connect(&served.addr, JOB + 1, TOKEN, None).await);
    assert!(other_job.contains("job-5"), "{other_job}");

    // Another protocol version, an over-long token and a hello cut short, by hand.
    let mut s = served.raw().await;
    s.write_all(&hello(PROTOCOL_VERSION + 1, JOB, TOKEN.as_bytes()))
        .await
        .expect("write");
    let (v, reason) = verdict(&mut s).await;
    assert_eq!(v, REFUSED);
    assert!(reason.contains("protocol version"), "{reason}");

    let mut s = served.raw().await;
    let mut long = hello(PROTOCOL_VERSION, JOB, b"");
    long[16..18].copy_from_slice(&(MAX_TOKEN_BYTES + 1).to_le_bytes());
    s.write_all(&long).await.expect("write");
    let (v, reason) = verdict(&mut s).await;
    assert_eq!(v, REFUSED);
    assert!(reason.contains("limit"), "{reason}");

    let mut s = served.raw().await;
    s.write_all(&hello(PROTOCOL_VERSION, JOB, TOKEN.as_bytes())[..10])
        .await
        .expect("write");
    s.shutdown().await.expect("half-close");
    let (v, _) = verdict(&mut s).await;
    assert_eq!(v, REFUSED, "a truncated hello");

    // A refused connection cannot push: the server closed it.
    let mut s = served.raw().await;
    s.write_all(&hello(PROTOCOL_VERSION, JOB, b"wrong"))
        .await
        .expect("write");
    assert_eq!(verdict(&mut s).await.0, REFUSED);
    let good = frame(&message(JOB, 0, 0));
    let mut push = u32::try_from(good.len())
        .expect("small")
        .to_le_bytes()
        .to_vec();
    push.extend_from_slice(&good);
    let _ = s.write_all(&push).await;
    assert!(closed(&mut s).await);

    assert_eq!(served.buffer.metrics().accepted, 0);
    assert!(served.buffer.try_pop().is_none());
    served.shutdown().await;
}

#[tokio::test]
async fn frames_are_answered_like_grpc_push() {
    let served = Served::start().await;
    let mut client = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
        .await
        .expect("welcome");
    assert!(client.is_loopback(), "{} is on this machine", served.addr);
    let good = frame(&message(JOB, 0, 0));
    assert_eq!(
        client.push(&good).await.expect("answer").status,
        PushStatus::Accepted
    );
    assert_eq!(
        client.push(&good).await.expect("answer").status,
        PushStatus::Duplicate
    );
    let far = client
        .push(&frame(&message(JOB, 0, 10)))
        .await
        .expect("answer");
    assert_eq!(far.status, PushStatus::Retry, "beyond the window");
    assert_eq!(
        u128::from(far.retry_after_ms),
        crate::MAX_RETRY_AFTER.as_millis(),
        "nothing delivered yet: the longest pause"
    );
    let step = served.buffer.try_pop().expect("step 0 delivered");
    assert_eq!(step.parts[0].records, vec![0, 1]);

    // A frame of another job (inside a well-authenticated connection) is refused, and the
    // connection closed.
    let stranger = client
        .push(&frame(&message(9, 0, 1)))
        .await
        .expect("answer");
    assert_eq!(stranger.status, PushStatus::Rejected);
    assert!(stranger.reason.contains("WrongJob"), "{}", stranger.reason);
    assert!(client.push(&good).await.is_err_and(|e| e.is_unreachable()));

    // gRPC still answers on the same port.
    let answer = grpc_push(&served.addr, None, 1).await.expect("answered");
    assert_eq!(answer.status, PushStatus::Accepted as i32);
    assert_eq!(served.buffer.metrics().accepted, 2);
    served.shutdown().await;
}

#[tokio::test]
async fn hostile_frames_close_the_connection_and_leave_the_buffer_alone() {
    let served = Served::start().await;
    let rejected = u8::try_from(i32::from(PushStatus::Rejected)).expect("small");

    // A length prefix over the limit: refused before anything is allocated.
    let mut s = welcomed(&served).await;
    s.write_all(&u32::MAX.to_le_bytes()).await.expect("write");
    let (code, reason) = answer(&mut s).await;
    assert_eq!(code, rejected);
    assert!(reason.contains("limit"), "{reason}");
    assert!(closed(&mut s).await);

    // A frame that ends before its declared length.
    let mut s = welcomed(&served).await;
    let good = frame(&message(JOB, 0, 0));
    let mut cut = u32::try_from(good.len() + 100)
        .expect("small")
        .to_le_bytes()
        .to_vec();
    cut.extend_from_slice(&good);
    s.write_all(&cut).await.expect("write");
    s.shutdown().await.expect("half-close");
    assert!(
        closed(&mut s).await,
        "a truncated frame closes the connection"
    );

    // Garbage and a bit flip: rejected with the codec's reason, then closed.
    for bad in [b"LODE\x01garbage".to_vec(), {
        let mut damaged = good.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        damaged
    }] {
        let mut s = welcomed(&served).await;
        let mut push = u32::try_from(bad.len())
            .expect("small")
            .to_le_bytes()
            .to_vec();
        push.extend_from_slice(&bad);
        s.write_all(&push).await.expect("write");
        let (code, reason) = answer(&mut s).await;
        assert_eq!(code, rejected);
        assert!(!reason.is_empty());
        assert!(closed(&mut s).await);
    }

    // Random bytes instead of a hello go to gRPC, which does not understand them either;
    // nothing reaches the buffer and the server keeps serving.
    let mut s = served.raw().await;
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
    let _ = closed(&mut s).await;

    assert_eq!(served.buffer.metrics().accepted, 0);
    let mut client = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
        .await
        .expect("still serving");
    assert_eq!(
        client.push(&good).await.expect("answer").status,
        PushStatus::Accepted
    );
    served.shutdown().await;
}

/// A file of the test-only TLS material in `proto/testdata/tls/`.
fn testdata(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/testdata/tls")
        .join(file)
}

#[tokio::test]
async fn a_tls_receiver_takes_both_transports_on_one_port_and_only_over_tls() {
    let identity =
        ServerTls::from_pem_files(&testdata("server.crt"), &testdata("server.key")).expect("id");
    let ca = ClientTls::from_ca_file(&testdata("ca.crt")).expect("CA");
    let served = Served::start_with(Some(identity)).await;
    assert!(served.addr.starts_with("https://"));

    // The data plane over TLS.
    let mut plane = DataPlaneClient::connect(&served.addr, JOB, TOKEN, Some(&ca))
        .await
        .expect("welcome over TLS");
    assert_eq!(pushed(&mut plane, 0).await, PushStatus::Accepted);
    // gRPC over TLS, on the same port.
    let answer = grpc_push(&served.addr, Some(&ca), 1)
        .await
        .expect("answered over TLS");
    assert_eq!(answer.status, PushStatus::Accepted as i32);

    // A plaintext hello is refused (not welcomed), saying that the port takes TLS; the
    // connection is closed.
    let mut s = served.raw().await;
    s.write_all(&hello(PROTOCOL_VERSION, JOB, TOKEN.as_bytes()))
        .await
        .expect("write");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(HELLO_TIMEOUT, s.read_to_end(&mut reply))
        .await
        .expect("closed in time");
    assert_eq!(reply.first(), Some(&REFUSED), "{reply:?}");
    let plain = served.addr.replacen("https://", "http://", 1);
    let refused = DataPlaneClient::connect(&plain, JOB, TOKEN, None)
        .await
        .expect_err("plaintext");
    assert!(
        matches!(&refused, DataPlaneError::Refused { reason, .. } if reason.contains("TLS only") && reason.contains(&served.addr)),
        "{refused:?}"
    );
    // So is a plaintext gRPC push, before the receiver looks at it.
    let refused = grpc_push(&plain, None, 2).await.expect_err("plaintext");
    assert!(
        refused.contains("FailedPrecondition") && refused.contains("TLS only"),
        "{refused}"
    );
    // A client that trusts another CA refuses the receiver, and says it is not a matter of
    // retrying.
    let other = ClientTls::from_ca_file(&testdata("other-ca.crt")).expect("other CA");
    let distrust = DataPlaneClient::connect(&served.addr, JOB, TOKEN, Some(&other))
        .await
        .expect_err("unknown issuer");
    assert!(!distrust.is_unreachable(), "{distrust:?}");
    // An https address without a CA is refused before dialing.
    let no_ca = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
        .await
        .expect_err("no CA");
    assert!(no_ca.to_string().contains("--tls-ca"), "{no_ca}");

    // None of that touched the buffer, and the receiver goes on serving, frames of many TLS
    // records included (each write must be flushed out of TLS's buffer before the answer is
    // awaited, on both sides).
    assert_eq!(served.buffer.metrics().accepted, 2);
    assert_eq!(pushed(&mut plane, 2).await, PushStatus::Accepted);
    let mut big = message(JOB, 0, 3);
    big.tensors = vec![lode_runtime::Tensor::new(
        vec![1 << 21],
        lode_runtime::TensorData::Int64(vec![7; 1 << 21]),
    )
    .expect("16 MiB")];
    for _ in 0..2 {
        let answer = tokio::time::timeout(Duration::from_secs(20), plane.push(&frame(&big)))
            .await
            .expect("answered in time")
            .expect("answer");
        assert_ne!(answer.status, PushStatus::Rejected, "{}", answer.reason);
    }
    for step in 0..4 {
        assert_eq!(served.buffer.try_pop().expect("in order").step, step);
    }
    served.shutdown().await;
}

#[test]
fn reasons_are_cut_at_a_character_boundary() {
    let long = "é".repeat(MAX_REASON_BYTES);
    let cut = bounded(&long);
    assert!(cut.len() <= MAX_REASON_BYTES);
    assert!(cut.len() >= MAX_REASON_BYTES - 1);
    assert_eq!(bounded("short"), "short");
    let bytes = answer_bytes(PushStatus::Retry, 20, &long);
    assert_eq!(bytes[0], 3);
    assert_eq!(
        u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]),
        20
    );
    assert_eq!(
        usize::from(u16::from_le_bytes([bytes[5], bytes[6]])),
        bytes.len() - 7
    );
}

#[test]
fn addresses_lose_their_scheme() {
    assert_eq!(host_port("http://127.0.0.1:9/"), "127.0.0.1:9");
    assert_eq!(host_port("127.0.0.1:9"), "127.0.0.1:9");
    assert_eq!(host_port("https://h:1"), "h:1");
}

/// A receiver replaced by a newer one (the consumer registered again) answers nothing more:
/// an answer would let the worker count a step as delivered that the new receiver never sees.
/// The data plane ends the connection unanswered (the worker reconnects to the receiver named
/// now), gRPC answers Unavailable, and the buffer takes nothing.
#[tokio::test]
async fn a_closed_receiver_answers_no_frame_and_takes_nothing() {
    let served = Served::start().await;
    let mut client = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
        .await
        .expect("welcome");
    assert_eq!(pushed(&mut client, 0).await, PushStatus::Accepted);
    served.buffer.close();
    // Step 0 is buffered (it would be Duplicate) and step 1 is within the window (Accepted):
    // neither answer may come.
    for step in [0, 1] {
        let err = client
            .push(&frame(&message(JOB, 0, step)))
            .await
            .expect_err("no answer");
        assert!(err.is_unreachable(), "{err}");
        client = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
            .await
            .expect("welcome");
    }
    let status = grpc_push(&served.addr, None, 1).await.expect_err("refused");
    assert!(status.to_string().contains("replaced"), "{status}");
    assert_eq!(served.buffer.metrics().accepted, 1);
    served.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_frames_in_one_write_is_answered_in_order() {
    let served = Served::start().await;
    let mut client = DataPlaneClient::connect(&served.addr, JOB, TOKEN, None)
        .await
        .expect("welcome");
    let mut encoder = crate::StepEncoder::new(crate::CodecConfig {
        compression: crate::Compression::Off,
        max_message_bytes: max_frame_bytes(),
    });
    // Steps 0, 1 and 0 again (a duplicate), then 10: past the window of 4.
    let msgs: Vec<_> = [0, 1, 0, 10].map(|step| message(JOB, 0, step)).into();
    let frames = msgs
        .iter()
        .map(|m| encoder.encode_parts(m))
        .collect::<Result<Vec<_>, _>>()
        .expect("encoded");
    client.send_frames(&frames).await.expect("sent");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(client.read_answer().await.expect("answer").status);
    }
    assert_eq!(
        statuses,
        [
            PushStatus::Accepted,
            PushStatus::Accepted,
            PushStatus::Duplicate,
            PushStatus::Retry
        ]
    );
    // The connection serves the next burst.
    assert_eq!(pushed(&mut client, 2).await, PushStatus::Accepted);
    assert_eq!(served.buffer.metrics().accepted, 3);
    served.shutdown().await;
}

#[tokio::test]
async fn a_rejected_frame_in_a_burst_is_answered_after_the_ones_before_and_nothing_after_is_taken()
{
    let served = Served::start().await;
    let mut s = welcomed(&served).await;
    let mut burst = Vec::new();
    for msg in [message(JOB, 0, 0), message(9, 0, 1), message(JOB, 0, 1)] {
        let f = frame(&msg);
        burst.extend_from_slice(&u32::try_from(f.len()).expect("small").to_le_bytes());
        burst.extend_from_slice(&f);
    }
    s.write_all(&burst).await.expect("write");
    assert_eq!(answer(&mut s).await.0, PushStatus::Accepted as u8);
    let (code, reason) = answer(&mut s).await;
    assert_eq!(code, PushStatus::Rejected as u8);
    assert!(reason.contains("WrongJob"), "{reason}");
    assert!(closed(&mut s).await, "closed after the rejected frame");
    assert_eq!(
        served.buffer.metrics().accepted,
        1,
        "the frame after is not taken"
    );
    served.shutdown().await;
}

#[test]
fn only_a_peer_on_this_machine_may_send_unsummed_frames() {
    for local in [
        "127.0.0.1:4000",
        "127.8.9.10:1",
        "[::1]:4000",
        "[::ffff:127.0.0.1]:4000",
    ] {
        let peer: SocketAddr = local.parse().expect("an address");
        assert_eq!(unsummed_from(Some(peer)), None, "{local}");
    }
    for remote in [
        "10.0.0.2:5000",
        "[2001:db8::1]:5000",
        "[::ffff:10.0.0.2]:5000",
    ] {
        let peer: SocketAddr = remote.parse().expect("an address");
        assert_eq!(
            unsummed_from(Some(peer)),
            Some(peer.to_string()),
            "{remote}"
        );
    }
    assert!(
        unsummed_from(None).is_some(),
        "an unknown peer is not trusted"
    );
}

#[tokio::test]
async fn a_connection_is_local_only_when_the_receiver_welcomes_it_as_local() {
    // A receiver behind a port forward sees a bridge address, not loopback: it says WELCOME,
    // and the worker, though it dialled 127.0.0.1, must then send summed frames.
    for (answer, local) in [(WELCOME, false), (WELCOME_LOCAL, true)] {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut hello = vec![0u8; 18 + TOKEN.len()];
            s.read_exact(&mut hello).await.expect("hello");
            s.write_all(&[answer]).await.expect("verdict");
            s
        });
        let client = DataPlaneClient::connect(&addr, JOB, TOKEN, None)
            .await
            .expect("welcomed");
        assert_eq!(client.is_loopback(), local, "verdict {answer}");
        drop(server.await.expect("server"));
    }
}
