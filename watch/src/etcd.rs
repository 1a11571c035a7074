//! The etcd backend: locks and elections of etcd's `concurrency` package
//! (etcd v3), as `etcdctl lock NAME` and `etcdctl elect NAME PROPOSAL`
//! and every client of that package make them.
//!
//! What a lock is:
//! - each contender puts a key `<prefix><name>/<lease id in hex>` attached
//!   to its session's lease; the `lease_id` of the contract is `<name>`
//!   (`locks/orders/694d8a3c2f1b0e05` under `locks/` is `orders`, and a
//!   name may itself contain `/`: the lease part is cut at the last one);
//! - the owner is the key with the lowest create revision under
//!   `<prefix><name>/`, and the fencing token is that create revision: it
//!   rises with every grant and never on a renewal, as the contract wants;
//! - `holder_id` is the key's value when it has one (an election's
//!   proposal), otherwise the lease id in hex, which is what names a
//!   mutex's session (`etcdctl lock` puts an empty value);
//! - the deadline comes from the lease (`LeaseTimeToLive`): when it is read
//!   and the TTL left, in whole seconds as etcd answers.
//!
//! A key under the prefix that is none of this (no `/` after the name, no
//! lease, a last part that is not its lease in hex, a value or key that is
//! not UTF-8) is logged once and counted as unreadable, and reported
//! nothing for.
//!
//! How it follows etcd: the locks are read at one revision (`Range` at
//! `R`), then watched from `R + 1` (`Watch` with `start_revision`): etcd
//! hands out every change after `R`, in order, once. The cursor saved with
//! the state file ([`crate::Session::cursor`]) is the revision of the last
//! change whose events were sent; a restarted watcher reads the locks at
//! that revision (they are what the state file says) and watches from the
//! next one, so every change made while it was down is replayed, exactly.
//! When that revision was compacted away (or is ahead of the cluster: a
//! new cluster under the same prefix), it says so in a log line and falls
//! back to a scan of the locks now, compared with what was reported, as
//! the Redis backend does.
//!
//! What a watch shows and what it does not:
//! - a new key, a new owner, a deleted key are seen as they happen;
//! - a delete does not say why. The adapter asks for the key's lease as
//!   soon as the delete arrives, in a task that reads the watch ahead of
//!   the loop that reports (which may be waiting on Kafka), since a
//!   client's release is a delete followed at once by a revoke of its
//!   session's lease: a lease still alive means the client deleted its
//!   key (`Unlock`, `Resign`): `released`. A lease gone means it was revoked or ran out,
//!   which etcd does the same way (a lease revoke deleting its keys), so
//!   the adapter tells them apart by the deadline it knows: gone more than
//!   [`REVOKE_MARGIN_MS`] before that deadline is `revoked` (reason `lease
//!   revoked`), otherwise `expired` (at the deadline);
//! - keepalives are not changes to keys, so no watch shows them. The
//!   adapter reads the TTL left of every owner's lease every
//!   `lease_poll_interval`; when the deadline it gives has moved later by
//!   more than [`RENEW_SLACK_MS`] (TTLs are whole seconds), that is a
//!   `renewed`. A read of 0 seconds shows no renewal: an expired lease
//!   answers 0 until the leader revokes it ([`renewal_read`]). So renewals are seen at most once per poll, late by up to
//!   a poll interval, and keepalives closer together than that are one
//!   renewal; the known deadline is never later than etcd's, which is
//!   what keeps an expiry from reading as a revoke;
//! - a TTL read tells the present, while the model may still be behind
//!   (always so while a restart replays history, and for a moment live):
//!   the owner's key may be gone by then, and a session's lease outlives
//!   an `Unlock`. So a renewal counts only when the key itself is read
//!   after the TTL and found with the same create revision: a key never
//!   comes back once deleted, so it owned the lock at the TTL read. A
//!   renewal of a key already gone would report a grant renewed after the
//!   end the replay is about to report.
//!
//! Limits: etcd has no clock to read, so `ts` is the watcher's clock when
//! it handles the change (a replay after a restart is stamped with the
//! time of the replay). A delete replayed after the lease's own deadline
//! (the watcher down longer than the released lease's remaining TTL)
//! reads as an expiry, and a lease revoked while the watcher was down,
//! replayed after its known deadline, too. A grant whose lease is gone
//! before the adapter first reads it (it began and ended while the
//! watcher was down) is reported with a TTL of 1 ms.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, KeyValue, WatchOptions, WatchResponse,
    WatchStream,
};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

use crate::mapping::{End, Held};
use crate::state::Observation;
use crate::{Backend, Change, Scan, Session, WatchError};

/// A lease found gone this long or more before the deadline the adapter
/// knows was revoked; closer to it, it ran out. etcd's leader checks for
/// expired leases every 500 ms, so an expiry is deleted up to that late
/// (never early: the known deadline is at most etcd's).
pub const REVOKE_MARGIN_MS: i64 = 500;

/// A TTL read gives whole seconds: deadlines read without a keepalive in
/// between differ by less than a second. A move later than this is a
/// renewal.
pub const RENEW_SLACK_MS: i64 = 1_000;

/// What to watch.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `http://host:port`, one per member.
    pub endpoints: Vec<String>,
    /// The locks' keys start with this (a `/` is added when missing).
    pub prefix: String,
    /// User and password, for a cluster with authentication on.
    pub user: Option<(String, String)>,
    /// Per-call timeout (the watch stream itself has none: HTTP/2
    /// keepalives find a dead connection).
    pub timeout: Duration,
    /// How often the TTL left of each owner's lease is read.
    pub lease_poll_interval: Duration,
}

/// The etcd backend.
pub struct Etcd {
    config: EtcdConfig,
    cursor: Option<i64>,
    /// Deadlines reported, by token (create revision).
    deadlines: HashMap<i64, i64>,
}

impl Etcd {
    pub fn new(mut config: EtcdConfig) -> Result<Etcd, WatchError> {
        if config.prefix.is_empty() {
            return Err(WatchError::Fatal(
                "an empty prefix: give the locks' prefix, e.g. locks/".into(),
            ));
        }
        if !config.prefix.ends_with('/') {
            config.prefix.push('/');
        }
        if config.endpoints.is_empty() {
            return Err(WatchError::Fatal("no etcd endpoint".into()));
        }
        config.lease_poll_interval = config.lease_poll_interval.max(Duration::from_millis(50));
        Ok(Etcd {
            config,
            cursor: None,
            deadlines: HashMap::new(),
        })
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn backend_error(what: &str) -> impl Fn(etcd_client::Error) -> WatchError + '_ {
    move |e| WatchError::Backend(format!("{what}: {e}"))
}

/// The TTL left of a lease in seconds, `-1` when it is gone.
async fn lease_ttl(
    c: &mut etcd_client::LeaseClient,
    timeout: Duration,
    lease: i64,
) -> Result<i64, WatchError> {
    Ok(timed(
        timeout,
        "reading a lease's TTL",
        c.time_to_live(lease, None),
    )
    .await?
    .ttl())
}

/// A call with the configured timeout.
async fn timed<T>(
    timeout: Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, WatchError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(backend_error(what)),
        Err(_) => Err(WatchError::Backend(format!("{what}: timed out"))),
    }
}

/// Where a key under the prefix belongs: its lock's name, or why it is
/// not a lock's key. `rest` is the key without the prefix.
pub fn parse_key(rest: &str, lease: i64) -> Result<&str, String> {
    let Some((name, suffix)) = rest.rsplit_once('/') else {
        return Err("no /<lease> after the lock's name".into());
    };
    if name.is_empty() {
        return Err("no lock name before the lease".into());
    }
    if lease == 0 {
        return Err("the key has no lease: not a session's key".into());
    }
    if suffix != format!("{lease:x}") {
        return Err(format!(
            "its last part {suffix:?} is not its lease {lease:x}"
        ));
    }
    Ok(name)
}

/// The holder a key names: its value, or its lease in hex when empty.
pub fn holder_of(value: &[u8], lease: i64) -> Result<String, String> {
    if value.is_empty() {
        return Ok(format!("{lease:x}"));
    }
    std::str::from_utf8(value)
        .map(str::to_string)
        .map_err(|_| "the value is not UTF-8".into())
}

/// How a deleted owner's grant ended: its lease alive or not when the
/// delete was handled at `now_ms`, against the deadline known then.
pub fn ended_by(lease_alive: bool, now_ms: i64, deadline_ms: i64) -> End {
    if lease_alive {
        End::Deleted
    } else if now_ms + REVOKE_MARGIN_MS < deadline_ms {
        End::Revoked("lease revoked")
    } else {
        End::Expired
    }
}

/// The deadline a TTL read gives (`ttl_s` whole seconds left at
/// `now_ms`); `None` for a lease that is gone (`-1`).
pub fn deadline_from_ttl(now_ms: i64, ttl_s: i64) -> Option<i64> {
    (ttl_s >= 0).then(|| now_ms + ttl_s * 1_000)
}

/// The deadline a TTL read proves for a renewal: none for a read of 0.
/// etcd answers the TTL left truncated to whole seconds, so a read of `n`
/// proves at least `n` seconds left; but a lease past its deadline that the
/// leader has not revoked yet (it looks every 500 ms) answers 0 too, so 0
/// proves nothing, and reading it as "now" would report the expiring lease
/// renewed after the expiry the revoke then reports.
pub fn renewal_read(now_ms: i64, ttl_s: i64) -> Option<i64> {
    (ttl_s >= 1).then(|| now_ms + ttl_s * 1_000)
}

/// The new deadline when a TTL read shows a renewal, given the known one.
pub fn renewed_deadline(known_ms: i64, read_ms: i64) -> Option<i64> {
    (read_ms > known_ms + RENEW_SLACK_MS).then_some(read_ms)
}

#[derive(Debug, Clone)]
struct Entry {
    key: String,
    lease: i64,
    value: Vec<u8>,
}

/// The keys under the prefix, as of the revision handled last.
#[derive(Debug, Default)]
struct Model {
    /// Name → create revision → key.
    locks: BTreeMap<String, BTreeMap<i64, Entry>>,
    /// Key → (name, create revision), to place a delete.
    keys: HashMap<Vec<u8>, (String, i64)>,
    /// Keys that are no lock's (the key without the prefix) → why.
    bad: BTreeMap<String, String>,
}

impl Model {
    /// The `lease_id` a key stands under: its lock's name, or for a key
    /// that is no lock's the key without the prefix.
    fn place(prefix: &str, key: &[u8], lease: i64) -> (String, Result<(), String>) {
        let Ok(key) = std::str::from_utf8(key) else {
            let lossy = String::from_utf8_lossy(key);
            let rest = lossy.strip_prefix(prefix).unwrap_or(&lossy).to_string();
            return (rest, Err("the key is not UTF-8".into()));
        };
        let rest = key.strip_prefix(prefix).unwrap_or(key);
        match parse_key(rest, lease) {
            Ok(name) => (name.to_string(), Ok(())),
            Err(why) => (rest.to_string(), Err(why)),
        }
    }

    /// A key put; returns the `lease_id` it touched.
    fn put(&mut self, prefix: &str, kv: &KeyValue) -> String {
        self.put_key(
            prefix,
            kv.key(),
            kv.value(),
            kv.lease(),
            kv.create_revision(),
        )
    }

    fn put_key(&mut self, prefix: &str, key: &[u8], value: &[u8], lease: i64, rev: i64) -> String {
        let (id, placed) = Model::place(prefix, key, lease);
        if let Some((old, rev)) = self.keys.remove(key) {
            if let Some(m) = self.locks.get_mut(&old) {
                m.remove(&rev);
                if m.is_empty() {
                    self.locks.remove(&old);
                }
            }
        }
        match placed {
            Ok(()) => {
                self.keys.insert(key.to_vec(), (id.clone(), rev));
                self.locks.entry(id.clone()).or_default().insert(
                    rev,
                    Entry {
                        key: String::from_utf8_lossy(key).into_owned(),
                        lease,
                        value: value.to_vec(),
                    },
                );
            }
            Err(why) => {
                self.bad.insert(id.clone(), why);
            }
        }
        id
    }

    /// A key deleted; returns the `lease_id` it touched, if it was known.
    fn delete(&mut self, prefix: &str, key: &[u8]) -> Option<String> {
        if let Some((name, rev)) = self.keys.remove(key) {
            if let Some(m) = self.locks.get_mut(&name) {
                m.remove(&rev);
                if m.is_empty() {
                    self.locks.remove(&name);
                }
            }
            return Some(name);
        }
        let lossy = String::from_utf8_lossy(key);
        let rest = lossy.strip_prefix(prefix).unwrap_or(&lossy).to_string();
        self.bad.remove(&rest).map(|_| rest)
    }

    /// The owner of a lock: its lowest create revision.
    fn owner(&self, name: &str) -> Option<(i64, &Entry)> {
        self.locks
            .get(name)?
            .first_key_value()
            .map(|(rev, e)| (*rev, e))
    }
}

impl Backend for Etcd {
    type Session = EtcdSession;

    fn name(&self) -> &'static str {
        "etcd"
    }

    fn scope(&self) -> String {
        format!("etcd/{}", self.config.prefix)
    }

    fn describe(&self) -> String {
        self.config.endpoints.join(",")
    }

    fn resume(&mut self, cursor: Option<i64>, reported: &BTreeMap<String, Held>) {
        self.cursor = cursor;
        self.deadlines = reported
            .values()
            .map(|h| (h.token as i64, h.deadline_ms))
            .collect();
    }

    async fn connect(&mut self) -> Result<EtcdSession, WatchError> {
        let t = self.config.timeout;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(t)
            .with_keep_alive(t, t);
        if let Some((user, password)) = &self.config.user {
            opts = opts.with_user(user, password);
        }
        let mut client = timed(
            t,
            "connecting",
            Client::connect(&self.config.endpoints, Some(opts)),
        )
        .await?;
        let prefix = self.config.prefix.clone();
        let range = |rev: i64| {
            let mut o = GetOptions::new().with_prefix();
            if rev > 0 {
                o = o.with_revision(rev);
            }
            o
        };
        let mut kv = client.kv_client();
        let (kvs, at) = match self.cursor {
            Some(rev) => match timed(
                t,
                "reading the locks",
                kv.get(prefix.as_str(), Some(range(rev))),
            )
            .await
            {
                Ok(r) => (r.kvs().to_vec(), rev),
                // Compacted, or a revision the cluster has not reached.
                Err(e) if e.to_string().contains("required revision") => {
                    let r = timed(
                        t,
                        "reading the locks",
                        kv.get(prefix.as_str(), Some(range(0))),
                    )
                    .await?;
                    let now = r.header().map_or(0, |h| h.revision());
                    warn!(revision = rev, error = %e, resync_at = now, "cannot replay from the saved revision: resyncing from a scan; changes in between are reported as a scan finds them");
                    (r.kvs().to_vec(), now)
                }
                Err(e) => return Err(e),
            },
            None => {
                let r = timed(
                    t,
                    "reading the locks",
                    kv.get(prefix.as_str(), Some(range(0))),
                )
                .await?;
                (r.kvs().to_vec(), r.header().map_or(0, |h| h.revision()))
            }
        };
        let mut model = Model::default();
        for kv in &kvs {
            model.put(&prefix, kv);
        }
        let mut stream = timed(
            t,
            "watching",
            client.watch(
                prefix.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(at + 1)
                        .with_prev_key(),
                ),
            ),
        )
        .await?;
        let created = timed(t, "watching", stream.message())
            .await?
            .ok_or_else(|| WatchError::Backend("the watch closed at once".into()))?;
        if created.canceled() {
            return Err(WatchError::Backend(format!(
                "the watch from revision {} was refused (compacted at {}): {}",
                at + 1,
                created.compact_revision(),
                created.cancel_reason()
            )));
        }
        if self.cursor.is_some_and(|c| c == at) {
            info!(
                revision = at,
                "replaying etcd's history from the saved revision"
            );
        }
        let mut poll = tokio::time::interval(self.config.lease_poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (received, reader) = spawn_reader(stream, client.clone(), t);
        Ok(EtcdSession {
            client,
            received,
            _reader: reader,
            prefix,
            timeout: t,
            model,
            deadlines: std::mem::take(&mut self.deadlines),
            pending: VecDeque::new(),
            inbox: None,
            at,
            pending_at: at,
            handed: None,
            poll,
        })
    }
}

/// A watch response with whether the lease of each key it deletes was
/// alive when the response arrived.
struct Received {
    resp: WatchResponse,
    alive: HashMap<i64, bool>,
    /// When it arrived: a lease found gone is told revoked or expired by
    /// this time, not by when the loop got to it. `None` once a lease was
    /// read later ([`EtcdSession::handle_inbox`]).
    arrived_ms: Option<i64>,
}

/// Responses the reader may hold ahead of the changes handed out.
const RECEIVED_AHEAD: usize = 1024;

/// Reads the watch in a task of its own, and the lease of every key a
/// response deletes as soon as the response arrives (from the key's
/// previous value, which the watch sends along).
///
/// Why: a lock client's release is two calls, delete the key then revoke
/// the session's lease (`Unlock` then `Close` in etcd's `concurrency`
/// package), and a delete is a release only if its lease is still alive
/// when read. The revoke goes through Raft and the TTL read does not, so a
/// read made when the delete arrives comes first; a read made after the
/// watcher's loop has waited on Kafka for a checkpoint comes too late and
/// reads a release as a revoke.
fn spawn_reader(
    mut stream: WatchStream,
    client: Client,
    timeout: Duration,
) -> (
    mpsc::Receiver<Result<Received, WatchError>>,
    AbortOnDropHandle<()>,
) {
    let (tx, rx) = mpsc::channel(RECEIVED_AHEAD);
    let task = tokio::spawn(async move {
        let mut leases = client.lease_client();
        loop {
            let r = async {
                let resp = stream
                    .message()
                    .await
                    .map_err(backend_error("watching"))?
                    .ok_or_else(|| WatchError::Backend("the watch stream closed".into()))?;
                if resp.canceled() {
                    return Err(WatchError::Backend(format!(
                        "the watch was cancelled (compacted at {}): {}",
                        resp.compact_revision(),
                        resp.cancel_reason()
                    )));
                }
                let deleted: BTreeSet<i64> = resp
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Delete)
                    .filter_map(|e| e.prev_kv())
                    .map(|kv| kv.lease())
                    .filter(|l| *l != 0)
                    .collect();
                let arrived_ms = Some(now_ms());
                let mut alive = HashMap::new();
                for lease in deleted {
                    alive.insert(lease, lease_ttl(&mut leases, timeout, lease).await? >= 0);
                }
                Ok(Received {
                    resp,
                    alive,
                    arrived_ms,
                })
            }
            .await;
            let stop = r.is_err();
            // Progress notices carry no change.
            if matches!(&r, Ok(m) if m.resp.events().is_empty()) {
                continue;
            }
            if tx.send(r).await.is_err() || stop {
                return;
            }
        }
    });
    (rx, AbortOnDropHandle::new(task))
}

/// One connection: the watch stream and the model it keeps up to date.
pub struct EtcdSession {
    client: Client,
    /// The watch's responses, as [`spawn_reader`] hands them on.
    received: mpsc::Receiver<Result<Received, WatchError>>,
    _reader: AbortOnDropHandle<()>,
    prefix: String,
    timeout: Duration,
    model: Model,
    /// Known deadlines of owners, by token; never later than etcd's.
    deadlines: HashMap<i64, i64>,
    /// Changes of the response being handed out.
    pending: VecDeque<Change>,
    /// A response received and not yet handled: kept here so that a
    /// cancelled [`Session::next_change`] loses nothing.
    inbox: Option<Received>,
    /// The revision every change up to which was handed out.
    at: i64,
    /// The revision of the response being handed out.
    pending_at: i64,
    /// What was last handed out, lock by lock, after the first scan: a
    /// later scan answers this, since the watch loses nothing.
    handed: Option<BTreeMap<String, (Observation, i64)>>,
    poll: tokio::time::Interval,
}

impl Session for EtcdSession {
    async fn next_change(&mut self) -> Result<Change, WatchError> {
        loop {
            if let Some(c) = self.pending.pop_front() {
                if self.pending.is_empty() {
                    self.at = self.pending_at;
                }
                return Ok(c);
            }
            if self.inbox.is_none() {
                tokio::select! {
                    r = self.received.recv() => {
                        let r = r.ok_or_else(|| WatchError::Backend("the watch reader stopped".into()))??;
                        self.inbox = Some(r);
                    }
                    _ = self.poll.tick() => {
                        self.poll_leases().await?;
                        continue;
                    }
                }
            }
            self.handle_inbox().await?;
        }
    }

    async fn read(&mut self, lease_id: &str) -> Result<(Observation, i64), WatchError> {
        let seen = self.observe(lease_id).await?;
        if let Some(h) = &mut self.handed {
            match &seen.0 {
                Observation::Absent => h.remove(lease_id),
                o => h.insert(lease_id.to_string(), (o.clone(), seen.1)),
            };
        }
        Ok(seen)
    }

    async fn scan(&mut self) -> Result<Scan, WatchError> {
        if let Some(h) = &self.handed {
            return Ok(Scan {
                locks: h.clone(),
                ended_ms: now_ms(),
            });
        }
        let ids: BTreeSet<String> = self
            .model
            .locks
            .keys()
            .chain(self.model.bad.keys())
            .cloned()
            .collect();
        let mut scan = Scan::default();
        for id in ids {
            let seen = self.observe(&id).await?;
            if seen.0 != Observation::Absent {
                scan.locks.insert(id, seen);
            }
        }
        scan.ended_ms = now_ms();
        self.handed = Some(scan.locks.clone());
        Ok(scan)
    }

    fn cursor(&self) -> Option<i64> {
        Some(self.at)
    }
}

impl EtcdSession {
    /// The lock as the model has it now.
    async fn observe(&mut self, lease_id: &str) -> Result<(Observation, i64), WatchError> {
        let Some((rev, e)) = self.model.owner(lease_id) else {
            let now = now_ms();
            return Ok(match self.model.bad.get(lease_id) {
                Some(why) => (Observation::Bad(why.clone()), now),
                None => (Observation::Absent, now),
            });
        };
        let (lease, key) = (e.lease, e.key.clone());
        let holder = match holder_of(&e.value, lease) {
            Ok(h) => h,
            Err(why) => return Ok((Observation::Bad(why), now_ms())),
        };
        let deadline_ms = match self.deadlines.get(&rev) {
            Some(d) => *d,
            None => {
                let ttl = self.ttl(lease).await?;
                let now = now_ms();
                // Gone already: it ended before it could be read.
                let d = deadline_from_ttl(now, ttl).unwrap_or(now);
                self.deadlines.insert(rev, d);
                d
            }
        };
        let now = now_ms();
        Ok((
            Observation::Held(Held {
                holder,
                token: rev as u64,
                value_hash: xxhash_rust::xxh3::xxh3_64(key.as_bytes()),
                deadline_ms,
            }),
            now,
        ))
    }

    /// [`lease_ttl`] on the client the watcher holds.
    async fn ttl(&mut self, lease: i64) -> Result<i64, WatchError> {
        lease_ttl(&mut self.client.lease_client(), self.timeout, lease).await
    }

    /// Turns the response in the inbox into one change per lock it
    /// touched, with how a deleted owner ended.
    async fn handle_inbox(&mut self) -> Result<(), WatchError> {
        let Some(Received { resp, alive, .. }) = &self.inbox else {
            return Ok(());
        };
        // Leases of deleted keys the reader could not read (a delete
        // without its previous value), read before the model moves on:
        // each read is kept, so a cancelled call starts where it stopped.
        let unread: BTreeSet<i64> = resp
            .events()
            .iter()
            .filter(|e| e.event_type() == EventType::Delete)
            .filter_map(|e| e.kv())
            .filter_map(|kv| self.model.keys.get(kv.key()))
            .filter_map(|(name, rev)| self.model.locks.get(name)?.get(rev))
            .map(|e| e.lease)
            .filter(|lease| !alive.contains_key(lease))
            .collect();
        for lease in unread {
            let alive = self.ttl(lease).await? >= 0;
            if let Some(r) = &mut self.inbox {
                r.alive.insert(lease, alive);
                // Read now, so judged by now.
                r.arrived_ms = None;
            }
        }
        let Some(Received {
            resp,
            alive,
            arrived_ms,
        }) = self.inbox.take()
        else {
            return Ok(());
        };
        let now = arrived_ms.unwrap_or_else(now_ms);
        let mut touched: Vec<String> = Vec::new();
        let mut owners: HashMap<String, Option<(i64, i64)>> = HashMap::new();
        let mut last_rev = self.at;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            last_rev = last_rev.max(kv.mod_revision());
            let id = match ev.event_type() {
                EventType::Put => Model::place(&self.prefix, kv.key(), kv.lease()).0,
                EventType::Delete => match self.model.keys.get(kv.key()) {
                    Some((name, _)) => name.clone(),
                    None => Model::place(&self.prefix, kv.key(), kv.lease()).0,
                },
            };
            if !owners.contains_key(&id) {
                let before = self.model.owner(&id).map(|(rev, e)| (rev, e.lease));
                owners.insert(id.clone(), before);
                touched.push(id);
            }
            match ev.event_type() {
                EventType::Put => {
                    self.model.put(&self.prefix, kv);
                }
                EventType::Delete => {
                    self.model.delete(&self.prefix, kv.key());
                }
            }
        }
        for id in touched {
            let end = match owners.get(&id).copied().flatten() {
                Some((rev, lease))
                    if !self
                        .model
                        .locks
                        .get(&id)
                        .is_some_and(|m| m.contains_key(&rev)) =>
                {
                    let alive = alive.get(&lease).copied().unwrap_or(false);
                    let deadline = self.deadlines.get(&rev).copied().unwrap_or(now);
                    self.deadlines.remove(&rev);
                    ended_by(alive, now, deadline)
                }
                _ => End::Unknown,
            };
            self.pending.push_back(Change { lease_id: id, end });
        }
        self.pending_at = last_rev;
        if self.pending.is_empty() {
            self.at = last_rev;
        }
        Ok(())
    }

    /// The create revision of `key` now, `None` when it does not exist.
    async fn created(&mut self, key: &str) -> Result<Option<i64>, WatchError> {
        let mut kv = self.client.kv_client();
        let r = timed(self.timeout, "reading a lock's key", kv.get(key, None)).await?;
        Ok(r.kvs().first().map(|kv| kv.create_revision()))
    }

    /// Reads the TTL left of every owner's lease; a deadline moved later
    /// is a change (a renewal) of its lock, if its key is still there.
    async fn poll_leases(&mut self) -> Result<(), WatchError> {
        let owners: Vec<(String, i64, i64, String)> = self
            .model
            .locks
            .keys()
            .filter_map(|name| {
                let (rev, e) = self.model.owner(name)?;
                Some((name.clone(), rev, e.lease, e.key.clone()))
            })
            .collect();
        let mut read: HashMap<i64, Option<i64>> = HashMap::new();
        for (name, rev, lease, key) in owners {
            let Some(known) = self.deadlines.get(&rev).copied() else {
                continue;
            };
            let deadline = match read.get(&lease) {
                Some(d) => *d,
                None => {
                    let ttl = self.ttl(lease).await?;
                    let d = renewal_read(now_ms(), ttl);
                    read.insert(lease, d);
                    d
                }
            };
            // A lease gone or about to be, or its key: the deletes are on
            // their way.
            if let Some(d) = deadline.and_then(|d| renewed_deadline(known, d)) {
                if self.created(&key).await? != Some(rev) {
                    continue;
                }
                self.deadlines.insert(rev, d);
                self.pending.push_back(Change {
                    lease_id: name,
                    end: End::Unknown,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_lock_name_and_its_own_lease() {
        assert_eq!(
            parse_key("orders/694d8a3c2f1b0e05", 0x694d8a3c2f1b0e05),
            Ok("orders")
        );
        assert_eq!(parse_key("a/b/c/1f", 0x1f), Ok("a/b/c"));
        assert_eq!(
            parse_key("orders", 5),
            Err("no /<lease> after the lock's name".into())
        );
        assert_eq!(
            parse_key("/5", 5),
            Err("no lock name before the lease".into())
        );
        assert_eq!(
            parse_key("orders/5", 0),
            Err("the key has no lease: not a session's key".into())
        );
        assert_eq!(
            parse_key("orders/6", 5),
            Err("its last part \"6\" is not its lease 5".into())
        );
    }

    #[test]
    fn the_holder_is_the_value_or_else_the_lease() {
        assert_eq!(holder_of(b"node-1", 0x2a), Ok("node-1".into()));
        assert_eq!(holder_of(b"", 0x2a), Ok("2a".into()));
        assert_eq!(
            holder_of(&[0xff, 0xfe], 0x2a),
            Err("the value is not UTF-8".into())
        );
    }

    #[test]
    fn a_delete_is_a_release_a_revoke_or_an_expiry() {
        // The lease lives on: the client deleted its key.
        assert_eq!(ended_by(true, 50_000, 10_000), End::Deleted);
        // Gone well before the deadline: revoked.
        assert_eq!(
            ended_by(false, 3_000, 10_000),
            End::Revoked("lease revoked")
        );
        assert_eq!(
            ended_by(false, 9_499, 10_000),
            End::Revoked("lease revoked")
        );
        // Gone at or near it: ran out.
        assert_eq!(ended_by(false, 9_500, 10_000), End::Expired);
        assert_eq!(ended_by(false, 10_400, 10_000), End::Expired);
    }

    #[test]
    fn ttl_reads_move_the_deadline_only_past_their_granularity() {
        assert_eq!(deadline_from_ttl(1_000, 9), Some(10_000));
        assert_eq!(deadline_from_ttl(1_000, 0), Some(1_000));
        assert_eq!(deadline_from_ttl(1_000, -1), None);
        // The same deadline read a little later, in whole seconds.
        assert_eq!(renewed_deadline(10_000, 10_700), None);
        assert_eq!(renewed_deadline(10_000, 11_000), None);
        assert_eq!(renewed_deadline(10_000, 11_001), Some(11_001));
        // Never earlier: a lease's TTL is only ever extended.
        assert_eq!(renewed_deadline(10_000, 9_000), None);
        // A read of 0, long after the known deadline: the lease ran out and
        // awaits its revoke, which is no renewal.
        assert_eq!(renewal_read(12_500, 0), None);
        assert_eq!(renewal_read(12_500, 2), Some(14_500));
        assert_eq!(renewal_read(12_500, -1), None);
    }

    #[test]
    fn the_owner_is_the_lowest_create_revision_and_strays_are_set_apart() {
        let mut m = Model::default();
        assert_eq!(m.put_key("l/", b"l/jobs/b", b"", 0xb, 7), "jobs");
        assert_eq!(m.put_key("l/", b"l/jobs/a", b"", 0xa, 5), "jobs");
        assert_eq!(m.put_key("l/", b"l/stray", b"x", 0, 6), "stray");
        assert_eq!(m.owner("jobs").map(|(r, e)| (r, e.lease)), Some((5, 0xa)));
        assert_eq!(
            m.bad.get("stray").map(String::as_str),
            Some("no /<lease> after the lock's name")
        );
        assert_eq!(m.delete("l/", b"l/jobs/a").as_deref(), Some("jobs"));
        assert_eq!(m.owner("jobs").map(|(r, _)| r), Some(7));
        assert_eq!(m.delete("l/", b"l/jobs/b").as_deref(), Some("jobs"));
        assert!(m.locks.is_empty());
        assert_eq!(m.delete("l/", b"l/stray").as_deref(), Some("stray"));
        assert_eq!(m.delete("l/", b"l/never"), None);
    }
}
