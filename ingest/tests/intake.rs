//! Requests into a running ingest loop (the OTLP/HTTP intake): answered
//! only once committed, kept once however often they are sent.

use std::time::Duration;

use leaseline_ingest::{FlushPolicy, IngestHooks, Intake, IntakeError};
use leaseline_lake::{Lake, Table};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use tokio_util::sync::CancellationToken;

const EXPORT: &str = r#"{"resourceLogs":[{"resource":{"attributes":[
    {"key":"lease.source","value":{"stringValue":"coordinator"}},
    {"key":"lease.holder_id","value":{"stringValue":"w-1"}}]},
  "scopeLogs":[{"logRecords":[
    {"timeUnixNano":"1757844000000000000","attributes":[
      {"key":"lease.kind","value":{"stringValue":"acquired"}},
      {"key":"lease.id","value":{"stringValue":"jobs/1"}},
      {"key":"lease.fencing_token","value":{"intValue":"3"}},
      {"key":"lease.ttl_ms","value":{"intValue":"5000"}}]},
    {"timeUnixNano":"1757844001000000000","attributes":[
      {"key":"lease.kind","value":{"stringValue":"released"}},
      {"key":"lease.id","value":{"stringValue":"jobs/1"}},
      {"key":"lease.fencing_token","value":{"intValue":"3"}}]},
    {"timeUnixNano":"1757844002000000000","attributes":[
      {"key":"lease.kind","value":{"stringValue":"released"}}]}]}]}]}"#;

async fn rows(lake: &Lake, table: Table) -> u64 {
    lake.latest().await.unwrap().rows_of(table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_once_committed_and_kept_once_across_retries() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let intake = Intake::new(Duration::from_secs(30));
    let body = bytes::Bytes::from_static(EXPORT.as_bytes());
    let enc = leaseline_ingest::otlp::Encoding::OtlpJson;

    // Before its loop runs, a request is told to come back.
    assert!(matches!(
        intake.logs(body.clone(), enc).await,
        Err(IntakeError::NotRunning)
    ));

    let stop = CancellationToken::new();
    let hooks = IngestHooks {
        intake: Some(intake.clone()),
        ..Default::default()
    };
    let run = tokio::spawn(leaseline_ingest::intake::run(
        lake.clone(),
        FlushPolicy::default(),
        stop.clone(),
        hooks,
    ));
    while !intake.is_running() {
        tokio::task::yield_now().await;
    }

    let first = intake.logs(body.clone(), enc).await.unwrap();
    assert_eq!((first.events, first.duplicates), (2, 0));
    assert_eq!(first.rejected.len(), 1);
    assert_eq!(first.rejected[0].0, 3);
    assert_eq!(
        first.rejected[0].1.reason.to_string(),
        "missing_field:lease_id"
    );
    // Answered: the rows are in the lake already.
    assert_eq!(rows(&lake, Table::LeaseEvents).await, 2);
    assert_eq!(rows(&lake, Table::LeaseRejects).await, 1);

    // The same export again, in protobuf this time: nothing new.
    let parsed: ExportLogsServiceRequest = serde_json::from_str(EXPORT).unwrap();
    let proto = bytes::Bytes::from(prost::Message::encode_to_vec(&parsed));
    let again = intake
        .logs(proto, leaseline_ingest::otlp::Encoding::OtlpProto)
        .await
        .unwrap();
    assert_eq!((again.events, again.duplicates), (0, 2));
    // Its reject has another origin (another body), so it is one more row.
    assert_eq!(again.rejected.len(), 1);
    let retry = intake.logs(body.clone(), enc).await.unwrap();
    assert_eq!(
        (retry.events, retry.duplicates, retry.rejected.len()),
        (0, 3, 0)
    );

    let bad = intake
        .logs(bytes::Bytes::from_static(b"{\"resourceLogs\": 1}"), enc)
        .await;
    match bad {
        Err(IntakeError::Invalid(e)) => assert_eq!(e.reason.to_string(), "invalid_otlp"),
        other => panic!("{other:?}"),
    }
    assert_eq!(rows(&lake, Table::LeaseEvents).await, 2);
    assert_eq!(rows(&lake, Table::LeaseRejects).await, 3);

    stop.cancel();
    let stats = run.await.unwrap().unwrap();
    assert_eq!(stats.events, 2);
}
