//! `leaseline serve`: the HTTP API, the PostgreSQL protocol, and optionally
//! ingest (Kafka, OTLP log exports on `POST /v1/logs`, or both), in one
//! process.
//!
//! With ingest, the alert engine evaluates the events as the lake commits
//! them, its auditor answers the audit's SQL tables too (one copy of the
//! history in the process), and `/metrics` shows ingest's health.
//!
//! Shutdown runs in order: stop consuming, flush the last Parquet file and
//! commit offsets (all inside the ingest task), let the alert engine write
//! its history and hand queued alerts to receivers, and only then stop
//! serving,
//! so queries keep working until the lake holds everything consumed.

use std::sync::Arc;

use anyhow::Context;
use leaseline_lake::{Lake, PendingRows};
use leaseline_query::QueryEngine;
use leaseline_server::accept::{serve_http, HttpLimits};
use leaseline_server::http::{metrics_router, router, AppState, MetricsRenderer};
use leaseline_server::tls::{Tls, TlsFiles};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::alerting;
use crate::config::Config;
use leaseline_alerts::LeaseMetrics;
use leaseline_audit::SharedAuditor;
use leaseline_ingest::{IngestHooks, IngestMetrics};

/// The HTTP API's tokens (from the configuration and its tokens file)
/// and allowed hosts.
fn http_auth(cfg: &Config) -> anyhow::Result<leaseline_server::auth::HttpAuth> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TokensFile {
        tokens: Vec<leaseline_server::auth::TokenConfig>,
    }
    let mut tokens = cfg.serve.http_tokens.clone();
    if let Some(path) = &cfg.serve.http_tokens_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the HTTP tokens file {}", path.display()))?;
        let file: TokensFile = toml::from_str(&text)
            .with_context(|| format!("the HTTP tokens file {}", path.display()))?;
        tokens.extend(file.tokens);
    }
    leaseline_server::auth::HttpAuth::new(&tokens, &cfg.serve.allowed_hosts)
        .map_err(|e| anyhow::anyhow!("serve.http_tokens: {e}"))
}

/// TLS from `serve.tls_cert_file` and `serve.tls_key_file`, if set.
fn tls(cfg: &Config) -> anyhow::Result<Option<Arc<Tls>>> {
    let s = &cfg.serve;
    let (cert, key) = match (&s.tls_cert_file, &s.tls_key_file) {
        (None, None) => {
            anyhow::ensure!(
                s.http_client_ca_file.is_none(),
                "serve.http_client_ca_file needs TLS: set serve.tls_cert_file and serve.tls_key_file too"
            );
            return Ok(None);
        }
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ => anyhow::bail!(
            "TLS needs both serve.tls_cert_file and serve.tls_key_file (--tls-cert-file, --tls-key-file)"
        ),
    };
    let tls = Tls::load(TlsFiles {
        cert,
        key,
        http_client_ca: s.http_client_ca_file.clone(),
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(Arc::new(tls)))
}

/// Reloads TLS on every SIGHUP until the process ends. Installed with or
/// without TLS, so that a stray SIGHUP never kills the server.
fn reload_on_sighup(tls: Option<Arc<Tls>>) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match &tls {
                    None => info!("SIGHUP: no TLS files to reload"),
                    Some(tls) => match tls.reload() {
                        Ok(()) => info!(
                            cert = %tls.files().cert.display(),
                            "TLS certificate reloaded; new connections get it"
                        ),
                        Err(e) => error!(
                            error = %e,
                            "TLS reload failed; still serving the previous certificate"
                        ),
                    },
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = tls;
    Ok(())
}

/// The PostgreSQL users: `serve.pg_user` with its password (from the
/// configuration, the environment or a file), then `serve.pg_users` and
/// the users file. Passwords become SCRAM verifiers here and are not kept.
/// Any empty password is refused: it would admit whoever sends one.
fn pg_users(cfg: &Config) -> anyhow::Result<leaseline_server::pg_auth::PgUsers> {
    use leaseline_server::pg_auth::{PgUsers, ScramVerifier};
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct UsersFile {
        users: Vec<crate::config::PgUserConfig>,
    }
    let first_line = |path: &std::path::Path| -> anyhow::Result<String> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the PostgreSQL password file {}", path.display()))?;
        Ok(text.lines().next().unwrap_or("").to_string())
    };
    let mut users = Vec::new();
    let mut password = cfg.serve.pg_password.clone();
    if let Some(path) = &cfg.serve.pg_password_file {
        anyhow::ensure!(
            password.is_none(),
            "give the PostgreSQL password once: serve.pg_password or serve.pg_password_file"
        );
        password = Some(first_line(path)?);
    }
    if let Some(password) = password {
        anyhow::ensure!(
            !password.is_empty(),
            "the PostgreSQL password is empty: set a real one (serve.pg_password or \
             LEASELINE_PG_PASSWORD), or none at all on a loopback address"
        );
        users.push((cfg.serve.pg_user.clone(), ScramVerifier::new(&password)));
    }
    let mut listed = cfg.serve.pg_users.clone();
    if let Some(path) = &cfg.serve.pg_users_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the PostgreSQL users file {}", path.display()))?;
        let file: UsersFile = toml::from_str(&text)
            .with_context(|| format!("the PostgreSQL users file {}", path.display()))?;
        listed.extend(file.users);
    }
    for user in listed {
        let name = user.name;
        let verifier = match (user.scram, user.password_file) {
            (Some(scram), None) => scram
                .parse::<ScramVerifier>()
                .map_err(|e| anyhow::anyhow!("serve.pg_users: user {name:?}: {e}"))?,
            (None, Some(path)) => ScramVerifier::new(&first_line(&path)?),
            _ => anyhow::bail!(
                "serve.pg_users: user {name:?} needs one of scram (a verifier: \
                 `leaseline pg-verifier` prints one) or password_file"
            ),
        };
        anyhow::ensure!(
            !verifier.is_of(""),
            "serve.pg_users: the password of user {name:?} is empty: set a real one \
             (its scram verifier or password_file)"
        );
        users.push((name, verifier));
    }
    PgUsers::new(users).map_err(|e| anyhow::anyhow!("serve.pg_users: {e}"))
}

/// How long an OTLP export waits for the commit of its records before it
/// is told to retry (they may still be committed; the retry is then kept
/// once).
const OTLP_COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the served lake's new events come from, if anywhere.
pub enum Source {
    /// Nowhere: serve what the lake holds (another process may ingest).
    Lake,
    /// Kafka, with the `[kafka]` settings (`serve --ingest`).
    Kafka,
    /// The simulator, in real time (`demo`).
    Simulator(leaseline_sim::SimConfig),
}

pub async fn run(
    lake: Lake,
    mut cfg: Config,
    source: Source,
    telemetry: &crate::telemetry::Telemetry,
) -> anyhow::Result<()> {
    // OTLP log exports pushed into this process's ingest loop, if taken.
    let intake = cfg
        .serve
        .otlp_logs
        .then(|| leaseline_ingest::Intake::new(OTLP_COMMIT_TIMEOUT));
    let live = !matches!(source, Source::Lake) || intake.is_some();
    let demo = matches!(source, Source::Simulator(_));
    // With ingest in this process, queries also see the rows it has
    // consumed but not yet flushed (within a fraction of a second).
    let pending = live.then(PendingRows::new);
    // One auditor for the alert engine and the audit's SQL tables: the
    // engine feeds it as the lake commits, queries read it.
    let auditor = live.then(|| SharedAuditor::new(cfg.audit));
    let mut engine = QueryEngine::with_audit_config(lake.clone(), cfg.audit).with_limits(cfg.query);
    if let Some(p) = &pending {
        engine = engine.with_pending(p.clone());
    }
    if let Some(a) = &auditor {
        engine = engine.with_live_audit(a.clone());
    }
    let engine = Arc::new(engine);
    let auth = Arc::new(http_auth(&cfg)?);
    anyhow::ensure!(
        cfg.serve.http_listen.ip().is_loopback() || !auth.is_open(),
        "refusing to serve HTTP on {} without tokens: set serve.http_tokens or \
         serve.http_tokens_file (or --http-tokens-file), or listen on a loopback address",
        cfg.serve.http_listen
    );
    let tls = tls(&cfg)?;
    reload_on_sighup(tls.clone())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let limits = HttpLimits {
        max_connections: cfg.serve.http_max_connections.max(1),
        header_timeout: cfg.serve.http_header_timeout,
        idle_timeout: cfg.serve.http_idle_timeout,
    };
    let listener = tokio::net::TcpListener::bind(cfg.serve.http_listen)
        .await
        .with_context(|| format!("binding the HTTP API to {}", cfg.serve.http_listen))?;
    let addr = listener.local_addr()?;
    info!(%addr, tls = tls.is_some(), "HTTP API listening on {scheme}://{addr}");
    if cfg.alerts.external_url.is_none() {
        cfg.alerts.external_url = url::Url::parse(&format!("{scheme}://{addr}/")).ok();
    }
    let lease_metrics = LeaseMetrics::new(&cfg.metrics);
    let ingest_metrics = live.then(IngestMetrics::new);
    let registry = Arc::new(alerting::registry(
        &lease_metrics,
        ingest_metrics.clone(),
        engine.live_audit().cloned(),
    ));
    telemetry.observe(Some(&lease_metrics), ingest_metrics.clone());

    let mut pg_addr = None;
    let (pg_stop, pg) = match cfg.serve.pg_listen {
        Some(addr) => {
            let users = Arc::new(pg_users(&cfg)?);
            if !addr.ip().is_loopback() && users.is_empty() {
                anyhow::bail!(
                    "refusing to serve PostgreSQL on {addr} without a password: set \
                     serve.pg_password (or LEASELINE_PG_PASSWORD), serve.pg_users or \
                     serve.pg_users_file, or listen on a loopback address"
                );
            }
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the PostgreSQL protocol to {addr}"))?;
            let bound = listener.local_addr()?;
            pg_addr = Some(bound);
            let names: Vec<&str> = users.names().collect();
            info!(addr = %bound, users = ?names, tls = tls.is_some(), "PostgreSQL listening on {bound}");
            let ctx = Arc::new(engine.live_session()?);
            let timeout = cfg.query.timeout;
            let idle_timeout = Some(cfg.serve.pg_idle_timeout).filter(|t| !t.is_zero());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            // Connections are served where queries run: a runaway query
            // slows other queries, never HTTP, /health or ingest.
            let listener = listener.into_std()?;
            let pg_engine = (*engine).clone();
            let max_connections = cfg.serve.pg_max_connections.max(1);
            let pg_tls = tls.clone();
            let task = leaseline_query::executor::handle().spawn(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                leaseline_server::pg::serve(
                    ctx,
                    pg_engine,
                    users,
                    timeout,
                    listener,
                    max_connections,
                    pg_tls,
                    idle_timeout,
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
            });
            (Some(stop), Some(task))
        }
        None => (None, None),
    };

    let http_stop = CancellationToken::new();
    let render: MetricsRenderer = Arc::new(move || alerting::render(&registry));
    // `/metrics` on a listener of its own when asked (a scrape network
    // apart from the one users query on); on the API's otherwise.
    let (api_metrics, metrics_http) = match cfg.serve.metrics_listen {
        None => (Some(render), None),
        Some(at) => {
            anyhow::ensure!(
                at.ip().is_loopback() || !auth.is_open(),
                "refusing to serve /metrics on {at} without tokens: set serve.http_tokens or \
                 serve.http_tokens_file, or listen on a loopback address"
            );
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("binding /metrics to {at}"))?;
            let bound = listener.local_addr()?;
            info!(addr = %bound, "metrics listening on {scheme}://{bound}/metrics");
            let app = metrics_router(AppState {
                engine: engine.clone(),
                metrics: Some(render),
                auth: auth.clone(),
                intake: None,
            });
            let stop = http_stop.clone();
            let tls = tls.clone();
            let task = tokio::spawn(async move {
                serve_http("metrics", listener, app, tls, limits, stop).await
            });
            (None, Some(task))
        }
    };
    let app = router(AppState {
        engine: engine.clone(),
        metrics: api_metrics,
        auth,
        intake: intake.clone(),
    });
    let stop = http_stop.clone();
    let http_tls = tls.clone();
    let http =
        tokio::spawn(async move { serve_http("api", listener, app, http_tls, limits, stop).await });

    let stop = CancellationToken::new();
    // The alert engine sees every event ingest accepts once the lake has
    // committed it; it stops when ingest has stopped and dropped the
    // fan-out.
    let mut alerts = None;
    let engine_fanout = match auditor {
        Some(auditor) => Some(alerting::start_live(
            &cfg,
            lake.clone(),
            auditor,
            lease_metrics.clone(),
        )?),
        None => None,
    };
    let mut ingest = engine_fanout.map(|(fanout, task)| {
        alerts = Some(task);
        let hooks = IngestHooks {
            pending: pending.clone(),
            fanout: Some(fanout),
            metrics: ingest_metrics.clone(),
            intake: intake.clone(),
        };
        let (lake, cfg, stop) = (lake.clone(), cfg.clone(), stop.clone());
        let input = match source {
            Source::Simulator(sim) => {
                return tokio::spawn(async move {
                    crate::demo::feed(lake, cfg.flush.clone(), sim, stop, hooks).await
                })
            }
            Source::Kafka => crate::Input::Kafka,
            Source::Lake => crate::Input::Requests,
        };
        tokio::spawn(async move { crate::ingest_until(lake, &cfg, input, stop, hooks).await })
    });
    if demo {
        println!(
            "{}",
            crate::demo::banner(&addr.to_string(), pg_addr, &crate::demo::lake_arg(&lake))
        );
    }

    // Run until a signal, or until ingest stops on its own (an error).
    let early = match ingest.as_mut() {
        Some(task) => tokio::select! {
            _ = crate::shutdown_signal() => None,
            r = task => Some(r),
        },
        None => {
            crate::shutdown_signal().await;
            None
        }
    };
    info!("shutdown requested");
    stop.cancel();
    let ingest_result = match early {
        Some(r) => Some(r),
        None => match ingest {
            Some(task) => Some(task.await),
            None => None,
        },
    };
    if let Some(task) = alerts {
        if let Err(e) = task.await {
            error!(error = %e, "alert engine task failed");
        }
    }
    http_stop.cancel();
    if let Some(stop) = pg_stop {
        let _ = stop.send(());
    }
    for server in std::iter::once(http).chain(metrics_http) {
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "HTTP server failed"),
            Err(e) => error!(error = %e, "HTTP server task failed"),
        }
    }
    if let Some(pg) = pg {
        match pg.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "PostgreSQL server failed"),
            Err(e) => error!(error = %e, "PostgreSQL server task failed"),
        }
    }
    match ingest_result {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(anyhow::anyhow!("ingest task failed: {e}")),
        None => {
            info!("stopped cleanly");
            Ok(())
        }
    }
}
