//! `leaseline check`: the audit as a command for CI pipelines and scripts.
//!
//! It prints every violation with its explanation and exits 1 when there is
//! any, 0 when the history is clean, and 2 when it could not check (an
//! unreadable file or lake). Lines that are not valid events are reported on
//! stderr with their file, line and reason; they do not change the verdict,
//! since the audit can only judge the events it has.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use leaseline_audit::{AuditConfig, Auditor, Violation};
use leaseline_lake::Lake;
use serde::Serialize;

/// How `check` prints violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    /// For people: one block per violation, then a summary.
    Text,
    /// One JSON object per violation per line (the `lease_violations`
    /// columns), then nothing else on stdout.
    Ndjson,
}

/// What was audited, for the summary line.
#[derive(Debug, Default)]
pub struct Summary {
    pub events: usize,
    pub malformed: usize,
    pub leases: usize,
    pub grants: usize,
    pub violations: usize,
}

/// Audits NDJSON files (`-` is standard input); `alerts`, when given, sees
/// every event too (a replay of the alert rules).
pub fn audit_files(
    files: &[String],
    config: AuditConfig,
    mut alerts: Option<&mut leaseline_alerts::AlertEngine>,
) -> anyhow::Result<(Auditor, usize)> {
    let mut auditor = Auditor::new(config);
    let mut malformed = 0;
    let stderr = std::io::stderr();
    for path in files {
        let reader: Box<dyn BufRead> = if path == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            Box::new(BufReader::new(
                File::open(path).with_context(|| format!("opening {path}"))?,
            ))
        };
        let mut line = Vec::new();
        let mut reader = reader;
        let mut no = 0u64;
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .with_context(|| format!("reading {path}"))?;
            if n == 0 {
                break;
            }
            no += 1;
            let text = trim_line(&line);
            if text.is_empty() {
                continue;
            }
            match leaseline_schema::decode(text) {
                Ok(event) => {
                    auditor.push(&event);
                    if let Some(a) = alerts.as_deref_mut() {
                        a.push(&event);
                    }
                }
                Err(e) => {
                    malformed += 1;
                    let _ = writeln!(
                        stderr.lock(),
                        "{path}:{no}: skipped: {}: {}",
                        e.reason,
                        e.message
                    );
                }
            }
        }
    }
    Ok((auditor, malformed))
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &line[..end]
}

/// Audits the lake's newest snapshot.
pub async fn audit_lake(lake: &Lake, config: AuditConfig) -> anyhow::Result<Auditor> {
    let m = lake.latest().await.context("reading the lake's manifest")?;
    Ok(leaseline_query::audit::audit_snapshot(lake, &m, config).await?)
}

/// Replays the alert rules over the lake's newest snapshot.
pub async fn replay_lake(
    lake: &Lake,
    engine: &mut leaseline_alerts::AlertEngine,
) -> anyhow::Result<()> {
    let m = lake.latest().await.context("reading the lake's manifest")?;
    let batch = lake
        .read_table(&m, leaseline_lake::Table::LeaseEvents)
        .await
        .context("reading lease_events")?;
    let cols = leaseline_schema::EventColumns::new(&batch)?;
    for i in 0..cols.len() {
        engine.push(&cols.event(i)?);
    }
    Ok(())
}

/// Prints the verdict; returns the summary.
pub fn report(
    auditor: &mut Auditor,
    malformed: usize,
    format: CheckFormat,
    out: &mut dyn Write,
) -> anyhow::Result<Summary> {
    let violations = auditor.violations();
    let summary = Summary {
        events: auditor.len(),
        malformed,
        leases: auditor.lease_ids().len(),
        grants: auditor.timeline().len(),
        violations: violations.len(),
    };
    match format {
        CheckFormat::Text => {
            for v in &violations {
                write_text(v, out)?;
            }
            let verdict = if violations.is_empty() {
                "clean: no safety violations".to_string()
            } else {
                format!("{} safety violation(s)", violations.len())
            };
            writeln!(
                out,
                "{verdict} in {} events ({} leases, {} grants{})",
                summary.events,
                summary.leases,
                summary.grants,
                if summary.malformed > 0 {
                    format!("; {} malformed lines skipped", summary.malformed)
                } else {
                    String::new()
                }
            )?;
        }
        CheckFormat::Ndjson => {
            for v in &violations {
                serde_json::to_writer(&mut *out, &Row::from(v))?;
                writeln!(out)?;
            }
        }
    }
    Ok(summary)
}

fn time(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{us}us"))
}

fn write_text(v: &Violation, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} on {} (token {}{}) at {}",
        v.kind,
        v.lease_id,
        v.fencing_token,
        v.holder_id
            .as_deref()
            .map(|h| format!(", holder {h}"))
            .unwrap_or_default(),
        time(v.at)
    )?;
    writeln!(out, "  {}", v.detail)?;
    writeln!(out, "  evidence: {}", v.evidence.join(", "))?;
    writeln!(out)
}

/// A `lease_violations` row as JSON.
#[derive(Serialize)]
struct Row<'a> {
    kind: &'static str,
    lease_id: &'a str,
    fencing_token: u64,
    holder_id: Option<&'a str>,
    at: String,
    other_fencing_token: Option<u64>,
    other_holder_id: Option<&'a str>,
    detail: &'a str,
    evidence: &'a [String],
}

impl<'a> From<&'a Violation> for Row<'a> {
    fn from(v: &'a Violation) -> Self {
        Row {
            kind: v.kind.as_str(),
            lease_id: &v.lease_id,
            fencing_token: v.fencing_token,
            holder_id: v.holder_id.as_deref(),
            at: time(v.at),
            other_fencing_token: v.other_fencing_token,
            other_holder_id: v.other_holder_id.as_deref(),
            detail: &v.detail,
            evidence: &v.evidence,
        }
    }
}
