//! The PostgreSQL backend: leases kept as rows of a table
//! `(name text primary key, holder text, token bigint, expires_at
//! timestamptz)`, the pattern of lock clients built on a database:
//!
//! - acquire: `INSERT ... ON CONFLICT (name) DO UPDATE SET holder = ...,
//!   token = leases.token + 1, expires_at = now() + ttl WHERE
//!   leases.expires_at < now()` (or a token from a sequence);
//! - renew: `UPDATE ... SET expires_at = now() + ttl WHERE name = $1 AND
//!   holder = $2 AND token = $3`;
//! - release: `DELETE ... WHERE name = $1 AND holder = $2 AND token = $3`,
//!   or clearing the row (`holder = NULL`, or `expires_at = now()`).
//!
//! What a lease is: a row whose holder is not NULL and whose `expires_at`
//! is later than the database's clock. A row past its `expires_at`, or
//! without a holder, is no lease (a lapsed row left for the next acquire
//! to take over). The fencing token is the `token` column, the holder the
//! `holder` column, the deadline `expires_at`. A row whose token is NULL or
//! negative, whose holder is empty, or whose columns are not of those
//! types, is logged once and counted as unreadable.
//!
//! Changes come from a trigger (`watch/sql/postgres.sql`, installed with
//! `--install` or printed with `--print-install-sql`) that sends a
//! `NOTIFY` on the channel `leaseline:<table>` for every row changed,
//! after its transaction commits. LISTEN/NOTIFY rather than logical
//! decoding: it needs no replication slot, no `wal_level = logical` and no
//! replication privilege, and a watcher that is away leaves nothing behind
//! on the server. Its price is that a notification sent while nobody
//! listens is lost: the watcher resyncs (reads the whole table) on every
//! connect and every `resync_interval`, as for Redis.
//!
//! The payload says how the grant the row held before ended, which the
//! row alone cannot say: `release` (a delete or a clear of a live grant:
//! `released`), `revoke` (the same in a transaction that set
//! `leaseline.revoke`: `revoked`, reason `operator`), `takeover` (a live
//! grant replaced by another holder or token before its deadline, which
//! only a forced acquire does: `revoked`, reason `takeover`), or `write`.
//! It also carries the changed row's token and deadline and the change's
//! `clock_timestamp()`: when the row read after the notification is that
//! row, `ts` is the change's time, so `ttl_ms` is `expires_at` minus the
//! change time.
//!
//! Nothing is written when a holder stops renewing, so the watcher reads a
//! lease again at its `expires_at` ([`crate::Backend::lapses_silently`]),
//! and a row found lapsed is `expired` at `expires_at`.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls, Row};
use tracing::warn;

use crate::mapping::{End, Held};
use crate::state::Observation;
use crate::{Backend, Change, Scan, Session, WatchError};

/// The trigger and its function, with `{{table}}`, `{{function}}` and
/// `{{channel}}` to fill in ([`install_sql`]).
const INSTALL_SQL: &str = include_str!("../sql/postgres.sql");

/// PostgreSQL's longest identifier, in bytes (NAMEDATALEN − 1); a longer
/// channel name is refused by `pg_notify`.
const MAX_IDENTIFIER: usize = 63;

/// What to watch.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// `postgres://user[:password]@host:port/dbname`, or the key=value
    /// form libpq takes.
    pub url: String,
    /// The lease table, `name` or `schema.name`.
    pub table: String,
    /// Run the install SQL at each connect.
    pub install: bool,
    /// A query the server does not answer within this long is a lost
    /// connection.
    pub timeout: Duration,
}

/// The lease table's names, quoted for SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The table, quoted (`"public"."leases"`).
    pub table: String,
    /// The trigger function, in the table's schema:
    /// `leaseline_notify_<table>`, quoted.
    pub function: String,
    /// The NOTIFY channel, unquoted: `leaseline:<table as given>`.
    pub channel: String,
}

/// `"a""b"`: an identifier quoted for SQL.
fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `'a''b'`: a string literal.
fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Names {
    /// From `table` or `schema.table`, as the names are spelled in the
    /// catalog (no quotes, case kept).
    pub fn new(table: &str) -> Result<Names, String> {
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() > 2 || parts.iter().any(|p| p.is_empty() || p.contains('\0')) {
            return Err(format!(
                "the table {table:?} is not `name` or `schema.name`"
            ));
        }
        let name = parts[parts.len() - 1];
        let function = format!("leaseline_notify_{name}");
        let channel = format!("leaseline:{table}");
        for n in parts
            .iter()
            .copied()
            .chain([function.as_str(), channel.as_str()])
        {
            if n.len() > MAX_IDENTIFIER {
                return Err(format!(
                    "{n:?} is longer than PostgreSQL's {MAX_IDENTIFIER} bytes: a shorter table name is needed"
                ));
            }
        }
        let quoted: Vec<String> = parts.iter().map(|p| quote_ident(p)).collect();
        let function = match parts.len() {
            2 => format!("{}.{}", quoted[0], quote_ident(&function)),
            _ => quote_ident(&function),
        };
        Ok(Names {
            table: quoted.join("."),
            function,
            channel,
        })
    }
}

/// The SQL that installs the trigger on `table` (`watch/sql/postgres.sql`
/// filled in).
pub fn install_sql(table: &str) -> Result<String, String> {
    let n = Names::new(table)?;
    Ok(INSTALL_SQL
        .replace("{{table}}", &n.table)
        .replace("{{function}}", &n.function)
        .replace("{{channel}}", &quote_literal(&n.channel)))
}

/// One row as a lease: see the module's documentation.
fn observe(
    holder: Option<String>,
    token: Option<i64>,
    expires_ms: Option<i64>,
    live: Option<bool>,
) -> Observation {
    let Some(holder) = holder else {
        return Observation::Absent;
    };
    let Some(deadline_ms) = expires_ms else {
        return Observation::Bad("expires_at is NULL: not a lease".into());
    };
    if live != Some(true) {
        return Observation::Absent;
    }
    if holder.is_empty() {
        return Observation::Bad("the holder is empty".into());
    }
    let token = match token.map(u64::try_from) {
        Some(Ok(t)) => t,
        Some(Err(_)) => return Observation::Bad("the token is negative".into()),
        None => return Observation::Bad("the token is NULL".into()),
    };
    Observation::Held(Held {
        value_hash: xxhash_rust::xxh3::xxh3_64(holder.as_bytes()),
        holder,
        token,
        deadline_ms,
    })
}

/// The columns every read selects after the name: holder, token,
/// deadline and liveness on the database's clock, and that clock.
const COLUMNS: &str = "holder, token, floor(extract(epoch FROM expires_at) * 1000)::bigint, \
     expires_at > c.now, floor(extract(epoch FROM c.now) * 1000)::bigint";

/// A row of [`COLUMNS`] from `at` on: the lease, and the clock.
fn row_observation(row: &Row, at: usize) -> (Observation, Option<i64>) {
    let now_ms = row.try_get::<_, i64>(at + 4).ok();
    let holder = match row.try_get::<_, Option<String>>(at) {
        Ok(h) => h,
        Err(_) => return (Observation::Bad("holder is not text".into()), now_ms),
    };
    let token = match row.try_get::<_, Option<i64>>(at + 1) {
        Ok(t) => t,
        Err(_) => return (Observation::Bad("token is not a bigint".into()), now_ms),
    };
    let expires = row.try_get::<_, Option<i64>>(at + 2).ok().flatten();
    let live = row.try_get::<_, Option<bool>>(at + 3).ok().flatten();
    (observe(holder, token, expires, live), now_ms)
}

/// A notification's payload (see `watch/sql/postgres.sql`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Notice {
    op: String,
    name: String,
    token: Option<i64>,
    expires_ms: Option<i64>,
    at_ms: i64,
}

impl Notice {
    fn end(&self) -> End {
        match self.op.as_str() {
            "release" => End::Deleted,
            "revoke" => End::Revoked("operator"),
            "takeover" => End::Revoked("takeover"),
            _ => End::Unknown,
        }
    }

    /// Whether `seen` is the row this change left: then the change's time
    /// is when it was seen.
    fn left(&self, seen: &Observation) -> bool {
        match seen {
            Observation::Held(h) => {
                self.token == i64::try_from(h.token).ok() && self.expires_ms == Some(h.deadline_ms)
            }
            Observation::Absent => self.end() != End::Unknown,
            Observation::Bad(_) => false,
        }
    }
}

/// The PostgreSQL backend.
pub struct Postgres {
    config: PostgresConfig,
    pg: tokio_postgres::Config,
    names: Names,
}

impl Postgres {
    pub fn new(config: PostgresConfig) -> Result<Postgres, WatchError> {
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| WatchError::Fatal(format!("the PostgreSQL URL: {e}")))?;
        let names = Names::new(&config.table).map_err(WatchError::Fatal)?;
        pg.connect_timeout(config.timeout);
        pg.keepalives(true);
        pg.keepalives_idle(Duration::from_secs(30));
        if pg.get_application_name().is_none() {
            pg.application_name("leaseline watch");
        }
        Ok(Postgres { config, pg, names })
    }

    fn dbname(&self) -> &str {
        self.pg.get_dbname().or(self.pg.get_user()).unwrap_or("")
    }
}

fn backend_error(what: &str) -> impl Fn(tokio_postgres::Error) -> WatchError + '_ {
    move |e| WatchError::Backend(format!("{what}: {e}"))
}

impl Backend for Postgres {
    type Session = PostgresSession;

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn scope(&self) -> String {
        format!("postgres/{}/{}", self.dbname(), self.config.table)
    }

    fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .pg
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = self.pg.get_ports().iter().map(|p| p.to_string()).collect();
        format!(
            "{}:{}/{} table {}",
            hosts.join(","),
            ports.join(","),
            self.dbname(),
            self.config.table
        )
    }

    fn lapses_silently(&self) -> bool {
        true
    }

    async fn connect(&mut self) -> Result<PostgresSession, WatchError> {
        let (client, mut connection) =
            tokio::time::timeout(self.config.timeout, self.pg.connect(NoTls))
                .await
                .map_err(|_| WatchError::Backend("connecting: timed out".into()))?
                .map_err(backend_error("connecting"))?;
        // The connection carries the replies to the session's queries and
        // the notifications: it is driven here, and the notifications are
        // queued without bound so that a slow watcher never stalls its own
        // queries behind them. It ends when the session drops the client.
        let (tx, notices) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(AsyncMessage::Notification(n)) => {
                        if tx.send(Ok(n.payload().to_string())).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                }
            }
            let _ = tx.send(Err("the server closed the connection".into()));
        });
        let session = PostgresSession {
            client,
            notices,
            pending: HashMap::new(),
            read_sql: format!(
                "SELECT {COLUMNS} FROM (SELECT clock_timestamp() AS now) c \
                 LEFT JOIN {} ON name = $1",
                self.names.table
            ),
            scan_sql: format!(
                "SELECT name, {COLUMNS} FROM {}, (SELECT clock_timestamp() AS now) c",
                self.names.table
            ),
            timeout: self.config.timeout,
        };
        if self.config.install {
            let sql = install_sql(&self.config.table).map_err(WatchError::Fatal)?;
            session
                .timed(session.client.batch_execute(&sql))
                .await?
                .map_err(|e| WatchError::Fatal(format!("installing the trigger: {e}")))?;
        }
        // Subscribed before the first scan: a change committed after the
        // scan's snapshot is notified.
        let listen = format!("LISTEN {}", quote_ident(&self.names.channel));
        session
            .timed(session.client.batch_execute(&listen))
            .await?
            .map_err(backend_error("LISTEN"))?;
        let installed = session
            .timed(session.client.query_opt(
                "SELECT 1 FROM pg_trigger WHERE tgname = 'leaseline_notify' \
                 AND tgrelid = to_regclass($1)",
                &[&self.names.table],
            ))
            .await?
            .map_err(backend_error("looking for the trigger"))?;
        if installed.is_none() {
            warn!(table = %self.config.table, "the table has no leaseline_notify trigger (--install, or --print-install-sql and run it): changes are seen at resyncs and deadlines only");
        }
        Ok(session)
    }
}

/// One connection: the queries and the notifications.
pub struct PostgresSession {
    client: Client,
    notices: mpsc::UnboundedReceiver<Result<String, String>>,
    /// The last notification of each lease not read since.
    pending: HashMap<String, Notice>,
    read_sql: String,
    scan_sql: String,
    timeout: Duration,
}

impl PostgresSession {
    async fn timed<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T, WatchError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| WatchError::Backend(format!("no answer within {:?}", self.timeout)))
    }
}

impl Session for PostgresSession {
    async fn next_change(&mut self) -> Result<Change, WatchError> {
        loop {
            let payload = match self.notices.recv().await {
                Some(Ok(p)) => p,
                Some(Err(e)) => return Err(WatchError::Backend(e)),
                None => return Err(WatchError::Backend("the connection ended".into())),
            };
            let notice: Notice = match serde_json::from_str(&payload) {
                Ok(n) => n,
                Err(e) => {
                    // Another sender on the channel, or another version
                    // of the trigger: the resyncs still see the table.
                    warn!(%payload, error = %e, "a notification that is not the trigger's; ignored");
                    continue;
                }
            };
            let change = Change {
                lease_id: notice.name.clone(),
                end: notice.end(),
            };
            self.pending.insert(notice.name.clone(), notice);
            return Ok(change);
        }
    }

    async fn read(&mut self, lease_id: &str) -> Result<(Observation, i64), WatchError> {
        let row = self
            .timed(self.client.query_one(&self.read_sql, &[&lease_id]))
            .await?
            .map_err(backend_error("reading a lease"))?;
        let (seen, now_ms) = row_observation(&row, 0);
        let now_ms = now_ms.ok_or_else(|| WatchError::Backend("no clock in the reply".into()))?;
        let at_ms = match self.pending.remove(lease_id) {
            Some(n) if n.left(&seen) => n.at_ms.min(now_ms),
            _ => now_ms,
        };
        Ok((seen, at_ms))
    }

    async fn scan(&mut self) -> Result<Scan, WatchError> {
        let rows = self
            .timed(self.client.query(&self.scan_sql, &[]))
            .await?
            .map_err(backend_error("scanning the table"))?;
        let mut scan = Scan::default();
        for row in rows {
            let Ok(name) = row.try_get::<_, String>(0) else {
                continue;
            };
            let (seen, now_ms) = row_observation(&row, 1);
            if seen != Observation::Absent {
                scan.locks.insert(name, (seen, now_ms.unwrap_or(0)));
            }
        }
        let now = self
            .timed(self.client.query_one(
                "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            ))
            .await?
            .map_err(backend_error("reading the clock"))?;
        scan.ended_ms = now
            .try_get::<_, i64>(0)
            .map_err(backend_error("reading the clock"))?;
        // What the scan read supersedes what was notified before it.
        self.pending.clear();
        Ok(scan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_the_channel_follows_the_table() {
        let n = Names::new("leases").unwrap();
        assert_eq!(n.table, "\"leases\"");
        assert_eq!(n.function, "\"leaseline_notify_leases\"");
        assert_eq!(n.channel, "leaseline:leases");
        let n = Names::new("locks.My\"Leases").unwrap();
        assert_eq!(n.table, "\"locks\".\"My\"\"Leases\"");
        assert_eq!(n.function, "\"locks\".\"leaseline_notify_My\"\"Leases\"");
        assert!(Names::new("a.b.c").is_err());
        assert!(Names::new("").is_err());
        assert!(
            Names::new(&"x".repeat(60)).is_err(),
            "the channel is too long"
        );
    }

    #[test]
    fn the_install_sql_names_the_table_and_its_channel() {
        let sql = install_sql("locks.leases").unwrap();
        assert!(!sql.contains("{{"));
        assert!(sql.contains("CREATE OR REPLACE FUNCTION \"locks\".\"leaseline_notify_leases\"()"));
        assert!(sql.contains("pg_notify('leaseline:locks.leases', json_build_object("));
        assert!(sql.contains("AFTER INSERT OR UPDATE OR DELETE ON \"locks\".\"leases\""));
    }

    #[test]
    fn a_live_row_is_a_lease_and_a_lapsed_or_cleared_one_is_none() {
        let Observation::Held(h) = observe(Some("w-1".into()), Some(7), Some(5_000), Some(true))
        else {
            panic!()
        };
        assert_eq!(
            (h.holder.as_str(), h.token, h.deadline_ms),
            ("w-1", 7, 5_000)
        );
        assert_eq!(h.value_hash, xxhash_rust::xxh3::xxh3_64(b"w-1"));
        assert_eq!(
            observe(Some("w-1".into()), Some(7), Some(5_000), Some(false)),
            Observation::Absent
        );
        assert_eq!(
            observe(None, Some(7), Some(5_000), Some(true)),
            Observation::Absent
        );
        // The row of a LEFT JOIN that found nothing.
        assert_eq!(observe(None, None, None, None), Observation::Absent);
    }

    #[test]
    fn a_row_that_is_no_lease_says_why() {
        let bad = |o: Observation| match o {
            Observation::Bad(why) => why,
            o => panic!("{o:?}"),
        };
        assert_eq!(
            bad(observe(Some("w".into()), Some(-1), Some(5), Some(true))),
            "the token is negative"
        );
        assert_eq!(
            bad(observe(Some("w".into()), None, Some(5), Some(true))),
            "the token is NULL"
        );
        assert_eq!(
            bad(observe(Some("".into()), Some(1), Some(5), Some(true))),
            "the holder is empty"
        );
        assert_eq!(
            bad(observe(Some("w".into()), Some(1), None, None)),
            "expires_at is NULL: not a lease"
        );
    }

    #[test]
    fn a_notification_says_how_the_grant_before_ended() {
        let n = |op: &str| Notice {
            op: op.into(),
            name: "L".into(),
            token: Some(3),
            expires_ms: Some(9_000),
            at_ms: 1_000,
        };
        assert_eq!(n("write").end(), End::Unknown);
        assert_eq!(n("release").end(), End::Deleted);
        assert_eq!(n("revoke").end(), End::Revoked("operator"));
        assert_eq!(n("takeover").end(), End::Revoked("takeover"));
        let parsed: Notice = serde_json::from_str(
            r#"{"op":"release","name":"L","token":null,"expires_ms":null,"at_ms":1000}"#,
        )
        .unwrap();
        assert_eq!(parsed.end(), End::Deleted);
        assert!(parsed.left(&Observation::Absent));
        // The row this change left, and a later one.
        let held = |token, deadline_ms| {
            Observation::Held(Held {
                holder: "w".into(),
                token,
                value_hash: 0,
                deadline_ms,
            })
        };
        assert!(n("write").left(&held(3, 9_000)));
        assert!(!n("write").left(&held(3, 12_000)));
        assert!(!n("write").left(&held(4, 9_000)));
        assert!(!n("write").left(&Observation::Absent));
    }
}
