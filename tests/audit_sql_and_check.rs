//! The audit through the command line: `leaseline check` over files and
//! over the lake, and the `lease_timeline`, `lease_violations` and
//! `lease_holders` tables through `leaseline sql`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use common::*;

fn check(args: &[&std::ffi::OsStr]) -> Output {
    leaseline().arg("check").args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn kinds_of_ndjson(out: &str) -> BTreeSet<(String, String, u64)> {
    out.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["kind"].as_str().unwrap().to_string(),
                v["lease_id"].as_str().unwrap().to_string(),
                v["fencing_token"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn expected_violations() -> BTreeSet<(String, String, u64)> {
    [
        ("overlapping_ownership", 8),
        ("stale_write_accepted", 7),
        ("write_after_loss", 7),
        ("token_regression", 5),
    ]
    .into_iter()
    .map(|(k, t)| (k.to_string(), "pay/acct-9".to_string(), t))
    .collect()
}

#[test]
fn check_of_a_clean_history_exits_0_and_reports_malformed_lines() {
    let out = check(&[sample().as_os_str()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("clean: no safety violations in 78 events"),
        "{stdout}"
    );
    assert!(stdout.contains("4 malformed lines skipped"), "{stdout}");
    // Each malformed line is named with its file, line and reason.
    assert!(
        stderr.contains("lease-events.ndjson:83: skipped: invalid_json"),
        "{stderr}"
    );
    assert!(stderr.contains("skipped: unknown_kind"), "{stderr}");
}

#[test]
fn check_of_an_unsafe_history_exits_1_and_explains_each_violation() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_unsafe(dir.path());
    let out = check(&[file.as_os_str()]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains(
            "overlapping_ownership on pay/acct-9 (token 8, holder b-2) at 2026-09-14T10:00:06.000Z"
        ),
        "{stdout}"
    );
    // The explanation names the grants, holders and times, and the evidence
    // names the events.
    let block: Vec<&str> = stdout
        .split("\n\n")
        .filter(|b| b.starts_with("overlapping_ownership"))
        .collect();
    assert_eq!(block.len(), 1, "{stdout}");
    for needle in ["8", "b-2", "7", "b-1", "10:00:06", "evidence:", "u1", "u2"] {
        assert!(
            block[0].contains(needle),
            "{needle} missing in {}",
            block[0]
        );
    }
    assert!(
        stdout.contains("4 safety violation(s) in 6 events (1 leases, 3 grants)"),
        "{stdout}"
    );

    let out = check(&["--format".as_ref(), "ndjson".as_ref(), file.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(kinds_of_ndjson(&text(&out.stdout)), expected_violations());
}

#[test]
fn check_tolerances_come_from_flags() {
    // With a 3 s skew tolerance the resource's write at 10:00:08 is no
    // longer surely after grant 8 began on the coordinator's clock at
    // 10:00:06, and the released-at-10:00:09 overlap is within tolerance.
    let dir = tempfile::tempdir().unwrap();
    let file = write_unsafe(dir.path());
    let out = check(&[
        "--format".as_ref(),
        "ndjson".as_ref(),
        "--clock-skew-tolerance".as_ref(),
        "5s".as_ref(),
        file.as_os_str(),
    ]);
    let got = kinds_of_ndjson(&text(&out.stdout));
    assert!(
        !got.iter().any(|(k, _, _)| k == "write_after_loss"),
        "{got:?}"
    );
    assert!(
        got.iter().any(|(k, _, _)| k == "stale_write_accepted"),
        "{got:?}"
    );
}

#[test]
fn check_that_cannot_read_its_input_exits_2() {
    let out = check(&["/nonexistent/leases.ndjson".as_ref()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/leases.ndjson"));
}

#[test]
fn audit_tables_in_sql_agree_with_check_on_the_lake() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let file = write_unsafe(dir.path());
    import_files(&lake, &[sample(), file]);

    // The SQL table and `check --lake` come from the same engine.
    let rows = sql(
        &lake,
        "SELECT kind, lease_id, fencing_token FROM lease_violations ORDER BY kind",
        "ndjson",
    );
    assert_eq!(kinds_of_ndjson(&rows), expected_violations());
    let out = leaseline()
        .args(["check", "--format", "ndjson", "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(kinds_of_ndjson(&text(&out.stdout)), expected_violations());

    // Who held orders/order-123, with which token, and how it ended.
    let timeline = sql(
        &lake,
        "SELECT fencing_token, holder_id, end_kind, renewals, writes_accepted, \
         CAST(acquired_at AS VARCHAR) AS acquired_at FROM lease_timeline \
         WHERE lease_id = 'orders/order-123' ORDER BY acquired_at",
        "csv",
    );
    let lines: Vec<&str> = timeline.lines().collect();
    assert_eq!(lines.len(), 3, "{timeline}");
    assert!(
        lines[1].starts_with("33,worker-1,expired,1,0,"),
        "{timeline}"
    );
    assert!(lines[2].starts_with("34,worker-2,"), "{timeline}");

    // The current holder of every lease.
    let holders = sql(
        &lake,
        "SELECT lease_id, holder_id, fencing_token FROM lease_holders ORDER BY lease_id",
        "csv",
    );
    assert!(
        holders.contains("orders/order-123,worker-2,34"),
        "{holders}"
    );
    assert!(holders.contains("pay/acct-9,b-3,5"), "{holders}");
    let leases = count(&lake, "lease_holders");
    let distinct = sql(
        &lake,
        "SELECT count(DISTINCT lease_id) AS n FROM lease_events WHERE kind = 'acquired'",
        "csv",
    );
    assert_eq!(
        distinct.lines().nth(1).unwrap().parse::<usize>().unwrap(),
        leases
    );

    // The evidence column is a list of event ids, usable in SQL.
    let evidence = sql(
        &lake,
        "SELECT array_to_string(evidence, ' ') AS ids FROM lease_violations \
         WHERE kind = 'token_regression'",
        "csv",
    );
    assert!(evidence.contains("u6"), "{evidence}");
}

/// Every row of the audit's tables, in one order, as CSV.
fn audit_rows(query: impl Fn(&str) -> String) -> (String, String) {
    (
        query(
            "SELECT * FROM lease_timeline ORDER BY lease_id, acquired_at, fencing_token, holder_id",
        ),
        query(
            "SELECT kind, lease_id, fencing_token, holder_id, CAST(at AS VARCHAR) AS at, \
             other_fencing_token, other_holder_id, detail, \
             array_to_string(evidence, ' ') AS evidence FROM lease_violations \
             ORDER BY kind, lease_id, fencing_token, at, evidence, detail",
        ),
    )
}

/// Asserts that two answers of [`audit_rows`] are the same, naming the
/// first row that differs rather than printing both tables.
#[track_caller]
fn assert_same_rows(what: &str, got: &(String, String), want: &(String, String)) {
    for (table, g, w) in [
        ("lease_timeline", &got.0, &want.0),
        ("lease_violations", &got.1, &want.1),
    ] {
        if let Some((i, (a, b))) = g
            .lines()
            .zip(w.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            panic!("{what}: {table} differs at row {i}:\n  got  {a}\n  want {b}");
        }
        assert_eq!(
            g.lines().count(),
            w.lines().count(),
            "{what}: rows of {table}"
        );
    }
}

/// SQL's audit holds the last `audit.event_window` of event time as events
/// and older grants as rows. The answer is the one of keeping every event:
/// on a first read, and when a later import brings events far older than
/// the newest (their leases are audited again from the lake).
#[test]
fn the_audit_window_of_sql_changes_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    run_ok(
        leaseline()
            .args(["simulate", "--start", "2026-09-14T10:00:00Z", "--output"])
            .arg(&events)
            .args(["--events", "60000", "--leases", "40", "--seed", "11"])
            .args([
                "--crash",
                "0.03",
                "--pause",
                "0.03",
                "--double-grant",
                "0.03",
            ])
            .args(["--late-fence", "0.03", "--token-reuse", "0.05"]),
    );
    // One line in nine is held back and imported last, up to the whole
    // history late.
    let history = std::fs::read_to_string(&events).unwrap();
    let (mut first, mut late) = (String::new(), String::new());
    for (i, line) in history.lines().enumerate() {
        let part = if i % 9 == 4 { &mut late } else { &mut first };
        part.push_str(line);
        part.push('\n');
    }
    let (first_file, late_file) = (
        dir.path().join("first.ndjson"),
        dir.path().join("late.ndjson"),
    );
    std::fs::write(&first_file, first).unwrap();
    std::fs::write(&late_file, late).unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[first_file]);

    let windowed = dir.path().join("windowed.toml");
    std::fs::write(&windowed, "[audit]\nevent_window = \"1m\"\n").unwrap();
    let everything = dir.path().join("everything.toml");
    std::fs::write(&everything, "[audit]\nevent_window = \"0s\"\n").unwrap();
    let sql_with = |config: &Path, q: &str| {
        let out = run_ok(
            leaseline()
                .arg("--config")
                .arg(config)
                .args(["sql", "--format", "csv", "--lake"])
                .arg(&lake)
                .arg(q),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let span = sql_with(
        &everything,
        "SELECT CAST(date_part('epoch', max(ts) - min(ts)) AS BIGINT) AS s FROM lease_events",
    );
    let span: i64 = span.lines().nth(1).unwrap().parse().unwrap();
    assert!(span > 600, "the history spans {span} s, not ten windows");

    // A server reads the lake as it grows, auditing the new file only.
    let server = Server::start(&lake, &["--config", windowed.to_str().unwrap()], dir.path());
    let served = |q: &str| {
        let r = server.sql(q, &["-H", "Accept: text/csv"]);
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
    };
    let before = audit_rows(served);
    assert_same_rows(
        "served, first read",
        &before,
        &audit_rows(|q| sql_with(&everything, q)),
    );
    assert!(
        before.0.lines().count() > 1_000,
        "{}",
        before.0.lines().count()
    );
    assert!(before.1.lines().count() > 10, "{}", before.1);

    import_files(&lake, &[late_file]);
    let after = audit_rows(|q| sql_with(&everything, q));
    assert_ne!(after, before, "the late events changed no row");
    assert_same_rows("sql", &audit_rows(|q| sql_with(&windowed, q)), &after);
    assert_same_rows("served, after the late file", &audit_rows(served), &after);

    // `check` of the history as one file, `check --lake` reading it with
    // the window, and SQL name the same violations.
    let by_file = check(&["--format".as_ref(), "ndjson".as_ref(), events.as_os_str()]);
    assert_eq!(by_file.status.code(), Some(1), "{}", text(&by_file.stderr));
    let by_file = kinds_of_ndjson(&text(&by_file.stdout));
    let by_lake = leaseline()
        .arg("--config")
        .arg(&windowed)
        .args(["check", "--format", "ndjson", "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    assert_eq!(by_lake.status.code(), Some(1), "{}", text(&by_lake.stderr));
    assert_eq!(kinds_of_ndjson(&text(&by_lake.stdout)), by_file);
    let by_sql = sql_with(
        &windowed,
        "SELECT kind, lease_id, fencing_token FROM lease_violations",
    );
    let by_sql: BTreeSet<(String, String, u64)> = by_sql
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[1].to_string(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(by_sql, by_file);
}
