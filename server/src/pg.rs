//! The PostgreSQL wire protocol, for psql, Grafana and other SQL clients.
//!
//! Why this module exists: `datafusion_postgres::serve*` binds its own
//! socket, never returns and cannot be shut down, and its default hooks let a
//! client run `INSERT`, `COPY`, `CREATE` or `SET datafusion.*` against the
//! shared `SessionContext`. So we drive pgwire ourselves over a listener the
//! caller bound (port 0 works: read `local_addr()` before passing it in), and
//! wrap `datafusion_postgres::DfSessionService` with:
//!
//! - [`ReadOnlyHook`], a `QueryHook` in front of the built-in hooks that
//!   refuses anything but queries (`SELECT`, `WITH`, `VALUES`, `EXPLAIN`,
//!   `SHOW`, `DESCRIBE`, cursors) with SQLSTATE 25006, answers `SET`/`RESET`
//!   for client session settings (what psql, JDBC and Grafana send) and never
//!   lets one reach DataFusion's own configuration;
//! - [`PgService`], which applies the query timeout to planning *and* to the
//!   streaming of rows (datafusion-postgres's own `statement_timeout` only
//!   covers building the `DataFrame`, which executes nothing).
//!
//! Authentication is SCRAM-SHA-256 for one user we choose, or none.
//! Without TLS configured an `SSLRequest` is declined (`N`) and clients go
//! on in plaintext (`sslmode=disable` or `prefer`); with it, connections
//! must upgrade, see [`crate::tls`].
//!
//! Every query reads through the one long-lived `SessionContext`; its table
//! providers decide which data a query sees.

use std::fmt::Debug;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::common::{DFSchema, ParamValues};
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{Select, Set, Statement, Visit, Visitor};
use datafusion_postgres::datafusion_pg_catalog::setup_pg_catalog;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::{HookClient, QueryHook};
use datafusion_postgres::pgwire::api::auth::noop::NoopStartupHandler;
use datafusion_postgres::pgwire::api::auth::StartupHandler;
use datafusion_postgres::pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use datafusion_postgres::pgwire::api::portal::Portal;
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{Response, Tag};
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, ConnectionManager, ErrorHandler,
    PgWireConnectionState, PgWireServerHandlers,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use datafusion_postgres::pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use datafusion_postgres::pgwire::tokio::TlsAcceptor;
use datafusion_postgres::{DfSessionService, Parser};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{Sink, SinkExt, StreamExt};

use crate::pg_auth::{PgUsers, ScramStartup};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{timeout_at, Instant};

/// How long open connections may finish after shutdown before they are cut.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a new connection may stay silent before its first message (the
/// startup or SSL request): a socket that never speaks must not hold a
/// place under the connection cap.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers a connection over the cap as PostgreSQL does: read its startup
/// message (answering an SSL request first: with TLS when it is
/// configured, so that the client can read the reason), then a FATAL
/// 53300. A client opening with a TLS handshake (PostgreSQL 17's direct
/// TLS) gets the handshake first, for the same reason. Reading first
/// matters: closing a socket with unread data resets it, and the client
/// would see a dropped connection instead of the reason.
async fn refuse(
    mut socket: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let mut buf = [0u8; 1024];
    if let Some(tls) = &tls {
        let mut first = [0u8; 1];
        if socket.peek(&mut first).await? == 1 && first[0] == crate::tls::TLS_HANDSHAKE {
            return refuse_over_tls(socket, tls).await;
        }
    }
    let n = socket.read(&mut buf).await?;
    if buf[..n] == SSL_REQUEST {
        if let Some(tls) = &tls {
            socket.write_all(b"S").await?;
            return refuse_over_tls(socket, tls).await;
        }
        socket.write_all(b"N").await?;
        // The startup message itself: its content does not matter here.
        let _startup = socket.read(&mut buf).await?;
    }
    socket.write_all(&too_many_clients()).await?;
    socket.shutdown().await
}

/// [`refuse`] once the client is to speak TLS: the handshake, its startup
/// message read, then FATAL 53300.
async fn refuse_over_tls(
    socket: tokio::net::TcpStream,
    tls: &tokio_rustls::TlsAcceptor,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tls.accept(socket).await?;
    let _startup = socket.read(&mut [0u8; 1024]).await?;
    socket.write_all(&too_many_clients()).await?;
    socket.shutdown().await
}

/// PostgreSQL's ErrorResponse for a server that is full, sent before
/// closing a connection over the cap: FATAL, SQLSTATE 53300.
fn too_many_clients() -> Vec<u8> {
    fatal(
        "53300",
        "sorry, too many clients already (serve.pg_max_connections)",
    )
}

/// A FATAL ErrorResponse message, for answers given before pgwire takes
/// the connection.
pub(crate) fn fatal(sqlstate: &str, message: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (code, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', sqlstate),
        (b'M', message),
    ] {
        fields.push(code);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    msg.extend_from_slice(&fields);
    msg
}

/// Session settings that datafusion-postgres's `SetShowHook` keeps per
/// connection (in the client's metadata); every other `SET` is acknowledged
/// and ignored.
const SESSION_SETTINGS: &[&str] = &[
    "statement_timeout",
    "datestyle",
    "intervalstyle",
    "bytea_output",
    "application_name",
    "extra_float_digits",
    "search_path",
];

/// Serves `ctx` over the PostgreSQL protocol on `listener` until `shutdown`
/// completes, then gives open connections [`SHUTDOWN_GRACE`] to finish.
///
/// `users`: SCRAM-SHA-256 for these users, or anyone when there are none.
/// Every query (planning and rows) gets `query_timeout`. With `tls`,
/// connections must upgrade to TLS (see [`crate::tls::pg_gate`]). A
/// connection that sends nothing for `idle_timeout` after its handshake is
/// closed.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    ctx: Arc<SessionContext>,
    engine: leaseline_query::QueryEngine,
    users: Arc<PgUsers>,
    query_timeout: Duration,
    listener: TcpListener,
    max_connections: usize,
    tls: Option<Arc<crate::tls::Tls>>,
    idle_timeout: Option<Duration>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let roles = users.names().map(str::to_owned).collect();
    install_pg_catalog(&ctx, roles).map_err(std::io::Error::other)?;
    crate::pg_describe::install_functions(&ctx)
        .await
        .map_err(std::io::Error::other)?;
    let handlers = Arc::new(Handlers {
        service: Arc::new(PgService::new(ctx, engine, query_timeout)),
        users,
        connections: Arc::new(ConnectionManager::new()),
    });
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                // Finished connections give their places back first: the
                // select above reaps them only when it happens to pick
                // that branch, and a client that has hung up must not be
                // counted against the next one.
                Ok((socket, peer)) if reaped(&mut connections) >= max_connections => {
                    tracing::warn!(%peer, max_connections, "postgres connection refused: too many clients");
                    let tls = tls.as_ref().map(|t| t.pg_acceptor());
                    // Said and closed off the accept loop, so a flood of
                    // them cannot stall it.
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(2), refuse(socket, tls)).await;
                    });
                }
                Ok((mut socket, peer)) => {
                    let handlers = handlers.clone();
                    let tls = tls.clone();
                    connections.spawn(async move {
                        if tokio::time::timeout(HANDSHAKE_TIMEOUT, socket.readable()).await.is_err() {
                            tracing::info!(%peer, "postgres connection closed: nothing sent within {HANDSHAKE_TIMEOUT:?}");
                            return;
                        }
                        let Some(acceptor) = crate::tls::pg_accept(tls.as_deref(), &mut socket, peer, HANDSHAKE_TIMEOUT).await else {
                            return;
                        };
                        if let Err(e) = serve_connection(socket, acceptor, handlers, idle_timeout).await {
                            tracing::debug!(%peer, error = %e, "postgres connection failed");
                        }
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "postgres accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        connections.shutdown().await;
    }
    Ok(())
}

/// The number of connections still open, once the finished ones are
/// taken out of the set.
fn reaped(connections: &mut JoinSet<()>) -> usize {
    while connections.try_join_next().is_some() {}
    connections.len()
}

/// How long the startup and authentication may take, as pgwire's own loop
/// and PostgreSQL's `authentication_timeout`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Drives one connection as pgwire's `process_socket` does, with one
/// addition: after the handshake, a connection that sends nothing for
/// `idle_timeout` is told so, FATAL 57P05 (idle_session_timeout, as
/// PostgreSQL 14+ says it), and closed, so forgotten sessions do not hold
/// places under the connection cap. A running query is not idle: the
/// timer only runs while the server waits for the client's next message.
async fn serve_connection<H: PgWireServerHandlers>(
    tcp: tokio::net::TcpStream,
    tls: Option<TlsAcceptor>,
    handlers: H,
    idle_timeout: Option<Duration>,
) -> std::io::Result<()> {
    let startup_deadline = Instant::now() + STARTUP_TIMEOUT;
    let Ok(negotiated) = timeout_at(startup_deadline, negotiate_tls(tcp, tls)).await else {
        return Ok(());
    };
    let Some(mut socket) = negotiated? else {
        return Ok(());
    };
    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    loop {
        let handshaking = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let message = if handshaking {
            match timeout_at(startup_deadline, socket.next()).await {
                Ok(message) => message,
                Err(_) => break,
            }
        } else if let Some(idle) = idle_timeout {
            match tokio::time::timeout(idle, socket.next()).await {
                Ok(message) => message,
                Err(_) => {
                    tracing::info!(peer = %socket.socket_addr(), "postgres connection closed: idle for {idle:?}");
                    let info = ErrorInfo::new(
                        "FATAL".to_owned(),
                        "57P05".to_owned(),
                        "terminating connection due to idle-session timeout (serve.pg_idle_timeout)"
                            .to_owned(),
                    );
                    socket
                        .send(PgWireBackendMessage::ErrorResponse(info.into()))
                        .await?;
                    socket.close().await?;
                    break;
                }
            }
        } else {
            socket.next().await
        };
        let Some(Ok(message)) = message else {
            break;
        };
        // The client is leaving; some clients wait for the server to close.
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        let extended_query = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        if let Err(mut e) = process_message(
            message,
            &mut socket,
            startup.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await
        {
            errors.on_error(&socket, &mut e);
            process_error(&mut socket, e, extended_query).await?;
        }
    }
    Ok(())
}

/// Adds the `pg_catalog` schema and Postgres functions that psql's `\d`
/// commands need, with `roles` as `pg_roles`, and turns on
/// `information_schema`, which Grafana's table and column pickers read.
/// Idempotent.
pub fn install_pg_catalog(
    ctx: &SessionContext,
    roles: Vec<String>,
) -> datafusion::error::Result<()> {
    let catalog = {
        let state = ctx.state_ref();
        let mut state = state.write();
        let options = state.config_mut().options_mut();
        // Read at table resolution (SessionState::schema_for_ref), so
        // turning it on after the context was built is enough; psql's
        // catalog queries test it.
        options.catalog.information_schema = true;
        options.catalog.default_catalog.clone()
    };
    if ctx
        .catalog(&catalog)
        .and_then(|c| c.schema("pg_catalog"))
        .is_some()
    {
        return Ok(());
    }
    // Not an `Arc<T>`: datafusion-pg-catalog 0.19's
    // `impl PgCatalogContextProvider for Arc<T>` calls itself.
    let roles = crate::pg_describe::Roles(Arc::new(roles));
    setup_pg_catalog(ctx, &catalog, roles).map_err(|e| *e)
}

/// The pgwire handlers of every connection.
struct Handlers {
    service: Arc<PgService>,
    /// None: anyone may connect.
    users: Arc<PgUsers>,
    /// Lets a client's cancel request (psql's Ctrl-C) find its connection.
    connections: Arc<ConnectionManager>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.service.clone()
    }

    /// Called once per connection: the SASL handler keeps the state of one
    /// handshake, so it must not be shared.
    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        let connections = self.connections.clone();
        Arc::new(if self.users.is_empty() {
            Startup::Trust(Trust(connections))
        } else {
            Startup::Scram(ScramStartup::new(self.users.clone(), connections))
        })
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.connections.clone()))
    }
}

/// No authentication, or SCRAM-SHA-256.
enum Startup {
    Trust(Trust),
    Scram(ScramStartup),
}

struct Trust(Arc<ConnectionManager>);

#[async_trait]
impl NoopStartupHandler for Trust {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.0.clone())
    }
}

// pgwire implements StartupHandler for every NoopStartupHandler; `Startup`
// is not one, so this impl does not overlap it.
#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Trust(h) => h.on_startup(client, message).await,
            Startup::Scram(h) => h.on_startup(client, message).await,
        }
    }
}

/// `DfSessionService` under a deadline per statement.
struct PgService {
    inner: DfSessionService,
    /// Admits each statement among the process's running queries.
    engine: leaseline_query::QueryEngine,
    timeout: Duration,
}

impl PgService {
    fn new(
        ctx: Arc<SessionContext>,
        engine: leaseline_query::QueryEngine,
        timeout: Duration,
    ) -> Self {
        // datafusion-postgres's default hooks, behind ours.
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(ReadOnlyHook),
            Arc::new(crate::pg_describe::DescribeHook),
            Arc::new(CursorStatementHook),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
        ];
        PgService {
            inner: DfSessionService::new_with_hooks(ctx, hooks),
            engine,
            timeout,
        }
    }

    /// A place among the running queries, or SQLSTATE 53300
    /// (too_many_connections, as PostgreSQL says when it is full).
    async fn admit(&self) -> PgWireResult<tokio::sync::OwnedSemaphorePermit> {
        self.engine.admit().await.map_err(|e| {
            PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".to_owned(),
                "53300".to_owned(),
                e.to_string(),
            )))
        })
    }

    /// The statement's time limit: `query.timeout`, or the connection's
    /// `statement_timeout` when that is set and shorter (0 means none, as
    /// in PostgreSQL). datafusion-postgres's `SetShowHook` keeps it in the
    /// client's metadata, in milliseconds.
    fn limit<C: ClientInfo + ?Sized>(&self, client: &C) -> Duration {
        client
            .metadata()
            .get("statement_timeout_ms")
            .and_then(|ms| ms.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .map_or(self.timeout, |ms| {
                self.timeout.min(Duration::from_millis(ms))
            })
    }

    /// Bounds the rows of a result by `deadline` and the client's cancel
    /// request too: they are computed while pgwire sends them, after
    /// `do_query` has returned. Dropping the stream stops DataFusion's
    /// execution; the admission `permit` is held until the last row is
    /// sent, and let go before the error that ends the rows early.
    fn bounded(
        &self,
        response: Response,
        deadline: Instant,
        limit: Duration,
        permit: Arc<tokio::sync::OwnedSemaphorePermit>,
        handle: Option<Arc<ConnectionHandle>>,
    ) -> Response {
        let mut query = match response {
            Response::Query(query) => query,
            other => return other,
        };
        // `QueryResponse` is #[non_exhaustive] but its fields are pub.
        let empty = futures::stream::empty::<PgWireResult<DataRow>>();
        let rows = std::mem::replace(&mut query.data_rows, Box::pin(empty));
        query.data_rows = Box::pin(futures::stream::unfold(
            Some((rows, permit, None)),
            move |running| {
                let handle = handle.clone();
                async move {
                    // None: the error that ended the rows was the last item.
                    let (mut rows, permit, cancel) = running?;
                    // Asked for when the rows start: pgwire watches its own
                    // cancel signal until `do_query` returns, and a new one
                    // before then would read as a cancel to it.
                    let cancel = match cancel {
                        Some(cancel) => cancel,
                        None => cancel_signal(handle).await,
                    };
                    let next = tokio::select! {
                        next = timeout_at(deadline, rows.next()) => next.map_err(|_| timed_out(limit)),
                        () = cancelled(cancel.clone()) => Err(canceled()),
                    };
                    match next {
                        Ok(Some(row)) => Some((row, Some((rows, permit, Some(cancel))))),
                        Ok(None) => None,
                        Err(e) => {
                            drop((rows, permit));
                            Some((Err(e), None))
                        }
                    }
                }
            },
        ));
        Response::Query(query)
    }
}

/// Resolves to true when the client asks to cancel the running statement
/// (a CancelRequest on another connection, as psql sends on Ctrl-C), to
/// false when the connection's next statement starts or it has no handle.
type Cancel = Shared<BoxFuture<'static, bool>>;

/// Where a cancel request for `client`'s connection arrives: pgwire's
/// `DefaultCancelHandler` finds it by the key sent in BackendKeyData.
fn cancel_handle<C: ClientInfo + ?Sized>(client: &C) -> Option<Arc<ConnectionHandle>> {
    client
        .session_extensions()
        .get::<Arc<ConnectionHandle>>()
        .map(|h| (*h).clone())
}

/// The cancel signal of what runs from now on the connection. pgwire
/// itself cancels `do_query` (planning, the wait for a place); this covers
/// the rows, which are computed after it.
async fn cancel_signal(handle: Option<Arc<ConnectionHandle>>) -> Cancel {
    let receiver = match handle {
        Some(handle) => Some(handle.start_query().await),
        None => None,
    };
    async move {
        match receiver {
            Some(receiver) => receiver.await.is_ok(),
            None => false,
        }
    }
    .boxed()
    .shared()
}

/// Completes only when the statement is cancelled.
async fn cancelled(cancel: Cancel) {
    if !cancel.await {
        std::future::pending::<()>().await;
    }
}

/// SQLSTATE 57014 (query_canceled) with PostgreSQL's words for a cancel
/// request.
fn canceled() -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        "57014".to_owned(),
        "canceling statement due to user request".to_owned(),
    )))
}

#[async_trait]
impl SimpleQueryHandler for PgService {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let handle = cancel_handle(client);
        let permit = Arc::new(self.admit().await?);
        // One deadline for all statements of the query string.
        let limit = self.limit(client);
        let deadline = Instant::now() + limit;
        let work = <DfSessionService as SimpleQueryHandler>::do_query(&self.inner, client, query);
        let (responses, read) =
            leaseline_query::recording_versions(timeout_at(deadline, work)).await;
        let responses = responses.map_err(|_| timed_out(limit))??;
        say_versions(client, read).await?;
        Ok(responses
            .into_iter()
            .map(|r| self.bounded(r, deadline, limit, permit.clone(), handle.clone()))
            .collect())
    }
}

#[async_trait]
impl ExtendedQueryHandler for PgService {
    type Statement = <DfSessionService as ExtendedQueryHandler>::Statement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.inner.query_parser()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let handle = cancel_handle(client);
        let permit = Arc::new(self.admit().await?);
        let limit = self.limit(client);
        let deadline = Instant::now() + limit;
        let work = <DfSessionService as ExtendedQueryHandler>::do_query(
            &self.inner,
            client,
            portal,
            max_rows,
        );
        let (response, read) =
            leaseline_query::recording_versions(timeout_at(deadline, work)).await;
        let response = response.map_err(|_| timed_out(limit))??;
        say_versions(client, read).await?;
        Ok(self.bounded(response, deadline, limit, permit, handle))
    }
}

/// Says, in a NOTICE before the rows, when the audit's tables answered for
/// an earlier commit than the lake's tables were read at: the alert engine
/// is catching up with ingest (docs/audit-and-sql.md). HTTP says the same
/// in its `Leaseline-*-Version` headers, on every answer; a NOTICE on every
/// statement would be noise in psql, so it comes only when they differ.
async fn say_versions<C>(client: &mut C, read: leaseline_query::VersionsRead) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let Some((audit, lake)) = read.audit_behind() else {
        return Ok(());
    };
    let names: Vec<&str> = leaseline_query::AuditView::ALL
        .iter()
        .map(|v| v.name())
        .collect();
    let (last, rest) = names.split_last().expect("the audit has tables");
    let notice = ErrorInfo::new(
        "NOTICE".to_owned(),
        "00000".to_owned(),
        format!(
            "{} and {last} answer for lake version {audit}, the lake's tables for version \
             {lake}: the alert engine is catching up with ingest",
            rest.join(", ")
        ),
    );
    client
        .send(PgWireBackendMessage::NoticeResponse(notice.into()))
        .await?;
    Ok(())
}

fn timed_out(limit: Duration) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        "57014".to_owned(), // query_canceled, as PostgreSQL's statement_timeout
        format!(
            "query timed out after {limit:?} (the limit is query.timeout, or statement_timeout when shorter)"
        ),
    )))
}

/// Runs before datafusion-postgres's hooks, on every statement of both the
/// simple protocol and the extended one (at Parse, so a refused statement is
/// never planned).
struct ReadOnlyHook;

/// What [`ReadOnlyHook`] does with a statement.
enum Verdict {
    /// Let the next hook or DataFusion answer it.
    Pass,
    /// Answer with this command tag, doing nothing.
    Ack(&'static str),
    Refuse(PgWireError),
}

fn verdict(statement: &Statement) -> Verdict {
    if leaseline_query::depth::check_parsed(statement).is_err() {
        return Verdict::Refuse(PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".to_owned(),
            "54001".to_owned(), // statement_too_complex
            leaseline_query::QueryError::TooComplex.to_string(),
        ))));
    }
    match statement {
        Statement::Set(set) => set_verdict(set),
        // DataFusion would reset its configuration, for every connection.
        Statement::Reset(_) => Verdict::Ack("RESET"),
        Statement::Discard { .. } => Verdict::Ack("DISCARD ALL"),
        // Answered by TransactionStatementHook without doing anything.
        Statement::StartTransaction { .. } | Statement::Commit { .. } | Statement::Rollback { .. } => {
            Verdict::Pass
        }
        _ => match statement.visit(&mut QueriesOnly) {
            ControlFlow::Continue(()) => Verdict::Pass,
            ControlFlow::Break(what) => Verdict::Refuse(read_only(&format!(
                "{what} is not allowed: leaseline is read-only (SELECT, WITH, EXPLAIN and SHOW only)"
            ))),
        },
    }
}

/// `SET` of a client session setting goes on to `SetShowHook` (which keeps
/// it for the connection); `datafusion.*` is refused, as it would change the
/// shared context; anything else is acknowledged and ignored, as
/// datafusion-postgres does, so clients that set things on connect work.
fn set_verdict(set: &Set) -> Verdict {
    let names: Vec<String> = match set {
        Set::SingleAssignment { variable, .. } => vec![variable.to_string()],
        Set::MultipleAssignments { assignments } => {
            assignments.iter().map(|a| a.name.to_string()).collect()
        }
        Set::ParenthesizedAssignments { variables, .. } => {
            variables.iter().map(ToString::to_string).collect()
        }
        _ => vec![],
    };
    let names: Vec<String> = names
        .iter()
        .map(|n| n.replace('"', "").to_lowercase())
        .collect();
    if names.iter().any(|n| n.starts_with("datafusion.")) {
        return Verdict::Refuse(read_only(
            "the engine's settings (datafusion.*) cannot be changed over this connection",
        ));
    }
    match set {
        Set::SingleAssignment {
            scope: None,
            hivevar: false,
            ..
        } if SESSION_SETTINGS.contains(&names[0].as_str()) => Verdict::Pass,
        Set::SetTimeZone { local: false, .. } => Verdict::Pass,
        _ => Verdict::Ack("SET"),
    }
}

/// Breaks on the first statement, anywhere in the tree (`EXPLAIN ANALYZE
/// INSERT`, `WITH x AS (DELETE ...)`, a cursor's query), that is not a
/// query, and on `SELECT ... INTO`, which DataFusion plans as
/// `CREATE TABLE`.
struct QueriesOnly;

impl Visitor for QueriesOnly {
    type Break = String;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<String> {
        match statement {
            Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::ExplainTable { .. }
            | Statement::ShowVariable { .. }
            | Statement::ShowVariables { .. }
            | Statement::ShowStatus { .. }
            | Statement::ShowTables { .. }
            | Statement::ShowColumns { .. }
            | Statement::ShowCreate { .. }
            | Statement::ShowFunctions { .. }
            | Statement::ShowCatalogs { .. }
            | Statement::ShowSchemas { .. }
            | Statement::ShowViews { .. }
            // Handled by CursorStatementHook; the cursor's query is visited.
            | Statement::Declare { .. }
            | Statement::Fetch { .. }
            | Statement::Close { .. } => ControlFlow::Continue(()),
            other => {
                let sql = other.to_string();
                let keyword = sql.split_whitespace().next().unwrap_or("statement");
                ControlFlow::Break(keyword.to_uppercase())
            }
        }
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<String> {
        if select.into.is_some() {
            ControlFlow::Break("SELECT INTO".to_owned())
        } else {
            ControlFlow::Continue(())
        }
    }
}

fn read_only(message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        "25006".to_owned(), // read_only_sql_transaction
        message.to_owned(),
    )))
}

/// The plan stored for an acknowledged statement at Parse: no columns, no
/// parameters.
fn nothing() -> LogicalPlan {
    LogicalPlan::EmptyRelation(EmptyRelation {
        produce_one_row: false,
        schema: Arc::new(DFSchema::empty()),
    })
}

impl Verdict {
    /// What a hook answers for a statement run (not just parsed).
    fn into_response(self) -> Option<PgWireResult<Response>> {
        match self {
            Verdict::Pass => None,
            Verdict::Ack(tag) => Some(Ok(Response::Execution(Tag::new(tag)))),
            Verdict::Refuse(e) => Some(Err(e)),
        }
    }
}

#[async_trait]
impl QueryHook for ReadOnlyHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        verdict(statement).into_response()
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        match verdict(statement) {
            Verdict::Pass => None,
            Verdict::Ack(_) => Some(Ok(nothing())),
            Verdict::Refuse(e) => Some(Err(e)),
        }
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        // Refused statements never get past Parse; checked again all the same.
        verdict(statement).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;

    fn check(sql: &str) -> Verdict {
        let statements = PostgresCompatibilityParser::new().parse(sql).unwrap();
        verdict(&statements[0])
    }

    // Pins the parser variants `verdict` relies on (e.g. `SET TIME ZONE` as
    // `Set::SetTimeZone`, `SET SESSION CHARACTERISTICS` as
    // `Set::SetTransaction`).
    #[test]
    fn queries_pass_and_changes_are_refused() {
        for sql in [
            "SELECT 1",
            "WITH t AS (SELECT 1 AS a) SELECT a FROM t",
            "EXPLAIN SELECT 1",
            "SHOW search_path",
            "SET extra_float_digits = 3",
            "SET TIME ZONE 'UTC'",
            "BEGIN",
        ] {
            assert!(matches!(check(sql), Verdict::Pass), "{sql}");
        }
        for sql in [
            "SET foo = 1",
            "RESET ALL",
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        ] {
            assert!(matches!(check(sql), Verdict::Ack(_)), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "COPY t TO '/tmp/x'",
            "CREATE TABLE t (a INT)",
            "DROP TABLE t",
            "SET datafusion.execution.batch_size = 1",
            "SELECT 1 INTO t",
            "EXPLAIN ANALYZE DELETE FROM t",
            "PREPARE p AS SELECT 1",
        ] {
            assert!(matches!(check(sql), Verdict::Refuse(_)), "{sql}");
        }
    }
}
