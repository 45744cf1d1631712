//! Lode's service protocol (`lode.v1`, `protos/lode/service/lode.proto`): the generated prost
//! messages and tonic client and server, plus what both ends must agree on: the protocol
//! version, the message size limit and the bearer-token metadata.
//!
//! A client that talks to a dispatcher:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lode_proto::service::{connect, v1::StatusRequest};
//! let mut client = connect("http://127.0.0.1:7000", "job-token", None).await?;
//! let status = client.status(StatusRequest { job_id: 1 }).await?.into_inner();
//! # let _ = status; Ok(()) }
//! ```

use std::fmt;

use hyper_util::rt::TokioIo;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::tls::{self, ClientTls, DialError};

/// Generated prost + tonic code; regenerate by building (see `build.rs`).
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    missing_docs,
    missing_debug_implementations,
    unused,
    unsafe_code
)]
#[rustfmt::skip]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/service/lode.v1.rs"));
}

/// The byte buffer type of the protocol's `bytes` fields that are shared rather than copied
/// (step frames, stage graphs).
pub use prost::bytes::Bytes;

/// The protocol version this build speaks; `Register` refuses a worker that speaks another.
/// Bump it with any change a worker must understand (or that a worker relies on the dispatcher
/// understanding). 2: a lease request carries the worker's report (`LeaseRequest.completed`),
/// which a version-1 dispatcher would drop unread. 3: step frames are of format version 2 (an
/// XXH3-64 checksum instead of a CRC32C, see `lode_transfer::codec`). 4: a worker
/// on its receiver's machine sends uncompressed frames unsummed (compression byte 2), which a
/// version-3 receiver would refuse frame by frame. 5: a request may carry up to 1024 steps
/// ([`MAX_STEPS_PER_REQUEST`], was 256), which a version-4 dispatcher refuses. 6: a lease's
/// consecutive records come as a range (`StepLease.records_from`, `records_count`), which a
/// version-5 worker would read as an empty batch. 7: a batch of consecutive steps comes as
/// runs (`StepLease.run_steps`, `CompletedStep.run_steps`, see [`crate::runs`]), which a
/// version-6 worker would read as one step and a version-6 dispatcher as one report.
pub const PROTOCOL_VERSION: u32 = 7;

/// The largest message either end encodes or decodes. Sized for `Register`'s answer, which
/// carries the plan and a stage graph.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The most steps one `Lease` grants or one `Complete` (or a lease's `completed`) reports:
/// bounds an answer and the work one request does under the dispatcher's lock. A worker's
/// batch of short steps is up to 256 (its lease limit is its share of a receiver window of up
/// to 1024 steps by default), and a report riding on a lease carries a batch and the last
/// burst before it, so the limit leaves room for several batches.
pub const MAX_STEPS_PER_REQUEST: u32 = 1024;

/// The most records in one step: bounds a lease answer (at most 10 bytes a record), a
/// journal line well below their limits, and what a worker expands a lease's range into.
pub const MAX_BATCH_RECORDS: u64 = 1 << 20;

/// A lease's records in no form a worker can read (see [`v1::StepLease::take_records`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    #[error("the records are both listed ({listed}) and given as a range ({count} from {from})")]
    BothForms {
        listed: usize,
        from: u64,
        count: u64,
    },
    #[error("the range of {count} records from {from} passes the largest record id")]
    Overflow { from: u64, count: u64 },
    #[error("{count} records is more than the {MAX_BATCH_RECORDS}-record limit of a step")]
    TooMany { count: u64 },
}

impl v1::StepLease {
    /// Sets the step's records: as the range `records_from`, `records_count` when they are
    /// consecutive ascending ids (an unshuffled pipeline's steps), else listed.
    pub fn set_records(&mut self, records: Vec<u64>) {
        let count = u64::try_from(records.len()).unwrap_or(u64::MAX);
        let consecutive = || {
            records
                .windows(2)
                .all(|w| w[0].checked_add(1) == Some(w[1]))
        };
        match records.first() {
            // The range's end must be a u64 too (a lone u64::MAX stays listed).
            Some(&from) if from.checked_add(count).is_some() && consecutive() => {
                self.records = Vec::new();
                self.records_from = from;
                self.records_count = count;
            }
            _ => {
                self.records = records;
                self.records_from = 0;
                self.records_count = 0;
            }
        }
    }

    /// The step's records in either form, moved out of the lease.
    pub fn take_records(&mut self) -> Result<Vec<u64>, RecordsError> {
        let (from, count) = (self.records_from, self.records_count);
        if count == 0 {
            return Ok(std::mem::take(&mut self.records));
        }
        if !self.records.is_empty() {
            return Err(RecordsError::BothForms {
                listed: self.records.len(),
                from,
                count,
            });
        }
        if count > MAX_BATCH_RECORDS {
            return Err(RecordsError::TooMany { count });
        }
        let end = from
            .checked_add(count)
            .ok_or(RecordsError::Overflow { from, count })?;
        Ok((from..end).collect())
    }
}

/// The metadata key that carries the job's token, as `Bearer <token>`.
pub const AUTHORIZATION: &str = "authorization";

/// The scheme before the token in [`AUTHORIZATION`].
pub const BEARER: &str = "Bearer ";

/// A dispatcher client that sends the job's token with every request.
pub type DispatcherClient =
    v1::dispatcher_client::DispatcherClient<InterceptedService<Channel, BearerAuth>>;

/// A receiver client (data workers push step frames) that sends the job's token.
pub type ReceiverClient =
    v1::receiver_client::ReceiverClient<InterceptedService<Channel, BearerAuth>>;

/// Server side: checks that `metadata` carries `Bearer <expected>` (compared in constant
/// time). The error is the status to answer with; it never says which part was wrong beyond
/// missing vs. wrong.
#[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
pub fn check_bearer(metadata: &tonic::metadata::MetadataMap, expected: &str) -> Result<(), Status> {
    let presented = metadata
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix(BEARER));
    match presented {
        None => Err(Status::unauthenticated(
            "missing `authorization: Bearer <token>` metadata",
        )),
        Some(token) if !constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
            Err(Status::unauthenticated("wrong token for this job"))
        }
        Some(_) => Ok(()),
    }
}

/// What a server checks before it reads a request: plaintext refused where TLS is served, the
/// job's token (constant time), then the job. A refused request is logged with `rpc`, the
/// peer and why, and touches no state. `server` names the server in the refusal
/// ("this dispatcher serves job-1, not job-2").
#[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
pub fn authorize<T>(
    request: &tonic::Request<T>,
    rpc: &'static str,
    token: &str,
    (served, asked): (u64, u64),
    server: &str,
) -> Result<(), Status> {
    crate::tls::refuse_plaintext(request)?;
    let remote = crate::tls::peer(request);
    if let Err(status) = check_bearer(request.metadata(), token) {
        tracing::warn!(rpc, ?remote, "rejected: {}", status.message());
        return Err(status);
    }
    if asked != served {
        tracing::warn!(
            rpc,
            ?remote,
            job = asked,
            "rejected: request for another job"
        );
        return Err(Status::permission_denied(format!(
            "this {server} serves job-{served}, not job-{asked}"
        )));
    }
    Ok(())
}

/// Whether a status means the peer could not be reached (restarting, gone): tonic reports a
/// refused connection as UNAVAILABLE and a connection dropped mid-call as UNKNOWN or (the
/// connection closed under the call) CANCELLED.
pub fn is_unreachable(status: &Status) -> bool {
    matches!(
        status.code(),
        // Cancelled: the client's call ended with its connection (the peer exited or
        // restarted mid-call); no Lode server answers it.
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// Calls `rpc` until it answers, retrying with backoff (10 ms doubling to 500 ms) while the
/// peer is unreachable, for at most `window`; any other error is returned at once.
pub async fn retry_unreachable<T, F, Fut>(
    window: std::time::Duration,
    mut rpc: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        match rpc().await {
            Ok(answer) => return Ok(answer.into_inner()),
            Err(status) if is_unreachable(&status) && started.elapsed() < window => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            Err(status) => return Err(status),
        }
    }
}

/// Byte equality whose time does not depend on where the first difference is.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
pub struct BearerAuth {
    value: MetadataValue<Ascii>,
}

impl BearerAuth {
    /// Fails when the token cannot travel in metadata (not visible ASCII, or empty).
    pub fn new(token: &str) -> Result<Self, ClientError> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::InvalidToken);
        }
        let value = format!("{BEARER}{token}")
            .parse()
            .map_err(|_| ClientError::InvalidToken)?;
        Ok(Self { value })
    }
}

impl fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerAuth(<redacted>)")
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, self.value.clone());
        Ok(request)
    }
}

/// Errors of [`connect`] and [`BearerAuth::new`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the job token must be non-empty visible ASCII")]
    InvalidToken,
    #[error("invalid dispatcher address {addr:?}")]
    InvalidAddress {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    Dial(#[from] DialError),
}

impl ClientError {
    /// Whether the server was not up or went away (worth retrying), rather than refused this
    /// client (a certificate it does not trust, no CA for an https address, a bad token).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClientError::Connect { source, .. } => {
                dial_cause(source).is_none_or(DialError::is_unreachable)
            }
            ClientError::Dial(e) => e.is_unreachable(),
            ClientError::InvalidToken | ClientError::InvalidAddress { .. } => false,
        }
    }
}

/// The [`DialError`] a connection failure comes from, when the TLS connector failed.
fn dial_cause(err: &tonic::transport::Error) -> Option<&DialError> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cause {
        if let Some(dial) = e.downcast_ref::<DialError>() {
            return Some(dial);
        }
        cause = e.source();
    }
    None
}

/// An RPC a server answered with an error status, said briefly: the call, the code and the
/// server's message (tonic's own display adds details and metadata nobody reads). The
/// transport error under a failed call, if any, is its source.
#[derive(Debug)]
pub struct RpcError {
    pub rpc: &'static str,
    pub status: Status,
}

impl RpcError {
    /// A `map_err` adapter naming the call.
    pub fn of(rpc: &'static str) -> impl FnOnce(Status) -> RpcError {
        move |status| RpcError { rpc, status }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {:?}", self.rpc, self.status.code())?;
        if !self.status.message().is_empty() {
            write!(f, ": {}", self.status.message())?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.status)
    }
}

/// Connects to the dispatcher at `addr` (`http://host:port`, or `https://host:port` over TLS
/// checked against `tls`'s CA), sending `token` with every request and accepting messages up
/// to [`MAX_MESSAGE_BYTES`].
pub async fn connect(
    addr: &str,
    token: &str,
    tls: Option<&ClientTls>,
) -> Result<DispatcherClient, ClientError> {
    let auth = BearerAuth::new(token)?;
    Ok(with_auth(open_channel(addr, tls).await?, auth))
}

/// Connects to a receiver (`http://host:port` or `https://host:port`) like [`connect`] does.
pub async fn connect_receiver(
    addr: &str,
    token: &str,
    tls: Option<&ClientTls>,
) -> Result<ReceiverClient, ClientError> {
    let auth = BearerAuth::new(token)?;
    let channel = open_channel(addr, tls).await?;
    Ok(
        v1::receiver_client::ReceiverClient::with_interceptor(channel, auth)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// How often a channel pings its peer over HTTP/2. Across hosts a cut link or a frozen peer
/// leaves the TCP connection open, and its requests would wait on retransmissions for
/// minutes; a ping unanswered within [`KEEPALIVE_TIMEOUT`] closes the connection instead, so
/// that the channel reconnects (at once when the link is back) and its requests fail fast.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a keepalive ping may go unanswered before the connection is closed: long enough
/// for a ping queued behind a step's frame on a slow link.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a connection attempt may take (a peer behind a cut link never answers its SYN).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A channel to `addr`: tonic's own connector in plaintext, [`tls::dial`] over TLS (also
/// when tonic reconnects).
async fn open_channel(addr: &str, tls: Option<&ClientTls>) -> Result<Channel, ClientError> {
    let trust = tls::trust_for(addr, tls)?.cloned();
    let endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|source| ClientError::InvalidAddress {
            addr: addr.to_owned(),
            source,
        })?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let connected = match trust {
        None => endpoint.connect().await,
        Some(trust) => {
            let target: std::sync::Arc<str> = addr.into();
            let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                let (trust, target) = (trust.clone(), target.clone());
                async move {
                    tls::dial(&target, Some(&trust), tls::Protocol::Grpc)
                        .await
                        .map(TokioIo::new)
                }
            });
            endpoint.connect_with_connector(connector).await
        }
    };
    connected.map_err(|source| ClientError::Connect {
        addr: addr.to_owned(),
        source,
    })
}

/// Wraps an existing channel (e.g. a lazily connecting one) like [`connect`] does.
pub fn with_auth(channel: Channel, auth: BearerAuth) -> DispatcherClient {
    v1::dispatcher_client::DispatcherClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn messages_round_trip() {
        let answer = v1::LeaseResponse {
            outcome: Some(v1::lease_response::Outcome::Lease(v1::StepLease {
                stage: 1,
                epoch: 2,
                step: 3,
                records: vec![5, 8, 13],
                deadline_ms: 1_000,
                now_ms: 10,
                generation: 4,
                records_from: 0,
                records_count: 0,
                run_steps: 0,
            })),
            max_leases: 7,
            refused: vec![v1::StepRef { epoch: 1, step: 2 }],
        };
        let bytes = answer.encode_to_vec();
        let back = v1::LeaseResponse::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(back, answer);
    }

    #[test]
    fn consecutive_records_travel_as_a_range_and_come_back_listed() {
        let mut lease = v1::StepLease::default();
        lease.set_records(vec![40, 41, 42, 43]);
        assert!(lease.records.is_empty());
        assert_eq!((lease.records_from, lease.records_count), (40, 4));
        let back = v1::StepLease::decode(lease.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(back.clone().take_records(), Ok(vec![40, 41, 42, 43]));

        // Shuffled, descending, repeated or empty, or a range whose end would pass u64::MAX:
        // listed as they are.
        let shuffled = [
            vec![3, 1, 2],
            vec![2, 1],
            vec![5, 5],
            vec![],
            vec![u64::MAX, 0],
        ];
        for records in shuffled.into_iter().chain([vec![u64::MAX]]) {
            let mut lease = v1::StepLease::default();
            lease.set_records(records.clone());
            assert_eq!(lease.records_count, 0, "{records:?}");
            assert_eq!(lease.take_records(), Ok(records));
        }
        // One record is a range of one; the largest id is a range that just fits.
        let mut lease = v1::StepLease::default();
        lease.set_records(vec![u64::MAX - 1]);
        assert_eq!((lease.records_from, lease.records_count), (u64::MAX - 1, 1));
        assert_eq!(lease.take_records(), Ok(vec![u64::MAX - 1]));
    }

    #[test]
    fn a_lease_whose_records_a_worker_cannot_read_says_why() {
        let both = v1::StepLease {
            records: vec![1],
            records_from: 2,
            records_count: 3,
            ..Default::default()
        };
        assert_eq!(
            both.clone().take_records(),
            Err(RecordsError::BothForms {
                listed: 1,
                from: 2,
                count: 3
            })
        );
        let past_the_end = v1::StepLease {
            records_from: u64::MAX - 1,
            records_count: 2,
            ..Default::default()
        };
        assert_eq!(
            past_the_end.clone().take_records(),
            Err(RecordsError::Overflow {
                from: u64::MAX - 1,
                count: 2
            })
        );
        let huge = v1::StepLease {
            records_count: MAX_BATCH_RECORDS + 1,
            ..Default::default()
        };
        let err = huge.clone().take_records().expect_err("too many");
        assert_eq!(
            err,
            RecordsError::TooMany {
                count: MAX_BATCH_RECORDS + 1
            }
        );
        assert_eq!(
            err.to_string(),
            "1048577 records is more than the 1048576-record limit of a step"
        );
    }

    #[test]
    fn rpc_errors_say_the_call_the_code_and_the_message() {
        let err = RpcError::of("Drain")(Status::not_found("worker-9 is not registered"));
        assert_eq!(
            err.to_string(),
            "Drain failed: NotFound: worker-9 is not registered"
        );
        let bare = RpcError::of("Status")(Status::unavailable(""));
        assert_eq!(bare.to_string(), "Status failed: Unavailable");
    }

    #[tokio::test]
    async fn an_https_address_without_a_ca_is_refused_before_dialing() {
        let err = connect("https://127.0.0.1:1", "token", None)
            .await
            .expect_err("no CA");
        assert!(
            matches!(err, ClientError::Dial(DialError::NoCa { .. })),
            "{err:?}"
        );
        assert!(!err.is_unreachable());
        let text = err.to_string();
        assert!(
            text.contains("https://127.0.0.1:1") && text.contains("--tls-ca"),
            "{text}"
        );
    }

    #[test]
    fn bearer_auth_adds_the_token_and_refuses_unsendable_ones() {
        use tonic::service::Interceptor;
        let mut auth = BearerAuth::new("s3cret").expect("valid token");
        let request = auth.call(Request::new(())).expect("intercepted");
        let value = request.metadata().get(AUTHORIZATION).expect("header set");
        assert_eq!(value.to_str().ok(), Some("Bearer s3cret"));
        assert!(!format!("{auth:?}").contains("s3cret"));
        for bad in ["", "has space", "new\nline", "ünï"] {
            assert!(
                matches!(BearerAuth::new(bad), Err(ClientError::InvalidToken)),
                "{bad:?}"
            );
        }
    }
}
