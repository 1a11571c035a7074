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
    /// What `/metrics` labels by (`per_lease_prefixes`).
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
    /// Address of the PostgreSQL wire protocol (psql, Grafana); `false`
    /// turns it off. Default `127.0.0.1:5432`.
    #[serde(deserialize_with = "listen_or_off")]
    pub pg_listen: Option<SocketAddr>,
    /// The PostgreSQL user. Default `leaseline`.
    pub pg_user: String,
    /// The PostgreSQL password (SCRAM-SHA-256). Without one, anyone may
    /// connect, which `serve` only allows on a loopback address.
    pub pg_password: Option<String>,
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
            pg_listen: Some(SocketAddr::from(([127, 0, 0, 1], 5432))),
            pg_user: "leaseline".into(),
            pg_password: None,
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

    #[test]
    fn the_documented_configuration_parses_and_shows_the_defaults() {
        let doc = include_str!("../../docs/configuration.md");
        let start = doc.find("```toml").expect("a toml block") + "```toml".len();
        let end = start + doc[start..].find("```").unwrap();
        let c: Config = toml::from_str(&doc[start..end]).unwrap();
        c.alerts.validate().unwrap();
        let d = Config::default();
        assert_eq!(c.alerts, d.alerts);
        assert_eq!(c.metrics, d.metrics);
        assert_eq!(c.audit, d.audit);
        assert_eq!(c.query, d.query);
        assert_eq!(c.serve, d.serve);
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
