//! The lease audit of `docs/event-contract.md` ("What the audit
//! derives"), as pure logic: SQL over the lake and the streaming alert
//! engine both run this crate, so the two never disagree.
//!
//! What enters: decoded [`leaseline_schema::LeaseEvent`]s, pushed into an
//! [`Auditor`] one at a time ([`Auditor::push`]) or in batches
//! ([`Auditor::push_all`], faster), in any order, duplicates included.
//!
//! What leaves, the same whatever the arrival order:
//! - [`Auditor::timeline`]: one [`Grant`] per `(lease_id, fencing_token)`
//!   with an `acquired` event, with how it ended ([`EndKind`]) and its
//!   keepalive and write counts;
//! - [`Auditor::violations`]: every [`Violation`] ([`ViolationKind`]), with a
//!   plain-English `detail` and the `evidence` event ids;
//! - [`Auditor::holders`]: the last grant of every lease ([`LeaseHolder`]);
//! - [`Auditor::lease`]: one lease's [`LeaseAudit`];
//! - [`Auditor::drain_changes`]: violations that appeared or went away since
//!   the previous call ([`ViolationChanges`]), for alerting;
//! - [`Auditor::settle`]: the rows that can no longer change, handed out
//!   and dropped from memory ([`Settled`]).
//!
//! Tolerances come from [`AuditConfig`].
//!
//! ```
//! use leaseline_audit::{Auditor, EndKind};
//!
//! let mut audit = Auditor::default();
//! for line in [
//!     r#"{"ts":"2026-09-14T10:00:00Z","kind":"acquired","source":"coordinator","lease_id":"L","holder_id":"b-1","fencing_token":7,"ttl_ms":10000}"#,
//!     r#"{"ts":"2026-09-14T10:00:05Z","kind":"released","source":"holder","lease_id":"L","holder_id":"b-1","fencing_token":7}"#,
//! ] {
//!     audit.push(&leaseline_schema::decode(line.as_bytes()).unwrap());
//! }
//! assert_eq!(audit.timeline()[0].end_kind, EndKind::Released);
//! assert!(audit.violations().is_empty());
//! ```
//!
//! # How it works
//!
//! Events are kept per lease, de-duplicated by `event_id` across the whole
//! history, in a compact 64-byte form with interned strings. A push checks
//! the id, appends the event to a short log and returns; the log is filed
//! under its leases in batches, marking them dirty. A read recomputes only
//! the dirty leases, from scratch, walking their events in one canonical
//! order: by timestamp, then kind (acquisitions, keepalive outcomes, resource
//! events, then ends), then content, never arrival. Every answer is
//! therefore a function of the set of events. Only whether a grant without
//! an end event is open or lapsed depends on the other leases (see below);
//! it is settled at read time.
//!
//! Memory grows with the history unless the caller settles it:
//! [`Auditor::settle`] hands out the rows that can no longer change (a
//! lease's grants and violations before a cut behind the caller's
//! lateness horizon) and drops their events, and [`Auditor::take_stale`]
//! with [`Auditor::reload`] replay a lease whose settled rows a late event
//! changes. The rows handed out plus the rows answered are always those of
//! the whole history (the protocol is in `settle.rs`). The ids of dropped
//! events are forgotten too, once they outnumber those held; the other
//! strings events carry (holders, backends, trace ids) stay interned.
//!
//! # Decisions where the contract is silent
//!
//! - **"The latest event time seen" is global**: the maximum `ts` over all
//!   events of all leases. A lease whose emitters all went quiet still shows
//!   `lapsed` once the rest of the fleet has moved past its TTL; per lease it
//!   would stay `open` forever. The price: one event with a far-future
//!   timestamp lapses every grant. Open versus lapsed is settled at read
//!   time, so pushing to one lease can turn another lease's grant from open
//!   to lapsed. A grant whose TTL runs out exactly at the latest time is
//!   lapsed: validity is the half-open interval `[acquired_at, valid_until)`.
//! - **Merged reports.** `acquired_at`, `holder_id` and the clock the grant
//!   started on come from the coordinator's `acquired` when there is one (it
//!   is authoritative for ownership), else from the earliest holder report.
//!   `renewals` and `renew_failures` are the larger of the per-source counts,
//!   since a keepalive reported by both sides is one keepalive.
//! - **Validity.** A grant is valid from `acquired_at` until the earliest of
//!   its first end event and its last success (the acquisition, or a renewal
//!   no later than that end event) plus the TTL in force then (a renewal
//!   without `ttl_ms` keeps the grant's last TTL). A renewal after a lapse
//!   but before any end event does extend it, as the contract's formula says.
//!   `ended_at` never precedes `acquired_at` (a skewed end report can). Its
//!   `end_kind` follows the first end event even when the TTL ran out before
//!   it; `ended_at` is then the TTL deadline. Without a TTL and without an
//!   end event a grant is open for ever.
//! - **Clocks.** The coordinator is one clock and the resource is one clock;
//!   each holder process (`holder_id`) is a clock of its own, as two holders
//!   are two machines. Comparisons on one clock take it as it is; across
//!   clocks the other must be later (or earlier) by more than
//!   `clock_skew_tolerance`. A fact with several signs (a grant that a holder
//!   released and the coordinator then expired) counts only when it holds
//!   against every sign that could refute it (an overlap must start before
//!   every end report of the earlier grant, beyond skew) or one sign that
//!   proves it (a renewal after any end report, beyond skew).
//! - **token_regression**: a grant whose token is not above the highest
//!   token among grants acquired surely earlier; one violation per grant,
//!   against that highest earlier grant.
//! - **overlapping_ownership**: one violation per pair of grants, reported
//!   against the later one; also when both went to the same holder (the
//!   coordinator granted twice).
//! - **renew_after_end**: one per offending `renewed` event, naming the
//!   earliest end event it is surely after. Acquisitions never count here.
//! - **late_fence**: the fence time is the `fenced` event's `mono_ms`, or its
//!   `deadline_mono_ms` when `mono_ms` is absent; the last successful
//!   keepalive is the holder-reported `acquired`/`renewed` of the same grant
//!   and holder with the highest `keepalive_sent_mono_ms` not after the
//!   fence. Without those readings or a TTL, nothing is judged. As the
//!   contract reads, a TTL under one second puts the safe deadline before
//!   the keepalive was even sent, so any fence is late.
//! - **stale_write_accepted**: against tokens of `write_accepted` events at a
//!   strictly earlier resource timestamp; a rejection's `max_token` is not
//!   taken as an accepted token.
//! - **write_after_loss**: one per write, when its grant surely ended before
//!   it or the next grant of the lease (by acquisition) surely began before
//!   it; `other_fencing_token` is that next grant when it applies. A write
//!   whose token was never granted cannot be judged for loss (but can be
//!   stale). One write can be both stale and after loss: both are reported.
//! - **"Zombie holder"** in the contract's alert defaults is not a violation
//!   kind: it is `renew_after_end` or `late_fence`
//!   ([`ViolationKind::alert_signal`]).
//! - **Duplicates.** Events without `event_id` are all kept. Events sharing
//!   one but differing keep the first in canonical order. Tokenless
//!   `renew_failed` events count against the latest grant of their holder
//!   acquired by then.
//! - Events whose token has no `acquired` event (orphan renewals, ends) are
//!   kept but belong to no grant.

mod auditor;
mod config;
mod derive;
mod detect;
mod grant;
mod ids;
mod intern;
mod lease;
mod prefetch;
mod record;
mod ser;
mod settle;
mod shared;
mod strtab;
pub mod table;
mod text;
mod violation;
pub mod window;

pub use crate::auditor::{Auditor, Settled, StoredFiles};
pub use crate::config::AuditConfig;
pub use crate::grant::{EndKind, Grant, LeaseHolder};
pub use crate::lease::LeaseAudit;
pub use crate::shared::SharedAuditor;
pub use crate::violation::{Violation, ViolationChanges, ViolationKind};
