//! Timeline pictures: who held a lease when, as SVG.
//!
//! One row per grant, a bar from its acquisition to its end (coloured by
//! how it ended) labelled with holder and token; renewals are ticks, failed
//! keepalives, drains, fences and expiries are markers on the grant's row;
//! writes are dots (accepted) and squares (rejected) on the row of the token
//! they carried; violations are red lines with their explanation listed
//! under the chart. Times are UTC.

use std::fmt::Write;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{TimestampMicrosecondType, UInt64Type};
use leaseline_query::QueryEngine;

use crate::error::ServerError;

/// One grant of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub token: u64,
    pub holder: String,
    pub start: i64,
    pub end: Option<i64>,
    pub end_kind: String,
}

/// One event of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub ts: i64,
    pub kind: String,
    pub holder: Option<String>,
    pub token: Option<u64>,
}

/// One violation of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    pub at: i64,
    pub kind: String,
    pub token: u64,
    pub detail: String,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn clock(us: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_micros(us)
        .map(|t| t.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_default()
}

fn color(end_kind: &str) -> &'static str {
    match end_kind {
        "released" => "#4c9a2a",
        "expired" => "#d64541",
        "revoked" => "#8e44ad",
        "lapsed" => "#e67e22",
        _ => "#2e86de",
    }
}

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 190.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 50.0;
const ROW: f64 = 34.0;

/// Draws the picture. `from`/`to` default to the data's extent.
pub fn render(
    lease: &str,
    bars: &[Bar],
    marks: &[Mark],
    flags: &[Flag],
    from: Option<i64>,
    to: Option<i64>,
) -> String {
    let times = bars
        .iter()
        .flat_map(|b| [Some(b.start), b.end])
        .flatten()
        .chain(marks.iter().map(|m| m.ts))
        .chain(flags.iter().map(|f| f.at));
    let (lo, hi) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (mut lo, mut hi) = if lo > hi { (0, 1_000_000) } else { (lo, hi) };
    let pad = ((hi - lo) / 20).max(100_000);
    lo = from.unwrap_or(lo - pad);
    hi = to.unwrap_or(hi + pad).max(lo + 1);
    let x =
        |t: i64| LEFT + (t.clamp(lo, hi) - lo) as f64 / (hi - lo) as f64 * (WIDTH - LEFT - RIGHT);

    // Rows: grants by acquisition; writes with an unknown token get a row.
    let mut rows: Vec<&Bar> = bars.iter().collect();
    rows.sort_by_key(|b| (b.start, b.token));
    let row_of = |token: Option<u64>| token.and_then(|t| rows.iter().position(|b| b.token == t));
    const DRAWN: [&str; 9] = [
        "renewed",
        "renew_failed",
        "drain_started",
        "fenced",
        "expired",
        "released",
        "revoked",
        "write_accepted",
        "stale_write_rejected",
    ];
    let extra = marks
        .iter()
        .any(|m| DRAWN.contains(&m.kind.as_str()) && row_of(m.token).is_none());
    let n_rows = rows.len() + usize::from(extra);
    let chart_bottom = TOP + ROW * n_rows.max(1) as f64 + 10.0;
    let height = chart_bottom + 76.0 + 18.0 * flags.len() as f64 + 20.0;
    let y = |r: usize| TOP + ROW * r as f64;

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="10" y="22" font-size="16" font-weight="bold">Lease {} — who held it, with which token</text>"#,
        esc(lease)
    );
    // Time axis.
    for i in 0..=6 {
        let t = lo + (hi - lo) * i / 6;
        let xi = x(t);
        let _ = write!(
            s,
            r##"<line x1="{xi:.1}" y1="{TOP}" x2="{xi:.1}" y2="{chart_bottom:.1}" stroke="#ddd"/><text x="{xi:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            chart_bottom + 16.0,
            clock(t)
        );
    }
    // Grants.
    for (r, b) in rows.iter().enumerate() {
        let (x0, x1) = (x(b.start), x(b.end.unwrap_or(hi)));
        let yr = y(r);
        let _ = write!(
            s,
            r##"<text x="10" y="{:.1}">{} · token {}</text><rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="16" rx="3" fill="{}" fill-opacity="0.75"><title>grant {} to {}: {} → {} ({})</title></rect><text x="{:.1}" y="{:.1}" fill="white" font-size="11">{} · {}</text>"##,
            yr + 18.0,
            esc(&b.holder),
            b.token,
            yr + 6.0,
            (x1 - x0).max(2.0),
            color(&b.end_kind),
            b.token,
            esc(&b.holder),
            clock(b.start),
            b.end.map(clock).unwrap_or_else(|| "open".into()),
            esc(&b.end_kind),
            x0 + 4.0,
            yr + 18.0,
            esc(&b.holder),
            b.token,
        );
    }
    if extra {
        let _ = write!(
            s,
            r#"<text x="10" y="{:.1}">writes with other tokens</text>"#,
            y(rows.len()) + 18.0
        );
    }
    // Events.
    for m in marks {
        let r = row_of(m.token).unwrap_or(rows.len());
        let (xm, ym) = (x(m.ts), y(r) + 14.0);
        let title = format!(
            "{} at {}{}{}",
            m.kind,
            clock(m.ts),
            m.holder
                .as_deref()
                .map(|h| format!(" by {h}"))
                .unwrap_or_default(),
            m.token.map(|t| format!(", token {t}")).unwrap_or_default()
        );
        let shape = match m.kind.as_str() {
            "renewed" => format!(
                r##"<line x1="{xm:.1}" y1="{:.1}" x2="{xm:.1}" y2="{:.1}" stroke="#1b4f72" stroke-width="1.5">"##,
                ym - 9.0,
                ym + 9.0
            ),
            "renew_failed" => format!(
                r##"<path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="#e67e22" stroke-width="2.5">"##,
                xm - 4.0,
                ym - 4.0
            ),
            "drain_started" => format!(
                r##"<path d="M{xm:.1},{:.1} l6,10 l-12,0 z" fill="#e67e22">"##,
                ym - 6.0
            ),
            "fenced" => format!(
                r##"<rect x="{:.1}" y="{:.1}" width="4" height="22" fill="black">"##,
                xm - 2.0,
                ym - 11.0
            ),
            "expired" => format!(
                r##"<path d="M{:.1},{:.1} l12,12 m0,-12 l-12,12" stroke="#c0392b" stroke-width="3.5">"##,
                xm - 6.0,
                ym - 6.0
            ),
            "released" => format!(
                r##"<circle cx="{xm:.1}" cy="{ym:.1}" r="5" fill="white" stroke="#333" stroke-width="2">"##
            ),
            "revoked" => format!(r##"<circle cx="{xm:.1}" cy="{ym:.1}" r="5" fill="#8e44ad">"##),
            "write_accepted" => format!(
                r##"<circle cx="{xm:.1}" cy="{ym:.1}" r="4" fill="#27ae60" stroke="#145a32">"##
            ),
            "stale_write_rejected" => format!(
                r##"<rect x="{:.1}" y="{:.1}" width="11" height="11" fill="#c0392b" stroke="black">"##,
                xm - 5.5,
                ym - 5.5
            ),
            _ => continue,
        };
        let close = if shape.starts_with("<line") {
            "</line>"
        } else if shape.starts_with("<path") {
            "</path>"
        } else if shape.starts_with("<circle") {
            "</circle>"
        } else {
            "</rect>"
        };
        let _ = write!(s, "{shape}<title>{}</title>{close}", esc(&title));
        if m.kind == "stale_write_rejected" || m.kind == "expired" {
            let label = if m.kind == "expired" {
                "expired"
            } else {
                "stale write rejected"
            };
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{:.1}" fill="#c0392b" font-size="11">{label}</text>"##,
                xm + 8.0,
                ym - 8.0
            );
        }
    }
    // Violations.
    for (i, f) in flags.iter().enumerate() {
        let xf = x(f.at);
        let _ = write!(
            s,
            r##"<line x1="{xf:.1}" y1="{TOP}" x2="{xf:.1}" y2="{chart_bottom:.1}" stroke="#c0392b" stroke-width="2" stroke-dasharray="5,3"><title>{}</title></line><text x="{:.1}" y="{:.1}" fill="#c0392b" font-weight="bold">{}</text>"##,
            esc(&f.detail),
            xf + 3.0,
            TOP - 4.0,
            i + 1
        );
        let _ = write!(
            s,
            r##"<text x="10" y="{:.1}" fill="#c0392b">{}. {} (token {}): {}</text>"##,
            chart_bottom + 62.0 + 18.0 * i as f64,
            i + 1,
            esc(&f.kind),
            f.token,
            esc(&f.detail)
        );
    }
    let legend_y = chart_bottom + 30.0;
    let _ = write!(
        s,
        r##"<text x="10" y="{legend_y:.1}" fill="#555">bars: grants (green released, red expired, orange lapsed, purple revoked, blue open)</text><text x="10" y="{:.1}" fill="#555">| renewal   ✕ failed keepalive (orange) or expiry (red)   ▲ drain   ▮ fence   ○ release   ● write accepted   ■ stale write rejected   dashed red: violation</text>"##,
        legend_y + 16.0
    );
    s.push_str("</svg>");
    s
}

fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn strings(b: &RecordBatch, i: usize) -> Vec<Option<String>> {
    let a = arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Utf8)
        .expect("castable to text");
    let a = a.as_string::<i32>();
    (0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r).to_string()))
        .collect()
}

fn times(b: &RecordBatch, i: usize) -> Vec<Option<i64>> {
    let a = b.column(i).as_primitive::<TimestampMicrosecondType>();
    (0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r)))
        .collect()
}

fn tokens(b: &RecordBatch, i: usize) -> Vec<Option<u64>> {
    let a = b.column(i).as_primitive::<UInt64Type>();
    (0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r)))
        .collect()
}

/// Queries the lease's grants, events and violations and draws them.
pub async fn lease_svg(
    engine: &QueryEngine,
    lease: &str,
    from: Option<i64>,
    to: Option<i64>,
) -> Result<String, ServerError> {
    let l = sql_str(lease);
    let window = |col: &str| {
        let mut w = String::new();
        if let Some(f) = from {
            let _ = write!(w, " AND {col} >= to_timestamp_micros({f})");
        }
        if let Some(t) = to {
            let _ = write!(w, " AND {col} < to_timestamp_micros({t})");
        }
        w
    };
    let grants = engine
        .sql(&format!(
            "SELECT fencing_token, holder_id, acquired_at, ended_at, end_kind FROM lease_timeline WHERE lease_id = {l}"
        ))
        .await?;
    let events = engine
        .sql(&format!(
            "SELECT ts, kind, holder_id, fencing_token FROM lease_events WHERE lease_id = {l}{} ORDER BY ts",
            window("ts")
        ))
        .await?;
    let violations = engine
        .sql(&format!(
            "SELECT at, kind, fencing_token, detail FROM lease_violations WHERE lease_id = {l}{} ORDER BY at",
            window("at")
        ))
        .await?;
    let mut bars = Vec::new();
    for b in &grants {
        let (tok, holder, start, end, kind) = (
            tokens(b, 0),
            strings(b, 1),
            times(b, 2),
            times(b, 3),
            strings(b, 4),
        );
        for r in 0..b.num_rows() {
            bars.push(Bar {
                token: tok[r].unwrap_or(0),
                holder: holder[r].clone().unwrap_or_default(),
                start: start[r].unwrap_or(0),
                end: end[r],
                end_kind: kind[r].clone().unwrap_or_default(),
            });
        }
    }
    // Only grants that overlap the window, when one is given.
    bars.retain(|b| {
        to.is_none_or(|t| b.start < t) && from.is_none_or(|f| b.end.is_none_or(|e| e > f))
    });
    let mut marks = Vec::new();
    for b in &events {
        let (ts, kind, holder, tok) = (times(b, 0), strings(b, 1), strings(b, 2), tokens(b, 3));
        for r in 0..b.num_rows() {
            marks.push(Mark {
                ts: ts[r].unwrap_or(0),
                kind: kind[r].clone().unwrap_or_default(),
                holder: holder[r].clone(),
                token: tok[r],
            });
        }
    }
    let mut flags = Vec::new();
    for b in &violations {
        let (at, kind, tok, detail) = (times(b, 0), strings(b, 1), tokens(b, 2), strings(b, 3));
        for r in 0..b.num_rows() {
            flags.push(Flag {
                at: at[r].unwrap_or(0),
                kind: kind[r].clone().unwrap_or_default(),
                token: tok[r].unwrap_or(0),
                detail: detail[r].clone().unwrap_or_default(),
            });
        }
    }
    Ok(render(lease, &bars, &marks, &flags, from, to))
}
