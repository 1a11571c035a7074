//! NDJSON import, `leaseline sql` output formats, compaction, and reading
//! the lake back with other engines (deltalake, polars, DuckDB).

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn import(lake: &Path, files: &[&Path], extra: &[&str]) -> String {
    import_with(lake, files, extra)
}

fn sample() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../samples/lease-events.ndjson"
    ))
}

fn readers(lake: &Path, table: &str) -> u64 {
    readers_agree(lake.to_str().unwrap(), table, &[])
}

#[test]
fn import_sample_keeps_rejects_with_their_lines_and_dedups() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let summary = import(&lake, &[sample()], &[]);
    // 83 lines: 78 unique events, 1 duplicate, 4 malformed.
    assert!(
        summary.contains("imported 83 lines: 78 events, 1 duplicates, 4 rejects"),
        "{summary}"
    );
    assert_eq!(count(&lake, "lease_events"), 78);
    let rejects = sql(
        &lake,
        "SELECT file_line, reason FROM lease_rejects ORDER BY file_line",
        "csv",
    );
    assert_eq!(
        rejects,
        "file_line,reason\n80,missing_field:fencing_token\n81,unknown_kind\n82,bad_timestamp\n83,invalid_json\n"
    );
    // The raw bytes are kept as they came, for replay after a fix.
    let raw = sql(
        &lake,
        "SELECT arrow_cast(raw, 'Utf8') AS raw FROM lease_rejects WHERE file_line = 83",
        "csv",
    );
    assert_eq!(raw, "raw\nnot json at all\n");

    // Importing the same file again adds nothing: no event (every line
    // has an event_id) and no reject (the same file and line).
    let again = import(&lake, &[sample()], &[]);
    assert!(
        again.contains("0 events, 83 duplicates, 0 rejects"),
        "{again}"
    );
    assert_eq!(count(&lake, "lease_events"), 78);
    assert_eq!(count(&lake, "lease_rejects"), 4);
    // Every table, read by other engines through its Delta log.
    assert_eq!(readers(&lake, "lease_events"), 78);
    assert_eq!(readers(&lake, "lease_rejects"), 4);
    let alerts = count(&lake, "lease_alerts") as u64;
    assert!(alerts > 0, "the sample fires alerts");
    assert_eq!(readers(&lake, "lease_alerts"), alerts);
}

#[test]
fn sql_answers_in_table_csv_json_and_ndjson() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import(&lake, &[sample()], &[]);
    let q = "SELECT lease_id, fencing_token, kind FROM lease_events WHERE lease_id = 'orders/order-123' ORDER BY ts LIMIT 2";
    let table = sql(&lake, q, "table");
    assert!(
        table.contains("| lease_id         | fencing_token | kind     |"),
        "{table}"
    );
    assert!(
        table.contains("| orders/order-123 | 33            | acquired |"),
        "{table}"
    );
    assert_eq!(
        sql(&lake, q, "csv"),
        "lease_id,fencing_token,kind\norders/order-123,33,acquired\norders/order-123,33,renewed\n"
    );
    let json: serde_json::Value = serde_json::from_str(&sql(&lake, q, "json")).unwrap();
    assert_eq!(json[0]["fencing_token"], 33);
    assert_eq!(json[1]["kind"], "renewed");
    let nd = sql(&lake, q, "ndjson");
    assert_eq!(nd.lines().count(), 2);

    // A bad query is a clear error, and writes are refused.
    for bad in [
        "SELECT nope FROM lease_events",
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO lease_events SELECT * FROM lease_events",
        "COPY lease_events TO '/tmp/x.parquet'",
        "DROP TABLE lease_events",
    ] {
        let out = leaseline()
            .args(["sql", "--lake"])
            .arg(&lake)
            .arg(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: "), "{bad}: {err}");
    }
    assert_eq!(count(&lake, "lease_events"), 78);
}

#[test]
fn duckdb_reads_the_same_rows_before_and_after_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    // Many small files: a flush every 10 lines.
    let file = dir.path().join("big.ndjson");
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(&format!(
            "{{\"ts\":{},\"kind\":\"renewed\",\"source\":\"holder\",\"lease_id\":\"l/{}\",\"holder_id\":\"h\",\"fencing_token\":{},\"event_id\":\"e{i}\"}}\n",
            1_789_380_000_000i64 + i * 1000,
            i % 7,
            i
        ));
    }
    std::fs::write(&file, text).unwrap();
    import(&lake, &[&file], &["--flush-max-rows", "100"]);
    let files_before = sql(
        &lake,
        "SELECT count(DISTINCT file_line) FROM lease_events",
        "csv",
    );
    assert!(files_before.contains("2000"));
    assert_eq!(count(&lake, "lease_events"), 2000);
    assert_eq!(readers(&lake, "lease_events"), 2000);
    let manifest_files = |lake: &Path| {
        walk(&lake.join("lease_events"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .filter(|p| !p.to_string_lossy().contains("_delta_log"))
            .count()
    };
    assert!(manifest_files(&lake) >= 20);

    // Readers query while compaction runs; each sees every row once.
    let lake2 = lake.clone();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..15 {
            seen.push(count(&lake2, "lease_events"));
        }
        seen
    });
    let out = run_ok(
        leaseline()
            .args(["compact", "--lake"])
            .arg(&lake)
            .args(["--target-file-bytes", "64MiB"]),
    );
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        report.starts_with("merged 20 files into 1 (2000 rows)"),
        "{report}"
    );
    for n in reader.join().unwrap() {
        assert_eq!(
            n, 2000,
            "a reader saw a partial or doubled lake during compaction"
        );
    }
    assert_eq!(count(&lake, "lease_events"), 2000);
    // Compacted, the replaced files still on storage: every engine reads
    // the new version, none the files of both.
    assert!(manifest_files(&lake) > 1);
    assert_eq!(readers(&lake, "lease_events"), 2000);

    // With no retention the replaced files are deleted; the counts hold.
    let out = leaseline()
        .args(["compact", "--lake"])
        .arg(&lake)
        .args(["--retention", "0s"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(manifest_files(&lake), 1);
    assert_eq!(count(&lake, "lease_events"), 2000);
    assert_eq!(readers(&lake, "lease_events"), 2000);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// `tests/fixtures/lake-before-delta` is the sample and an unsafe history
/// imported by the last release that wrote the format before Delta tables
/// (commit 8b4f26e): `leaseline import --lake tests/fixtures/lake-before-delta
/// samples/lease-events.ndjson tests/fixtures/unsafe.ndjson`.
#[test]
fn migrate_turns_a_lake_of_the_last_release_into_the_same_tables() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old");
    copy_dir(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/lake-before-delta"
        )),
        &old,
    );
    // Until migrated, it is refused with the command to run.
    let out = leaseline()
        .args(["sql", "--lake"])
        .arg(&old)
        .arg("SELECT 1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("leaseline migrate"), "{err}");

    let out = run_ok(leaseline().args(["migrate", "--lake"]).arg(&old));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(": 84 events, 4 rejects,"), "{said}");
    assert!(!old.join("_manifest").exists());

    // The same history imported by this release.
    let fresh = dir.path().join("fresh");
    let unsafe_history = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/unsafe.ndjson"
    ));
    import(&fresh, &[sample(), unsafe_history], &[]);
    let queries = [
        "SELECT event_id, ts, kind, source, lease_id, holder_id, fencing_token, ttl_ms, backend, latency_ms, reason, max_token, mono_ms, keepalive_sent_mono_ms, deadline_mono_ms, trace_id, span_id, attrs, file_line FROM lease_events ORDER BY file_line",
        "SELECT file_line, reason, message, arrow_cast(raw, 'Utf8') AS raw FROM lease_rejects ORDER BY file_line",
        "SELECT * FROM lease_timeline ORDER BY lease_id, fencing_token",
        "SELECT * FROM lease_violations ORDER BY 1, 2, 3, 4",
        "SELECT * FROM lease_holders ORDER BY 1, 2",
        "SELECT alertname, lease_id, holder_id, state, starts_at, ends_at FROM lease_alerts ORDER BY 1, 2, 3, 4, 5",
    ];
    for q in queries {
        let (a, b) = (sql(&old, q, "ndjson"), sql(&fresh, q, "ndjson"));
        assert!(a.lines().count() > 0, "{q} answered nothing");
        assert_eq!(a, b, "{q}");
    }
    for table in ["lease_events", "lease_rejects", "lease_alerts"] {
        readers(&old, table);
    }
}

/// A lake on S3 (moto's server): three imports commit at once, their
/// commits conflict and are retried, not lost; other engines read the
/// tables from the bucket, also after a compaction.
#[test]
fn a_lake_on_s3_takes_concurrent_writers_and_other_engines_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(dir.path(), "leaseline");
    s3.export_env();
    let lake = s3.url("lake");
    let mut procs = Vec::new();
    for w in 0..3 {
        let file = dir.path().join(format!("w{w}.ndjson"));
        let mut text = String::new();
        for i in 0..1500 {
            text.push_str(&format!(
                "{{\"ts\":{},\"kind\":\"renewed\",\"source\":\"holder\",\"lease_id\":\"l/{w}-{}\",\"holder_id\":\"h\",\"fencing_token\":{},\"event_id\":\"w{w}-{i}\"}}\n",
                1_789_380_000_000i64 + i * 1000,
                i % 5,
                18_446_744_073_709_550_000u64 + i as u64
            ));
        }
        std::fs::write(&file, text).unwrap();
        let mut cmd = leaseline();
        cmd.args(["import", "--lake", &lake, "--flush-max-rows", "50"])
            .arg(&file)
            .env("LEASELINE_LOG", "info,leaseline_ingest=debug");
        procs.push(Proc::spawn(&format!("import-{w}"), cmd, dir.path()));
    }
    let mut conflicts = 0;
    for mut p in procs {
        let status = p.wait(Duration::from_secs(300));
        assert!(status.success(), "{}", p.logs());
        conflicts += p.logs().matches("commit conflict; rebasing").count();
    }
    assert!(
        conflicts > 0,
        "90 commits from 3 writers at once never raced"
    );
    let at = Path::new(&lake);
    assert_eq!(count(at, "lease_events"), 4500);
    let distinct = sql(
        at,
        "SELECT count(DISTINCT event_id) AS n FROM lease_events",
        "csv",
    );
    assert_eq!(distinct, "n\n4500\n");
    assert_eq!(readers_agree(&lake, "lease_events", &[]), 4500);

    run_ok(leaseline().args(["compact", "--lake", &lake, "--retention", "1h"]));
    assert_eq!(readers_agree(&lake, "lease_events", &[]), 4500);
    assert_eq!(
        readers_agree(&lake, "lease_alerts", &[]) as usize,
        count(at, "lease_alerts")
    );
}

/// `compact --keep-events` removes the UTC days wholly older than the
/// retention from `lease_events` and `lease_rejects`, and the audit's rows
/// go with them; other engines read the same.
#[test]
fn days_past_the_event_retention_leave_the_lake_with_what_they_derived() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let now = chrono::Utc::now();
    let old = (now - chrono::Duration::days(40)).format("%Y-%m-%dT10:00:00Z");
    let recent = (now - chrono::Duration::days(1)).format("%Y-%m-%dT10:00:00Z");
    let lines = [
        format!(
            r#"{{"ts":"{old}","kind":"acquired","source":"coordinator","lease_id":"old/1","holder_id":"a","fencing_token":1,"ttl_ms":10000,"event_id":"o1"}}"#
        ),
        format!(
            r#"{{"ts":"{old}","kind":"released","source":"holder","lease_id":"old/1","holder_id":"a","fencing_token":1,"event_id":"o2"}}"#
        ),
        format!(
            r#"{{"ts":"{recent}","kind":"acquired","source":"coordinator","lease_id":"new/1","holder_id":"b","fencing_token":1,"ttl_ms":10000,"event_id":"n1"}}"#
        ),
        format!(
            r#"{{"ts":"{recent}","kind":"released","source":"holder","lease_id":"new/1","holder_id":"b","fencing_token":1,"event_id":"n2"}}"#
        ),
    ];
    let input = dir.path().join("days.ndjson");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    import(&lake, &[input.as_path()], &[]);
    let grants = "SELECT lease_id FROM lease_timeline ORDER BY lease_id";
    assert_eq!(sql(&lake, grants, "csv"), "lease_id\nnew/1\nold/1\n");

    // Kept forever by default: nothing goes.
    run_ok(leaseline().args(["compact", "--lake", lake.to_str().unwrap()]));
    assert_eq!(count(&lake, "lease_events"), 4);

    let out = run_ok(leaseline().args([
        "compact",
        "--lake",
        lake.to_str().unwrap(),
        "--keep-events",
        "30d",
    ]));
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.contains("removed 2 rows in 1 files"), "{out}");
    assert_eq!(count(&lake, "lease_events"), 2);
    assert_eq!(sql(&lake, grants, "csv"), "lease_id\nnew/1\n");
    assert_eq!(
        sql(&lake, "SELECT count(*) AS n FROM lease_violations", "csv"),
        "n\n0\n"
    );
    assert_eq!(readers(&lake, "lease_events"), 2);

    let bad = leaseline()
        .args([
            "compact",
            "--lake",
            lake.to_str().unwrap(),
            "--keep-events",
            "soon",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("neither \"forever\" nor a duration"), "{err}");
}
