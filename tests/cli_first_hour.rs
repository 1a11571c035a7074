//! What a new user meets first, through the real binary: a mistyped lake
//! is an error (never an empty, clean-looking answer), errors are said once
//! with a hint, output ends quietly when its reader goes away, every flag
//! has an environment variable and no secret shows in `--help`, and the
//! demo can be run again on its own directory without inventing
//! violations.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn first_line(b: &[u8]) -> String {
    text(b).lines().next().unwrap_or("").to_string()
}

fn run(dir: &Path, args: &[&str]) -> Output {
    leaseline().current_dir(dir).args(args).output().unwrap()
}

#[test]
fn check_on_a_missing_lake_fails_instead_of_passing() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["check", "--lake", "no/such/lake"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert_eq!(
        first_line(&out.stderr),
        "error: no lake at no/such/lake: no such directory"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(!dir.path().join("no").exists(), "check created the lake");
}

#[test]
fn sql_and_timeline_on_a_missing_lake_fail_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["sql", "--lake", "nowhere", "SELECT 1"][..],
        &[
            "timeline", "--lake", "nowhere", "orders/1", "--svg", "out.svg",
        ][..],
        &["compact", "--lake", "nowhere"][..],
    ] {
        let out = run(dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            first_line(&out.stderr),
            "error: no lake at nowhere: no such directory",
            "{args:?}"
        );
        assert!(!dir.path().join("nowhere").exists(), "{args:?} created it");
        assert!(!dir.path().join("out.svg").exists());
    }
}

#[test]
fn a_directory_with_nothing_committed_is_not_a_lake() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = run(dir.path(), &["sql", "--lake", "empty", "SELECT 1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        first_line(&out.stderr),
        "error: no lake at empty: nothing has been committed there (no Delta tables)"
    );
}

#[test]
fn the_default_lake_missing_suggests_the_lakes_nearby() {
    let dir = tempfile::tempdir().unwrap();
    import_files(&dir.path().join("data/demo"), &[sample()]);
    let out = run(dir.path(), &["sql", "SELECT count(*) FROM lease_events"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            "error: no lake at ./data/lake: no such directory",
            "hint: lakes here: ./data/demo (pass one with --lake)"
        ]
    );
}

#[test]
fn a_sql_error_is_said_once_with_the_tables_as_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    let lake = lake.to_str().unwrap();

    let out = run(dir.path(), &["sql", "--lake", lake, "SELEC 1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "error: SQL error: sql parser error: Expected: an SQL statement, found: SELEC at Line: 1, Column: 1",
            "hint: the tables are lease_events, lease_rejects, lease_alerts, lease_timeline, lease_violations, lease_holders; every surface is read-only (SELECT, EXPLAIN, SHOW, DESCRIBE)"
        ]
    );

    let out = run(dir.path(), &["sql", "--lake", lake, "SELECT * FROM leases"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        first_line(&out.stderr),
        "error: Error during planning: table 'leaseline.public.leases' not found"
    );

    let out = run(
        dir.path(),
        &["sql", "--lake", lake, "DROP TABLE lease_events"],
    );
    assert_eq!(out.status.code(), Some(2));
    let first = first_line(&out.stderr);
    assert!(
        first.starts_with("error: Error during planning: DDL not supported"),
        "{first}"
    );
    assert_eq!(first.matches("DDL not supported").count(), 1, "{first}");
}

#[test]
fn an_empty_result_shows_its_header_and_row_count() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    let out = sql(
        &lake,
        "SELECT lease_id, holder_id FROM lease_events WHERE lease_id = 'nope'",
        "table",
    );
    assert_eq!(
        out,
        "+----------+-----------+\n| lease_id | holder_id |\n+----------+-----------+\n+----------+-----------+\n(0 rows)\n"
    );
    let out = sql(&lake, "SELECT 1 AS one", "table");
    assert_eq!(
        out,
        "+-----+\n| one |\n+-----+\n| 1   |\n+-----+\n(1 row)\n"
    );
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    // Far more than a pipe's buffer, so the writer meets the closed pipe.
    let mut child = leaseline()
        .args(["sql", "--lake"])
        .arg(&lake)
        .args([
            "--format",
            "csv",
            "SELECT value FROM generate_series(1, 2000000)",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "value");
    assert_eq!(lines.next().unwrap().unwrap(), "1");
    drop(lines);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}

/// The options of one subcommand's `--help`, each with its description
/// and the lines below it.
fn options(help: &str) -> Vec<(String, String)> {
    let mut opts: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("--") || (t.starts_with('-') && t.chars().nth(2) == Some(',')) {
            let name = t
                .split_whitespace()
                .find(|w| w.starts_with("--"))
                .unwrap()
                .trim_end_matches(',')
                .to_string();
            opts.push((name, t.to_string()));
        } else if let Some(last) = opts.last_mut() {
            if line.starts_with("          ") {
                last.1.push(' ');
                last.1.push_str(t);
            }
        }
    }
    opts
}

/// An option's help without its names, value name and bracketed notes
/// (`[env: ...]`, `[default: ...]`): what is left describes it.
fn description(help: &str) -> String {
    let mut rest = help.to_string();
    while let Some(i) = rest.find(" [") {
        let Some(j) = rest[i..].find(']') else { break };
        rest.replace_range(i..i + j + 1, "");
    }
    rest.split_whitespace()
        .skip_while(|w| w.starts_with('-') || w.starts_with('<'))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn every_flag_has_a_description_and_an_environment_variable() {
    let commands = [
        "ingest",
        "serve",
        "import",
        "sql",
        "check",
        "demo",
        "timeline",
        "simulate",
        "compact",
        "pg-verifier",
    ];
    for c in commands {
        let out = leaseline().args([c, "--help"]).output().unwrap();
        assert!(out.status.success());
        let help = text(&out.stdout);
        assert!(!help.contains("Output format. Output format"), "{c}");
        let opts = options(&help);
        assert!(opts.len() > 1, "{c}: no options found in\n{help}");
        for (name, desc) in opts {
            if name == "--help" || name == "--version" {
                continue;
            }
            assert!(
                desc.contains("[env: "),
                "{c} {name} has no environment variable: {desc}"
            );
            assert!(
                !description(&desc).is_empty(),
                "{c} {name} has no description: {desc}"
            );
        }
    }
}

#[test]
fn secrets_stay_out_of_help() {
    let out = leaseline()
        .args(["ingest", "--help"])
        .env("LEASELINE_KAFKA_PROPERTIES", "sasl.password=hunter2")
        .env("LEASELINE_PG_PASSWORD", "hunter3")
        .output()
        .unwrap();
    let help = text(&out.stdout);
    assert!(help.contains("LEASELINE_KAFKA_PROPERTIES"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
    let out = leaseline()
        .args(["serve", "--help"])
        .env("LEASELINE_KAFKA_PROPERTIES", "sasl.password=hunter2")
        .env("LEASELINE_PG_PASSWORD", "hunter3")
        .output()
        .unwrap();
    let help = text(&out.stdout);
    assert!(
        !help.contains("hunter2") && !help.contains("hunter3"),
        "{help}"
    );
}

/// Runs the demo on `lake` until the lake has at least `events` events
/// committed, then stops it with Ctrl-C.
fn demo_until(dir: &Path, lake: &Path, sim: &[&str], events: usize, n: usize) {
    let mut cmd = leaseline();
    cmd.args(["demo", "--lake"])
        .arg(lake)
        .args(["--http-listen", "127.0.0.1:0", "--no-pg"])
        .args(sim)
        .env("LEASELINE_LOG", "info");
    let mut demo = Proc::spawn(&format!("demo-{n}"), cmd, dir);
    let count = |query: &str| {
        let out = leaseline()
            .args(["sql", "--lake"])
            .arg(lake)
            .args(["--format", "csv", query])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| text(&out.stdout).lines().nth(1)?.parse::<usize>().ok())
            .flatten()
            .unwrap_or(0)
    };
    // The simulator starts after the lake was replaced: counting before
    // that would count the previous run's events. Each run goes on until
    // its lake holds a violation, so that what it shows is never vacuous.
    let reached = wait_until(Duration::from_secs(120), || {
        demo.logs().contains("simulator running")
            && count("SELECT count(*) FROM lease_events") >= events
            && count("SELECT count(*) FROM lease_violations") > 0
    });
    assert!(
        reached,
        "run {n} never reached {events} events and a violation:\n{}",
        demo.logs()
    );
    demo.signal(libc::SIGINT);
    let status = demo.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}:\n{}", demo.logs());
}

#[test]
fn the_demo_run_twice_on_its_lake_reports_only_injected_violations() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("demo");
    let sim = [
        "--leases",
        "200",
        "--events",
        "200000",
        "--seed",
        "7",
        "--crash",
        "0.05",
        "--pause",
        "0.05",
        "--double-grant",
        "0.05",
    ];
    demo_until(dir.path(), &lake, &sim, 1_500, 1);
    demo_until(dir.path(), &lake, &sim, 1_500, 2);

    // The simulator's ground truth for the same fleet and seed: the demo
    // stops early, so what it shows must be a part of it.
    let truth_file = dir.path().join("truth.ndjson");
    run_ok(
        leaseline()
            .args([
                "simulate", "--leases", "200", "--events", "200000", "--seed", "7",
            ])
            .args([
                "--crash",
                "0.05",
                "--pause",
                "0.05",
                "--double-grant",
                "0.05",
            ])
            .args(["--output", "/dev/null", "--truth"])
            .arg(&truth_file),
    );
    let key = |v: &serde_json::Value| {
        (
            v["kind"].as_str().unwrap().to_string(),
            v["lease_id"].as_str().unwrap().to_string(),
            v["fencing_token"].as_u64().unwrap(),
        )
    };
    let truth: BTreeSet<_> = std::fs::read_to_string(&truth_file)
        .unwrap()
        .lines()
        .map(|l| key(&serde_json::from_str(l).unwrap()))
        .collect();
    let found: BTreeSet<_> = sql(
        &lake,
        "SELECT kind, lease_id, fencing_token FROM lease_violations",
        "ndjson",
    )
    .lines()
    .map(|l| key(&serde_json::from_str(l).unwrap()))
    .collect();
    assert!(!found.is_empty(), "the second run injected nothing to find");
    let invented: Vec<_> = found.difference(&truth).collect();
    assert!(
        invented.is_empty(),
        "violations the simulator did not inject: {invented:?}"
    );
    assert!(dir.path().join("demo/.leaseline-demo").exists());
}

#[test]
fn the_demo_refuses_a_directory_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    let out = leaseline()
        .args(["demo", "--no-pg", "--http-listen", "127.0.0.1:0", "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        first_line(&out.stderr),
        format!(
            "error: {} is not empty and was not written by `leaseline demo`; the demo starts on a fresh lake each run and deletes only its own, so give it a new or empty directory with --lake",
            lake.display()
        )
    );
    assert_eq!(count(&lake, "lease_events"), 78);
}

/// An on-call engineer's query on a machine whose cores are all busy (a
/// `serve` catching up, a build): `leaseline sql` keeps the priority it
/// was started with and answers, where query threads that yielded to any
/// busy process would wait past the timeout.
#[test]
fn sql_answers_while_other_processes_keep_every_core_busy() {
    const GRANTS: &str = "SELECT count(*) AS grants FROM lease_timeline";
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    import_files(&lake, &[sample()]);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy: Vec<Proc> = (0..=cores)
        .map(|i| {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "while :; do :; done"]);
            Proc::spawn(&format!("busy-{i}"), cmd, dir.path())
        })
        .collect();
    let out = run(
        dir.path(),
        &[
            "sql",
            "--lake",
            lake.to_str().unwrap(),
            "--query-timeout",
            "3s",
            "--format",
            "csv",
            GRANTS,
        ],
    );
    drop(busy);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let grants = sql(&lake, GRANTS, "csv");
    assert_eq!(text(&out.stdout), grants);
    assert_ne!(grants, "grants\n0\n");
}
