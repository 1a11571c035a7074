//! Wording of violation details and evidence references.

use chrono::DateTime;

use crate::ids::EventIds;
use crate::intern::Interner;
use crate::record::Ev;

/// A UTC time of day (`10:00:06.000`): details read like an incident
/// timeline, and the violation's `at` carries the full timestamp.
pub(crate) fn time(us: i64) -> String {
    match DateTime::from_timestamp_micros(us) {
        Some(t) if us.rem_euclid(1000) == 0 => t.format("%H:%M:%S%.3f").to_string(),
        Some(t) => t.format("%H:%M:%S%.6f").to_string(),
        None => format!("{us} us"),
    }
}

/// A full RFC 3339 UTC timestamp with microseconds.
pub(crate) fn timestamp(us: i64) -> String {
    match DateTime::from_timestamp_micros(us) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        None => format!("{us} us"),
    }
}

/// How evidence names an event: its `event_id`, or, for events sent without
/// one, a description precise enough to find the event in the lake.
pub(crate) fn evidence(ev: &Ev, strings: &Interner, ids: &EventIds) -> String {
    if let Some(id) = ids.get_opt(ev.event_id) {
        return id.to_string();
    }
    let mut s = format!("(no event_id) {} {}", ev.source, ev.kind);
    if let Some(t) = ev.token() {
        s.push_str(&format!(" token {t}"));
    }
    if let Some(h) = strings.get_opt(ev.holder) {
        s.push_str(&format!(" holder {h}"));
    }
    s.push_str(" at ");
    s.push_str(&timestamp(ev.ts));
    s
}

/// Milliseconds for prose: whole when whole, else to the microsecond.
pub(crate) fn ms(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.3} ms")
    }
}
