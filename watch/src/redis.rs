//! The Redis backend: locks taken with `SET key value NX PX ttl` on a
//! single Redis instance (7.0 or newer, for `PEXPIRETIME`).
//!
//! What a lock is:
//! - its key starts with the watched prefix, and its `lease_id` is the key
//!   without the prefix (`locks:orders/7` under `locks:` is `orders/7`), so
//!   the same lease has the same name whichever prefix a deployment uses;
//! - its value is a string naming the holder: all of it, or one part of it
//!   cut at a separator ([`ValueLayout`]);
//! - it has an expiry (a key without one is no lease);
//! - its fencing token is read from a counter key the client raises with
//!   `INCR` before each `SET NX` (by default `<key>:token`), or from a part
//!   of the value ([`TokenFrom`]). Counter keys under the prefix are not
//!   locks. The contract requires a token on every event the watcher
//!   sends, so a lock without one is reported as unreadable, not as a grant
//!   without a token.
//!
//! A key under the prefix that is none of this (a hash, a value without the
//! holder's part, no expiry, no counter) is logged once and counted as
//! unreadable, and reported nothing for.
//!
//! Each lock is read by one Lua script, atomically: its type, value,
//! `PEXPIRETIME`, its counter and the server's `TIME`. The deadline is the
//! server's absolute expiry, so reading a lock twice gives the same
//! deadline unless it was renewed, and `ts` is the server's clock.
//!
//! Changes come from keyspace notifications on `__keyspace@<db>__:<prefix>*`:
//! `del` ends a grant as `released`, `expired` as `expired` (at its
//! deadline), `evicted` as `revoked`; any other event on the key (`set`,
//! `expire`, `rename_to`, ...) is read to see what it did. Notifications
//! need `notify-keyspace-events` to include `K`, `g`, `$`, `x` and `e`; the
//! watcher adds the missing ones with `CONFIG SET` unless told not to. A
//! counter's notifications are ignored: its `INCR` comes before the `SET`
//! it is read for.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tracing::{info, warn};

use crate::mapping::{End, Held};
use crate::state::Observation;
use crate::{Backend, Change, Scan, Session, WatchError};

/// How the lock's value names its holder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValueLayout {
    /// Cut the value at this separator; `None`: the whole value is the
    /// holder.
    pub separator: Option<String>,
    /// With a separator: the part (from 0) that names the holder.
    pub holder_part: usize,
}

/// Where a lock's fencing token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFrom {
    /// A counter key, named by this pattern with `{key}` standing for the
    /// lock's key: `{key}:token`.
    Counter(String),
    /// This part (from 0) of the value cut at [`ValueLayout::separator`].
    ValuePart(usize),
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// The locks' keys start with this.
    pub prefix: String,
    pub layout: ValueLayout,
    pub token: TokenFrom,
    /// Turn on the keyspace notifications needed with `CONFIG SET`.
    pub configure_notifications: bool,
    /// Per-call read timeout: a server that stops answering is a lost
    /// connection.
    pub timeout: Duration,
}

/// The notification classes the watcher needs: keyspace events (`K`) of
/// generic commands (`g`: `del`, `expire`, `rename`), strings (`$`:
/// `set`), expiries (`x`) and evictions (`e`).
const NOTIFY_CLASSES: &str = "Kg$xe";

/// Reads one lock and its counter atomically, with the server's time.
const READ_LOCK: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
local v = false
if t == 'string' then v = redis.call('GET', KEYS[1]) end
local exp = redis.call('PEXPIRETIME', KEYS[1])
local tt = 'none'
local tok = false
if #KEYS > 1 then
  tt = redis.call('TYPE', KEYS[2])['ok']
  if tt == 'string' then tok = redis.call('GET', KEYS[2]) end
end
local now = redis.call('TIME')
return {t, v, exp, tt, tok, now[1], now[2]}
"#;

/// The Redis backend.
pub struct Redis {
    config: RedisConfig,
    client: Client,
    db: i64,
    script: redis::Script,
}

impl Redis {
    pub fn new(config: RedisConfig) -> Result<Redis, WatchError> {
        let client = Client::open(config.url.as_str())
            .map_err(|e| WatchError::Fatal(format!("the Redis URL: {e}")))?;
        if let TokenFrom::Counter(p) = &config.token {
            if !p.contains("{key}") || p == "{key}" {
                return Err(WatchError::Fatal(format!(
                    "the token key pattern {p:?} must contain {{key}} and something else"
                )));
            }
        }
        if matches!(config.token, TokenFrom::ValuePart(_)) && config.layout.separator.is_none() {
            return Err(WatchError::Fatal(
                "a token in the value needs a value separator".into(),
            ));
        }
        let db = client.get_connection_info().redis_settings().db();
        Ok(Redis {
            config,
            client,
            db,
            script: redis::Script::new(READ_LOCK),
        })
    }
}

/// The counter key of a lock's key, when tokens come from counters.
fn counter_key(token: &TokenFrom, key: &str) -> Option<String> {
    match token {
        TokenFrom::Counter(p) => Some(p.replace("{key}", key)),
        TokenFrom::ValuePart(_) => None,
    }
}

fn backend_error(what: &str) -> impl Fn(redis::RedisError) -> WatchError + '_ {
    move |e| WatchError::Backend(format!("{what}: {e}"))
}

/// Escapes the glob characters of a prefix for `PSUBSCRIBE` and `SCAN
/// MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `key` is a counter of the pattern (`{key}:token` makes every
/// key ending in `:token` one), and so not a lock.
fn is_counter(pattern: &TokenFrom, key: &str) -> bool {
    let TokenFrom::Counter(p) = pattern else {
        return false;
    };
    let Some((pre, post)) = p.split_once("{key}") else {
        return false;
    };
    key.len() > pre.len() + post.len() && key.starts_with(pre) && key.ends_with(post)
}

impl Backend for Redis {
    type Session = RedisSession;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn scope(&self) -> String {
        format!("redis/{}/{}", self.db, self.config.prefix)
    }

    fn describe(&self) -> String {
        let info = self.client.get_connection_info();
        format!("{}/{}", info.addr(), self.db)
    }

    async fn connect(&mut self) -> Result<RedisSession, WatchError> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.timeout))
            .set_response_timeout(Some(self.config.timeout));
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(backend_error("connecting"))?;
        if self.config.configure_notifications {
            configure_notifications(&mut conn).await?;
        }
        let mut pubsub = tokio::time::timeout(self.config.timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| WatchError::Backend("connecting for notifications: timed out".into()))?
            .map_err(backend_error("connecting for notifications"))?;
        let channel_prefix = format!("__keyspace@{}__:", self.db);
        pubsub
            .psubscribe(format!(
                "{channel_prefix}{}*",
                glob_escape(&self.config.prefix)
            ))
            .await
            .map_err(backend_error("subscribing to keyspace notifications"))?;
        Ok(RedisSession {
            conn,
            notifications: Box::pin(pubsub.into_on_message()),
            channel_prefix,
            config: self.config.clone(),
            script: self.script.clone(),
        })
    }
}

/// Adds the notification classes the watcher needs to what the server
/// already sends. A server that refuses `CONFIG` (a managed service) is
/// watched by its resyncs alone, and says so.
async fn configure_notifications(conn: &mut MultiplexedConnection) -> Result<(), WatchError> {
    let current: Result<Vec<String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await;
    let current = match current {
        Ok(v) => v.get(1).cloned().unwrap_or_default(),
        Err(e) if e.is_io_error() || e.is_timeout() => {
            return Err(WatchError::Backend(format!(
                "reading the notification settings: {e}"
            )))
        }
        Err(e) => {
            warn!(error = %e, "cannot read notify-keyspace-events; changes are seen at resyncs only unless the server already sends {NOTIFY_CLASSES}");
            return Ok(());
        }
    };
    // `A` stands for every class but `K`, `E`, `m` and `n`.
    let covered = |c: char| current.contains(c) || (c != 'K' && current.contains('A'));
    let missing: String = NOTIFY_CLASSES.chars().filter(|&c| !covered(c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let wanted = format!("{current}{missing}");
    let set: Result<(), _> = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(&wanted)
        .query_async(conn)
        .await;
    match set {
        Ok(()) => info!(notify_keyspace_events = %wanted, "turned on keyspace notifications"),
        Err(e) if e.is_io_error() || e.is_timeout() => {
            return Err(WatchError::Backend(format!(
                "setting notify-keyspace-events: {e}"
            )))
        }
        Err(e) => {
            warn!(error = %e, "cannot turn on keyspace notifications ({missing} missing); changes are seen at resyncs only")
        }
    }
    Ok(())
}

/// A connection for reads and one for notifications.
pub struct RedisSession {
    conn: MultiplexedConnection,
    notifications: Pin<Box<dyn Stream<Item = redis::Msg> + Send>>,
    channel_prefix: String,
    config: RedisConfig,
    script: redis::Script,
}

impl Session for RedisSession {
    async fn next_change(&mut self) -> Result<Change, WatchError> {
        loop {
            let Some(msg) = self.notifications.next().await else {
                return Err(WatchError::Backend(
                    "the notification connection closed".into(),
                ));
            };
            let Some(key) = msg.get_channel_name().strip_prefix(&self.channel_prefix) else {
                continue;
            };
            if is_counter(&self.config.token, key) {
                continue;
            }
            let Some(lease_id) = key.strip_prefix(&self.config.prefix) else {
                continue;
            };
            let event: String = msg.get_payload().unwrap_or_default();
            let end = match event.as_str() {
                "del" => End::Deleted,
                "expired" => End::Expired,
                "evicted" => End::Evicted,
                _ => End::Unknown,
            };
            return Ok(Change {
                lease_id: lease_id.to_string(),
                end,
            });
        }
    }

    async fn read(&mut self, lease_id: &str) -> Result<(Observation, i64), WatchError> {
        let key = format!("{}{lease_id}", self.config.prefix);
        self.read_key(&key).await
    }

    async fn scan(&mut self) -> Result<Scan, WatchError> {
        let pattern = format!("{}*", glob_escape(&self.config.prefix));
        let mut cursor: u64 = 0;
        let mut keys: Vec<Vec<u8>> = Vec::new();
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn)
                .await
                .map_err(backend_error("scanning"))?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut scan = Scan::default();
        for raw in keys {
            let key = match String::from_utf8(raw) {
                Ok(k) => k,
                Err(e) => {
                    // Not a name the contract can carry; the tracker warns
                    // about it once, under a readable form of it.
                    let name = String::from_utf8_lossy(e.as_bytes());
                    let lease_id = name.get(self.config.prefix.len()..).unwrap_or(&name);
                    let why = Observation::Bad("the key is not UTF-8".into());
                    scan.locks.insert(lease_id.to_string(), (why, 0));
                    continue;
                }
            };
            if is_counter(&self.config.token, &key) {
                continue;
            }
            let lease_id = key[self.config.prefix.len()..].to_string();
            let read = self.read_key(&key).await?;
            // A key that expired between SCAN and the read: not found.
            if read.0 != Observation::Absent {
                scan.locks.insert(lease_id, read);
            }
        }
        scan.ended_ms = self.server_time().await?;
        Ok(scan)
    }
}

impl RedisSession {
    async fn read_key(&mut self, key: &str) -> Result<(Observation, i64), WatchError> {
        let mut call = self.script.key(key);
        if let Some(counter) = counter_key(&self.config.token, key) {
            call.key(counter);
        }
        let reply: Value = call
            .invoke_async(&mut self.conn)
            .await
            .map_err(backend_error("reading a lock"))?;
        let lease_id = &key[self.config.prefix.len()..];
        parse_read(lease_id, &reply, &self.config.layout, &self.config.token).ok_or_else(|| {
            WatchError::Backend(format!("unexpected reply to the lock read: {reply:?}"))
        })
    }

    async fn server_time(&mut self) -> Result<i64, WatchError> {
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn)
            .await
            .map_err(backend_error("reading the server's time"))?;
        Ok(s * 1000 + us / 1000)
    }
}

fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b.as_slice()),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        v => std::str::from_utf8(text(v)?).ok()?.parse().ok(),
    }
}

/// A lock from the reply of [`READ_LOCK`], and the server's time; `None`
/// when the reply is not the script's.
fn parse_read(
    lease_id: &str,
    reply: &Value,
    layout: &ValueLayout,
    token_from: &TokenFrom,
) -> Option<(Observation, i64)> {
    let Value::Array(r) = reply else {
        return None;
    };
    let [kind, value, expires, counter_kind, counter, secs, micros] = r.as_slice() else {
        return None;
    };
    let now_ms = int(secs)? * 1000 + int(micros)? / 1000;
    let bad = |why: String| Some((Observation::Bad(why), now_ms));
    let kind = text(kind)?;
    if kind == b"none" {
        return Some((Observation::Absent, now_ms));
    }
    if kind != b"string" {
        return bad(format!("a {}, not a string", String::from_utf8_lossy(kind)));
    }
    if lease_id.is_empty() {
        return bad("the key is the prefix itself: no lease name".into());
    }
    let raw = text(value)?;
    let Ok(value) = std::str::from_utf8(raw) else {
        return bad("the value is not UTF-8".into());
    };
    let deadline_ms = match int(expires)? {
        -2 => return Some((Observation::Absent, now_ms)),
        -1 => return bad("the key has no expiry: not a lease".into()),
        d => d,
    };
    let parts: Vec<&str> = match &layout.separator {
        Some(sep) => value.split(sep.as_str()).collect(),
        None => vec![value],
    };
    let holder = match parts.get(layout.holder_part) {
        Some(h) if !h.is_empty() => h.to_string(),
        _ => {
            return bad(format!(
                "no holder in part {} of the value",
                layout.holder_part
            ))
        }
    };
    let token = match token_from {
        TokenFrom::ValuePart(i) => parts.get(*i).and_then(|t| t.parse::<u64>().ok()),
        TokenFrom::Counter(_) => match text(counter_kind)? {
            b"none" => return bad("its token counter does not exist".into()),
            b"string" => text(counter)
                .and_then(|t| std::str::from_utf8(t).ok())
                .and_then(|t| t.parse::<u64>().ok()),
            _ => None,
        },
    };
    let Some(token) = token else {
        return bad("its fencing token is not an unsigned integer".into());
    };
    Some((
        Observation::Held(Held {
            holder,
            token,
            value_hash: xxhash_rust::xxh3::xxh3_64(raw),
            deadline_ms,
        }),
        now_ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(kind: &str, value: Option<&str>, exp: i64, counter: Option<&str>) -> Value {
        Value::Array(vec![
            bulk(kind),
            value.map_or(Value::Nil, bulk),
            Value::Int(exp),
            bulk(if counter.is_some() { "string" } else { "none" }),
            counter.map_or(Value::Nil, bulk),
            bulk("1700000000"),
            bulk("250999"),
        ])
    }

    const WHOLE: ValueLayout = ValueLayout {
        separator: None,
        holder_part: 0,
    };

    fn counter() -> TokenFrom {
        TokenFrom::Counter("{key}:token".into())
    }

    #[test]
    fn a_lock_reads_as_holder_token_and_server_deadline() {
        let r = reply("string", Some("w-1"), 1_700_000_010_000, Some("41"));
        let (obs, now) = parse_read("L", &r, &WHOLE, &counter()).unwrap();
        assert_eq!(now, 1_700_000_000_250);
        let Observation::Held(h) = obs else {
            panic!("{obs:?}")
        };
        assert_eq!(
            (h.holder.as_str(), h.token, h.deadline_ms),
            ("w-1", 41, 1_700_000_010_000)
        );
        assert_eq!(h.value_hash, xxhash_rust::xxh3::xxh3_64(b"w-1"));
    }

    #[test]
    fn holder_and_token_can_be_parts_of_the_value() {
        let layout = ValueLayout {
            separator: Some(":".into()),
            holder_part: 0,
        };
        let r = reply("string", Some("w-1:17:nonce"), 1_700_000_010_000, None);
        let (obs, _) = parse_read("L", &r, &layout, &TokenFrom::ValuePart(1)).unwrap();
        let Observation::Held(h) = obs else {
            panic!("{obs:?}")
        };
        assert_eq!((h.holder.as_str(), h.token), ("w-1", 17));
    }

    #[test]
    fn what_is_not_a_readable_lock_says_why() {
        let cases = [
            (reply("hash", None, -1, None), "a hash, not a string"),
            (
                reply("string", Some("w-1"), -1, Some("1")),
                "the key has no expiry: not a lease",
            ),
            (
                reply("string", Some("w-1"), 5, None),
                "its token counter does not exist",
            ),
            (
                reply("string", Some("w-1"), 5, Some("x")),
                "its fencing token is not an unsigned integer",
            ),
            (
                reply("string", Some(""), 5, Some("1")),
                "no holder in part 0 of the value",
            ),
        ];
        for (r, why) in cases {
            let (obs, _) = parse_read("L", &r, &WHOLE, &counter()).unwrap();
            assert_eq!(obs, Observation::Bad(why.into()));
        }
        let (obs, _) = parse_read("L", &reply("none", None, -2, None), &WHOLE, &counter()).unwrap();
        assert_eq!(obs, Observation::Absent);
        assert!(parse_read("L", &Value::Int(1), &WHOLE, &counter()).is_none());
    }

    #[test]
    fn counters_are_told_from_locks_and_prefixes_are_escaped() {
        let c = counter();
        assert!(is_counter(&c, "locks:a:token"));
        assert!(!is_counter(&c, "locks:a"));
        assert!(!is_counter(&c, ":token"));
        assert!(!is_counter(&TokenFrom::ValuePart(1), "locks:a:token"));
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
