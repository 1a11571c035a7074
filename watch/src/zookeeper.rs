//! The ZooKeeper backend: the lock recipe of ZooKeeper's documentation and
//! of Curator's `InterProcessMutex`. Under a root (`/locks`), each child is
//! a lock (`/locks/orders-1`); a contender creates an ephemeral sequential
//! node under it (`lock-0000000007`, Curator's
//! `_c_<uuid>-lock-0000000007`), and the node with the lowest sequence
//! owns the lock; the others wait for their predecessor to go.
//!
//! - `lease_id` is the lock's name under the root (`orders-1`); locks are
//!   the root's children, one level.
//! - The owner is the child whose name ends in `lock-` and ten digits with
//!   the lowest sequence; other children (a read-write lock's `read-`
//!   nodes, anything else) are no contenders.
//! - The fencing token is the owner node's `czxid`, the id of the
//!   transaction that created it: it rises with every node created in the
//!   ensemble, so a later grant always has a higher token, even when the
//!   lock's directory was deleted and its sequence started again (the
//!   sequence would not).
//! - The holder is the node's data when it is UTF-8 text (Curator writes
//!   the client's address), otherwise the owning session's id, `0x…`.
//! - An owner node that is not ephemeral is not a lock held by a session:
//!   unreadable.
//!
//! ZooKeeper grants no time: a lock is held while its session lives, and
//! sessions are kept alive by heartbeats nobody else sees. So `ttl_ms` is
//! the contract's longest (100 years, less a day for clock skew), counted
//! from the node's `ctime`, and no `renewed` is ever reported; the audit
//! keeps a grant open until its end.
//!
//! Changes come from one persistent recursive watch on the root (ZooKeeper
//! 3.6 or newer). A lock's node created or deleted makes the watcher read
//! the lock. When the deleted node is the owner the watcher knew, it asks
//! the server whether the owning session is still alive (the `dump`
//! four-letter word, which must be allowed: `4lw.commands.whitelist`):
//! alive, the session deleted its own node: `released`; gone, the session
//! expired (or was closed) and the server deleted the node: `expired`.
//! Without `dump`, every end is `released`, and the watcher says so once.
//!
//! Revocation is Curator's: `Revoker.attemptRevoke` sets the owner node's
//! data to [`REVOKE_MESSAGE`], and a holder that made its lock revocable
//! releases it. The watcher sees the data change; the owner node deleted
//! after it while its session lives is `revoked` (reason
//! [`REVOKE_REASON`]), and the holder stays the one read before the
//! request.
//!
//! ZooKeeper has no clock a client can read: `ts` is the watcher's clock.
//! A disconnection is a lost service: the client's watches miss the events
//! of the time it was away (ZOOKEEPER-4698), so the watcher reconnects with
//! a new session and resyncs.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;
use zookeeper_client as zk;

use crate::mapping::{End, Held};
use crate::state::Observation;
use crate::{Backend, Change, Scan, Session, WatchError};

/// The `ttl_ms` of a grant from its node's creation: the contract's
/// longest, less a day so that a watcher's clock behind the server's never
/// makes it longer.
const GRANT_TTL_MS: i64 = 3_155_760_000_000 - 86_400_000;

/// The data Curator's `Revoker` writes into an owner node to ask its
/// holder to let go (`LockInternals.REVOKE_MESSAGE`).
pub const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

/// The `reason` of a grant ended after a revocation request.
pub const REVOKE_REASON: &str = "revocation requested";

/// What to watch.
#[derive(Debug, Clone)]
pub struct ZooKeeperConfig {
    /// The ensemble, `host:port[,host:port]`.
    pub connect: String,
    /// The locks are the children of this node.
    pub root: String,
    /// Where to ask `dump` whether a session lives (`host:port`); by
    /// default the first server of `connect`. In an ensemble only the
    /// leader answers it.
    pub dump_at: Option<String>,
    /// The watcher's own session timeout.
    pub session_timeout: Duration,
    /// A request the server does not answer within this long is a lost
    /// connection.
    pub timeout: Duration,
}

/// The ZooKeeper backend.
pub struct ZooKeeper {
    config: ZooKeeperConfig,
    root: String,
    dump_at: String,
}

impl ZooKeeper {
    pub fn new(config: ZooKeeperConfig) -> Result<ZooKeeper, WatchError> {
        let root = normalize_root(&config.root).map_err(WatchError::Fatal)?;
        let dump_at = match &config.dump_at {
            Some(a) => a.clone(),
            None => config
                .connect
                .split(',')
                .next()
                .map(|s| s.split('/').next().unwrap_or(s).trim().to_string())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| WatchError::Fatal("no ZooKeeper server given".into()))?,
        };
        Ok(ZooKeeper {
            config,
            root,
            dump_at,
        })
    }
}

/// `/locks` from `/locks/` or `/locks`; the root itself is `/`.
fn normalize_root(root: &str) -> Result<String, String> {
    if !root.starts_with('/') {
        return Err(format!("the root {root:?} is not an absolute path"));
    }
    let trimmed = root.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.into()
    })
}

fn child_path(root: &str, name: &str) -> String {
    if root == "/" {
        format!("/{name}")
    } else {
        format!("{root}/{name}")
    }
}

/// The lock a node event's path is about, and the node under it if any:
/// `/locks/orders-1/lock-0000000003` under `/locks` is `("orders-1",
/// Some("lock-0000000003"))`. Deeper paths are ignored.
fn lock_of<'a>(root: &str, path: &'a str) -> Option<(&'a str, Option<&'a str>)> {
    let rest = if root == "/" {
        path.strip_prefix('/')?
    } else {
        path.strip_prefix(root)?.strip_prefix('/')?
    };
    let mut parts = rest.split('/');
    let lock = parts.next().filter(|l| !l.is_empty())?;
    let node = parts.next();
    if parts.next().is_some() {
        return None;
    }
    Some((lock, node))
}

/// The sequence of a contender's node name: `lock-` and ten digits at its
/// end.
fn sequence(name: &str) -> Option<u64> {
    let (head, digits) = name.split_at(name.len().checked_sub(10)?);
    if !head.ends_with("lock-") || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The owner among a lock's children: the lowest sequence.
fn owner(children: &[String]) -> Option<&str> {
    children
        .iter()
        .filter_map(|c| Some((sequence(c)?, c.as_str())))
        .min()
        .map(|(_, c)| c)
}

/// The lock as its owner node shows it. `known` is the holder read from
/// the same node before: a revocation request overwrote its data.
fn held(node: &str, data: &[u8], stat: &zk::Stat, known: Option<&str>) -> Observation {
    if stat.ephemeral_owner == 0 {
        return Observation::Bad(format!(
            "the owner node {node} is not ephemeral: no session holds it"
        ));
    }
    let Ok(token) = u64::try_from(stat.czxid) else {
        return Observation::Bad("the owner node's czxid is negative".into());
    };
    let holder = match (std::str::from_utf8(data).map(str::trim), known) {
        (_, Some(k)) if data == REVOKE_MESSAGE => k.to_string(),
        (Ok(h), _) if !h.is_empty() && data != REVOKE_MESSAGE => h.to_string(),
        _ => format!("0x{:x}", stat.ephemeral_owner),
    };
    Observation::Held(Held {
        holder,
        token,
        value_hash: xxhash_rust::xxh3::xxh3_64(node.as_bytes()),
        deadline_ms: stat.ctime.saturating_add(GRANT_TTL_MS),
    })
}

/// The live sessions in the reply to `dump`: the ids under "Session
/// Sets", before the ephemeral nodes. `None` when the reply is not a dump
/// (the word is not allowed).
fn live_sessions(dump: &str) -> Option<Vec<i64>> {
    let start = dump.find("Session Sets")?;
    let end = dump[start..]
        .find("ephemeral nodes dump")
        .map_or(dump.len(), |e| start + e);
    Some(
        dump[start..end]
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("0x"))
            .filter_map(|h| u64::from_str_radix(h, 16).ok())
            .map(|u| u as i64)
            .collect(),
    )
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn backend_error(what: &str) -> impl Fn(zk::Error) -> WatchError + '_ {
    move |e| WatchError::Backend(format!("{what}: {e}"))
}

impl Backend for ZooKeeper {
    type Session = ZooKeeperSession;

    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn scope(&self) -> String {
        format!("zookeeper{}", self.root)
    }

    fn describe(&self) -> String {
        format!("{}{}", self.config.connect, self.root)
    }

    async fn connect(&mut self) -> Result<ZooKeeperSession, WatchError> {
        let client = tokio::time::timeout(
            self.config.timeout,
            zk::Client::connector()
                .with_session_timeout(self.config.session_timeout)
                .with_connection_timeout(self.config.timeout)
                .connect(&self.config.connect),
        )
        .await
        .map_err(|_| WatchError::Backend("connecting: timed out".into()))?
        .map_err(backend_error("connecting"))?;
        // Watching before the first scan: a change after the scan's read
        // of a lock is notified.
        let watcher = tokio::time::timeout(
            self.config.timeout,
            client.watch(&self.root, zk::AddWatchMode::PersistentRecursive),
        )
        .await
        .map_err(|_| WatchError::Backend("adding the watch: timed out".into()))?
        .map_err(backend_error("adding the watch"))?;
        Ok(ZooKeeperSession {
            client,
            watcher,
            root: self.root.clone(),
            dump_at: self.dump_at.clone(),
            owners: HashMap::new(),
            timeout: self.config.timeout,
            dump_refused: false,
            handling: None,
        })
    }
}

/// A lock's owner node as last read.
struct Owner {
    node: String,
    session: i64,
    holder: String,
    /// Its data asked the holder to let go ([`REVOKE_MESSAGE`]).
    revoke_requested: bool,
}

/// One session with the ensemble.
pub struct ZooKeeperSession {
    client: zk::Client,
    watcher: zk::PersistentWatcher,
    root: String,
    dump_at: String,
    /// Each lock's owner node as last read.
    owners: HashMap<String, Owner>,
    timeout: Duration,
    /// `dump` was refused: ends are `released`, said once.
    dump_refused: bool,
    /// The event [`Session::next_change`] is handling: kept until it
    /// returns, so that a call dropped while it asks `dump` (the loop's
    /// other timers win a `select!`) loses nothing; the next call takes
    /// it up again.
    handling: Option<zk::WatchedEvent>,
}

impl ZooKeeperSession {
    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<Result<T, zk::Error>, WatchError> {
        tokio::time::timeout(self.timeout, f).await.map_err(|_| {
            WatchError::Backend(format!("{what}: no answer within {:?}", self.timeout))
        })
    }

    /// How an owner node that was deleted ended: its session alive, it was
    /// released; gone, the server deleted it when the session ended.
    async fn end_of(&mut self, session: i64) -> End {
        match self.dump().await {
            Ok(Some(live)) if live.contains(&session) => End::Deleted,
            Ok(Some(_)) => End::Expired,
            Ok(None) => {
                if !self.dump_refused {
                    self.dump_refused = true;
                    warn!(at = %self.dump_at, "the server does not answer `dump` (allow it with 4lw.commands.whitelist): a session's expiry is reported as a release");
                }
                End::Deleted
            }
            Err(e) => {
                warn!(at = %self.dump_at, error = %e, "could not ask `dump` whether a session lives; reported as a release");
                End::Deleted
            }
        }
    }

    async fn dump(&self) -> std::io::Result<Option<Vec<i64>>> {
        let ask = async {
            let mut s = tokio::net::TcpStream::connect(&self.dump_at).await?;
            s.write_all(b"dump").await?;
            let mut reply = String::new();
            s.read_to_string(&mut reply).await?;
            Ok::<_, std::io::Error>(reply)
        };
        let reply = tokio::time::timeout(self.timeout, ask)
            .await
            .map_err(|_| std::io::Error::other("timed out"))??;
        Ok(live_sessions(&reply))
    }

    async fn read_lock(&mut self, lock: &str) -> Result<Observation, WatchError> {
        let path = child_path(&self.root, lock);
        // The owner may go between the listing and its read: list again.
        for _ in 0..10 {
            let children = match self
                .timed("listing a lock", self.client.list_children(&path))
                .await?
            {
                Ok(c) => c,
                Err(zk::Error::NoNode) => {
                    self.owners.remove(lock);
                    return Ok(Observation::Absent);
                }
                Err(e) => return Err(WatchError::Backend(format!("listing {path}: {e}"))),
            };
            let Some(node) = owner(&children).map(str::to_string) else {
                self.owners.remove(lock);
                return Ok(Observation::Absent);
            };
            let node_path = format!("{path}/{node}");
            match self
                .timed("reading a lock node", self.client.get_data(&node_path))
                .await?
            {
                Ok((data, stat)) => {
                    let same = self
                        .owners
                        .get(lock)
                        .filter(|o| o.node == node && o.session == stat.ephemeral_owner);
                    let known = same.map(|o| o.holder.clone());
                    let requested = data == REVOKE_MESSAGE;
                    if requested && !same.is_some_and(|o| o.revoke_requested) {
                        tracing::info!(lease_id = lock, node = %node, "revocation requested");
                    }
                    let seen = held(&node, &data, &stat, known.as_deref());
                    if let Observation::Held(h) = &seen {
                        self.owners.insert(
                            lock.to_string(),
                            Owner {
                                node: node.clone(),
                                session: stat.ephemeral_owner,
                                holder: h.holder.clone(),
                                revoke_requested: requested,
                            },
                        );
                    } else {
                        self.owners.remove(lock);
                    }
                    return Ok(seen);
                }
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(WatchError::Backend(format!("reading {node_path}: {e}"))),
            }
        }
        Err(WatchError::Backend(format!(
            "{path}: its owner kept changing while read"
        )))
    }
}

impl Session for ZooKeeperSession {
    async fn next_change(&mut self) -> Result<Change, WatchError> {
        loop {
            let event = match &self.handling {
                Some(event) => event.clone(),
                None => {
                    let event = self.watcher.changed().await;
                    self.handling = Some(event.clone());
                    event
                }
            };
            if event.event_type == zk::EventType::Session {
                self.handling = None;
                if event.session_state == zk::SessionState::SyncConnected {
                    continue;
                }
                // Events of the time away are lost (ZOOKEEPER-4698), and
                // after a terminal state the watcher must not be polled:
                // a new session and a resync.
                return Err(WatchError::Backend(format!(
                    "the session is {:?}",
                    event.session_state
                )));
            }
            let Some((lock, node)) = lock_of(&self.root, &event.path) else {
                self.handling = None;
                continue;
            };
            let end = match (event.event_type, node, self.owners.get(lock)) {
                (zk::EventType::NodeDeleted, Some(node), Some(owner)) if node == owner.node => {
                    let revoked = owner.revoke_requested;
                    match self.end_of(owner.session).await {
                        End::Deleted if revoked => End::Revoked(REVOKE_REASON),
                        end => end,
                    }
                }
                _ => End::Unknown,
            };
            self.handling = None;
            return Ok(Change {
                lease_id: lock.to_string(),
                end,
            });
        }
    }

    async fn read(&mut self, lease_id: &str) -> Result<(Observation, i64), WatchError> {
        let seen = self.read_lock(lease_id).await?;
        Ok((seen, unix_ms()))
    }

    async fn scan(&mut self) -> Result<Scan, WatchError> {
        let locks = match self
            .timed("listing the locks", self.client.list_children(&self.root))
            .await?
        {
            Ok(l) => l,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(WatchError::Backend(format!("listing {}: {e}", self.root))),
        };
        let mut scan = Scan::default();
        for lock in locks {
            let seen = self.read_lock(&lock).await?;
            if seen != Observation::Absent {
                scan.locks.insert(lock, (seen, unix_ms()));
            }
        }
        scan.ended_ms = unix_ms();
        Ok(scan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_are_lock_nodes_and_the_lowest_sequence_owns() {
        assert_eq!(sequence("lock-0000000007"), Some(7));
        assert_eq!(
            sequence("_c_2b1e7e2a-1d5e-4d8e-9c55-1f0e5e6f2a11-lock-0000000012"),
            Some(12)
        );
        assert_eq!(sequence("read-0000000003"), None);
        assert_eq!(sequence("lock-00000007"), None);
        assert_eq!(sequence("lock-000000000x"), None);
        let children = vec![
            "lock-0000000010".to_string(),
            "read-0000000001".to_string(),
            "_c_x-lock-0000000009".to_string(),
            "lock-0000000011".to_string(),
        ];
        assert_eq!(owner(&children), Some("_c_x-lock-0000000009"));
        assert_eq!(owner(&["leases".to_string()]), None);
    }

    #[test]
    fn event_paths_name_a_lock_and_a_node() {
        assert_eq!(
            lock_of("/locks", "/locks/orders-1/lock-0000000003"),
            Some(("orders-1", Some("lock-0000000003")))
        );
        assert_eq!(
            lock_of("/locks", "/locks/orders-1"),
            Some(("orders-1", None))
        );
        assert_eq!(lock_of("/locks", "/locks"), None);
        assert_eq!(lock_of("/locks", "/locksmith/a"), None);
        assert_eq!(lock_of("/locks", "/locks/a/b/c"), None);
        assert_eq!(
            lock_of("/", "/a/lock-0000000001"),
            Some(("a", Some("lock-0000000001")))
        );
        assert_eq!(normalize_root("/locks/").unwrap(), "/locks");
        assert_eq!(normalize_root("/").unwrap(), "/");
        assert!(normalize_root("locks").is_err());
    }

    fn stat(czxid: i64, owner: i64) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 1_700_000_000_000,
            mtime: 1_700_000_000_000,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        }
    }

    #[test]
    fn the_owner_node_gives_holder_czxid_token_and_a_grant_without_end() {
        let Observation::Held(h) = held("lock-0000000001", b"w-1\n", &stat(0x2a, 0x1001), None)
        else {
            panic!()
        };
        assert_eq!((h.holder.as_str(), h.token), ("w-1", 42));
        assert_eq!(h.deadline_ms, 1_700_000_000_000 + GRANT_TTL_MS);
        // No data: the session names the holder.
        let Observation::Held(h) = held("lock-0000000001", b"", &stat(7, 0x1001), None) else {
            panic!()
        };
        assert_eq!(h.holder, "0x1001");
        assert!(matches!(
            held("lock-0000000001", b"w", &stat(7, 0), None),
            Observation::Bad(_)
        ));
    }

    #[test]
    fn a_revocation_request_keeps_the_holder_read_before_it() {
        let node = "lock-0000000001";
        let Observation::Held(h) = held(node, REVOKE_MESSAGE, &stat(7, 0x1001), Some("w-1")) else {
            panic!()
        };
        assert_eq!((h.holder.as_str(), h.token), ("w-1", 7));
        // The same grant as before the request: nothing to report.
        let Observation::Held(before) = held(node, b"w-1", &stat(7, 0x1001), None) else {
            panic!()
        };
        assert_eq!((before.token, before.value_hash), (h.token, h.value_hash));
        // Requested before the watcher read the node: the session names it.
        let Observation::Held(h) = held(node, REVOKE_MESSAGE, &stat(7, 0x1001), None) else {
            panic!()
        };
        assert_eq!(h.holder, "0x1001");
    }

    #[test]
    fn a_dump_lists_the_live_sessions() {
        let dump = "SessionTracker dump:\nSession Sets (2)/(1):\n0 expire at Wed Dec 02 22:21:03 UTC 2026:\n1 expire at Wed Dec 02 22:21:04 UTC 2026:\n\t0x10001093b510000\nephemeral nodes dump:\nSessions with Ephemerals (1):\n0x10001093b510001:\n\t/locks/a/lock-0000000000\n";
        assert_eq!(live_sessions(dump), Some(vec![0x10001093b510000]));
        assert_eq!(
            live_sessions("dump is not executed because it is not in the whitelist.\n"),
            None
        );
    }
}
