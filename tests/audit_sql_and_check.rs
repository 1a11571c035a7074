//! The audit through the command line: `leaseline check` over files and
//! over the lake, and the `lease_timeline`, `lease_violations` and
//! `lease_holders` tables through `leaseline sql`.

mod common;

use std::collections::BTreeSet;
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
