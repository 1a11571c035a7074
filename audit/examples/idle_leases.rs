//! What a lease that has gone quiet costs a long-running auditor.
//!
//! A settle keeps each lease's last grant in memory, so that
//! `lease_holders` answers from memory (condition 5 of `settle.rs`). A
//! fleet whose lease ids change (one lease per job, or per pod) therefore
//! leaves one entry per lease it ever saw. This measures that: it files
//! `LEASES` leases of one grant each (acquired, three renewals, released)
//! in batches of 20,000, as fleets that follow one another, settles far
//! past them after each batch, and prints the events held and the
//! resident memory per lease.
//!
//! `cargo run --release -p leaseline-audit --example idle_leases [LEASES]`

use leaseline_audit::{AuditConfig, Auditor};
use leaseline_schema::decode;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let leases: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(400_000);
    let fleet = 20_000;
    let mut auditor = Auditor::new(AuditConfig::default());
    let start = rss_kib();
    let t0: i64 = 1_790_000_000;
    println!("leases,events_held,rss_mib,rss_bytes_per_lease");
    let mut filed = 0;
    while filed < leases {
        let base = t0 + (filed / fleet) as i64 * 60;
        for i in filed..(filed + fleet).min(leases) {
            let at = |s: i64| {
                chrono::DateTime::from_timestamp(base + s, 0)
                    .unwrap()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            };
            // One grant: acquired, renewed three times, released.
            let steps = [
                (0, "acquired", "coordinator", "a"),
                (2, "renewed", "holder", "r1"),
                (4, "renewed", "holder", "r2"),
                (6, "renewed", "holder", "r3"),
                (8, "released", "holder", "x"),
            ];
            let lines = steps.map(|(s, kind, source, id)| {
                format!(
                    r#"{{"ts":"{}","kind":"{kind}","source":"{source}","lease_id":"jobs/{i}","holder_id":"pod-{i}","fencing_token":1,"ttl_ms":6000,"event_id":"{i}-{id}"}}"#,
                    at(s)
                )
            });
            for l in &lines {
                auditor.push(&decode(l.as_bytes()).unwrap());
            }
        }
        filed = (filed + fleet).min(leases);
        // Far past every grant filed: whatever can settle does.
        auditor.settle((base + 3_600) * 1_000_000);
        let rss = rss_kib().saturating_sub(start);
        println!(
            "{filed},{},{:.1},{}",
            auditor.held(),
            rss as f64 / 1024.0,
            rss * 1024 / filed as u64
        );
    }
}
