//! The `lode.v1.Receiver` endpoint: a thin layer over [`SharedReceiver`]. Every request is
//! checked for the job's token and id before it touches the buffer; a malformed frame is
//! rejected with its reason and logged; a full buffer answers `RETRY` (backpressure: the
//! worker pushes again later) rather than blocking a server thread.
//!
//! [`serve_receiver`] serves gRPC and the data plane ([`crate::data_plane`]) on one port; both
//! offer frames through `ReceiverService::offer_frame`, so they answer alike. With TLS every
//! connection is TLS: the handshake comes first, then the same sniffing inside it; a peer that
//! does not complete a handshake (a plaintext client) is logged and closed, untouched.
//! Connections come through `lode_proto::accept` (the one accept loop), at most
//! [`MAX_CONNECTIONS`] open at once.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use lode_proto::accept::{self, Limited};
use lode_proto::service::v1::receiver_server::{Receiver, ReceiverServer};
use lode_proto::service::v1::{FetchRequest, FetchResponse, PushRequest, PushResponse, PushStatus};
use lode_proto::service::MAX_MESSAGE_BYTES;
use lode_proto::tls::{peek_exact, plaintext_refusal, ServerConnectInfo, ServerStream, ServerTls};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use crate::data_plane::{self, DATA_PLANE_MAGIC, HELLO_TIMEOUT, MAX_DATA_CONNECTIONS};
use crate::{
    CodecConfig, Compression, FrameChecksum, Offer, SharedReceiver, StepDecoder, StepEncoder,
};

/// What the receiver answers a pushed frame, on either transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub status: PushStatus,
    /// For [`PushStatus::Retry`]: how long the sender waits before it pushes the step again
    /// ([`SharedReceiver::retry_after`], whole milliseconds); 0 otherwise.
    pub retry_after_ms: u64,
    /// For [`PushStatus::Rejected`]: why.
    pub reason: String,
}

impl Verdict {
    fn new(status: PushStatus) -> Self {
        Verdict {
            status,
            retry_after_ms: 0,
            reason: String::new(),
        }
    }
}

/// The receiver service of one job.
#[derive(Debug, Clone)]
pub struct ReceiverService {
    job: u64,
    token: Arc<str>,
    buffer: Arc<SharedReceiver>,
}

impl ReceiverService {
    pub fn new(job: u64, token: &str, buffer: Arc<SharedReceiver>) -> Self {
        ReceiverService {
            job,
            token: token.into(),
            buffer,
        }
    }

    /// Where received tensors' memory comes from.
    pub(crate) fn pool(&self) -> &crate::TensorPool {
        self.buffer.pool()
    }

    pub(crate) fn job(&self) -> u64 {
        self.job
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Decodes `frame` and offers it to the buffer: the answer both transports give, or None
    /// when the receiver was closed (a newer one replaced it: the sender is not answered, and
    /// pushes to the receiver the dispatcher names now). The caller has checked the token and
    /// job of the connection or request.
    pub(crate) fn offer_frame(
        &self,
        decoder: &mut StepDecoder,
        frame: &[u8],
        sum: Option<&FrameChecksum>,
    ) -> Option<Verdict> {
        let decoded = match sum {
            Some(sum) => decoder.decode_summed(frame, sum),
            None => decoder.decode(frame),
        };
        let msg = match decoded {
            Ok(msg) => msg,
            Err(e) => return Some(self.refuse_frame(&e)),
        };
        self.offer_message(msg)
    }

    /// Offers a decoded message to the buffer (see [`Self::offer_frame`]).
    pub(crate) fn offer_message(&self, msg: crate::StepMessage) -> Option<Verdict> {
        let (step, stage) = (msg.step, msg.stage);
        self.verdict(self.buffer.try_push(msg), step, stage)
    }

    /// Offers decoded messages in order, under one lock (see
    /// [`SharedReceiver::try_push_all`]): each one's answer as [`Self::offer_message`] gives
    /// it, up to the first that ends the connection (a rejected message's answer, then
    /// nothing; or None, the receiver closed). The messages after it are dropped unoffered.
    pub(crate) fn offer_messages(&self, msgs: Vec<crate::StepMessage>) -> Vec<Option<Verdict>> {
        let ids: Vec<(u64, u32)> = msgs.iter().map(|m| (m.step, m.stage)).collect();
        let offers = self.buffer.try_push_all(msgs);
        offers
            .into_iter()
            .zip(ids)
            .map(|(offer, (step, stage))| self.verdict(offer, step, stage))
            .collect()
    }

    /// The answer to a message of `step` and `stage` the buffer answered `offer`.
    fn verdict(&self, offer: Offer, step: u64, stage: u32) -> Option<Verdict> {
        Some(match offer {
            Offer::Accepted => Verdict::new(PushStatus::Accepted),
            Offer::Duplicate | Offer::Stale => Verdict::new(PushStatus::Duplicate),
            Offer::TooFarAhead => Verdict {
                retry_after_ms: whole_millis(self.buffer.retry_after(step)),
                ..Verdict::new(PushStatus::Retry)
            },
            Offer::Rejected(why) => {
                tracing::warn!(step, stage, reason = ?why, "rejected a step message");
                Verdict {
                    reason: format!("{why:?}"),
                    ..Verdict::new(PushStatus::Rejected)
                }
            }
            Offer::Closed => return None,
        })
    }

    /// The answer to a frame the codec refused.
    pub(crate) fn refuse_frame(&self, e: &crate::TransferError) -> Verdict {
        tracing::warn!(cause = %e, "rejected a malformed step frame");
        Verdict {
            reason: e.to_string(),
            ..Verdict::new(PushStatus::Rejected)
        }
    }

    #[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
    fn authorize<T>(
        &self,
        rpc: &'static str,
        request: &Request<T>,
        job: u64,
    ) -> Result<(), Status> {
        lode_proto::service::authorize(request, rpc, &self.token, (self.job, job), "receiver")
    }
}

/// A pause in whole milliseconds, rounded up (as both transports send it).
fn whole_millis(pause: Duration) -> u64 {
    let millis = pause.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX)
}

fn answer(verdict: Verdict) -> Response<PushResponse> {
    Response::new(PushResponse {
        status: verdict.status.into(),
        retry_after_ms: verdict.retry_after_ms,
        reason: verdict.reason,
    })
}

#[tonic::async_trait]
impl Receiver for ReceiverService {
    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        self.authorize("Push", &request, request.get_ref().job_id)?;
        let frame = request.into_inner().frame;
        let mut decoder = StepDecoder::new(MAX_MESSAGE_BYTES as u64);
        let Some(verdict) = self.offer_frame(&mut decoder, &frame, None) else {
            return Err(Status::unavailable(
                "this receiver was replaced: push to the one the dispatcher names now",
            ));
        };
        Ok(answer(verdict))
    }

    async fn fetch(
        &self,
        request: Request<FetchRequest>,
    ) -> Result<Response<FetchResponse>, Status> {
        self.authorize("Fetch", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let Some(msg) = self.buffer.peek(req.stage, req.global_step) else {
            return Ok(Response::new(FetchResponse {
                found: false,
                frame: lode_proto::service::Bytes::new(),
            }));
        };
        let mut encoder = StepEncoder::new(CodecConfig {
            compression: Compression::Off,
            max_message_bytes: MAX_MESSAGE_BYTES as u64,
        });
        let frame = encoder
            .encode(&msg)
            .map_err(|e| Status::internal(format!("cannot re-encode a held frame: {e}")))?;
        Ok(Response::new(FetchResponse {
            found: true,
            frame: frame.into(),
        }))
    }
}

/// The receiver's gRPC server failed: the address it served on and the cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve on {addr}")]
pub struct ServeError {
    pub addr: String,
    #[source]
    pub source: tonic::transport::Error,
}

/// Accepted connections waiting for the gRPC server to take them.
const GRPC_BACKLOG: usize = 64;

/// Open connections of a receiver, data plane and gRPC together; more wait in the listen
/// backlog. Twice the data-plane bound, so that a data-plane connection over its own bound is
/// still accepted and told why it is refused.
pub const MAX_CONNECTIONS: usize = 2 * MAX_DATA_CONNECTIONS;

/// Serves `service` on `listener` until `shutdown` resolves: gRPC, and the data plane on the
/// same port (see [`crate::data_plane`]), over TLS only when `tls` is given. On shutdown, no
/// connection is accepted any more, data-plane connections close after the frame in hand, and
/// gRPC drains its calls.
pub async fn serve_receiver(
    listener: TcpListener,
    service: ReceiverService,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let (to_grpc, grpc_incoming) = mpsc::channel::<io::Result<Limited<Sniffed>>>(GRPC_BACKLOG);
    let (stop, stopped) = watch::channel(false);
    let grpc = {
        let mut stopped = stopped.clone();
        tonic::transport::Server::builder()
            .add_service(
                ReceiverServer::new(service.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::ReceiverStream::new(grpc_incoming),
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            )
    };
    let admission = Arc::new(Semaphore::new(MAX_DATA_CONNECTIONS));
    let handle = move |stream, peer, permit| {
        let (tls, service, to_grpc) = (tls.clone(), service.clone(), to_grpc.clone());
        let (admission, stopped) = (admission.clone(), stopped.clone());
        route(
            stream, peer, permit, tls, service, to_grpc, admission, stopped,
        )
    };
    let accept = async move {
        accept::accept_loop(listener, MAX_CONNECTIONS, shutdown, handle).await;
        let _ = stop.send(true);
    };
    let ((), served) = tokio::join!(accept, grpc);
    served.map_err(|source| ServeError { addr, source })
}

/// Hands a new connection to the data plane or to gRPC by its first four bytes (inside TLS
/// when the receiver serves TLS); the connection holds `permit` while it is open.
#[allow(clippy::too_many_arguments)]
async fn route(
    stream: TcpStream,
    peer: SocketAddr,
    permit: accept::Permit,
    tls: Option<ServerTls>,
    service: ReceiverService,
    to_grpc: mpsc::Sender<io::Result<Limited<Sniffed>>>,
    admission: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) {
    let sniffed = match accept::secure(stream, peer, tls.as_ref()).await {
        None => return,
        // A plaintext client on the TLS port: it is told, in its protocol, that this port
        // takes TLS.
        Some(ServerStream::PlainOnTlsPort(tcp)) => sniff_plain(tcp, true).await,
        Some(ServerStream::Plain(tcp)) => sniff_plain(tcp, false).await,
        Some(stream) => sniff_tls(stream).await,
    };
    match sniffed {
        Some(stream) if stream.head == DATA_PLANE_MAGIC => {
            let data_permit = admission.try_acquire_owned().ok();
            let refusal = if matches!(stream.inner, ServerStream::PlainOnTlsPort(_)) {
                Some(plaintext_refusal(stream.inner.tcp().local_addr().ok()))
            } else if data_permit.is_none() {
                Some(format!(
                    "over {MAX_DATA_CONNECTIONS} data-plane connections"
                ))
            } else {
                None
            };
            data_plane::serve_connection(stream, Some(peer), service, refusal, stopped).await;
            drop((data_permit, permit));
        }
        // Anything else is HTTP/2's business (it refuses what is not HTTP/2).
        Some(stream) => {
            let _ = to_grpc.send(Ok(Limited::new(stream, permit))).await;
        }
        // Closed before saying anything.
        None => {}
    }
}

/// A plaintext connection's first four bytes, peeked (left in the socket); None if it closed
/// first. A peer silent for [`HELLO_TIMEOUT`] goes to gRPC, which times it out its own way.
/// `on_tls_port`: the receiver serves TLS, and this client is only to be refused.
async fn sniff_plain(stream: TcpStream, on_tls_port: bool) -> Option<Sniffed> {
    let mut head = [0u8; 4];
    let head = match tokio::time::timeout(HELLO_TIMEOUT, peek_exact(&stream, &mut head)).await {
        Ok(Ok(false)) => return None,
        Ok(Ok(true)) => head,
        // Silent or broken: not the data plane.
        _ => [0; 4],
    };
    Some(Sniffed {
        head,
        replayed: head.len(),
        inner: if on_tls_port {
            ServerStream::PlainOnTlsPort(stream)
        } else {
            ServerStream::Plain(stream)
        },
    })
}

/// A TLS connection's first four bytes, read and kept to be replayed; None if it closed, broke
/// or stayed silent for [`HELLO_TIMEOUT`].
async fn sniff_tls(mut stream: ServerStream) -> Option<Sniffed> {
    let mut head = [0u8; 4];
    match tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => Some(Sniffed {
            head,
            replayed: 0,
            inner: stream,
        }),
        _ => None,
    }
}

/// A connection whose first four bytes were looked at: a TLS stream had to read them, so they
/// are handed out again before the rest; a plaintext one only peeked (nothing to replay).
#[derive(Debug)]
struct Sniffed {
    head: [u8; 4],
    /// How much of `head` the reader has had.
    replayed: usize,
    inner: ServerStream,
}

impl Connected for Sniffed {
    type ConnectInfo = ServerConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(rest) = this.head.get(this.replayed..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_frames::{frame, message};
    use crate::ReceiverConfig;
    use lode_proto::service::connect_receiver;

    #[tokio::test]
    async fn hostile_pushes_are_rejected_without_touching_the_buffer() {
        let buffer =
            Arc::new(SharedReceiver::new(ReceiverConfig::new(5, [0u32], 0, 4)).expect("receiver"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_receiver(
            listener,
            ReceiverService::new(5, "right", buffer.clone()),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        let push = |token: &'static str, job: u64, frame: Vec<u8>| {
            let addr = addr.clone();
            async move {
                let mut client = connect_receiver(&addr, token, None).await.expect("connect");
                client
                    .push(PushRequest {
                        job_id: job,
                        frame: frame.into(),
                    })
                    .await
            }
        };
        let good = frame(&message(5, 0, 0));

        let wrong_token = push("wrong", 5, good.clone()).await.expect_err("refused");
        assert_eq!(wrong_token.code(), tonic::Code::Unauthenticated);
        let other_job = push("right", 6, good.clone()).await.expect_err("refused");
        assert_eq!(other_job.code(), tonic::Code::PermissionDenied);
        let garbage = push("right", 5, b"LODE\x01garbage".to_vec())
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(garbage.status, PushStatus::Rejected as i32);
        assert!(!garbage.reason.is_empty());
        let mut damaged = good.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        for (refused, what) in [
            (damaged, "a bit flip is caught"),
            (frame(&message(9, 0, 0)), "a frame of another job"),
            (frame(&message(5, 3, 0)), "a stage the job lacks"),
        ] {
            let answer = push("right", 5, refused)
                .await
                .expect("answered")
                .into_inner();
            assert_eq!(answer.status, PushStatus::Rejected as i32, "{what}");
        }
        // A message over the 64 MiB limit, from a client that does not hold itself to it:
        // refused by the server before decoding, and the server goes on serving.
        let channel = tonic::transport::Channel::from_shared(addr.clone())
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut unbounded =
            lode_proto::service::v1::receiver_client::ReceiverClient::with_interceptor(
                channel,
                lode_proto::service::BearerAuth::new("right").expect("token"),
            )
            .max_encoding_message_size(usize::MAX);
        let oversized = unbounded
            .push(PushRequest {
                job_id: 5,
                frame: vec![0u8; MAX_MESSAGE_BYTES + 1].into(),
            })
            .await
            .expect_err("over the limit");
        assert_eq!(oversized.code(), tonic::Code::OutOfRange, "{oversized:?}");
        // Nothing of that reached the buffer.
        assert_eq!(buffer.metrics().accepted, 0);
        assert!(buffer.try_pop().is_none());

        // The real thing, then its duplicate, then a step past the window (backpressure).
        let answer = push("right", 5, good.clone())
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(answer.status, PushStatus::Accepted as i32);
        let answer = push("right", 5, good).await.expect("answered").into_inner();
        assert_eq!(answer.status, PushStatus::Duplicate as i32);
        let far = frame(&message(5, 0, 10));
        let answer = push("right", 5, far).await.expect("answered").into_inner();
        assert_eq!(answer.status, PushStatus::Retry as i32);
        assert_eq!(
            u128::from(answer.retry_after_ms),
            crate::MAX_RETRY_AFTER.as_millis(),
            "nothing delivered yet: the longest pause"
        );
        let step = buffer.try_pop().expect("step 0 delivered");
        assert_eq!(step.parts[0].records, vec![0, 1]);

        let _ = stop.send(());
        server.await.expect("joined").expect("served");
    }
}
