//! `leaseline timeline --svg` and `GET /api/v1/leases/{id}/timeline.svg`
//! against the real binary: an unknown lease is an error on both (exit 2,
//! 404), a range with nothing in it is a picture that says so, and the
//! picture stays well-formed XML with violations, writes and a holder id
//! holding control characters.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A lake holding the unsafe payment history (`pay/acct-9`: an
/// overlapping grant, a late write, a token regression) and the sample.
fn lake(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    import_files(&lake, &[sample(), write_unsafe(dir)]);
    lake
}

/// Runs `leaseline timeline --lake LAKE ARGS --svg -`.
fn timeline(lake: &Path, args: &[&str]) -> std::process::Output {
    leaseline()
        .args(["timeline", "--lake"])
        .arg(lake)
        .args(args)
        .args(["--svg", "-"])
        .output()
        .unwrap()
}

#[test]
fn an_unknown_lease_exits_2_on_the_cli_and_is_404_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake(dir.path());

    let out = timeline(&lake, &["orders/no-such-lease"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.lines().next(),
        Some("error: no lease 'orders/no-such-lease' in the lake"),
        "{stderr}"
    );

    // Nor is a file left behind.
    let file = dir.path().join("nothing.svg");
    let out = leaseline()
        .args(["timeline", "--lake"])
        .arg(&lake)
        .args(["orders/no-such-lease", "--svg"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!file.exists());

    let server = Server::start(&lake, &["--no-pg"], dir.path());
    let reply = server.get("/api/v1/leases/orders%2Fno-such-lease/timeline.svg");
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.content_type, "application/json");
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "error": "not_found",
            "message": "no lease 'orders/no-such-lease' in the lake",
        })
    );
}

#[test]
fn a_known_lease_with_nothing_in_the_range_is_a_picture_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake(dir.path());
    // pay/acct-9's events are 10:00:00 to 10:00:20 on 2026-09-14.
    let range = [
        "--from",
        "2026-09-15T08:00:00Z",
        "--to",
        "2026-09-15T09:00:00Z",
    ];
    let out = timeline(&lake, &[&["pay/acct-9"][..], &range].concat());
    assert!(out.status.success(), "{out:?}");
    let svg = String::from_utf8(out.stdout).unwrap();
    assert_well_formed(&svg);
    assert!(svg.contains(">Nothing in this range.</text>"), "{svg}");
    assert!(
        svg.contains(
            ">The lease has events from 2026-09-14 10:00:00.000 to 2026-09-14 10:00:20.000 UTC.</text>"
        ),
        "{svg}"
    );
    // The axis covers the asked hour, on round ten minutes.
    for tick in ["08:00:00", "08:30:00", "09:00:00"] {
        assert!(svg.contains(&format!(">{tick}</text>")), "{svg}");
    }
    assert!(svg.contains(">2026-09-15 UTC</text>"), "{svg}");

    let server = Server::start(&lake, &["--no-pg"], dir.path());
    let reply = server.get(
        "/api/v1/leases/pay%2Facct-9/timeline.svg?from=2026-09-15T08:00:00Z&to=2026-09-15T09:00:00Z",
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.text(), svg);
}

#[test]
fn a_lease_with_violations_and_writes_is_drawn_with_every_explanation() {
    let dir = tempfile::tempdir().unwrap();
    let lake = lake(dir.path());
    let out = timeline(&lake, &["pay/acct-9"]);
    assert!(out.status.success(), "{out:?}");
    let svg = String::from_utf8(out.stdout).unwrap();
    assert_well_formed(&svg);
    for needle in [
        ">b-1 · token 7</text>",
        ">b-2 · token 8</text>",
        ">b-3 · token 5</text>",
        "write_accepted at 10:00:07.000 by b-2, token 8",
        "write_accepted at 10:00:08.000 by b-1, token 7",
        ">2026-09-14 UTC</text>",
        ">10:00:00</text>",
        ">10:00:10</text>",
        ">10:00:20</text>",
    ] {
        assert!(svg.contains(needle), "the picture lacks {needle:?}:\n{svg}");
    }
    // Each violation the audit reports is numbered and explained.
    let csv = sql(
        &lake,
        "SELECT kind FROM lease_violations WHERE lease_id = 'pay/acct-9' ORDER BY at",
        "csv",
    );
    let kinds: Vec<&str> = csv.lines().skip(1).collect();
    assert!(kinds.contains(&"overlapping_ownership"), "{kinds:?}");
    for (i, kind) in kinds.iter().enumerate() {
        let head = format!(">{}. </text>", i + 1);
        assert!(svg.contains(&head), "no {head:?} in\n{svg}");
        assert!(
            svg.contains(&format!(">{kind} (token ")),
            "no {kind} in\n{svg}"
        );
    }
}

#[test]
fn control_characters_in_a_holder_id_still_make_well_formed_xml() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("nul.ndjson");
    std::fs::write(
        &events,
        concat!(
            r#"{"ts":"2026-09-14T10:00:00.000Z","kind":"acquired","source":"coordinator","lease_id":"jobs/nul","holder_id":"worker\u0000-1\u001b[31m","fencing_token":3,"ttl_ms":10000,"event_id":"n1"}"#,
            "\n",
            r#"{"ts":"2026-09-14T10:00:02.000Z","kind":"write_accepted","source":"resource","lease_id":"jobs/nul","holder_id":"worker\u0000-1\u001b[31m","fencing_token":3,"event_id":"n2"}"#,
            "\n",
        ),
    )
    .unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[events]);
    let out = timeline(&lake, &["jobs/nul"]);
    assert!(out.status.success(), "{out:?}");
    let svg = String::from_utf8(out.stdout).unwrap();
    assert_well_formed(&svg);
    assert!(
        svg.contains(">worker\u{FFFD}-1\u{FFFD}[31m · token 3</text>"),
        "{svg}"
    );
}
