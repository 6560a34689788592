//! Serving the twin's sockets so that no peer can pin them: a bound on connections per
//! listener, the TLS handshake off the accept loop and under a timeout, HTTP/1 request
//! heads under a timeout, idle connections closed, and request bodies read up to a limit.
//!
//! These are real network timeouts on the wall clock (a peer lives in real time), not
//! simulated time.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_stream::StreamExt;

/// Connection limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetLimits {
    /// A TLS client must finish its handshake within this.
    pub handshake_timeout: Duration,
    /// An HTTP/1 client must send a whole request head within this, also when a kept-alive
    /// connection waits for its next request.
    pub header_timeout: Duration,
    /// A connection with no bytes in either direction for this long is shut down
    /// gracefully (requests in flight, such as a quiet watch, are finished first).
    pub idle_timeout: Duration,
    /// gRPC (the Talos endpoints, which have no idle timeout: their streams are quiet for
    /// long): the server pings a connection this often, and drops it when a ping goes
    /// unanswered for as long.
    pub keepalive: Duration,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    /// kube-apiserver's default is 250, Go's own default made explicit
    /// (`k8s.io/apiserver/pkg/server/secure_serving.go`; `--http2-max-streams-per-connection`
    /// changes it); a client's further requests wait for a stream to end.
    pub http2_max_streams: u32,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            keepalive: Duration::from_secs(60),
            max_connections: 1024,
            http2_max_streams: 250,
        }
    }
}

/// A stream holding its listener's connection slot and recording when bytes last moved.
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    _slot: OwnedSemaphorePermit,
}

/// Milliseconds since `start` of the last read or write.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() != before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// tonic reads the client certificates from the TLS stream's connect info.
impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Tracked<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepts the next connection once a slot is free. `None` when the listener is closed for
/// good (the caller stops).
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, OwnedSemaphorePermit)> {
    let slot = slots.clone().acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                let _ = tcp.set_nodelay(true);
                return Some((tcp, slot));
            }
            // Out of file descriptors and the like: back off instead of spinning.
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// TLS connections for a tonic server, handshaken off the accept loop under the handshake
/// timeout, at most `max_connections` at once. Feed it to `serve_with_incoming`. Each
/// completed handshake counts in `handshakes` (a client that redials shows there).
pub fn tls_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    limits: NetLimits,
    mut stop: watch::Receiver<bool>,
    handshakes: Arc<AtomicU64>,
) -> impl tokio_stream::Stream<
    Item = Result<Tracked<tokio_rustls::server::TlsStream<TcpStream>>, std::io::Error>,
> {
    let (tx, rx) = mpsc::channel(32);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tx.closed() => return,
                n = accept(&listener, &slots) => n,
            };
            let Some((tcp, slot)) = next else { return };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let handshakes = handshakes.clone();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => {
                        handshakes.fetch_add(1, Ordering::Relaxed);
                        tls
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                };
                let _ = tx
                    .send(Ok(Tracked {
                        inner: tls,
                        activity: Activity::new(),
                        _slot: slot,
                    }))
                    .await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves `app` over HTTP/1.1 and HTTP/2 (over TLS when `tls` is given) until `stop` turns
/// true, within `limits`; counts each connection accepted in `accepted`.
pub async fn serve_http(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: NetLimits,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            n = accept(&listener, &slots) => n,
        };
        let Some((tcp, slot)) = next else { return };
        accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tls = tls.clone();
        let app = app.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let activity = Activity::new();
            match tls {
                Some(acceptor) => {
                    let stream =
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            _ => return,
                        };
                    let io = Tracked {
                        inner: stream,
                        activity: activity.clone(),
                        _slot: slot,
                    };
                    serve_connection(io, activity, app, limits, stop).await;
                }
                None => {
                    let io = Tracked {
                        inner: tcp,
                        activity: activity.clone(),
                        _slot: slot,
                    };
                    serve_connection(io, activity, app, limits, stop).await;
                }
            }
        });
    }
}

async fn serve_connection<S>(
    io: Tracked<S>,
    activity: Arc<Activity>,
    app: Router,
    limits: NetLimits,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // No HTTP/2 pings here: a ping's answer would count as activity and keep an idle
    // connection open for good; the idle timeout already ends dead ones.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_streams);
    let svc = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        let idle_at = activity.last() + limits.idle_timeout;
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended");
                }
                return;
            }
            _ = tokio::time::sleep_until(idle_at.into()), if !shutting_down => {
                // Bytes moved meanwhile: wait for the new deadline.
                if activity.last() + limits.idle_timeout <= Instant::now() {
                    conn.as_mut().graceful_shutdown();
                    shutting_down = true;
                }
            }
            _ = stop.wait_for(|s| *s), if !shutting_down => {
                conn.as_mut().graceful_shutdown();
                shutting_down = true;
            }
        }
    }
}

/// How long a client may take to send a whole request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of an oversized body is read and thrown away before answering 413, so a
/// client still writing it reads the answer instead of a reset connection.
pub const DRAIN_LIMIT: usize = 16 << 20;

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("reading the request body: {0}")]
    Read(axum::Error),
}

/// Reads a whole request body of at most `limit` bytes, within [`BODY_TIMEOUT`]. A larger
/// one is refused without keeping it: the rest is read and discarded (up to
/// [`DRAIN_LIMIT`]) so the client gets the refusal.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let read = async {
        let mut stream = body.into_data_stream();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(BodyError::Read)?;
            if out.len().saturating_add(chunk.len()) > limit {
                let mut drained = out.len().saturating_add(chunk.len());
                drop(out);
                while drained < DRAIN_LIMIT {
                    match stream.next().await {
                        Some(Ok(c)) => drained = drained.saturating_add(c.len()),
                        _ => break,
                    }
                }
                return Err(BodyError::TooLarge { limit });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(BODY_TIMEOUT, read)
        .await
        .unwrap_or(Err(BodyError::Timeout(BODY_TIMEOUT)))
}
