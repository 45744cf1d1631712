//! The receiver's data plane: step frames over a TCP connection (inside TLS when the receiver
//! serves TLS), on the receiver's own port beside gRPC.
//!
//! gRPC's unary `Push` copies a 1 MiB frame about four times outside the kernel (the request
//! encoder, HTTP/2 framing, the response decoder's buffer) and reached about a fifth of a
//! plain TCP copy on loopback. Here a frame crosses with one copy into the socket and one
//! out of it, so a worker's push costs little more than the bytes themselves. gRPC `Push`
//! still works (older workers, tools); `Fetch` stays on gRPC.
//!
//! # One port
//! [`crate::service::serve_receiver`] looks at the first four bytes of every accepted
//! connection: [`DATA_PLANE_MAGIC`] starts a data-plane connection, anything else (HTTP/2
//! starts with `PRI `) goes to the gRPC server. So the address the consumer registers with
//! the dispatcher, and the heartbeat hands the workers, serves both. A receiver that serves
//! TLS (`https://` address) completes the handshake first and looks at the first four bytes
//! inside it; every connection to it must be TLS.
//!
//! # Connection
//! All integers little-endian.
//! ```text
//! client hello:   "LODP", protocol version u32, job id u64, token length u16, token bytes
//! server answer:  0 = welcome | 1 = refused, reason length u16, reason (UTF-8)
//! then, repeated: client: frame length u32, frame (see transfer::codec)
//!                 server: status u8 (PushStatus's numbers), retry_after_ms u32,
//!                         reason length u16, reason (UTF-8)
//! ```
//! The receiver answers frames in the order they came. A client need not wait for an answer
//! before doing other work or sending more frames: a worker with short steps sends a burst of
//! frames in one vectored write, computes the next burst while the receiver takes this one,
//! and reads this burst's answers before it sends the next. While the next frame's bytes have
//! already arrived, the receiver holds a decoded frame back (up to `MOST_HELD` of them, and
//! about `MOST_HELD_BYTES`) and offers it to the buffer with the next ones, under one lock and
//! with one wake-up of a consumer waiting for a step, then writes their answers together: a
//! burst is offered a few dozen frames at a time and answered with one write (and read with
//! one read). Few bytes missing from the connection's buffer (a length prefix, a header) come
//! through it, in a read that also brings what follows, never in a system call of their own;
//! while the frames are short, a read takes up to the buffer's room (see
//! `Incoming::expect_frames_of`). Frames held when the receiver stops are dropped unanswered:
//! the sender pushes them again to the receiver named next.
//! The hello is checked (token in constant time, then job, then protocol version) before the
//! receiver's buffer is touched; a refusal says why and closes the connection. A frame length
//! over [`MAX_MESSAGE_BYTES`] is refused before anything is allocated. An uncompressed frame
//! is decoded as it arrives (`transfer::codec::stream`): each numeric tensor's values are read
//! from the socket into the tensor's own memory, so the bytes cross user space once; a
//! tensor's memory is allocated (zeroed, so untouched pages cost nothing) for at most what the
//! rest of the frame could fill. Any other frame is read into a buffer that grows with the
//! bytes that arrive (at most `READ_CHUNK` ahead of them) and is decoded whole. Either way
//! the frame's checksum is summed piece by piece as it arrives, while the bytes are in cache,
//! and a frame is refused exactly as `StepDecoder` refuses it. A frame the
//! codec refuses is answered `REJECTED` with the reason, and the connection is closed (a sender
//! that produced it cannot be trusted to stay in step); so is one that ends early. Nothing a
//! peer sends can panic the receiver.
//!
//! # Limits
//! [`MAX_DATA_CONNECTIONS`] data-plane connections at once (one per pushing worker), each
//! reading at most one frame and holding at most `MOST_HELD` decoded ones (about
//! `MOST_HELD_BYTES`) whose bytes had already arrived; a hello must arrive within
//! [`HELLO_TIMEOUT`].

use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::Duration;

use lode_proto::service::v1::PushStatus;
use lode_proto::service::{constant_time_eq, MAX_MESSAGE_BYTES, PROTOCOL_VERSION};
use lode_proto::tls::{self, ClientStream, ClientTls, DialError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use lode_proto::tls::host_port;

use crate::codec::stream::{self, Incoming, StreamFault};
use crate::codec::{FrameHeader, HEADER_LEN};
use crate::service::{ReceiverService, Verdict};
use crate::{Frame, FrameChecksum, FrameParts, StepDecoder, StepMessage};

/// The first bytes of a data-plane connection.
pub const DATA_PLANE_MAGIC: [u8; 4] = *b"LODP";

/// The longest token a hello may carry; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: u16 = 4096;

/// Reasons longer than this are cut (at a character boundary) before they are sent.
pub const MAX_REASON_BYTES: usize = 1024;

/// How long a new connection may take to send its first bytes and its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Data-plane connections served at once; later ones are refused in the hello answer.
pub const MAX_DATA_CONNECTIONS: usize = 1024;

/// The most a frame buffer grows ahead of the bytes received, and the most one read asks for:
/// a 1 MiB step frame takes one or two reads (each read is a system call; smaller reads cost
/// more than the cache they keep warm for the checksum).
const READ_CHUNK: usize = 1 << 20;

const WELCOME: u8 = 0;
const REFUSED: u8 = 1;
/// A welcome to a peer the receiver sees on its own machine: it may send unsummed frames
/// (see the codec's docs). Both ends must see a loopback peer for a connection to be local:
/// behind a port forward on one host (a container's published port) the worker dials
/// loopback while the receiver sees a bridge address, and would refuse unsummed frames.
const WELCOME_LOCAL: u8 = 2;

/// Errors of the data plane's client.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// The receiver could not be reached or its TLS handshake failed (see
    /// [`DialError::is_unreachable`]).
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The connection broke (the receiver may be restarting).
    #[error("data plane connection to {addr} failed")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The receiver refused the hello (wrong token, another job, another protocol version).
    #[error("the receiver at {addr} refused the connection: {reason}")]
    Refused { addr: String, reason: String },
    /// The receiver answered something this build does not understand.
    #[error("the receiver at {addr} answered {what}")]
    Protocol { addr: String, what: String },
    /// The frame is larger than any receiver accepts.
    #[error("a {bytes}-byte frame is over the data plane's limit of {limit} bytes")]
    FrameTooLarge { bytes: usize, limit: usize },
    /// The token cannot be sent (empty or too long).
    #[error("the job token must be 1 to {MAX_TOKEN_BYTES} bytes")]
    InvalidToken,
}

impl DataPlaneError {
    /// Whether the receiver was unreachable or went away: worth reconnecting and retrying.
    pub fn is_unreachable(&self) -> bool {
        match self {
            DataPlaneError::Io { .. } => true,
            DataPlaneError::Dial(e) => e.is_unreachable(),
            _ => false,
        }
    }
}

/// The receiver's answer to one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushAnswer {
    pub status: PushStatus,
    pub retry_after_ms: u64,
    pub reason: String,
}

/// A worker's data-plane connection to one receiver, authenticated for one job.
#[derive(Debug)]
pub struct DataPlaneClient {
    addr: String,
    stream: ClientStream,
    /// The receiver is on this machine as both ends see it: the connection's peer is a
    /// loopback address, and the receiver welcomed it as local.
    loopback: bool,
    /// Answer bytes read and not yet parsed: one read takes every answer that has arrived
    /// (a burst's answers come together), not one read per answer.
    answers: Vec<u8>,
}

/// The most answer bytes one read asks for.
const ANSWER_READ: usize = 4096;

impl DataPlaneClient {
    /// Whether the receiver is reached over loopback (on this machine, as both ends see it),
    /// where compressing a frame costs CPU and saves no bandwidth that matters, and an
    /// uncompressed frame may go without its checksum.
    pub fn is_loopback(&self) -> bool {
        self.loopback
    }

    /// Connects to the receiver at `addr` (`host:port`, `http://host:port` as the dispatcher
    /// hands it out, or `https://host:port` over TLS checked against `tls`'s CA) and says
    /// hello for `job` with `token`.
    pub async fn connect(
        addr: &str,
        job: u64,
        token: &str,
        tls: Option<&ClientTls>,
    ) -> Result<Self, DataPlaneError> {
        let token_len = u16::try_from(token.len())
            .ok()
            .filter(|&n| n > 0 && n <= MAX_TOKEN_BYTES)
            .ok_or(DataPlaneError::InvalidToken)?;
        let host = host_port(addr);
        let io = |source| DataPlaneError::Io {
            addr: host.to_owned(),
            source,
        };
        let mut stream = tls::dial(addr, tls, tls::Protocol::DataPlane).await?;
        let mut hello = Vec::with_capacity(18 + token.len());
        hello.extend_from_slice(&DATA_PLANE_MAGIC);
        hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        hello.extend_from_slice(&job.to_le_bytes());
        hello.extend_from_slice(&token_len.to_le_bytes());
        hello.extend_from_slice(token.as_bytes());
        send(&mut stream, &hello).await.map_err(io)?;
        let verdict = stream.read_u8().await.map_err(io)?;
        match verdict {
            WELCOME | WELCOME_LOCAL => Ok(DataPlaneClient {
                addr: host.to_owned(),
                loopback: verdict == WELCOME_LOCAL
                    && stream
                        .tcp()
                        .peer_addr()
                        .is_ok_and(|peer| on_this_machine(peer.ip())),
                stream,
                answers: Vec::new(),
            }),
            REFUSED => {
                let reason = read_reason(&mut stream).await.map_err(io)?;
                Err(DataPlaneError::Refused {
                    addr: host.to_owned(),
                    reason,
                })
            }
            other => Err(DataPlaneError::Protocol {
                addr: host.to_owned(),
                what: format!("hello verdict {other}"),
            }),
        }
    }

    /// The receiver's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one frame and waits for the receiver's answer.
    pub async fn push(&mut self, frame: &[u8]) -> Result<PushAnswer, DataPlaneError> {
        self.push_pieces(&[frame]).await
    }

    /// Sends one frame given in parts (the tensors' values straight from their memory) and
    /// waits for the receiver's answer.
    pub async fn push_parts(
        &mut self,
        frame: &FrameParts<'_>,
    ) -> Result<PushAnswer, DataPlaneError> {
        self.send_parts(frame).await?;
        self.read_answer().await
    }

    /// Sends one frame given in parts without waiting for its answer: the caller reads it
    /// later with [`Self::read_answer`] (answers come in the order of the frames), and may do
    /// other work meanwhile.
    pub async fn send_parts(&mut self, frame: &FrameParts<'_>) -> Result<(), DataPlaneError> {
        self.send_frames(std::slice::from_ref(frame)).await
    }

    /// Sends several frames, in order, with as few vectored writes as the kernel allows (one,
    /// unless the socket's buffer fills or the pieces pass the system's limit per call),
    /// without waiting for their answers: one answer per frame follows, in the same order.
    pub async fn send_frames<F: Frame>(&mut self, frames: &[F]) -> Result<(), DataPlaneError> {
        let prefixes = frame_prefixes(frames)?;
        self.write_slices(&mut burst_slices(frames, &prefixes))
            .await
    }

    /// Sends the frame made of `pieces` with vectored writes, then reads the answer.
    async fn push_pieces(&mut self, pieces: &[&[u8]]) -> Result<PushAnswer, DataPlaneError> {
        self.send_pieces(pieces).await?;
        self.read_answer().await
    }

    /// Sends the frame made of `pieces` with vectored writes.
    async fn send_pieces(&mut self, pieces: &[&[u8]]) -> Result<(), DataPlaneError> {
        let prefix = frame_prefix(pieces.iter().map(|p| p.len()).sum())?;
        let mut slices = Vec::with_capacity(pieces.len() + 1);
        slices.push(IoSlice::new(&prefix));
        slices.extend(pieces.iter().map(|p| IoSlice::new(p)));
        self.write_slices(&mut slices).await
    }

    /// Writes every byte of `slices` (vectored writes, as many as the kernel needs) and
    /// flushes.
    async fn write_slices(&mut self, slices: &mut [IoSlice<'_>]) -> Result<(), DataPlaneError> {
        let addr = &self.addr;
        let io = |source| DataPlaneError::Io {
            addr: addr.clone(),
            source,
        };
        let mut unsent: &mut [IoSlice<'_>] = slices;
        while !unsent.is_empty() {
            let sent = self.stream.write_vectored(unsent).await.map_err(io)?;
            if sent == 0 {
                return Err(io(std::io::ErrorKind::WriteZero.into()));
            }
            IoSlice::advance_slices(&mut unsent, sent);
        }
        // Over TLS the last records may still sit in the session's buffer.
        self.stream.flush().await.map_err(io)
    }

    /// Reads the answer to the oldest frame sent and not yet answered.
    pub async fn read_answer(&mut self) -> Result<PushAnswer, DataPlaneError> {
        let addr = &self.addr;
        let io = |source| DataPlaneError::Io {
            addr: addr.clone(),
            source,
        };
        // Status, retry_after_ms and the reason's length, then the reason.
        fill_answers(&mut self.stream, &mut self.answers, 7)
            .await
            .map_err(io)?;
        let [code, r0, r1, r2, r3, l0, l1] = [0, 1, 2, 3, 4, 5, 6].map(|i| self.answers[i]);
        let retry_after_ms = u32::from_le_bytes([r0, r1, r2, r3]);
        let end = 7 + usize::from(u16::from_le_bytes([l0, l1]));
        fill_answers(&mut self.stream, &mut self.answers, end)
            .await
            .map_err(io)?;
        let reason = String::from_utf8_lossy(&self.answers[7..end]).into_owned();
        self.answers.drain(..end);
        let status = PushStatus::try_from(i32::from(code))
            .ok()
            .filter(|s| *s != PushStatus::Unspecified)
            .ok_or_else(|| DataPlaneError::Protocol {
                addr: self.addr.clone(),
                what: format!("push status {code}"),
            })?;
        Ok(PushAnswer {
            status,
            retry_after_ms: u64::from(retry_after_ms),
            reason,
        })
    }
}

/// Reads until `answers` holds at least `want` bytes: whatever has arrived, up to
/// [`ANSWER_READ`] bytes per read.
async fn fill_answers(
    stream: &mut (impl AsyncRead + Unpin),
    answers: &mut Vec<u8>,
    want: usize,
) -> std::io::Result<()> {
    if answers.len() >= want {
        // Mostly so: one read takes a whole burst's answers (no 4 KiB buffer to zero per frame).
        return Ok(());
    }
    let mut chunk = [0u8; ANSWER_READ];
    while answers.len() < want {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        answers.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

/// The length prefixes of a burst's frames, or the error for the first one over the limit.
pub fn frame_prefixes<F: Frame>(frames: &[F]) -> Result<Vec<[u8; 4]>, DataPlaneError> {
    frames.iter().map(|f| frame_prefix(f.frame_len())).collect()
}

/// A burst's bytes on the wire, in order: each frame's prefix (from [`frame_prefixes`]), then
/// its pieces.
pub fn burst_slices<'a, F: Frame>(frames: &'a [F], prefixes: &'a [[u8; 4]]) -> Vec<IoSlice<'a>> {
    let mut slices =
        Vec::with_capacity(frames.len() + frames.iter().map(|f| f.pieces().count()).sum::<usize>());
    for (frame, prefix) in frames.iter().zip(prefixes) {
        slices.push(IoSlice::new(prefix));
        slices.extend(frame.pieces().map(IoSlice::new));
    }
    slices
}

/// A frame's length prefix, or the error for a frame over the limit.
fn frame_prefix(len: usize) -> Result<[u8; 4], DataPlaneError> {
    u32::try_from(len)
        .ok()
        .filter(|&n| u64::from(n) <= max_frame_bytes())
        .map(u32::to_le_bytes)
        .ok_or(DataPlaneError::FrameTooLarge {
            bytes: len,
            limit: MAX_MESSAGE_BYTES,
        })
}

fn max_frame_bytes() -> u64 {
    u64::try_from(MAX_MESSAGE_BYTES).unwrap_or(u64::MAX)
}

async fn read_reason(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<String> {
    let len = stream.read_u16_le().await?;
    let mut reason = vec![0u8; usize::from(len)];
    stream.read_exact(&mut reason).await?;
    Ok(String::from_utf8_lossy(&reason).into_owned())
}

/// Writes `bytes` and flushes them: a TLS stream keeps what the socket did not take yet in its
/// session's buffer, and both ends wait for an answer after each message (a plain TCP
/// stream's flush does nothing).
async fn send(stream: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// `reason` cut to [`MAX_REASON_BYTES`] at a character boundary.
fn bounded(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Appends a reason (length u16, bytes) to `out`.
fn put_reason(out: &mut Vec<u8>, reason: &str) {
    let reason = bounded(reason);
    let len = u16::try_from(reason.len()).unwrap_or(0);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&reason.as_bytes()[..usize::from(len)]);
}

/// The bytes of a push answer.
fn answer_bytes(status: PushStatus, retry_after_ms: u64, reason: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(7 + reason.len());
    // PushStatus's numbers are 0..=4.
    out.push(u8::try_from(i32::from(status)).unwrap_or(0));
    out.extend_from_slice(
        &u32::try_from(retry_after_ms)
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    put_reason(&mut out, reason);
    out
}

/// Why a hello was refused (said to the peer and logged).
#[derive(Debug)]
struct Refusal(String);

/// Reads and checks a hello; the buffer is not touched.
async fn read_hello(
    stream: &mut (impl AsyncRead + Unpin),
    service: &ReceiverService,
) -> Result<(), Refusal> {
    let broken = |e: std::io::Error| Refusal(format!("incomplete hello: {e}"));
    let mut head = [0u8; 18];
    stream.read_exact(&mut head).await.map_err(broken)?;
    let [m0, m1, m2, m3, v0, v1, v2, v3, j0, j1, j2, j3, j4, j5, j6, j7, t0, t1] = head;
    if [m0, m1, m2, m3] != DATA_PLANE_MAGIC {
        return Err(Refusal("not a data-plane hello".to_owned()));
    }
    let version = u32::from_le_bytes([v0, v1, v2, v3]);
    let job = u64::from_le_bytes([j0, j1, j2, j3, j4, j5, j6, j7]);
    let token_len = u16::from_le_bytes([t0, t1]);
    if token_len > MAX_TOKEN_BYTES {
        return Err(Refusal(format!(
            "a {token_len}-byte token is over the limit of {MAX_TOKEN_BYTES}"
        )));
    }
    let mut token = vec![0u8; usize::from(token_len)];
    stream.read_exact(&mut token).await.map_err(broken)?;
    if !constant_time_eq(&token, service.token().as_bytes()) {
        return Err(Refusal("wrong token for this job".to_owned()));
    }
    if job != service.job() {
        return Err(Refusal(format!(
            "this receiver serves job-{}, not job-{job}",
            service.job()
        )));
    }
    if version != PROTOCOL_VERSION {
        return Err(Refusal(format!(
            "protocol version {version}; this receiver speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(())
}

/// Reads a frame of `len` bytes and decodes it: the message, the answer to a frame the codec
/// refused, or the connection's error (it broke or ended mid-frame). An uncompressed frame is
/// decoded as it arrives, its values read into the tensors' memory
/// ([`stream::read_raw_frame`]); any other is read into `frame` (cleared first; it grows with
/// the bytes that actually arrive, by at most [`READ_CHUNK`] ahead of them, whatever the
/// prefix said), summed as the bytes arrive, and decoded by `decoder`. An unsummed frame is
/// taken only when `unsummed_from` is None (the peer is on this machine).
async fn read_frame(
    incoming: &mut Incoming<impl AsyncRead + Unpin>,
    len: u32,
    frame: &mut Vec<u8>,
    decoder: &mut StepDecoder,
    service: &ReceiverService,
    unsummed_from: Option<&str>,
) -> std::io::Result<Result<StepMessage, Verdict>> {
    let len = usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidData)?;
    frame.clear();
    let mut sum = FrameChecksum::default();
    if len >= HEADER_LEN {
        let mut head = [0u8; HEADER_LEN];
        incoming.read_exact_into(&mut head).await?;
        if let Ok(header) = FrameHeader::parse(&head, decoder.max_message_bytes()) {
            if stream::streams(&header) {
                let limit = decoder.max_message_bytes();
                let decoded = stream::read_raw_frame(
                    incoming,
                    &head,
                    &header,
                    len_u64(len),
                    limit,
                    service.pool(),
                    unsummed_from,
                )
                .await;
                return match decoded {
                    Ok(msg) => Ok(Ok(msg)),
                    Err(StreamFault::Refused(e)) => Ok(Err(service.refuse_frame(&e))),
                    Err(StreamFault::Io(e)) => Err(e),
                };
            }
        }
        frame.extend_from_slice(&head);
        sum.update(&head);
    }
    let rest = len - frame.len();
    incoming
        .read_summed(rest, frame, READ_CHUNK, &mut sum)
        .await?;
    Ok(decoder
        .decode_summed(frame, &sum)
        .map_err(|e| service.refuse_frame(&e)))
}

/// The most decoded frames, and about the most of their bytes, a connection holds before
/// offering them: a burst's frames already buffered are offered together (one lock, one
/// wake-up of the consumer), a few at a time; a large frame is offered at once (held frames
/// are outside the receiver's window, which bounds its memory).
const MOST_HELD: usize = 64;
const MOST_HELD_BYTES: usize = 1 << 20;

/// Offers the `held` messages (see [`ReceiverService::offer_messages`]) and appends their
/// answers to `owed`. False when the connection ends there: a message was rejected (its
/// answer is the last owed), or the receiver was closed (a newer one replaced it: that frame
/// and the rest are not answered, since an answer would count them as delivered; the sender
/// sees the connection end and pushes to the receiver the dispatcher names now).
fn offer_held(
    service: &ReceiverService,
    held: &mut Vec<StepMessage>,
    owed: &mut Vec<u8>,
    peer: Option<SocketAddr>,
) -> bool {
    if held.is_empty() {
        return true;
    }
    for verdict in service.offer_messages(std::mem::take(held)) {
        let Some(verdict) = verdict else {
            tracing::debug!(?peer, "data plane: the receiver was replaced; closing");
            return false;
        };
        owed.extend_from_slice(&verdict_bytes(&verdict));
        if verdict.status == PushStatus::Rejected {
            tracing::warn!(?peer, reason = %verdict.reason, "data plane: closing after a rejected frame");
            return false;
        }
    }
    true
}

/// A verdict's answer on the wire.
fn verdict_bytes(verdict: &Verdict) -> Vec<u8> {
    answer_bytes(verdict.status, verdict.retry_after_ms, &verdict.reason)
}

/// Whether `ip` is a loopback address (also IPv4 in IPv6): a peer on this machine.
fn on_this_machine(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// None when `peer` is on this machine (a loopback address, also IPv4 in IPv6), which may
/// leave the frame checksum out (see the codec's docs); else how to name it in a refusal.
fn unsummed_from(peer: Option<SocketAddr>) -> Option<String> {
    match peer {
        Some(p) if on_this_machine(p.ip()) => None,
        Some(p) => Some(p.to_string()),
        None => Some("a peer of unknown address".to_owned()),
    }
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Serves one data-plane connection (its first bytes are [`DATA_PLANE_MAGIC`]; plaintext or
/// TLS, with Nagle's delay off) until the peer closes it, it breaks the protocol, or `stop`
/// turns true.
pub(crate) async fn serve_connection(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    peer: Option<SocketAddr>,
    service: ReceiverService,
    refusal: Option<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut stream, &service)).await {
        // Said whatever the hello was (it is read first, so the peer is not reset mid-write).
        Ok(_) if refusal.is_some() => Err(Refusal(refusal.unwrap_or_default())),
        Ok(hello) => hello,
        Err(_) => Err(Refusal("no hello in time".to_owned())),
    };
    if let Err(Refusal(reason)) = hello {
        tracing::warn!(?peer, %reason, "data plane: refused a connection");
        let mut out = vec![REFUSED];
        put_reason(&mut out, &reason);
        let _ = send(&mut stream, &out).await;
        return;
    }
    let unsummed_from = unsummed_from(peer);
    let welcome = if unsummed_from.is_none() {
        WELCOME_LOCAL
    } else {
        WELCOME
    };
    if send(&mut stream, &[welcome]).await.is_err() {
        return;
    }
    let mut decoder = StepDecoder::new(max_frame_bytes());
    let mut frame = Vec::new();
    let mut incoming = Incoming::new(stream);
    // Frames decoded and not yet offered, and answers not yet written: while the next frame's
    // bytes are already here (a worker's burst), its frame joins them, so that a burst is
    // offered under one lock and answered with one write.
    let mut held = Vec::new();
    let mut held_bytes = 0;
    let mut owed = Vec::new();
    loop {
        let len = tokio::select! {
            biased;
            _ = stop.changed() => return,
            len = incoming.read_u32_le() => match len {
                Ok(len) => len,
                // The peer closed between frames (or broke): the normal end.
                Err(_) => return,
            },
        };
        if u64::from(len) > max_frame_bytes() {
            let reason =
                format!("a {len}-byte frame is over the limit of {MAX_MESSAGE_BYTES} bytes");
            tracing::warn!(?peer, %reason, "data plane: closing a connection");
            if offer_held(&service, &mut held, &mut owed, peer) {
                owed.extend_from_slice(&answer_bytes(PushStatus::Rejected, 0, &reason));
            }
            let _ = send(incoming.get_mut(), &owed).await;
            return;
        }
        let read = read_frame(
            &mut incoming,
            len,
            &mut frame,
            &mut decoder,
            &service,
            unsummed_from.as_deref(),
        )
        .await;
        incoming.expect_frames_of(usize::try_from(len).unwrap_or(usize::MAX));
        let refused = match read {
            Ok(Ok(msg)) => {
                held.push(msg);
                held_bytes += usize::try_from(len).unwrap_or(usize::MAX);
                None
            }
            Ok(Err(refusal)) => Some(refusal),
            Err(e) => {
                tracing::warn!(?peer, declared = len, cause = %e, "data plane: a frame broke off; closing");
                offer_held(&service, &mut held, &mut owed, peer);
                let _ = send(incoming.get_mut(), &owed).await;
                return;
            }
        };
        if refused.is_none()
            && held.len() < MOST_HELD
            && held_bytes < MOST_HELD_BYTES
            && !incoming.buffered().is_empty()
        {
            continue;
        }
        held_bytes = 0;
        let mut open = offer_held(&service, &mut held, &mut owed, peer);
        // A refused frame ends the connection once the frames before it are answered.
        if let Some(refusal) = refused {
            if open {
                tracing::warn!(?peer, reason = %refusal.reason, "data plane: closing after a rejected frame");
                owed.extend_from_slice(&verdict_bytes(&refusal));
            }
            open = false;
        }
        let sent = send(incoming.get_mut(), &owed).await;
        owed.clear();
        if sent.is_err() || !open {
            return;
        }
    }
}

#[cfg(test)]
#[path = "data_plane_tests.rs"]
mod tests;
