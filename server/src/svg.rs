//! Timeline pictures: who held a lease when, as SVG.
//!
//! One band per holder, in order of first acquisition, with one bar per
//! grant from its acquisition to its end (coloured by how it ended),
//! labelled with holder and token where the label fits. A holder whose own
//! grants overlap gets a second row in its band. Under each bar, renewals
//! are ticks, and failed keepalives, drains, fences, expiries, releases,
//! revocations and writes are markers on the row of the token they carried,
//! stacked in lanes so that markers close in time never cover each other.
//! Violations are red dashed lines, numbered, with their explanation listed
//! under the chart. Times are UTC; the axis steps are round.
//!
//! A lease with no events at all is [`ServerError::NotFound`]; a lease
//! with nothing in the asked range is drawn as an empty axis over that
//! range with a note saying where the lease's events are.

use std::collections::HashMap;
use std::fmt::Write;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, TimestampMicrosecondType, UInt64Type};
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

/// Escapes text for XML. Control characters other than what XML 1.0
/// allows cannot appear even as character references, and tab and line
/// breaks would be folded into spaces anyway, so every control character
/// (and the two non-characters U+FFFE, U+FFFF) becomes U+FFFD: a holder id
/// with a NUL still yields a picture a browser opens.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn utc(us: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::<chrono::Utc>::from_timestamp_micros(us)
}

fn clock(us: i64) -> String {
    utc(us)
        .map(|t| t.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_default()
}

fn date(us: i64) -> String {
    utc(us)
        .map(|t| t.format("%Y-%m-%d").to_string())
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
const MARGIN: f64 = 10.0;
/// The column of row names.
const LEFT: f64 = 190.0;
/// Room right of the time axis for labels of open grants and late markers.
const RIGHT: f64 = 130.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const BAR_H: f64 = 18.0;
const TICK_H: f64 = 7.0;
const LANE_H: f64 = 16.0;
const ROW_GAP: f64 = 10.0;
/// Half the width of a marker glyph, its stroke included.
const GLYPH: f64 = 7.0;
/// Horizontal room kept between two things sharing a lane.
const GAP: f64 = 3.0;
/// Axis ticks at most; with steps at most 2.5 apart this leaves 4 or more.
const MAX_TICKS: i64 = 9;
/// Violations listed under the chart at most; the rest are counted.
const MAX_LISTED: usize = 100;

const MS: i64 = 1_000;
const SEC: i64 = 1_000_000;
const MIN: i64 = 60 * SEC;
const HOUR: i64 = 60 * MIN;
const DAY: i64 = 24 * HOUR;
/// Axis steps, in microseconds. Every step under a day divides a day, so
/// multiples of it counted from the epoch fall on round times of day.
const STEPS: [i64; 35] = [
    MS,
    2 * MS,
    5 * MS,
    10 * MS,
    20 * MS,
    50 * MS,
    100 * MS,
    200 * MS,
    500 * MS,
    SEC,
    2 * SEC,
    5 * SEC,
    10 * SEC,
    15 * SEC,
    30 * SEC,
    MIN,
    2 * MIN,
    5 * MIN,
    10 * MIN,
    15 * MIN,
    30 * MIN,
    HOUR,
    2 * HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    5 * DAY,
    10 * DAY,
    20 * DAY,
    50 * DAY,
    100 * DAY,
    200 * DAY,
    500 * DAY,
];

/// The smallest round step that cuts `span` microseconds into at most
/// `max_ticks` ticks.
fn tick_step(span: i64, max_ticks: i64) -> i64 {
    let intervals = (max_ticks - 1).max(1);
    STEPS
        .iter()
        .copied()
        .find(|&s| span <= s.saturating_mul(intervals))
        .unwrap_or_else(|| {
            let days = (span / intervals / DAY).max(1);
            days * DAY
        })
}

/// The ticks of `[lo, hi]`: multiples of the step, with their labels.
fn axis_ticks(lo: i64, hi: i64) -> (i64, Vec<(i64, String)>) {
    let step = tick_step(hi - lo, MAX_TICKS);
    let mut t = lo.div_euclid(step) * step;
    if t < lo {
        t += step;
    }
    let mut out = Vec::new();
    while t <= hi {
        out.push((t, tick_label(t, step)));
        t += step;
    }
    (step, out)
}

/// `HH:MM:SS`, with milliseconds only when the step is under a second, and
/// the date alone for steps of days.
fn tick_label(t: i64, step: i64) -> String {
    let Some(d) = utc(t) else {
        return String::new();
    };
    let f = if step >= DAY {
        "%Y-%m-%d"
    } else if step >= SEC {
        "%H:%M:%S"
    } else {
        "%H:%M:%S%.3f"
    };
    d.format(f).to_string()
}

/// Estimated advance of `s` in a sans-serif font of `size` px. The metrics
/// are DejaVu Sans's, wider than most sans-serif faces, so text laid out
/// with them fits in the others too.
fn text_width(s: &str, size: f64) -> f64 {
    let em: f64 = s
        .chars()
        .map(|c| match c {
            'i' | 'l' | 'j' | 'I' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | '·' => 0.30,
            ' ' | 'f' | 't' | 'r' | '(' | ')' | '[' | ']' | '-' | '/' => 0.40,
            'm' | 'w' | 'M' | 'W' | '%' | '@' | '—' => 0.92,
            '0'..='9' | 'a'..='z' => 0.64,
            'A'..='Z' | '#' | '&' => 0.74,
            c if c.is_ascii() => 0.64,
            // CJK, Hangul, kana, fullwidth forms and emoji take a full em.
            c if ('\u{1100}'..='\u{115F}').contains(&c)
                || ('\u{2E80}'..='\u{A4CF}').contains(&c)
                || ('\u{AC00}'..='\u{D7A3}').contains(&c)
                || ('\u{F900}'..='\u{FAFF}').contains(&c)
                || ('\u{FE30}'..='\u{FE4F}').contains(&c)
                || ('\u{FF00}'..='\u{FF60}').contains(&c)
                || ('\u{FFE0}'..='\u{FFE6}').contains(&c)
                || c >= '\u{1F000}' =>
            {
                1.0
            }
            _ => 0.70,
        })
        .sum();
    em * size
}

/// `s` cut with an ellipsis to fit `max_w` px.
fn fit(s: &str, size: f64, max_w: f64) -> String {
    if text_width(s, size) <= max_w {
        return s.to_string();
    }
    let mut out = String::new();
    for c in s.chars() {
        let mut next = out.clone();
        next.push(c);
        if text_width(&next, size) + text_width("…", size) > max_w {
            break;
        }
        out = next;
    }
    out.push('…');
    out
}

/// `s` broken into lines of at most `max_w` px, at spaces, or inside a
/// word longer than a line.
fn wrap(s: &str, size: f64, max_w: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in s.split_whitespace() {
        let candidate = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if text_width(&candidate, size) <= max_w {
            line = candidate;
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        for c in word.chars() {
            let mut next = line.clone();
            next.push(c);
            if !line.is_empty() && text_width(&next, size) > max_w {
                lines.push(std::mem::take(&mut line));
                line.push(c);
            } else {
                line = next;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// A rectangle of the picture: where something was drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rect {
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

#[cfg(test)]
impl Rect {
    fn intersects(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
}

#[derive(Clone, Copy)]
enum Anchor {
    Start,
    Middle,
    End,
}

/// The SVG text and where its parts went; the layout decisions are tested
/// on the second.
#[derive(Debug, Default)]
struct Canvas {
    svg: String,
    bars: Vec<Rect>,
    bar_labels: Vec<Rect>,
    ticks: Vec<Rect>,
    markers: Vec<Rect>,
    flag_labels: Vec<Rect>,
    texts: Vec<Rect>,
    axis: Vec<(i64, String)>,
    height: f64,
}

impl Canvas {
    /// Writes one line of text; `extra` is more attributes. Returns (and
    /// records) the box it takes by the estimated metrics.
    fn text(
        &mut self,
        x: f64,
        baseline: f64,
        size: f64,
        anchor: Anchor,
        extra: &str,
        content: &str,
    ) -> Rect {
        let w = text_width(content, size);
        let (x0, a) = match anchor {
            Anchor::Start => (x, ""),
            Anchor::Middle => (x - w / 2.0, r#" text-anchor="middle""#),
            Anchor::End => (x - w, r#" text-anchor="end""#),
        };
        let _ = write!(
            self.svg,
            r#"<text x="{x:.1}" y="{baseline:.1}" font-size="{size}"{a}{extra}>{}</text>"#,
            esc(content)
        );
        let r = Rect {
            x0,
            y0: baseline - 0.8 * size,
            x1: x0 + w,
            y1: baseline + 0.25 * size,
        };
        self.texts.push(r);
        r
    }
}

/// Event kinds drawn as markers under the bars, in legend order.
const MARKER_KINDS: [&str; 8] = [
    "renew_failed",
    "drain_started",
    "fenced",
    "expired",
    "released",
    "revoked",
    "write_accepted",
    "stale_write_rejected",
];

/// The words written beside a marker, for the events a postmortem is
/// about; the others explain themselves in the legend and their tooltip.
fn marker_label(kind: &str) -> Option<&'static str> {
    match kind {
        "expired" => Some("expired"),
        "stale_write_rejected" => Some("stale write rejected"),
        _ => None,
    }
}

/// A marker glyph centred on (x, y), without its closing tag.
fn glyph(kind: &str, x: f64, y: f64) -> (String, &'static str) {
    match kind {
        "renew_failed" => (
            format!(
                r##"<path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="#e67e22" stroke-width="2.5">"##,
                x - 4.0,
                y - 4.0
            ),
            "</path>",
        ),
        "drain_started" => (
            format!(
                r##"<path d="M{x:.1},{:.1} l6,10 l-12,0 z" fill="#e67e22">"##,
                y - 5.0
            ),
            "</path>",
        ),
        "fenced" => (
            format!(
                r##"<rect x="{:.1}" y="{:.1}" width="4" height="14" fill="black">"##,
                x - 2.0,
                y - 7.0
            ),
            "</rect>",
        ),
        "expired" => (
            format!(
                r##"<path d="M{:.1},{:.1} l11,11 m0,-11 l-11,11" stroke="#c0392b" stroke-width="3">"##,
                x - 5.5,
                y - 5.5
            ),
            "</path>",
        ),
        "released" => (
            format!(
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="white" stroke="#333" stroke-width="2">"##
            ),
            "</circle>",
        ),
        "revoked" => (
            format!(r##"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="#8e44ad">"##),
            "</circle>",
        ),
        "write_accepted" => (
            format!(r##"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="#27ae60" stroke="#145a32">"##),
            "</circle>",
        ),
        _ => (
            format!(
                r##"<rect x="{:.1}" y="{:.1}" width="11" height="11" fill="#c0392b" stroke="black">"##,
                x - 5.5,
                y - 5.5
            ),
            "</rect>",
        ),
    }
}

fn mark_title(m: &Mark) -> String {
    format!(
        "{} at {}{}{}",
        m.kind,
        clock(m.ts),
        m.holder
            .as_deref()
            .map(|h| format!(" by {h}"))
            .unwrap_or_default(),
        m.token.map(|t| format!(", token {t}")).unwrap_or_default()
    )
}

/// Markers of one kind closer than a glyph's width, drawn as one glyph.
struct Group<'a> {
    marks: Vec<&'a Mark>,
    x: f64,
    /// Glyph and label, horizontally; the lane gives the vertical.
    x0: f64,
    x1: f64,
    label: Option<(String, f64, Anchor)>,
    lane: usize,
}

/// One row of the chart: some grants of one holder that do not overlap
/// (or the events whose token has no grant in the picture).
struct Row<'a> {
    /// The row's name in the left column; only the first row of a band has one.
    name: Option<String>,
    band: usize,
    bars: Vec<&'a Bar>,
    ticks: Vec<f64>,
    groups: Vec<Group<'a>>,
    lanes: usize,
    top: f64,
}

impl Row<'_> {
    fn height(&self) -> f64 {
        let ticks = if self.ticks.is_empty() {
            0.0
        } else {
            TICK_H + 1.0
        };
        BAR_H + ticks + LANE_H * self.lanes as f64
    }

    fn lanes_top(&self) -> f64 {
        self.top + self.height() - LANE_H * self.lanes as f64
    }
}

/// Places the markers of a row: same-kind markers within a glyph of each
/// other merge, then each goes into the first lane where it (with its
/// label) clears everything already there.
fn place_markers<'a>(marks: &[&'a Mark], x: &dyn Fn(i64) -> f64) -> (Vec<Group<'a>>, usize) {
    let mut groups: Vec<Group<'a>> = Vec::new();
    for kind in MARKER_KINDS {
        let mut of_kind: Vec<&Mark> = marks.iter().copied().filter(|m| m.kind == kind).collect();
        of_kind.sort_by_key(|m| m.ts);
        let mut current: Option<Group<'a>> = None;
        for m in of_kind {
            let xm = x(m.ts);
            match current.as_mut() {
                Some(g) if xm - g.x < 2.0 * GLYPH => g.marks.push(m),
                _ => {
                    groups.extend(current.take());
                    current = Some(Group {
                        marks: vec![m],
                        x: xm,
                        x0: xm - GLYPH,
                        x1: xm + GLYPH,
                        label: None,
                        lane: 0,
                    });
                }
            }
        }
        groups.extend(current);
    }
    for g in &mut groups {
        let Some(word) = marker_label(&g.marks[0].kind) else {
            continue;
        };
        let text = if g.marks.len() > 1 {
            format!("{word} ×{}", g.marks.len())
        } else {
            word.to_string()
        };
        let w = text_width(&text, 11.0);
        // Beside the glyph on the right, unless that leaves the picture.
        if g.x + GLYPH + 2.0 + w <= WIDTH - MARGIN {
            g.x1 = g.x + GLYPH + 2.0 + w;
            g.label = Some((text, g.x + GLYPH + 2.0, Anchor::Start));
        } else {
            g.x0 = g.x - GLYPH - 2.0 - w;
            g.label = Some((text, g.x - GLYPH - 2.0, Anchor::End));
        }
    }
    groups.sort_by(|a, b| a.x0.total_cmp(&b.x0));
    let mut lanes: Vec<f64> = Vec::new();
    for g in &mut groups {
        match lanes.iter().position(|&right| right + GAP <= g.x0) {
            Some(i) => {
                lanes[i] = g.x1;
                g.lane = i;
            }
            None => {
                g.lane = lanes.len();
                lanes.push(g.x1);
            }
        }
    }
    (groups, lanes.len())
}

/// The time range drawn: the asked one, or the data's with a margin.
fn window(
    bars: &[Bar],
    marks: &[Mark],
    flags: &[Flag],
    from: Option<i64>,
    to: Option<i64>,
    extent: Option<(i64, i64)>,
) -> (i64, i64) {
    let times = bars
        .iter()
        .flat_map(|b| [Some(b.start), b.end])
        .flatten()
        .chain(marks.iter().map(|m| m.ts))
        .chain(flags.iter().map(|f| f.at));
    let (lo, hi) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (lo, hi) = if lo <= hi {
        (lo, hi)
    } else {
        match (from, to, extent) {
            (Some(f), None, _) => (f, f + MIN),
            (None, Some(t), _) => (t - MIN, t),
            (_, _, Some(e)) => e,
            _ => (0, SEC),
        }
    };
    let pad = ((hi - lo) / 20).max(100 * MS);
    let lo = from.unwrap_or(lo - pad);
    let hi = to.unwrap_or(hi + pad).max(lo + MS);
    (lo, hi)
}

/// Draws the picture. `from`/`to` default to the data's extent; `extent`
/// is the first and last event time of the whole lease, named when the
/// range holds nothing.
pub fn render(
    lease: &str,
    bars: &[Bar],
    marks: &[Mark],
    flags: &[Flag],
    from: Option<i64>,
    to: Option<i64>,
    extent: Option<(i64, i64)>,
) -> String {
    draw(lease, bars, marks, flags, from, to, extent).svg
}

fn draw(
    lease: &str,
    bars: &[Bar],
    marks: &[Mark],
    flags: &[Flag],
    from: Option<i64>,
    to: Option<i64>,
    extent: Option<(i64, i64)>,
) -> Canvas {
    let (lo, hi) = window(bars, marks, flags, from, to, extent);
    let x = |t: i64| LEFT + (t.clamp(lo, hi) - lo) as f64 / (hi - lo) as f64 * PLOT_W;
    let mut c = Canvas::default();

    // Rows: one band per holder, by first acquisition; a grant goes on the
    // band's first row whose grants have all ended by its start.
    let mut sorted: Vec<&Bar> = bars.iter().collect();
    sorted.sort_by_key(|b| (b.start, b.token));
    let mut rows: Vec<Row> = Vec::new();
    let mut band_rows: Vec<(String, Vec<usize>)> = Vec::new();
    let mut row_ends: Vec<i64> = Vec::new();
    for &b in &sorted {
        let band = match band_rows.iter().position(|(h, _)| *h == b.holder) {
            Some(i) => i,
            None => {
                band_rows.push((b.holder.clone(), Vec::new()));
                band_rows.len() - 1
            }
        };
        let free = band_rows[band]
            .1
            .iter()
            .copied()
            .find(|&r| row_ends[r] <= b.start);
        let r = free.unwrap_or_else(|| {
            rows.push(Row {
                name: None,
                band,
                bars: Vec::new(),
                ticks: Vec::new(),
                groups: Vec::new(),
                lanes: 0,
                top: 0.0,
            });
            row_ends.push(i64::MIN);
            band_rows[band].1.push(rows.len() - 1);
            rows.len() - 1
        });
        rows[r].bars.push(b);
        row_ends[r] = b.end.unwrap_or(i64::MAX);
    }
    // Bands stay together, in order of first acquisition.
    rows.sort_by_key(|r| r.band);
    for (band, (holder, _)) in band_rows.iter().enumerate() {
        let grants: Vec<&Bar> = sorted
            .iter()
            .copied()
            .filter(|b| b.holder == *holder)
            .collect();
        let name = match grants.as_slice() {
            [one] => format!("{holder} · token {}", one.token),
            many => format!("{holder} · {} grants", many.len()),
        };
        if let Some(first) = rows.iter_mut().find(|r| r.band == band) {
            first.name = Some(name);
        }
    }
    let row_of: HashMap<u64, usize> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.bars.iter().map(move |b| (b.token, i)))
        .collect();
    let mut row_marks: Vec<Vec<&Mark>> = vec![Vec::new(); rows.len() + 1];
    for m in marks {
        if m.kind != "renewed" && !MARKER_KINDS.contains(&m.kind.as_str()) {
            continue;
        }
        let r = m
            .token
            .and_then(|t| row_of.get(&t).copied())
            .unwrap_or(rows.len());
        row_marks[r].push(m);
    }
    if !row_marks[rows.len()].is_empty() {
        rows.push(Row {
            name: Some("tokens without a grant".into()),
            band: band_rows.len(),
            bars: Vec::new(),
            ticks: Vec::new(),
            groups: Vec::new(),
            lanes: 0,
            top: 0.0,
        });
    }
    for (r, row) in rows.iter_mut().enumerate() {
        row.ticks = row_marks[r]
            .iter()
            .filter(|m| m.kind == "renewed")
            .map(|m| x(m.ts))
            .collect();
        let (groups, lanes) = place_markers(&row_marks[r], &x);
        row.groups = groups;
        row.lanes = lanes;
        if row.bars.is_empty() && lanes == 0 {
            row.lanes = 1;
        }
    }

    // Violations: a dashed line each, numbered above the chart; numbers
    // that would touch go into lanes of their own.
    let mut flag_nums: Vec<(f64, String, usize, Rect, String)> = Vec::new();
    {
        let mut i = 0;
        while i < flags.len() {
            let xf = x(flags[i].at);
            let mut j = i + 1;
            while j < flags.len() && (x(flags[j].at) - xf).abs() < 1.0 {
                j += 1;
            }
            let text = match j - i {
                1 => format!("{}", i + 1),
                2 => format!("{},{}", i + 1, i + 2),
                _ => format!("{}–{}", i + 1, j),
            };
            let w = text_width(&text, 12.0);
            let (x0, x1) = if xf + 3.0 + w <= WIDTH - MARGIN {
                (xf + 3.0, xf + 3.0 + w)
            } else {
                (xf - 3.0 - w, xf - 3.0)
            };
            let title = flags[i..j]
                .iter()
                .enumerate()
                .map(|(k, f)| format!("{}. {}: {}", i + k + 1, f.kind, f.detail))
                .collect::<Vec<_>>()
                .join(" · ");
            flag_nums.push((
                xf,
                text,
                0,
                Rect {
                    x0,
                    y0: 0.0,
                    x1,
                    y1: 0.0,
                },
                title,
            ));
            i = j;
        }
    }
    flag_nums.sort_by(|a, b| a.3.x0.total_cmp(&b.3.x0));
    let mut num_lanes: Vec<f64> = Vec::new();
    for f in &mut flag_nums {
        match num_lanes.iter().position(|&right| right + GAP <= f.3.x0) {
            Some(l) => {
                num_lanes[l] = f.3.x1;
                f.2 = l;
            }
            None => {
                f.2 = num_lanes.len();
                num_lanes.push(f.3.x1);
            }
        }
    }

    // Vertical layout, top to bottom.
    let title_base = 22.0;
    let nums_top = 34.0;
    let chart_top = nums_top + 14.0 * num_lanes.len() as f64 + 4.0;
    let mut y = chart_top;
    for row in rows.iter_mut() {
        row.top = y;
        y += row.height() + ROW_GAP;
    }
    let empty = bars.is_empty() && marks.is_empty() && flags.is_empty();
    let empty_h = 56.0;
    if empty {
        y += empty_h;
    }
    let chart_bottom = y - if empty { 0.0 } else { ROW_GAP / 2.0 };

    let (step, ticks) = axis_ticks(lo, hi);
    let date_changes: Vec<bool> = ticks
        .iter()
        .enumerate()
        .map(|(i, (t, _))| {
            step < DAY
                && date(*t)
                    != if i == 0 {
                        date(lo)
                    } else {
                        date(ticks[i - 1].0)
                    }
        })
        .collect();
    let axis_base = chart_bottom + 15.0;
    let after_axis = if date_changes.iter().any(|&d| d) {
        axis_base + 14.0
    } else {
        axis_base
    };

    // What follows the axis is laid out as it is written, so the picture
    // ends where its last line does.
    let _ = write!(c.svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = fit(
        &format!("Lease {lease} — who held it, with which token"),
        16.0,
        WIDTH - 2.0 * MARGIN,
    );
    c.text(
        MARGIN,
        title_base,
        16.0,
        Anchor::Start,
        r#" font-weight="bold""#,
        &title,
    );

    // Every other band shaded, so a holder's rows read as one.
    let mut band_top: HashMap<usize, (f64, f64)> = HashMap::new();
    for row in &rows {
        let e = band_top.entry(row.band).or_insert((row.top, row.top));
        e.1 = row.top + row.height();
    }
    let mut bands: Vec<(usize, (f64, f64))> = band_top.into_iter().collect();
    bands.sort_by_key(|b| b.0);
    for (band, (top, bottom)) in &bands {
        if band % 2 == 1 {
            let _ = write!(
                c.svg,
                r##"<rect x="0" y="{:.1}" width="{WIDTH}" height="{:.1}" fill="#f3f5f7"/>"##,
                top - ROW_GAP / 2.0,
                bottom - top + ROW_GAP
            );
        }
    }

    // The time axis: grid lines, then labels, the date where it changes
    // and, in the name column, the first date and the zone.
    for (t, _) in &ticks {
        let xt = x(*t);
        let _ = write!(
            c.svg,
            r##"<line x1="{xt:.1}" y1="{chart_top:.1}" x2="{xt:.1}" y2="{chart_bottom:.1}" stroke="#ddd"/>"##
        );
    }
    let _ = write!(
        c.svg,
        r##"<line x1="{LEFT}" y1="{chart_bottom:.1}" x2="{:.1}" y2="{chart_bottom:.1}" stroke="#999"/>"##,
        LEFT + PLOT_W
    );
    for (i, (t, label)) in ticks.iter().enumerate() {
        let xt = x(*t);
        c.text(
            xt,
            axis_base,
            12.0,
            Anchor::Middle,
            r##" fill="#555""##,
            label,
        );
        if date_changes[i] {
            c.text(
                xt,
                axis_base + 14.0,
                11.0,
                Anchor::Middle,
                r##" fill="#555""##,
                &date(*t),
            );
        }
        c.axis.push((*t, label.clone()));
    }
    let zone = if step >= DAY {
        "UTC".to_string()
    } else {
        format!("{} UTC", date(lo))
    };
    c.text(
        MARGIN,
        axis_base,
        12.0,
        Anchor::Start,
        r##" fill="#555" font-weight="bold""##,
        &zone,
    );

    // Rows: names, bars, ticks, markers. Bar labels come last of all, so
    // that nothing is drawn over them.
    let mut labels: Vec<(f64, f64, String, &'static str, &'static str)> = Vec::new();
    for row in &rows {
        if let Some(name) = &row.name {
            let name = fit(name, 12.0, LEFT - 2.0 * MARGIN);
            c.text(MARGIN, row.top + 13.0, 12.0, Anchor::Start, "", &name);
        }
        for (i, b) in row.bars.iter().enumerate() {
            let (x0, x1) = (x(b.start), x(b.end.unwrap_or(hi)));
            let w = (x1 - x0).max(2.0);
            c.bars.push(Rect {
                x0,
                y0: row.top,
                x1: x0 + w,
                y1: row.top + BAR_H,
            });
            let _ = write!(
                c.svg,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{BAR_H}" rx="3" fill="{}" fill-opacity="0.8"><title>{}</title></rect>"##,
                row.top,
                color(&b.end_kind),
                esc(&format!(
                    "grant {} to {}: {} → {} ({})",
                    b.token,
                    b.holder,
                    clock(b.start),
                    b.end.map(clock).unwrap_or_else(|| "open".into()),
                    b.end_kind
                )),
            );
            // Inside the bar if it fits, else right of it up to the row's
            // next bar; the full label first, then the token alone.
            let room_right = row
                .bars
                .get(i + 1)
                .map(|n| x(n.start))
                .unwrap_or(WIDTH - MARGIN)
                - GAP;
            let full = format!("{} · {}", b.holder, b.token);
            let short = b.token.to_string();
            for text in [full, short] {
                let tw = text_width(&text, 11.0);
                if tw + 8.0 <= w {
                    labels.push((x0 + 4.0, row.top, text, "white", color(&b.end_kind)));
                    break;
                }
                if x0 + w + 4.0 + tw <= room_right {
                    labels.push((x0 + w + 4.0, row.top, text, "#222", "white"));
                    break;
                }
            }
        }
        let tick_top = row.top + BAR_H + 1.0;
        if !row.ticks.is_empty() {
            let n = row.ticks.len();
            let _ = write!(
                c.svg,
                "<g><title>{n} renewal{}</title>",
                if n == 1 { "" } else { "s" }
            );
        }
        for &xt in &row.ticks {
            let _ = write!(
                c.svg,
                r##"<line x1="{xt:.1}" y1="{tick_top:.1}" x2="{xt:.1}" y2="{:.1}" stroke="#1b4f72" stroke-width="1.5"/>"##,
                tick_top + TICK_H
            );
            c.ticks.push(Rect {
                x0: xt - 0.75,
                y0: tick_top,
                x1: xt + 0.75,
                y1: tick_top + TICK_H,
            });
        }
        if !row.ticks.is_empty() {
            c.svg.push_str("</g>");
        }
        let lanes_top = row.lanes_top();
        for g in &row.groups {
            let yc = lanes_top + LANE_H * g.lane as f64 + LANE_H / 2.0;
            let first = g.marks[0];
            let title = match g.marks.as_slice() {
                [one] => mark_title(one),
                many => format!(
                    "{} × {} from {} to {}",
                    many.len(),
                    first.kind,
                    clock(first.ts),
                    clock(many[many.len() - 1].ts)
                ),
            };
            let (open, close) = glyph(&first.kind, g.x, yc);
            let _ = write!(c.svg, "{open}<title>{}</title>{close}", esc(&title));
            if let Some((text, lx, anchor)) = &g.label {
                c.text(*lx, yc + 4.0, 11.0, *anchor, r##" fill="#c0392b""##, text);
            }
            c.markers.push(Rect {
                x0: g.x0,
                y0: yc - LANE_H / 2.0 + 1.0,
                x1: g.x1,
                y1: yc + LANE_H / 2.0 - 1.0,
            });
        }
    }
    if empty {
        let mid = LEFT + PLOT_W / 2.0;
        // Paper under the note, so the grid lines do not cross its words.
        let _ = write!(
            c.svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="44" fill="white"/>"#,
            mid - 280.0,
            chart_top + 6.0,
            560.0
        );
        c.text(
            mid,
            chart_top + 22.0,
            13.0,
            Anchor::Middle,
            r##" fill="#555""##,
            "Nothing in this range.",
        );
        if let Some((first, last)) = extent {
            let where_ = format!(
                "The lease has events from {} {} to {} {} UTC.",
                date(first),
                clock(first),
                date(last),
                clock(last)
            );
            c.text(
                mid,
                chart_top + 42.0,
                12.0,
                Anchor::Middle,
                r##" fill="#555""##,
                &where_,
            );
        }
    }

    // Violation lines over the rows, their numbers above the chart.
    for (xf, text, lane, rect, title) in &flag_nums {
        let _ = write!(
            c.svg,
            r##"<line x1="{xf:.1}" y1="{chart_top:.1}" x2="{xf:.1}" y2="{chart_bottom:.1}" stroke="#c0392b" stroke-width="2" stroke-dasharray="5,3"><title>{}</title></line>"##,
            esc(title)
        );
        let base = nums_top + 14.0 * *lane as f64 + 10.0;
        let r = c.text(
            rect.x0,
            base,
            12.0,
            Anchor::Start,
            r##" fill="#c0392b" font-weight="bold""##,
            text,
        );
        c.flag_labels.push(r);
    }
    for (lx, top, text, fill, halo) in labels {
        let r = c.text(
            lx,
            top + 13.0,
            11.0,
            Anchor::Start,
            &format!(
                r#" fill="{fill}" stroke="{halo}" stroke-width="3" stroke-linejoin="round" paint-order="stroke""#
            ),
            &text,
        );
        c.bar_labels.push(r);
    }

    // Legend: colour swatches for how grants ended, then every marker.
    let mut ly = after_axis + 24.0;
    let mut lx = MARGIN;
    let swatches = [
        ("released", "released"),
        ("expired", "expired"),
        ("lapsed", "lapsed"),
        ("revoked", "revoked"),
        ("open", "open"),
    ];
    c.text(lx, ly, 12.0, Anchor::Start, r##" fill="#555""##, "grants:");
    lx += text_width("grants:", 12.0) + 8.0;
    for (kind, word) in swatches {
        let _ = write!(
            c.svg,
            r##"<rect x="{lx:.1}" y="{:.1}" width="18" height="10" rx="2" fill="{}" fill-opacity="0.8"/>"##,
            ly - 9.0,
            color(kind)
        );
        let r = c.text(
            lx + 22.0,
            ly,
            12.0,
            Anchor::Start,
            r##" fill="#555""##,
            word,
        );
        lx = r.x1 + 14.0;
    }
    ly += 20.0;
    lx = MARGIN;
    let items: [(&str, &str); 10] = [
        ("renewed", "renewal"),
        ("renew_failed", "failed keepalive"),
        ("drain_started", "drain"),
        ("fenced", "fence"),
        ("expired", "expiry"),
        ("released", "release"),
        ("revoked", "revocation"),
        ("write_accepted", "write accepted"),
        ("stale_write_rejected", "stale write rejected"),
        ("violation", "violation"),
    ];
    for (kind, word) in items {
        let w = 22.0 + text_width(word, 12.0) + 14.0;
        if lx + w > WIDTH - MARGIN {
            lx = MARGIN;
            ly += 20.0;
        }
        let (gx, gy) = (lx + 7.0, ly - 4.0);
        match kind {
            "renewed" => {
                let _ = write!(
                    c.svg,
                    r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" stroke="#1b4f72" stroke-width="1.5"/>"##,
                    gy - 4.0,
                    gy + 4.0
                );
            }
            "violation" => {
                let _ = write!(
                    c.svg,
                    r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" stroke="#c0392b" stroke-width="2" stroke-dasharray="5,3"/>"##,
                    gy - 7.0,
                    gy + 7.0
                );
            }
            k => {
                let (open, close) = glyph(k, gx, gy);
                let _ = write!(c.svg, "{open}{close}");
            }
        }
        c.text(
            lx + 18.0,
            ly,
            12.0,
            Anchor::Start,
            r##" fill="#555""##,
            word,
        );
        lx += w;
    }
    // Violations, explained: each wrapped to the picture's width, its
    // continuation lines indented under the text.
    if !flags.is_empty() {
        ly += 26.0;
        for (i, f) in flags.iter().enumerate().take(MAX_LISTED) {
            let head = format!("{}. ", i + 1);
            let indent = text_width(&head, 12.0);
            let body = format!("{} (token {}): {}", f.kind, f.token, f.detail);
            let lines = wrap(&body, 12.0, WIDTH - 2.0 * MARGIN - indent);
            c.text(
                MARGIN,
                ly,
                12.0,
                Anchor::Start,
                r##" fill="#c0392b" font-weight="bold""##,
                &head,
            );
            for line in lines {
                c.text(
                    MARGIN + indent,
                    ly,
                    12.0,
                    Anchor::Start,
                    r##" fill="#c0392b""##,
                    &line,
                );
                ly += 16.0;
            }
            ly += 4.0;
        }
        if flags.len() > MAX_LISTED {
            c.text(
                MARGIN,
                ly,
                12.0,
                Anchor::Start,
                r##" fill="#c0392b""##,
                &format!(
                    "… and {} more (SELECT * FROM lease_violations WHERE lease_id = …)",
                    flags.len() - MAX_LISTED
                ),
            );
        }
    }
    let bottom = c.texts.iter().map(|r| r.y1).fold(0.0, f64::max);
    c.height = (bottom + MARGIN).ceil();
    let height = c.height;
    c.svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">{}</svg>"#,
        c.svg
    );
    c
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

fn counts(b: &RecordBatch, i: usize) -> Vec<Option<i64>> {
    let a = arrow::compute::cast(b.column(i), &DataType::Int64).expect("castable to BIGINT");
    let a = a.as_primitive::<Int64Type>();
    (0..a.len())
        .map(|r| a.is_valid(r).then(|| a.value(r)))
        .collect()
}

/// Queries the lease's grants, events and violations and draws them.
///
/// A lease without a single event is [`ServerError::NotFound`]: an empty
/// picture would read as "nobody held it". A known lease with nothing in
/// `[from, to)` is a picture of that range that says so and names where
/// the lease's events are.
pub async fn lease_svg(
    engine: &QueryEngine,
    lease: &str,
    from: Option<i64>,
    to: Option<i64>,
) -> Result<String, ServerError> {
    if let (Some(f), Some(t)) = (from, to) {
        if f >= t {
            let at = |us: i64| {
                utc(us)
                    .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
                    .unwrap_or_default()
            };
            return Err(ServerError::BadRequest(format!(
                "the range is empty: from {} is not before to {}",
                at(f),
                at(t)
            )));
        }
    }
    let l = sql_str(lease);
    let known = engine
        .sql(&format!(
            "SELECT count(*) AS n, min(ts) AS first, max(ts) AS last FROM lease_events WHERE lease_id = {l}"
        ))
        .await?;
    let mut extent = None;
    for b in &known {
        let (n, first, last) = (counts(b, 0), times(b, 1), times(b, 2));
        if n.first().copied().flatten().unwrap_or(0) > 0 {
            extent = first[0].zip(last[0]);
        }
    }
    if extent.is_none() {
        return Err(ServerError::NotFound(format!(
            "no lease '{lease}' in the lake"
        )));
    }
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
    Ok(render(lease, &bars, &marks, &flags, from, to, extent))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microseconds since the epoch of an RFC 3339 time.
    fn t(s: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .timestamp_micros()
    }

    fn bar(token: u64, holder: &str, start: &str, end: Option<&str>, kind: &str) -> Bar {
        Bar {
            token,
            holder: holder.into(),
            start: t(start),
            end: end.map(t),
            end_kind: kind.into(),
        }
    }

    fn mark(ts: &str, kind: &str, holder: &str, token: u64) -> Mark {
        Mark {
            ts: t(ts),
            kind: kind.into(),
            holder: Some(holder.into()),
            token: Some(token),
        }
    }

    fn labels(lo: &str, hi: &str) -> (i64, Vec<String>) {
        let (step, ticks) = axis_ticks(t(lo), t(hi));
        (step, ticks.into_iter().map(|(_, l)| l).collect())
    }

    #[test]
    fn tick_steps_are_the_smallest_round_step_that_keeps_the_axis_readable() {
        assert_eq!(tick_step(1, MAX_TICKS), MS);
        assert_eq!(tick_step(700 * MS, MAX_TICKS), 100 * MS);
        assert_eq!(tick_step(19_800 * MS, MAX_TICKS), 5 * SEC);
        assert_eq!(tick_step(100 * SEC, MAX_TICKS), 15 * SEC);
        assert_eq!(tick_step(3 * HOUR, MAX_TICKS), 30 * MIN);
        assert_eq!(tick_step(30 * HOUR, MAX_TICKS), 6 * HOUR);
        assert_eq!(tick_step(10 * DAY, MAX_TICKS), 2 * DAY);
        // Past the table: whole days, still at most MAX_TICKS ticks.
        assert_eq!(tick_step(8_000 * DAY, MAX_TICKS), 1_000 * DAY);
    }

    #[test]
    fn ticks_fall_on_round_times_and_show_milliseconds_only_when_the_step_needs_them() {
        assert_eq!(
            labels("2026-09-14T09:59:59.100Z", "2026-09-14T10:00:18.900Z"),
            (
                5 * SEC,
                vec![
                    "10:00:00".to_string(),
                    "10:00:05".into(),
                    "10:00:10".into(),
                    "10:00:15".into()
                ]
            )
        );
        // A window starting at an odd time still gets round ticks.
        assert_eq!(
            labels("2026-12-01T22:47:45.385Z", "2026-12-01T22:48:52.310Z"),
            (
                10 * SEC,
                vec![
                    "22:47:50".to_string(),
                    "22:48:00".into(),
                    "22:48:10".into(),
                    "22:48:20".into(),
                    "22:48:30".into(),
                    "22:48:40".into(),
                    "22:48:50".into()
                ]
            )
        );
        assert_eq!(
            labels("2026-09-14T10:00:00.030Z", "2026-09-14T10:00:00.420Z"),
            (
                50 * MS,
                vec![
                    "10:00:00.050".to_string(),
                    "10:00:00.100".into(),
                    "10:00:00.150".into(),
                    "10:00:00.200".into(),
                    "10:00:00.250".into(),
                    "10:00:00.300".into(),
                    "10:00:00.350".into(),
                    "10:00:00.400".into()
                ]
            )
        );
        assert_eq!(
            labels("2026-09-10T13:00:00Z", "2026-09-20T01:00:00Z"),
            (
                2 * DAY,
                vec![
                    "2026-09-12".to_string(),
                    "2026-09-14".into(),
                    "2026-09-16".into(),
                    "2026-09-18".into(),
                    "2026-09-20".into()
                ]
            )
        );
    }

    #[test]
    fn the_axis_names_the_date_and_utc_and_the_date_again_where_it_changes() {
        let svg = render(
            "l",
            &[bar(
                1,
                "h",
                "2026-12-01T23:59:40Z",
                Some("2026-12-02T00:00:20Z"),
                "released",
            )],
            &[],
            &[],
            None,
            None,
            None,
        );
        assert!(svg.contains(">2026-12-01 UTC</text>"), "{svg}");
        // Midnight is a tick, and the next day's date is written under it.
        let midnight = svg.find(">00:00:00</text>").expect("a tick at midnight");
        let date = svg.find(">2026-12-02</text>").expect("the new date");
        assert!(midnight < date);
        assert_eq!(svg.matches(">2026-12-02</text>").count(), 1);
    }

    #[test]
    fn escaping_replaces_what_xml_cannot_hold_and_keeps_everything_else() {
        assert_eq!(
            esc("a\u{0}b<c>&\"'\u{7}\t\n\u{1b}\u{7f}\u{85}\u{FFFF}é名"),
            "a\u{FFFD}b&lt;c&gt;&amp;&quot;&#39;\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}é名"
        );
        let svg = render(
            "orders/\u{0}x",
            &[bar(
                7,
                "worker\u{0}-1\u{1}",
                "2026-09-14T10:00:00Z",
                None,
                "open",
            )],
            &[mark("2026-09-14T10:00:01Z", "write_accepted", "w\u{2}", 7)],
            &[],
            None,
            None,
            None,
        );
        assert!(!svg.chars().any(|c| c.is_control()), "{svg:?}");
        assert!(svg.contains("worker\u{FFFD}-1\u{FFFD} · token 7"), "{svg}");
        assert!(svg.contains("Lease orders/\u{FFFD}x"), "{svg}");
    }

    #[test]
    fn long_names_are_cut_and_explanations_wrapped_to_the_picture() {
        assert_eq!(wrap("a bb ccc", 12.0, 1000.0), vec!["a bb ccc"]);
        let narrow = text_width("aa bb", 12.0) + 1.0;
        assert_eq!(wrap("aa bb cc dd", 12.0, narrow), vec!["aa bb", "cc dd"]);
        // A word longer than the line is broken inside.
        let w = text_width("abc", 12.0) + 1.0;
        assert_eq!(wrap("abcdefg", 12.0, w), vec!["abc", "def", "g"]);
        let cut = fit("worker-with-a-very-long-name-indeed", 12.0, 100.0);
        assert!(
            cut.ends_with('…') && text_width(&cut, 12.0) <= 100.0,
            "{cut}"
        );
    }

    /// Everything a test wants to know about a picture's layout.
    fn check_layout(c: &Canvas) {
        for (i, a) in c.markers.iter().enumerate() {
            for b in &c.markers[i + 1..] {
                assert!(!a.intersects(b), "markers overlap: {a:?} {b:?}");
            }
        }
        for (i, a) in c.flag_labels.iter().enumerate() {
            for b in &c.flag_labels[i + 1..] {
                assert!(!a.intersects(b), "violation numbers overlap: {a:?} {b:?}");
            }
        }
        for (i, a) in c.bars.iter().enumerate() {
            for b in &c.bars[i + 1..] {
                assert!(!a.intersects(b), "bars overlap: {a:?} {b:?}");
            }
        }
        for l in &c.bar_labels {
            for o in c.ticks.iter().chain(&c.markers) {
                assert!(!l.intersects(o), "label {l:?} under {o:?}");
            }
        }
        for r in &c.texts {
            assert!(
                r.x0 >= 0.0 && r.x1 <= WIDTH - MARGIN + 0.01 && r.y1 <= c.height,
                "text outside the picture: {r:?} (height {})",
                c.height
            );
        }
        // Sized to its content: the last line, then the margin.
        let bottom = c.texts.iter().map(|r| r.y1).fold(0.0, f64::max);
        assert_eq!(c.height, (bottom + MARGIN).ceil());
    }

    #[test]
    fn labels_markers_and_violation_text_never_cover_each_other() {
        let bars = [
            bar(
                33,
                "worker-1",
                "2026-09-14T10:00:00Z",
                Some("2026-09-14T10:00:13.300Z"),
                "expired",
            ),
            bar(34, "worker-2", "2026-09-14T10:00:13.300Z", None, "open"),
        ];
        let mut marks = vec![
            // The expiry and the stale write in the same millisecond.
            mark("2026-09-14T10:00:13.300Z", "expired", "worker-1", 33),
            mark(
                "2026-09-14T10:00:13.300Z",
                "stale_write_rejected",
                "worker-1",
                33,
            ),
            mark("2026-09-14T10:00:13.310Z", "fenced", "worker-1", 33),
            mark("2026-09-14T10:00:13.320Z", "renew_failed", "worker-1", 33),
            // A stale write at the very end of the window: its label
            // must turn left.
            mark(
                "2026-09-14T10:00:20Z",
                "stale_write_rejected",
                "worker-1",
                33,
            ),
        ];
        // Renewals and writes right under both labels.
        for ms in (0..13_000).step_by(250) {
            let ts = t("2026-09-14T10:00:00Z") + ms * MS;
            marks.push(Mark {
                ts,
                kind: "renewed".into(),
                holder: Some("worker-1".into()),
                token: Some(33),
            });
            marks.push(Mark {
                ts: ts + 100 * MS,
                kind: "write_accepted".into(),
                holder: Some("worker-1".into()),
                token: Some(33),
            });
        }
        for ms in (0..6_000).step_by(40) {
            marks.push(Mark {
                ts: t("2026-09-14T10:00:13.500Z") + ms * MS,
                kind: "write_accepted".into(),
                holder: Some("worker-2".into()),
                token: Some(34),
            });
        }
        let detail = "grant 34 of worker-2 began at 10:00:13.300 while grant 33 of worker-1 was valid until 10:00:13.300 (expired); ".repeat(4);
        let flags = [
            Flag {
                at: t("2026-09-14T10:00:13.300Z"),
                kind: "overlapping_ownership".into(),
                token: 34,
                detail: detail.clone(),
            },
            Flag {
                at: t("2026-09-14T10:00:13.301Z"),
                kind: "stale_write_after_expiry".into(),
                token: 33,
                detail: "x".into(),
            },
            Flag {
                at: t("2026-09-14T10:00:13.350Z"),
                kind: "overlapping_ownership".into(),
                token: 34,
                detail: "y".into(),
            },
            Flag {
                at: t("2026-09-14T10:00:20Z"),
                kind: "overlapping_ownership".into(),
                token: 34,
                detail: "z".into(),
            },
        ];
        let c = draw(
            "orders/order-123",
            &bars,
            &marks,
            &flags,
            None,
            Some(t("2026-09-14T10:00:20Z")),
            None,
        );
        check_layout(&c);
        // Both labels are drawn, inside their bars.
        assert_eq!(c.bar_labels.len(), 2, "{}", c.svg);
        assert!(c.svg.contains(">worker-1 · 33</text>"), "{}", c.svg);
        assert!(c.svg.contains(">worker-2 · 34</text>"), "{}", c.svg);
        // The expiry and the stale write share a millisecond, each with
        // its words, in lanes of their own.
        assert_eq!(
            c.svg
                .matches(r##"fill="#c0392b">stale write rejected</text>"##)
                .count(),
            2
        );
        assert!(c.svg.contains(r##"fill="#c0392b">expired</text>"##));
        // The last one turns its words left, to stay in the picture.
        assert!(c
            .svg
            .contains(r##"text-anchor="end" fill="#c0392b">stale write rejected</text>"##));
        // The two violations a millisecond apart share a number.
        assert!(c.svg.contains(">1,2</text>"), "{}", c.svg);
        assert!(c.svg.contains(">3</text>") && c.svg.contains(">4</text>"));
        // The long explanation takes several lines, each in the picture.
        let lines = wrap(
            &format!("overlapping_ownership (token 34): {detail}"),
            12.0,
            WIDTH - 2.0 * MARGIN - text_width("1. ", 12.0),
        );
        assert!(lines.len() >= 3, "{lines:?}");
        for line in &lines {
            assert!(c.svg.contains(&format!(">{line}</text>")), "{line}");
        }
        // Renewals are ticks under the bar, and the dense writes merged.
        assert_eq!(c.ticks.len(), 52);
        assert!(c.svg.contains("× write_accepted from"), "{}", c.svg);
    }

    #[test]
    fn a_holder_whose_grants_overlap_gets_a_second_row_and_sequential_grants_share_one() {
        let bars = [
            bar(
                1,
                "a",
                "2026-09-14T10:00:00Z",
                Some("2026-09-14T10:00:10Z"),
                "released",
            ),
            bar(
                2,
                "b",
                "2026-09-14T10:00:10Z",
                Some("2026-09-14T10:00:20Z"),
                "released",
            ),
            bar(
                3,
                "a",
                "2026-09-14T10:00:20Z",
                Some("2026-09-14T10:00:30Z"),
                "expired",
            ),
            // The faulty second grant to `a` while 3 is held.
            bar(
                4,
                "a",
                "2026-09-14T10:00:25Z",
                Some("2026-09-14T10:00:35Z"),
                "released",
            ),
        ];
        let c = draw("l", &bars, &[], &[], None, None, None);
        check_layout(&c);
        let tops: Vec<f64> = c.bars.iter().map(|r| r.y0).collect();
        // a's band: grants 1 and 3 on its first row, 4 on a second; then b.
        assert_eq!(tops[0], tops[1], "{tops:?}");
        assert!(tops[2] > tops[0] && tops[3] > tops[2], "{tops:?}");
        assert!(c.svg.contains(">a · 3 grants</text>"));
        assert!(c.svg.contains(">b · token 2</text>"));
    }

    #[test]
    fn a_range_with_nothing_in_it_is_an_axis_with_a_note() {
        let c = draw(
            "l",
            &[],
            &[],
            &[],
            Some(t("2026-09-15T00:00:00Z")),
            Some(t("2026-09-15T01:00:00Z")),
            Some((t("2026-09-14T10:00:00Z"), t("2026-09-14T10:00:18Z"))),
        );
        check_layout(&c);
        assert!(c.svg.contains(">Nothing in this range.</text>"));
        assert!(c.svg.contains(
            ">The lease has events from 2026-09-14 10:00:00.000 to 2026-09-14 10:00:18.000 UTC.</text>"
        ));
        let ticks: Vec<&str> = c.axis.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            ticks,
            ["00:00:00", "00:10:00", "00:20:00", "00:30:00", "00:40:00", "00:50:00", "01:00:00"]
        );
    }
}
