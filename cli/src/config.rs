//! The configuration file (TOML) and how flags and environment variables
//! override it.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use leaseline_alerts::{AlertsConfig, MetricsConfig};
use leaseline_audit::AuditConfig;
use leaseline_ingest::{CompactionConfig, FlushPolicy, KafkaConfig};
use leaseline_query::QueryLimits;
use serde::Deserialize;

/// Everything `leaseline` can be configured with. Every key is optional;
/// defaults are documented in `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The lake's root: a directory or an object store URL
    /// (`file://`, `s3://`, `gs://`, `az://`).
    pub lake: String,
    pub kafka: KafkaConfig,
    pub flush: FlushPolicy,
    pub compaction: CompactionConfig,
    /// Tolerances of the audit (`late_fence_tolerance`,
    /// `clock_skew_tolerance`).
    pub audit: AuditConfig,
    /// Per-query limits (`max_memory_bytes`, `timeout`).
    pub query: QueryLimits,
    /// `leaseline serve`.
    pub serve: ServeConfig,
    /// The alert rules, their thresholds, windows and severities, and the
    /// receivers (`[[alerts.receivers]]`).
    pub alerts: AlertsConfig,
    /// What `/metrics` labels by (`per_lease_prefixes`, `max_backends`,
    /// `max_labelled_leases`).
    pub metrics: MetricsConfig,
    /// OpenTelemetry export (`otlp_endpoint`, `metrics_interval`).
    pub telemetry: crate::telemetry::TelemetryConfig,
}

/// The `[serve]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Address of the HTTP API. Default `127.0.0.1:8080`.
    pub http_listen: SocketAddr,
    /// Whether `serve` also consumes Kafka (with the `[kafka]`, `[flush]`
    /// and `[compaction]` settings). Default false.
    pub ingest: bool,
    /// Whether `serve` takes OpenTelemetry log exports on `POST /v1/logs`
    /// (OTLP/HTTP) into the lake. Default false.
    pub otlp_logs: bool,
    /// Address of the PostgreSQL wire protocol (psql, Grafana); `false`
    /// turns it off. Default `127.0.0.1:5432`.
    #[serde(deserialize_with = "listen_or_off")]
    pub pg_listen: Option<SocketAddr>,
    /// The PostgreSQL user. Default `leaseline`.
    pub pg_user: String,
    /// The PostgreSQL password (SCRAM-SHA-256). Without one, anyone may
    /// connect, which `serve` only allows on a loopback address.
    pub pg_password: Option<String>,
    /// PostgreSQL connections open at once; more are refused with SQLSTATE
    /// 53300. Default 256.
    pub pg_max_connections: usize,
    /// A file holding the PostgreSQL password (its first line), so that it
    /// need not sit in the configuration or the environment.
    pub pg_password_file: Option<std::path::PathBuf>,
    /// More PostgreSQL users, each with a SCRAM-SHA-256 verifier or a
    /// password file. Default none.
    pub pg_users: Vec<PgUserConfig>,
    /// A TOML file of more users (`[[users]]` tables like `pg_users`), so
    /// they can live apart from the configuration.
    pub pg_users_file: Option<std::path::PathBuf>,
    /// A PostgreSQL connection that sends nothing for this long after its
    /// handshake is closed (FATAL 57P05); 0 turns it off. Default 5 min.
    #[serde(with = "humantime_serde")]
    pub pg_idle_timeout: std::time::Duration,
    /// Bearer tokens of the HTTP API, by their SHA-256, with scopes
    /// (`query`, `metrics`, `ingest`). Without any, the API is open, which
    /// `serve` only allows on a loopback address. Default none.
    pub http_tokens: Vec<leaseline_server::auth::TokenConfig>,
    /// A TOML file of more tokens (`[[tokens]]` tables like
    /// `http_tokens`), so they can live apart from the configuration.
    pub http_tokens_file: Option<std::path::PathBuf>,
    /// Host names clients use for this server, besides its IP addresses
    /// and `localhost`; requests naming any other host in `Host` or
    /// `Origin` are refused. Default none.
    pub allowed_hosts: Vec<String>,
    /// Serve `/metrics` on this address instead of the HTTP API's (with
    /// the same tokens, scope `metrics`). Default: on the API's.
    pub metrics_listen: Option<SocketAddr>,
    /// The certificate chain (PEM) of TLS on HTTP and PostgreSQL; with it,
    /// neither serves plaintext. Reloaded on SIGHUP. Default none.
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The private key (PEM) of `tls_cert_file`.
    pub tls_key_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that HTTP clients' certificates must be
    /// signed by (mutual TLS). Default none: no client certificate asked.
    pub http_client_ca_file: Option<std::path::PathBuf>,
    /// Open connections per HTTP listener; one more is answered once
    /// (`/health`, or 503) and closed. Default 1024.
    pub http_max_connections: usize,
    /// How long a connection has for its TLS handshake, and a request for
    /// its head. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub http_header_timeout: std::time::Duration,
    /// How long a kept-alive connection may wait for its next request.
    /// Default 60 s.
    #[serde(with = "humantime_serde")]
    pub http_idle_timeout: std::time::Duration,
}

/// One PostgreSQL user of `serve.pg_users`: its name and one of a
/// SCRAM-SHA-256 verifier (`leaseline pg-verifier` makes one, as does
/// PostgreSQL in `pg_authid`) or a file whose first line is its password.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgUserConfig {
    pub name: String,
    #[serde(default)]
    pub scram: Option<String>,
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for PgUserConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgUserConfig")
            .field("name", &self.name)
            .field("password_file", &self.password_file)
            .finish_non_exhaustive()
    }
}

/// An address, or `false` for off.
fn listen_or_off<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Listen {
        Off(bool),
        At(SocketAddr),
    }
    match Listen::deserialize(d)? {
        Listen::At(a) => Ok(Some(a)),
        Listen::Off(false) => Ok(None),
        Listen::Off(true) => Err(serde::de::Error::custom(
            "pg_listen is an address, or false to turn it off",
        )),
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            ingest: false,
            otlp_logs: false,
            pg_listen: Some(SocketAddr::from(([127, 0, 0, 1], 5432))),
            pg_user: "leaseline".into(),
            pg_password: None,
            pg_password_file: None,
            pg_max_connections: 256,
            pg_users: Vec::new(),
            pg_users_file: None,
            pg_idle_timeout: std::time::Duration::from_secs(300),
            http_tokens: Vec::new(),
            http_tokens_file: None,
            allowed_hosts: Vec::new(),
            metrics_listen: None,
            tls_cert_file: None,
            tls_key_file: None,
            http_client_ca_file: None,
            http_max_connections: 1024,
            http_header_timeout: std::time::Duration::from_secs(10),
            http_idle_timeout: std::time::Duration::from_secs(60),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lake: "./data/lake".into(),
            kafka: KafkaConfig::default(),
            flush: FlushPolicy::default(),
            compaction: CompactionConfig::default(),
            audit: AuditConfig::default(),
            query: QueryLimits::default(),
            serve: ServeConfig::default(),
            alerts: AlertsConfig::default(),
            metrics: MetricsConfig::default(),
            telemetry: Default::default(),
        }
    }
}

impl Config {
    /// Reads a config file; a missing `path` gives the defaults.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let cfg: Config = toml::from_str(&text)
            .with_context(|| format!("invalid config file {}", path.display()))?;
        cfg.alerts
            .validate()
            .with_context(|| format!("invalid config file {}", path.display()))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TOML blocks of a Markdown document. Every opening fence must
    /// name a language and every fence must close: a stray fence turns the
    /// rest of the reference into prose, and the blocks after it would
    /// escape this test.
    fn toml_blocks(doc: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut open: Option<(usize, &str, String)> = None;
        for (i, line) in doc.lines().enumerate() {
            let Some(info) = line.trim_start().strip_prefix("```") else {
                if let Some((_, _, body)) = &mut open {
                    body.push_str(line);
                    body.push('\n');
                }
                continue;
            };
            match open.take() {
                None => {
                    let lang = info.trim();
                    assert!(
                        !lang.is_empty(),
                        "line {}: a code block opens without a language; is a fence missing above?",
                        i + 1
                    );
                    open = Some((i + 1, lang, String::new()));
                }
                Some((_, lang, body)) => {
                    assert!(
                        info.trim().is_empty(),
                        "line {}: a closing fence with text after it",
                        i + 1
                    );
                    if lang == "toml" {
                        blocks.push(body);
                    }
                }
            }
        }
        if let Some((line, ..)) = open {
            panic!("the code block opened at line {line} never closes");
        }
        blocks
    }

    #[test]
    fn every_documented_key_shows_its_default() {
        let blocks = toml_blocks(include_str!("../../docs/configuration.md"));
        assert!(!blocks.is_empty(), "no toml block in docs/configuration.md");
        let defaults = Config::default();
        let mut documented = std::collections::BTreeSet::new();
        for (n, block) in blocks.iter().enumerate() {
            // Keys a block leaves out take their defaults, so the whole
            // parsed block equals the defaults exactly when every key it
            // shows has its default value.
            let c: Config = toml::from_str(block)
                .unwrap_or_else(|e| panic!("toml block {} does not parse: {e}", n + 1));
            c.alerts.validate().unwrap();
            assert_eq!(
                c,
                defaults,
                "toml block {} documents a value other than the default",
                n + 1
            );
            let table: toml::Table = toml::from_str(block).unwrap();
            documented.extend(table.keys().cloned());
        }
        // Destructured so that a new section fails to compile here until
        // it is added to the list, and then fails until it is documented.
        let Config {
            lake: _,
            kafka: _,
            flush: _,
            compaction: _,
            audit: _,
            query: _,
            serve: _,
            alerts: _,
            metrics: _,
            telemetry: _,
        } = defaults;
        let sections = [
            "lake",
            "kafka",
            "flush",
            "compaction",
            "audit",
            "query",
            "serve",
            "alerts",
            "metrics",
            "telemetry",
        ];
        let missing: Vec<_> = sections
            .iter()
            .filter(|s| !documented.contains(**s))
            .collect();
        assert!(missing.is_empty(), "undocumented sections: {missing:?}");
    }

    #[test]
    fn a_block_with_a_changed_default_or_a_stray_fence_is_caught() {
        // The check above must be able to fail: a changed value differs
        // from the defaults, and a lost fence is refused.
        let changed: Config = toml::from_str("[flush]\nmax_rows = 100000\n").unwrap();
        assert_ne!(changed, Config::default());
        let stray = "```toml\nlake = \"x\"\n```\n\n[audit]\n```\n";
        let err = std::panic::catch_unwind(|| toml_blocks(stray)).unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert_eq!(
            msg,
            "line 6: a code block opens without a language; is a fence missing above?"
        );
        assert_eq!(
            toml_blocks("```toml\na = 1\n```\n```sh\nls\n```\n```toml\nb = 2\n```\n"),
            vec!["a = 1\n".to_string(), "b = 2\n".to_string()]
        );
    }

    #[test]
    fn parses_units_and_refuses_unknown_keys() {
        let c: Config = toml::from_str(
            r#"
            lake = "s3://bucket/leases"
            [kafka]
            brokers = "k1:9092,k2:9092"
            topics = ["leases"]
            properties = { "security.protocol" = "SASL_SSL" }
            [flush]
            max_rows = 5000
            max_bytes = "8 MiB"
            flush_interval = "2s"
            [compaction]
            target_file_bytes = "256MiB"
            retention = "30m"
            [audit]
            late_fence_tolerance = "80ms"
            [serve]
            pg_listen = false
            "#,
        )
        .unwrap();
        assert_eq!(c.flush.max_rows, 5000);
        assert_eq!(c.flush.max_bytes.as_u64(), 8 * 1024 * 1024);
        assert_eq!(c.flush.flush_interval, std::time::Duration::from_secs(2));
        assert_eq!(c.compaction.retention, std::time::Duration::from_secs(1800));
        assert_eq!(c.kafka.properties["security.protocol"], "SASL_SSL");
        assert!(c.compaction.enabled);
        assert_eq!(
            c.audit.late_fence_tolerance,
            std::time::Duration::from_millis(80)
        );
        assert_eq!(
            c.audit.clock_skew_tolerance,
            std::time::Duration::from_millis(250),
            "unset keys keep their defaults"
        );

        assert_eq!(c.serve.pg_listen, None);
        let on: Config = toml::from_str("[serve]\npg_listen = \"0.0.0.0:6432\"\n").unwrap();
        assert_eq!(on.serve.pg_listen, Some("0.0.0.0:6432".parse().unwrap()));

        let err = toml::from_str::<Config>("[flush]\nmax_row = 1\n").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
