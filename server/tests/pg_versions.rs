//! Over the PostgreSQL protocol, a statement whose audit tables answer for
//! an earlier commit than its lake tables (the alert engine catching up
//! with ingest) is told so in a NOTICE, as HTTP says it in its headers.

use std::sync::Arc;
use std::time::Duration;

// The query tests' helpers: one way to commit test events.
#[path = "../../query/tests/common/mod.rs"]
mod common;

use common::append;
use futures::StreamExt;
use leaseline_lake::{Lake, Table};
use leaseline_query::QueryEngine;
use leaseline_schema::decode;
use tokio_postgres::AsyncMessage;

const ACQ7: &str = r#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"a","fencing_token":7,"ttl_ms":10000,"event_id":"a7"}"#;
const ACQ9: &str = r#"{"ts":"2026-09-14T10:00:30Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"c","fencing_token":9,"ttl_ms":10000,"event_id":"c9"}"#;

/// Runs `sql` on a new connection, by the extended protocol or, when
/// `simple`, the simple one: its rows' first column, and the notices that
/// came with them.
async fn query_by(port: u16, sql: &str, simple: bool) -> (Vec<i64>, Vec<String>) {
    let (client, mut connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=leaseline dbname=leaseline"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Driven by hand, as the default driver logs notices and drops them.
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_owned());
            }
        }
    });
    let rows: Vec<i64> = if simple {
        let messages = client.simple_query(sql).await.unwrap();
        messages
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v.parse().unwrap()),
                _ => None,
            })
            .collect()
    } else {
        let rows = client.query(sql, &[]).await.unwrap();
        rows.iter().map(|r| r.get::<_, i64>(0)).collect()
    };
    drop(client);
    driver.await.unwrap();
    let mut notices = vec![];
    while let Ok(n) = rx.try_recv() {
        notices.push(n);
    }
    (rows, notices)
}

async fn query(port: u16, sql: &str) -> (Vec<i64>, Vec<String>) {
    query_by(port, sql, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_answered_for_an_earlier_commit_says_so_in_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let shared = leaseline_audit::SharedAuditor::new(leaseline_audit::AuditConfig::default());
    let engine = QueryEngine::new(lake.clone()).with_live_audit(shared.clone());
    let feed = |line: &str| {
        shared.lock().push(&decode(line.as_bytes()).unwrap());
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(leaseline_server::pg::serve(
        Arc::new(engine.live_session().unwrap()),
        engine.clone(),
        Arc::new(leaseline_server::pg_auth::PgUsers::new(vec![]).unwrap()),
        Duration::from_secs(30),
        listener,
        16,
        None,
        None,
        async {
            let _ = stopped.await;
        },
    ));

    let grants = "SELECT CAST(fencing_token AS BIGINT) FROM lease_timeline ORDER BY 1";
    let v1 = append(&lake, &[ACQ7]).await;
    feed(ACQ7);
    shared.mark(v1.version, v1.rows_of(Table::LeaseEvents));
    assert_eq!(
        query(port, grants).await,
        (vec![7], vec![]),
        "up to date: no notice"
    );

    // Ingest commits v2; the engine has not taken it. Both protocols say
    // so.
    let v2 = append(&lake, &[ACQ9]).await;
    for simple in [false, true] {
        let (rows, notices) = query_by(port, grants, simple).await;
        assert_eq!(rows, vec![7], "the grants of v1");
        assert_eq!(notices.len(), 1, "simple: {simple}, {notices:?}");
        let said = &notices[0];
        assert!(
            said.contains(&format!("answer for lake version {},", v1.version))
                && said.contains(&format!("for version {}:", v2.version)),
            "{said}"
        );
    }
    // A statement of the lake's own tables reads v2 and says nothing.
    let events = "SELECT count(*) FROM lease_events";
    assert_eq!(query(port, events).await, (vec![2], vec![]));

    // The engine takes v2: the same statement, up to date and quiet.
    feed(ACQ9);
    shared.mark(v2.version, v2.rows_of(Table::LeaseEvents));
    assert_eq!(query(port, grants).await, (vec![7, 9], vec![]));

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
