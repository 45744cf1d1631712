//! The `lode.v1.Receiver` endpoint: a thin layer over [`SharedReceiver`]. Every request is
//! checked for the job's token and id before it touches the buffer; a malformed frame is
//! rejected with its reason and logged; a full buffer answers `RETRY` (backpressure: the
//! worker pushes again later) rather than blocking a server thread.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lode_proto::service::v1::receiver_server::{Receiver, ReceiverServer};
use lode_proto::service::v1::{FetchRequest, FetchResponse, PushRequest, PushResponse, PushStatus};
use lode_proto::service::{check_bearer, MAX_MESSAGE_BYTES};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::ServiceError;
use crate::transfer::{CodecConfig, Compression, Offer, SharedReceiver, StepDecoder, StepEncoder};

/// How long a pushing worker waits before retrying when the buffer is full.
pub const RETRY_AFTER: Duration = Duration::from_millis(20);

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

    #[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
    fn authorize<T>(
        &self,
        rpc: &'static str,
        request: &Request<T>,
        job: u64,
    ) -> Result<(), Status> {
        if let Err(status) = check_bearer(request.metadata(), &self.token) {
            tracing::warn!(rpc, remote = ?request.remote_addr(), "rejected: {}", status.message());
            return Err(status);
        }
        if job != self.job {
            tracing::warn!(rpc, remote = ?request.remote_addr(), job, "rejected: another job");
            return Err(Status::permission_denied(format!(
                "this receiver serves job-{}, not job-{job}",
                self.job
            )));
        }
        Ok(())
    }
}

fn answer(status: PushStatus, reason: String) -> Response<PushResponse> {
    Response::new(PushResponse {
        status: status.into(),
        retry_after_ms: if status == PushStatus::Retry {
            u64::try_from(RETRY_AFTER.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        },
        reason,
    })
}

#[tonic::async_trait]
impl Receiver for ReceiverService {
    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        self.authorize("Push", &request, request.get_ref().job_id)?;
        let frame = request.into_inner().frame;
        let msg = match StepDecoder::new(MAX_MESSAGE_BYTES as u64).decode(&frame) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(cause = %e, "rejected a malformed step frame");
                return Ok(answer(PushStatus::Rejected, e.to_string()));
            }
        };
        let (step, stage) = (msg.step, msg.stage);
        Ok(match self.buffer.try_push(msg) {
            Offer::Accepted => answer(PushStatus::Accepted, String::new()),
            Offer::Duplicate | Offer::Stale => answer(PushStatus::Duplicate, String::new()),
            Offer::TooFarAhead => answer(PushStatus::Retry, String::new()),
            Offer::Rejected(why) => {
                tracing::warn!(step, stage, reason = ?why, "rejected a step message");
                answer(PushStatus::Rejected, format!("{why:?}"))
            }
        })
    }

    async fn fetch(
        &self,
        request: Request<FetchRequest>,
    ) -> Result<Response<FetchResponse>, Status> {
        self.authorize("Fetch", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let Some(msg) = self.buffer.peek(req.stage, req.step) else {
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

/// Serves `service` on `listener` until `shutdown` resolves.
pub async fn serve_receiver(
    listener: TcpListener,
    service: ReceiverService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServiceError> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(
            ReceiverServer::new(service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|source| ServiceError::Serve { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::{ReceiverConfig, StepMessage};
    use crate::{Tensor, TensorData};
    use lode_proto::service::connect_receiver;

    fn message(job: u64, stage: u32, step: u64) -> StepMessage {
        StepMessage {
            job,
            stage,
            step,
            epoch: 0,
            records: vec![step * 2, step * 2 + 1],
            tensors: vec![Tensor::new(vec![2], TensorData::Int64(vec![7, 8])).expect("tensor")],
        }
    }

    fn frame(msg: &StepMessage) -> Vec<u8> {
        StepEncoder::new(CodecConfig::default())
            .encode(msg)
            .expect("encodes")
    }

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
            async {
                let _ = stopped.await;
            },
        ));
        let push = |token: &'static str, job: u64, frame: Vec<u8>| {
            let addr = addr.clone();
            async move {
                let mut client = connect_receiver(&addr, token).await.expect("connect");
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
        let answer = push("right", 5, damaged)
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(
            answer.status,
            PushStatus::Rejected as i32,
            "a bit flip is caught"
        );
        let stranger = frame(&message(9, 0, 0));
        let answer = push("right", 5, stranger)
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(
            answer.status,
            PushStatus::Rejected as i32,
            "a frame of another job"
        );
        let unknown_stage = frame(&message(5, 3, 0));
        let answer = push("right", 5, unknown_stage)
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(
            answer.status,
            PushStatus::Rejected as i32,
            "a stage the job lacks"
        );
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
        assert!(answer.retry_after_ms > 0);
        let step = buffer.try_pop().expect("step 0 delivered");
        assert_eq!(step.parts[0].records, vec![0, 1]);

        let _ = stop.send(());
        server.await.expect("joined").expect("served");
    }
}
