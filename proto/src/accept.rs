//! The one accept loop of every Lode server (the dispatcher, the receiver, the metrics
//! endpoints): a cap on open connections, TCP_NODELAY, a back-off when accepting fails, a
//! stop, and each connection handled on its own task, so that a slow or silent peer (a TLS
//! handshake that never ends) holds up nobody but its own permit.
//!
//! The TLS side (`ServerTls::accept`: the handshake, and a plaintext client on a TLS port
//! told so in its own protocol) is [`crate::tls`]; [`secure`] applies it to an accepted
//! connection and logs a failed handshake.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

use crate::tls::{ServerStream, ServerTls};

/// How long the loop waits after a failed accept (out of descriptors, a reset before accept)
/// rather than spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// One of a server's connection permits, held while the connection is open.
pub type Permit = OwnedSemaphorePermit;

/// Accepts connections on `listener` while fewer than `limit` are open, until `stop`
/// resolves; each goes to `handle` on a task of its own with its permit (drop the permit when
/// the connection ends). Connections beyond the limit wait in the listen backlog.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limit: usize,
    stop: impl Future<Output = ()>,
    handle: F,
) where
    F: Fn(TcpStream, SocketAddr, Permit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limit));
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            () = &mut stop => return,
            permit = Arc::clone(&permits).acquire_owned() => permit,
        };
        let Ok(permit) = permit else { return };
        let accepted = tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(err) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, cause = %err, "cannot set TCP_NODELAY");
                }
                tokio::spawn(handle(stream, peer, permit));
            }
            Err(err) => {
                tracing::warn!(cause = %err, "accept failed; backing off");
                tokio::select! {
                    () = &mut stop => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

/// The connection as the server speaks it: plaintext without `tls`, else after the TLS
/// handshake (or a plaintext client on the TLS port, to be refused by the protocol). None, and
/// a warning, when the handshake fails.
pub async fn secure(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<&ServerTls>,
) -> Option<ServerStream> {
    let Some(tls) = tls else {
        return Some(ServerStream::Plain(stream));
    };
    match tls.accept(stream).await {
        Ok(stream) => Some(stream),
        Err(err) => {
            tracing::warn!(%peer, cause = %err, "TLS handshake failed; connection closed");
            None
        }
    }
}

/// A connection that holds its server's permit while it is open (for connections handed on
/// to a server that owns them from then on, e.g. tonic's).
#[derive(Debug)]
pub struct Limited<S> {
    stream: S,
    _permit: Permit,
}

impl<S> Limited<S> {
    pub fn new(stream: S, permit: Permit) -> Self {
        Limited {
            stream,
            _permit: permit,
        }
    }
}

impl<S: Connected> Connected for Limited<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_until_a_permit_is_free() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<Permit>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(accept_loop(
            listener,
            2,
            async {
                let _ = stop_rx.await;
            },
            move |_stream, _peer, permit| {
                let seen_tx = seen_tx.clone();
                async move {
                    // The test holds the permit: the connection counts as open.
                    let _ = seen_tx.send(permit);
                }
            },
        ));
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let first = seen.recv().await.expect("first");
        let _second = seen.recv().await.expect("second");
        let waited = tokio::time::timeout(Duration::from_millis(200), seen.recv()).await;
        assert!(
            waited.is_err(),
            "a third connection was handled over the limit of 2"
        );
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await;
        assert!(
            matches!(third, Ok(Some(_))),
            "the freed permit went to the waiting connection"
        );
        let _ = stop_tx.send(());
        server.await.expect("the loop stops");
    }
}
