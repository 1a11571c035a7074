//! The HTTP API of `leaseline serve`, against the real binary on a free
//! port: formats by `Accept`, the lease and violation endpoints, and the
//! status codes of errors (400 bad query, 503 over a limit).

mod common;

use std::path::PathBuf;

use common::*;

fn lake_with_history(dir: &std::path::Path) -> PathBuf {
    let lake = dir.join("lake");
    let unsafe_file = write_unsafe(dir);
    import_files(&lake, &[sample(), unsafe_file]);
    lake
}

#[test]
fn sql_answers_json_csv_ndjson_and_arrow_by_accept() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    let q = "SELECT kind, count(*) AS n FROM lease_events GROUP BY kind ORDER BY kind";

    let json = server.sql(q, &[]);
    assert_eq!(json.status, 200, "{}", json.text());
    assert_eq!(json.content_type, "application/json");
    let rows = json.json();
    let rows = rows.as_array().unwrap();
    let acquired = rows.iter().find(|r| r["kind"] == "acquired").unwrap();
    // 1 + 1 + 12 in the sample, 3 in the unsafe history.
    assert_eq!(acquired["n"], 17, "{rows:?}");

    let csv = server.sql(q, &["-H", "Accept: text/csv"]);
    assert_eq!(csv.status, 200);
    assert!(csv.content_type.starts_with("text/csv"));
    assert!(csv.text().starts_with("kind,n\n"), "{}", csv.text());
    assert!(csv.text().contains("acquired,17\n"), "{}", csv.text());

    let nd = server.sql(q, &["-H", "Accept: application/x-ndjson"]);
    assert_eq!(nd.text().lines().count(), rows.len());

    let arrow = server.sql(
        q,
        &[
            "-H",
            "Accept: application/vnd.apache.arrow.stream, application/json;q=0.5",
        ],
    );
    assert_eq!(arrow.status, 200);
    assert_eq!(arrow.content_type, "application/vnd.apache.arrow.stream");
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(arrow.body), None).unwrap();
    let batches: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
    let n: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(n, rows.len());

    // A JSON body works too, and an empty result is an empty array.
    let empty = server.sql(
        r#"{"query": "SELECT * FROM lease_events WHERE lease_id = 'nope'"}"#,
        &["-H", "Content-Type: application/json"],
    );
    assert_eq!(empty.status, 200, "{}", empty.text());
    assert_eq!(empty.json(), serde_json::json!([]));

    let refused = server.sql(q, &["-H", "Accept: image/png"]);
    assert_eq!(refused.status, 406);
}

#[test]
fn bad_and_refused_queries_are_400_with_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    for q in [
        "SELEC 1",
        "SELECT nope FROM lease_events",
        "DROP TABLE lease_events",
        "INSERT INTO lease_events SELECT * FROM lease_events",
        "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
        "COPY lease_events TO '/tmp/leak.csv'",
        "SELECT * FROM '/etc/passwd'",
        "SET datafusion.execution.batch_size = 1",
    ] {
        let r = server.sql(q, &[]);
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        let body = r.json();
        assert_eq!(body["error"], "bad_request", "{q}: {body}");
        assert!(!body["message"].as_str().unwrap().is_empty());
    }
    assert!(!std::path::Path::new("/tmp/leak.csv").exists());
    // Nothing was dropped or added.
    let n = server
        .sql("SELECT count(*) AS n FROM lease_events", &[])
        .json();
    assert_eq!(n[0]["n"], 84);
}

#[test]
fn queries_over_their_memory_or_time_limit_are_503() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &["--query-max-memory-bytes", "64KiB"], dir.path());
    // A sort of 84^2 wide rows does not fit in 64 KiB, and nothing spills.
    let big = server.sql(
        "SELECT a.*, b.attrs AS b_attrs FROM lease_events a CROSS JOIN lease_events b ORDER BY a.attrs, b.attrs",
        &[],
    );
    assert_eq!(big.status, 503, "{}", big.text());
    assert_eq!(big.json()["error"], "resource_exhausted");
    assert!(big.text().contains("Resources exhausted"), "{}", big.text());
    // Small queries still fit.
    assert_eq!(
        server.sql("SELECT count(*) FROM lease_events", &[]).status,
        200
    );
    drop(server);

    let server = Server::start(&lake, &["--query-timeout", "300ms"], dir.path());
    // 84^4 = 50 million rows of string work takes far more than 300 ms.
    let slow = server.sql(
        "SELECT sum(length(a.lease_id || b.lease_id || c.lease_id || d.lease_id)) AS n \
         FROM lease_events a, lease_events b, lease_events c, lease_events d",
        &[],
    );
    assert_eq!(slow.status, 503, "{}", slow.text());
    assert!(slow.json()["message"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    // The server is fine afterwards.
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn lease_timeline_and_violations_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());

    let t = server.get("/api/v1/leases/orders%2Forder-123/timeline");
    assert_eq!(t.status, 200, "{}", t.text());
    let grants = t.json();
    let tokens: Vec<u64> = grants
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["fencing_token"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [33, 34]);
    assert_eq!(grants[0]["holder_id"], "worker-1");
    assert_eq!(grants[0]["end_kind"], "expired");

    // Grant 33 ended at 10:00:13.3 (renewed at 10:00:03.3 for 10 s, then
    // expired); grant 34 began at 10:00:13.5. A window from 10:00:13.4
    // holds only 34, one up to 10:00:13.4 only 33.
    let late =
        server.get("/api/v1/leases/orders%2Forder-123/timeline?from=2026-09-14T10:00:13.400Z");
    assert_eq!(late.status, 200, "{}", late.text());
    let late = late.json();
    assert_eq!(late.as_array().unwrap().len(), 1, "{late}");
    assert_eq!(late[0]["fencing_token"], 34);
    let early = server.get(&format!(
        "/api/v1/leases/orders%2Forder-123/timeline?to={}",
        1_789_380_013_400i64 // 2026-09-14T10:00:13.400Z in epoch milliseconds
    ));
    let early = early.json();
    assert_eq!(early.as_array().unwrap().len(), 1, "{early}");
    assert_eq!(early[0]["fencing_token"], 33);

    let csv = server.get_as("/api/v1/leases/orders%2Forder-123/timeline", "text/csv");
    assert!(
        csv.text().starts_with("lease_id,fencing_token,holder_id"),
        "{}",
        csv.text()
    );

    let unknown = server.get("/api/v1/leases/nope/timeline");
    assert_eq!(unknown.status, 200);
    assert_eq!(unknown.json(), serde_json::json!([]));

    let bad_time = server.get("/api/v1/leases/x/timeline?from=yesterday");
    assert_eq!(bad_time.status, 400);
    assert!(bad_time.text().contains("RFC 3339"), "{}", bad_time.text());

    let all = server.get("/api/v1/violations").json();
    assert_eq!(all.as_array().unwrap().len(), 4, "{all}");
    for v in all.as_array().unwrap() {
        assert_eq!(v["lease_id"], "pay/acct-9");
        assert!(!v["detail"].as_str().unwrap().is_empty());
        assert!(!v["evidence"].as_array().unwrap().is_empty());
    }
    let overlaps = server
        .get("/api/v1/violations?kind=overlapping_ownership&lease_id=pay%2Facct-9")
        .json();
    assert_eq!(overlaps.as_array().unwrap().len(), 1);
    assert_eq!(overlaps[0]["fencing_token"], 8);
    assert_eq!(overlaps[0]["other_fencing_token"], 7);
    let none = server
        .get("/api/v1/violations?from=2026-09-14T10:00:21Z")
        .json();
    assert_eq!(none, serde_json::json!([]));
    let bad_kind = server.get("/api/v1/violations?kind=zombie");
    assert_eq!(bad_kind.status, 400);
    assert!(
        bad_kind.text().contains("late_fence"),
        "{}",
        bad_kind.text()
    );
}

#[test]
fn sigterm_stops_serve_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let mut server = Server::start(&lake, &[], dir.path());
    let status = server.proc.terminate(std::time::Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", server.proc.logs());
}

#[test]
fn every_error_is_json_even_from_the_extractors() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    // An unknown query parameter, an unknown route, a wrong method.
    let bad_param = server.get("/api/v1/violations?nope=1");
    assert_eq!(bad_param.status, 400, "{}", bad_param.text());
    assert_eq!(bad_param.json()["error"], "bad_request");
    assert!(
        bad_param.json()["message"]
            .as_str()
            .unwrap()
            .contains("nope"),
        "{}",
        bad_param.text()
    );
    let unknown = server.get("/api/v1/nothing");
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["message"], "no endpoint /api/v1/nothing");
    let method = server.get("/api/v1/sql");
    assert_eq!(method.status, 405);
    assert_eq!(method.json()["error"], "method_not_allowed");
}

#[test]
fn every_bad_parameter_is_400_with_a_json_error_never_500() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake_with_history(dir.path());
    let server = Server::start(&lake, &[], dir.path());
    let lease = "/api/v1/leases/orders%2Forder-123";
    // (what is sent, a word the message must hold)
    let gets = [
        // Times: not a time, out of what a timestamp holds, duplicated.
        (
            format!("{lease}/timeline?from=yesterday"),
            "neither RFC 3339",
        ),
        (format!("{lease}/timeline?to=1e3"), "neither RFC 3339"),
        (
            format!("{lease}/timeline.svg?from=9223372036854775"),
            "out of range",
        ),
        (
            format!("{lease}/timeline.svg?from=-9223372036854775&to=9223372036854775"),
            "out of range",
        ),
        (
            format!("{lease}/timeline?from=99999999999999999999"),
            "neither RFC 3339",
        ),
        (
            "/api/v1/violations?to=-9223372036854775".to_string(),
            "out of range",
        ),
        ("/api/v1/violations?from=1&from=2".to_string(), "duplicate"),
        (
            format!("{lease}/timeline.svg?from=2026-09-14T11:00:00Z&to=2026-09-14T10:00:00Z"),
            "the range is empty",
        ),
        // Lease ids that are not UTF-8.
        ("/api/v1/leases/%FF/timeline".to_string(), "UTF-8"),
        ("/api/v1/leases/%FF/timeline.svg".to_string(), "UTF-8"),
        // Unknown kinds and parameters (a limit is not one).
        (
            "/api/v1/violations?kind=nope".to_string(),
            "unknown violation kind",
        ),
        ("/api/v1/violations?limit=10".to_string(), "limit"),
        (format!("{lease}/timeline?format=csv"), "format"),
    ];
    for (path, word) in &gets {
        let r = server.get(path);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], "bad_request", "{path}");
        let message = r.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains(word), "{path}: {message}");
    }
    // Bodies: JSON of the wrong shape, unknown fields, not JSON at all.
    for body in [
        "{\"query\": 5}",
        "[1]",
        "",
        "{\"query\":\"SELECT 1\",\"x\":1}",
        "{",
    ] {
        let r = server.sql(body, &["-H", "Content-Type: application/json"]);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap()
                .starts_with("request body: "),
            "{body}: {}",
            r.text()
        );
    }
    // Queries whose values are refused once computed, and bad limits.
    for q in [
        "SELECT 1/0",
        "SELECT CAST('x' AS INT)",
        "SELECT to_timestamp('garbage')",
        "SELECT make_date(2026, 13, 1)",
        "SELECT date_trunc('fortnight', now())",
        "SELECT regexp_like('a', '(')",
        "SELECT substr('abc', 1, -1)",
        "SELECT arrow_cast(1, 'Nope')",
        "SELECT * FROM lease_events LIMIT -1",
        "SELECT * FROM lease_events LIMIT 'ten'",
    ] {
        let r = server.sql(q, &[]);
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        assert_eq!(r.json()["error"], "bad_request", "{q}");
    }
    // The server is unharmed.
    let n = server.sql("SELECT count(*) AS n FROM lease_events", &[]);
    assert_eq!(n.json()[0]["n"], 84);
}
