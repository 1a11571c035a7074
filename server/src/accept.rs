//! The accept loop of the HTTP listeners (the API and `/metrics`), with
//! TLS and the limits that keep a flood of connections from exhausting
//! the process.
//!
//! - **A cap on open connections** (`serve.http_max_connections`, each
//!   listener its own). A connection over it is served exactly one request
//!   and closed: `/health` is answered as usual, so probes keep working
//!   while the cap is reached, and anything else gets `503`
//!   (`resource_exhausted`) with `Retry-After: 1`. At most
//!   [`OVER_CAP_MAX`] such connections are in hand at once, each for at
//!   most [`OVER_CAP_TIMEOUT`]; beyond that a new connection is closed at
//!   once.
//! - **Deadlines.** A new connection has `serve.http_header_timeout` to
//!   finish its TLS handshake, and then again to send its first request's
//!   head; once a later request's first byte arrives its head must be
//!   complete within the same time. Between requests a kept-alive
//!   connection may stay silent for `serve.http_idle_timeout`. While a
//!   request is being answered no deadline runs here (the query has its
//!   own timeout). A connection past its deadline is closed.
//! - **Accept errors** (out of file descriptors, `EMFILE`/`ENFILE`) are
//!   logged and retried after [`ACCEPT_BACKOFF`]; they never end the loop.
//! - **TLS.** With a [`Tls`], every connection must start a TLS handshake;
//!   one that starts with anything else (plain HTTP) gets a plaintext
//!   `400` naming `https://` and is closed. Nothing else is served without
//!   TLS.
//! - **Shutdown.** On `shutdown` the listener closes, open connections
//!   finish the request in hand (idle ones close at once), and after
//!   [`SHUTDOWN_GRACE`] the rest are abandoned.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use crate::tls::{Tls, TLS_HANDSHAKE};

/// How long to wait after a failed accept before the next.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Connections over the cap being answered at once, at most.
pub const OVER_CAP_MAX: usize = 64;
/// How long a connection over the cap has for its handshake and request.
pub const OVER_CAP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long open connections may finish after shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The limits of one HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` is cancelled; see the module
/// documentation. `name` tells the listeners apart in the log.
pub async fn serve_http(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<Tls>>,
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let places = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let over_cap = Arc::new(Semaphore::new(OVER_CAP_MAX));
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // The peer gave up before we took it: nothing to do.
                Err(e) if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionRefused
                ) => continue,
                Err(e) => {
                    // EMFILE and the like: connections close and free
                    // descriptors, so wait a little and go on.
                    tracing::warn!(listener = name, error = %e, "HTTP accept failed; retrying in {ACCEPT_BACKOFF:?}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let conn = Conn {
            peer,
            app: app.clone(),
            tls: tls.as_ref().map(|t| t.http_acceptor()),
            shutdown: shutdown.clone(),
        };
        match places.clone().try_acquire_owned() {
            Ok(place) => {
                tracker.spawn(async move {
                    conn.serve(stream, limits, false).await;
                    drop(place);
                });
            }
            Err(_) => match over_cap.clone().try_acquire_owned() {
                Ok(place) => {
                    tracing::warn!(listener = name, %peer, max_connections = limits.max_connections, "HTTP connection over the cap: one request, then closed");
                    let limits = HttpLimits {
                        header_timeout: OVER_CAP_TIMEOUT.min(limits.header_timeout),
                        idle_timeout: Duration::ZERO,
                        ..limits
                    };
                    tracker.spawn(async move {
                        let _ = tokio::time::timeout(
                            OVER_CAP_TIMEOUT * 2,
                            conn.serve(stream, limits, true),
                        )
                        .await;
                        drop(place);
                    });
                }
                Err(_) => drop(stream),
            },
        }
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "HTTP connections still open {SHUTDOWN_GRACE:?} after shutdown; closing them"
        );
    }
    Ok(())
}

/// One accepted connection.
struct Conn {
    peer: SocketAddr,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
}

impl Conn {
    async fn serve(self, stream: TcpStream, limits: HttpLimits, over_cap: bool) {
        let peer = self.peer;
        let _ = stream.set_nodelay(true);
        let Some(acceptor) = self.tls.clone() else {
            return self.serve_io(stream, limits, over_cap).await;
        };
        let handshake = async {
            let mut first = [0u8; 1];
            if stream.peek(&mut first).await? == 0 {
                return Ok(None);
            }
            if first[0] != TLS_HANDSHAKE {
                plaintext_on_tls_port(stream).await?;
                return Ok(None);
            }
            acceptor.accept(stream).await.map(Some)
        };
        match tokio::time::timeout(limits.header_timeout, handshake).await {
            Ok(Ok(Some(tls))) => self.serve_io(tls, limits, over_cap).await,
            Ok(Ok(None)) => {}
            // A client without an acceptable certificate (mutual TLS), one
            // that distrusts ours, or a scanner.
            Ok(Err(e)) => tracing::info!(%peer, error = %e, "HTTP TLS handshake failed"),
            Err(_) => {
                tracing::info!(%peer, "HTTP TLS handshake not done within {:?}", limits.header_timeout)
            }
        }
    }

    async fn serve_io<IO>(self, io: IO, limits: HttpLimits, over_cap: bool)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Watched {
            inner: io,
            activity: activity.clone(),
        });
        let app = self.app.clone();
        let tracked = activity.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let mut app = app.clone();
            let busy = Busy::start(tracked.clone());
            async move {
                let response = if over_cap && req.uri().path() != "/health" {
                    too_many_connections()
                } else {
                    app.call(req.map(Body::new)).await?
                };
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        inner: body,
                        _busy: busy,
                    })
                }))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        // Deadlines are kept by `Activity`, which tells idle from slow.
        builder
            .header_read_timeout(None::<Duration>)
            .keep_alive(!over_cap);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut draining = false;
        loop {
            let deadline = activity.deadline(limits);
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(peer = %self.peer, error = %e, "HTTP connection ended");
                    }
                    return;
                }
                _ = activity.changed.notified() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    if activity.deadline(limits).is_some_and(|d| d <= Instant::now()) {
                        tracing::debug!(peer = %self.peer, "HTTP connection closed: silent past its deadline");
                        return;
                    }
                }
                _ = self.shutdown.cancelled(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Where a connection is between requests, for its deadline.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's first byte; `served`: after a response.
    Idle { since: Instant, served: bool },
    /// A request's head has begun arriving.
    Head { since: Instant },
    /// Requests being answered (hyper answers them one at a time, but a
    /// response body may still be streaming when the next is parsed).
    Busy(usize),
}

struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            phase: Mutex::new(Phase::Idle {
                since: Instant::now(),
                served: false,
            }),
            changed: Notify::new(),
        }
    }

    fn update(&self, f: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *phase = f(*phase);
        drop(phase);
        self.changed.notify_one();
    }

    fn deadline(&self, limits: HttpLimits) -> Option<Instant> {
        match *self.phase.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Idle {
                since,
                served: false,
            } => Some(since + limits.header_timeout),
            Phase::Idle {
                since,
                served: true,
            } => Some(since + limits.idle_timeout),
            Phase::Head { since } => Some(since + limits.header_timeout),
            Phase::Busy(_) => None,
        }
    }

    /// Bytes arrived.
    fn read(&self) {
        let idle = matches!(
            *self.phase.lock().unwrap_or_else(|e| e.into_inner()),
            Phase::Idle { .. }
        );
        if idle {
            self.update(|p| match p {
                Phase::Idle { .. } => Phase::Head {
                    since: Instant::now(),
                },
                other => other,
            });
        }
    }
}

/// Marks a request in hand from its head until its response body is done.
struct Busy(Arc<Activity>);

impl Busy {
    fn start(activity: Arc<Activity>) -> Busy {
        activity.update(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        Busy(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.update(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle {
                since: Instant::now(),
                served: true,
            },
        });
    }
}

/// A response body that keeps its request [`Busy`] until it is sent or
/// dropped.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's stream, telling [`Activity`] when bytes arrive.
struct Watched<IO> {
    inner: IO,
    activity: Arc<Activity>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The answer to any request but `/health` on a connection over the cap.
fn too_many_connections() -> Response<Body> {
    let body = serde_json::json!({
        "error": "resource_exhausted",
        "message": "too many open HTTP connections (serve.http_max_connections); retry later",
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A plain HTTP request to a TLS listener: one plaintext answer saying so
/// (as nginx does), after reading the request head so that closing does
/// not reset the connection under the answer.
async fn plaintext_on_tls_port(mut stream: TcpStream) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body = serde_json::json!({
        "error": "bad_request",
        "message": "this address speaks HTTPS only (serve.tls_cert_file is set): use https://",
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}
