//! Delivery to receivers: Alertmanager's API v2 and generic JSON webhooks.
//!
//! Each receiver has its own outbox and task, so a slow or dead receiver
//! delays nobody else. The outbox holds the newest update of each alert
//! (an update replaces the one before it for the same alert), so a receiver
//! that comes back after an outage gets the current state of every alert
//! that changed meanwhile: delayed, none lost. One exception: a firing
//! update not yet delivered is never replaced by its own resolution. The
//! resolution waits behind it and goes in a later request, so an alert that
//! resolved before it could be sent (a late event, a backlog read at once,
//! a receiver outage) still reaches the receiver as firing once, never as
//! resolved only. Only when the outbox holds `queue_capacity` distinct
//! updates is the oldest dropped, counted in
//! `leaseline_alert_queue_overflow_total` and logged.
//!
//! Each receiver also has its own HTTP client (its trusted CA, its client
//! certificate) and its own credentials, read from files. A secret is held
//! as a [`Secret`], which no `Debug` or `Display` shows, and is sent only
//! in a header reqwest marks sensitive.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use indexmap::IndexMap;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::alert::{Alert, AlertState};
use crate::config::{ReceiverConfig, ReceiverKind};
use crate::error::{AlertError, Result};
use crate::metrics::LeaseMetrics;

const MAX_BATCH: usize = 500;

/// The outbox key of a resolution queued behind its undelivered firing.
const RESOLVED_AFTER: &str = "#resolved-after-firing";

fn rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// One queued update: whether it says firing, and what is sent.
type Update = (bool, Value);

/// A password or token read from a file.
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Reads the first line of a secret file. Errors name the file, never
/// its content.
fn read_secret(path: &Path, what: &str) -> std::result::Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the {what} file {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(format!("the {what} file {} is empty", path.display()));
    }
    Ok(Secret(line.to_string()))
}

/// How a receiver authenticates; the secrets are read before each attempt,
/// so a rotated one is used without a restart.
#[derive(Debug)]
enum Auth {
    None,
    Basic {
        username: String,
        password_file: PathBuf,
    },
    Bearer {
        token_file: PathBuf,
    },
}

impl Auth {
    fn of(cfg: &ReceiverConfig) -> Auth {
        if let Some(b) = &cfg.basic_auth {
            Auth::Basic {
                username: b.username.clone(),
                password_file: b.password_file.clone(),
            }
        } else if let Some(t) = &cfg.bearer_token_file {
            Auth::Bearer {
                token_file: t.clone(),
            }
        } else {
            Auth::None
        }
    }

    /// Reads the secret once, to fail at start-up rather than at the
    /// first alert.
    fn check(&self) -> std::result::Result<(), String> {
        match self {
            Auth::None => Ok(()),
            Auth::Basic { password_file, .. } => {
                read_secret(password_file, "basic_auth password").map(drop)
            }
            Auth::Bearer { token_file } => read_secret(token_file, "bearer token").map(drop),
        }
    }

    fn apply(
        &self,
        req: reqwest::RequestBuilder,
    ) -> std::result::Result<reqwest::RequestBuilder, String> {
        Ok(match self {
            Auth::None => req,
            Auth::Basic {
                username,
                password_file,
            } => {
                let password = read_secret(password_file, "basic_auth password")?;
                req.basic_auth(username, Some(password.0))
            }
            Auth::Bearer { token_file } => {
                let token = read_secret(token_file, "bearer token")?;
                req.bearer_auth(token.0)
            }
        })
    }
}

/// The HTTP client of one receiver: the system's roots, or only its own
/// CA; its client certificate for mutual TLS.
fn client_for(cfg: &ReceiverConfig) -> Result<reqwest::Client> {
    let err = |m: String| AlertError::Config(format!("alert receiver {:?}: {m}", cfg.name));
    let read = |p: &Path, what: &str| {
        std::fs::read(p).map_err(|e| err(format!("reading {what} {}: {e}", p.display())))
    };
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if let Some(tls) = &cfg.tls {
        if let Some(ca) = &tls.ca_file {
            let certs = reqwest::Certificate::from_pem_bundle(&read(ca, "tls.ca_file")?)
                .map_err(|e| err(format!("tls.ca_file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(err(format!(
                    "tls.ca_file {} holds no PEM certificate",
                    ca.display()
                )));
            }
            // Like Prometheus's ca_file: a private receiver is trusted
            // through its own CA only.
            b = b.tls_built_in_root_certs(false);
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            let mut pem = read(cert, "tls.cert_file")?;
            pem.push(b'\n');
            pem.extend(read(key, "tls.key_file")?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                err(format!(
                    "tls.cert_file {} with tls.key_file {}: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
            b = b.identity(id);
        }
    }
    b.build()
        .map_err(|e| err(format!("building its HTTP client: {}", chain(&e))))
}

/// An error and its causes on one line: reqwest's own message ("error
/// sending request") says nothing of a refused certificate or a reset
/// connection, its sources do.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let part = s.to_string();
        if !msg.contains(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        src = s.source();
    }
    msg
}

struct Outbox {
    cfg: ReceiverConfig,
    client: reqwest::Client,
    auth: Auth,
    capacity: usize,
    queue: Mutex<IndexMap<String, Update>>,
    wake: Notify,
    metrics: Option<LeaseMetrics>,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, IndexMap<String, Update>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, fingerprint: String, firing: bool, payload: Value) {
        let mut q = self.lock();
        queue_update(&mut q, fingerprint, firing, payload);
        while q.len() > self.capacity {
            if let Some((dropped, _)) = q.shift_remove_index(0) {
                warn!(receiver = self.cfg.name(), alert = %dropped, "alert queue full: dropped the oldest update");
                if let Some(m) = &self.metrics {
                    m.queue_overflow
                        .get_or_create(&LeaseMetrics::receiver_labels(self.cfg.name()))
                        .inc();
                }
            }
        }
        drop(q);
        self.wake.notify_one();
    }
}

/// Sends alert state changes to every configured receiver.
pub struct Notifier {
    outboxes: Vec<Arc<Outbox>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    resend_interval: Duration,
}

impl Notifier {
    /// Starts one delivery task per receiver. Fails, before starting any,
    /// when a receiver's CA, client certificate or secret file cannot be
    /// read: better at start-up than at the first alert.
    pub fn start(
        receivers: &[ReceiverConfig],
        capacity: usize,
        resend_interval: Duration,
        metrics: Option<LeaseMetrics>,
    ) -> Result<Notifier> {
        let mut outboxes = Vec::new();
        for cfg in receivers {
            let auth = Auth::of(cfg);
            auth.check()
                .map_err(|e| AlertError::Config(format!("alert receiver {:?}: {e}", cfg.name)))?;
            outboxes.push(Arc::new(Outbox {
                cfg: cfg.clone(),
                client: client_for(cfg)?,
                auth,
                capacity,
                queue: Mutex::new(IndexMap::new()),
                wake: Notify::new(),
                metrics: metrics.clone(),
            }));
        }
        let tasks = outboxes
            .iter()
            .map(|o| tokio::spawn(deliver(o.clone())))
            .collect();
        Ok(Notifier {
            outboxes,
            tasks,
            resend_interval,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.outboxes.is_empty()
    }

    /// Queues alerts for every receiver. Pending alerts are not sent.
    /// `now_us` is the wall clock: Alertmanager compares `endsAt` with its
    /// own, so a firing alert is sent as ending a few resend intervals from
    /// now (it is re-sent before then), and a resolved one no later than now.
    pub fn send(&self, alerts: &[Alert], now_us: i64) {
        for a in alerts.iter().filter(|a| a.state != AlertState::Pending) {
            let fp = a.fingerprint();
            for o in &self.outboxes {
                let mut payload = match o.cfg.kind {
                    ReceiverKind::Alertmanager => self.alertmanager_alert(a, now_us),
                    ReceiverKind::Webhook => self.webhook_alert(a, &fp, now_us),
                };
                // Validation keeps these from replacing the alert's own.
                for (k, v) in &o.cfg.labels {
                    payload["labels"][k] = Value::String(v.clone());
                }
                o.put(fp.clone(), a.state == AlertState::Firing, payload);
            }
        }
    }

    fn ends_at(&self, a: &Alert, now_us: i64) -> i64 {
        match a.ends_at {
            Some(e) if a.state == AlertState::Resolved => e.min(now_us),
            _ => {
                now_us + 4 * i64::try_from(self.resend_interval.as_micros()).unwrap_or(i64::MAX / 8)
            }
        }
    }

    fn annotations(a: &Alert) -> Value {
        let mut ann = json!({"summary": a.summary, "description": a.description});
        if let Some(u) = &a.timeline_url {
            ann["timeline"] = Value::String(u.clone());
        }
        ann
    }

    fn alertmanager_alert(&self, a: &Alert, now_us: i64) -> Value {
        let mut v = json!({
            "labels": a.labels(),
            "annotations": Self::annotations(a),
            "startsAt": rfc3339(a.starts_at.min(now_us)),
            "endsAt": rfc3339(self.ends_at(a, now_us)),
        });
        if let Some(u) = &a.timeline_url {
            v["generatorURL"] = Value::String(u.clone());
        }
        v
    }

    fn webhook_alert(&self, a: &Alert, fp: &str, now_us: i64) -> Value {
        json!({
            "status": if a.state == AlertState::Firing { "firing" } else { "resolved" },
            "labels": a.labels(),
            "annotations": Self::annotations(a),
            "startsAt": rfc3339(a.starts_at),
            "endsAt": a.ends_at.filter(|_| a.state == AlertState::Resolved).map(rfc3339)
                .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_string()),
            "generatorURL": a.timeline_url.clone().unwrap_or_default(),
            "fingerprint": fp,
            "sentAt": rfc3339(now_us),
        })
    }

    /// Waits until every outbox is empty or `deadline` passes, then stops
    /// the delivery tasks. Returns how many updates were left undelivered.
    pub async fn shutdown(self, deadline: Duration) -> usize {
        let drained = async {
            loop {
                if self.outboxes.iter().all(|o| o.lock().is_empty()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let _ = tokio::time::timeout(deadline, drained).await;
        for t in &self.tasks {
            t.abort();
        }
        let left: usize = self.outboxes.iter().map(|o| o.lock().len()).sum();
        if left > 0 {
            warn!(
                undelivered = left,
                "stopping with alert updates undelivered"
            );
        }
        left
    }
}

/// Queues one update of the alert `fingerprint` (see the module docs).
fn queue_update(
    q: &mut IndexMap<String, Update>,
    fingerprint: String,
    firing: bool,
    payload: Value,
) {
    let behind = format!("{fingerprint}{RESOLVED_AFTER}");
    let key = if firing {
        // Firing again: the queued resolution is out of date.
        q.shift_remove(&behind);
        fingerprint
    } else if q.get(&fingerprint).is_some_and(|(f, _)| *f) || q.contains_key(&behind) {
        behind
    } else {
        fingerprint
    };
    // Re-inserting moves the alert to the back: updates go out in the
    // order they were made.
    q.shift_remove(&key);
    q.insert(key, (firing, payload));
}

/// The updates of the next request, oldest first; a resolution waits
/// until its firing has gone out.
fn next_batch(q: &IndexMap<String, Update>) -> Vec<(String, Update)> {
    q.iter()
        .filter(|(k, _)| {
            k.strip_suffix(RESOLVED_AFTER)
                .is_none_or(|fp| !q.contains_key(fp))
        })
        .take(MAX_BATCH)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn deliver(outbox: Arc<Outbox>) {
    let name = outbox.cfg.name().to_string();
    let mut backoff = Duration::from_millis(100);
    let mut failures = 0u64;
    loop {
        let batch = next_batch(&outbox.lock());
        if batch.is_empty() {
            outbox.wake.notified().await;
            continue;
        }
        let url = &outbox.cfg.url;
        let (url, body) = match outbox.cfg.kind {
            ReceiverKind::Alertmanager => {
                let mut u = url.clone();
                u.path_segments_mut()
                    .map(|mut p| {
                        p.pop_if_empty().extend(["api", "v2", "alerts"]);
                    })
                    .ok();
                (
                    u,
                    Value::Array(batch.iter().map(|(_, (_, v))| v.clone()).collect()),
                )
            }
            ReceiverKind::Webhook => {
                let alerts: Vec<Value> = batch.iter().map(|(_, (_, v))| v.clone()).collect();
                let firing = alerts.iter().any(|a| a["status"] == "firing");
                (
                    url.clone(),
                    json!({
                        "version": "4",
                        "receiver": name,
                        "status": if firing { "firing" } else { "resolved" },
                        "alerts": alerts,
                    }),
                )
            }
        };
        let request = outbox
            .auth
            .apply(outbox.client.post(url.clone()).json(&body));
        let result = match request {
            Ok(r) => r.send().await.map_err(|e| chain(&e)),
            Err(e) => Err(e),
        };
        let ok = match result {
            Ok(r) if r.status().is_success() => true,
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                let hint = match status.as_u16() {
                    401 | 403 => " (check the receiver's basic_auth or bearer_token_file)",
                    _ => "",
                };
                if failures == 0 || failures.is_multiple_of(20) {
                    warn!(receiver = %name, %url, %status, body = %text.chars().take(300).collect::<String>(), retry_in = ?backoff, "alert delivery refused{hint}");
                }
                false
            }
            Err(error) => {
                if failures == 0 || failures.is_multiple_of(20) {
                    warn!(receiver = %name, %url, %error, retry_in = ?backoff, "alert delivery failed");
                }
                false
            }
        };
        let labels = LeaseMetrics::receiver_labels(&name);
        if ok {
            if failures > 0 {
                info!(receiver = %name, after_failures = failures, "alert delivery recovered");
            }
            failures = 0;
            backoff = Duration::from_millis(100);
            if let Some(m) = &outbox.metrics {
                m.deliveries.get_or_create(&labels).inc();
            }
            let mut q = outbox.lock();
            for (k, sent) in &batch {
                // Keep an update that arrived while this one was in flight.
                if q.get(k) == Some(sent) {
                    q.shift_remove(k);
                }
            }
            debug!(receiver = %name, alerts = batch.len(), "alerts delivered");
        } else {
            failures += 1;
            if let Some(m) = &outbox.metrics {
                m.delivery_failures.get_or_create(&labels).inc();
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BasicAuth, ReceiverTls};

    fn keys(b: &[(String, Update)]) -> Vec<(&str, bool)> {
        b.iter().map(|(k, (f, _))| (k.as_str(), *f)).collect()
    }

    #[test]
    fn a_firing_not_yet_sent_is_never_replaced_by_its_resolution() {
        let mut q = IndexMap::new();
        queue_update(&mut q, "a".into(), true, json!(1));
        queue_update(&mut q, "a".into(), false, json!(2));
        queue_update(&mut q, "b".into(), false, json!(3));
        // The firing goes first, alone for its alert.
        let first = next_batch(&q);
        assert_eq!(keys(&first), vec![("a", true), ("b", false)]);
        for (k, _) in &first {
            q.shift_remove(k);
        }
        // Then its resolution.
        let second = next_batch(&q);
        assert_eq!(keys(&second), vec![("a#resolved-after-firing", false)]);
        // A later resolution replaces the queued one; firing again drops it.
        queue_update(&mut q, "a".into(), false, json!(4));
        assert_eq!(q.len(), 1);
        assert_eq!(q["a#resolved-after-firing"].1, json!(4));
        queue_update(&mut q, "a".into(), true, json!(5));
        assert_eq!(keys(&next_batch(&q)), vec![("a", true)]);
        // An update of a firing alert still replaces it.
        queue_update(&mut q, "a".into(), true, json!(6));
        assert_eq!(q.len(), 1);
        assert_eq!(q["a"].1, json!(6));
    }

    #[test]
    fn a_secret_shows_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "hunter2\nsecond line\n").unwrap();
        let s = read_secret(&file, "basic_auth password").unwrap();
        assert_eq!(s.0, "hunter2");
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        let auth = Auth::Basic {
            username: "u".into(),
            password_file: file,
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn an_unreadable_secret_or_ca_stops_the_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = ReceiverConfig::new(
            ReceiverKind::Alertmanager,
            "am",
            "https://127.0.0.1:9".parse().unwrap(),
        );
        r.basic_auth = Some(BasicAuth {
            username: "u".into(),
            password_file: dir.path().join("absent"),
        });
        let err = Notifier::start(&[r.clone()], 10, Duration::from_secs(60), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("alert receiver \"am\": reading the basic_auth password file")
                && err.contains("absent"),
            "{err}"
        );

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        r.basic_auth = None;
        r.bearer_token_file = Some(empty);
        let err = Notifier::start(&[r.clone()], 10, Duration::from_secs(60), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("is empty"), "{err}");

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate").unwrap();
        r.bearer_token_file = None;
        r.tls = Some(ReceiverTls {
            ca_file: Some(not_pem),
            ..Default::default()
        });
        let err = Notifier::start(&[r], 10, Duration::from_secs(60), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
    }
}
