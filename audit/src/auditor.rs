//! The incremental engine.

use leaseline_schema::LeaseEvent;

use crate::config::{AuditConfig, Tolerances};
use crate::derive::Scratch;
use crate::grant::{Grant, LeaseHolder};
use crate::ids::EventIds;
use crate::intern::{Interner, Sym, NONE};
use crate::lease::{LeaseAudit, LeaseState};
use crate::prefetch::prefetch;
use crate::record::{canonical_cmp, Ev};
use crate::violation::{Violation, ViolationChanges};

/// Events logged before they are filed under their leases: enough to
/// overlap many cache misses, few enough for the log to stay in cache.
const LOG_BATCH: usize = 4096;

/// Below this many leases to recompute, threads cost more than they save
/// (the streaming alert engine's reads are far below it).
const PARALLEL_MIN_LEASES: usize = 2048;

/// Leases a recompute worker takes at a time: big enough that the shared
/// cursor is rarely contended, small enough to even out uneven leases.
const PARALLEL_RUN_LEASES: usize = 256;

/// Ids kept beyond twice those of the events held before they are
/// compacted ([`Auditor::settle`]): compacting costs a pass over what is
/// held, so it waits until it frees at least this many.
const MIN_ID_COMPACTION: usize = 1 << 14;

/// Holder ids, backends and trace ids interned beyond twice those left
/// after the last compaction before they are compacted too: trace ids are
/// new with nearly every operation, and holder ids with every restart of a
/// pod, so the table would otherwise grow with the history.
const MIN_STRING_COMPACTION: usize = 1 << 14;

/// An event's string hashes, computed ahead of its lookups.
#[derive(Clone, Copy)]
struct Hashes {
    id: Option<u64>,
    lease: u64,
    holder: Option<u64>,
}

/// Whether pushed events' `event_id`s are looked up for duplicates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ids {
    Check,
    /// The caller knows they are new: see [`Auditor::push_all_unique`].
    Unique,
    /// A lease's history replayed after its events were dropped
    /// ([`Auditor::reload`]): ids already known are theirs.
    Replay,
}

/// Where the event kept for an `event_id` lives.
#[derive(Clone, Copy)]
struct IdInfo {
    lease: Sym,
    fingerprint: u64,
}

/// The audit engine: push events in any order, read grants and violations.
///
/// Every read answers for the set of distinct events pushed so far,
/// whatever their arrival order. Reads take `&mut self` because they first
/// recompute the leases whose events changed since the last read.
///
/// A clone copies the whole history (time and memory in proportion to the
/// events): SQL uses it to audit rows not yet in the lake on top of the
/// cached lake's engine without changing that engine.
#[derive(Clone)]
pub struct Auditor {
    config: AuditConfig,
    tol: Tolerances,
    /// Lease ids; a lease's symbol is its index in `states`.
    leases: Interner,
    states: Vec<LeaseState>,
    strings: Interner,
    /// Strings left by the last compaction of `strings`.
    strings_kept: usize,
    ids: EventIds,
    /// Per `event_id` symbol.
    id_info: Vec<IdInfo>,
    /// Events pushed but not yet filed under their lease. Filing touches a
    /// different lease's memory for nearly every event; done in batches,
    /// those cache misses overlap instead of stalling each push.
    log: Vec<Ev>,
    events: usize,
    latest: Option<i64>,
    /// Leases to recompute before the next read, each once
    /// (`LeaseState::listed`): a serve with no reader never refreshes, so
    /// a lease listed again at each touch would grow this with the events.
    dirty: Vec<Sym>,
    /// Leases changed since the last `drain_changes`.
    undrained: Vec<Sym>,
    /// Lease symbols sorted by lease id, for deterministic output order.
    sorted: Vec<Sym>,
    scratch: Scratch,
    /// Leases given an event that changes what was settled
    /// ([`Auditor::take_stale`]).
    stale: Vec<Sym>,
    /// Leases stale and not replayed yet, whether taken or not.
    stale_leases: usize,
    /// Leases replayed whole since their rows were last released
    /// ([`Auditor::release_kept`]): the rows stored for them are void.
    voided: Vec<Sym>,
    /// Where the rows released are stored.
    stored: Option<std::sync::Arc<StoredFiles>>,
    /// Room a lease takes for its events when first met ([`Auditor::reserve`]).
    expected_per_lease: usize,
    /// Bumped at each release: answers derived before it are out of date
    /// whatever the events held.
    generation: u64,
}

/// The files of the lake's stored audit tables that hold the rows an
/// auditor released ([`Auditor::release_kept`]), as `(path, bytes)`
/// relative to the lake root: those rows together with what the auditor
/// answers are the whole tables.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredFiles {
    pub timeline: Vec<(String, u64)>,
    pub violations: Vec<(String, u64)>,
}

/// The rows of one lease that [`Auditor::settle`] let go of.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub lease_id: std::sync::Arc<str>,
    /// The lease's grants acquired before `cut`, not handed out before.
    pub grants: Vec<Grant>,
    /// The lease's violations before `cut`, not handed out before.
    pub violations: Vec<Violation>,
    /// Everything of the lease before this time is now settled.
    pub cut: i64,
    /// The events before `cut` that the rows from `cut` on are still
    /// judged against (`settle.rs`): with them and the events from `cut`
    /// on, a reader audits the rest of the lease exactly. Filled by
    /// [`Auditor::kept`] only.
    pub context: Vec<LeaseEvent<'static>>,
}

/// Runs `f` on every lease state (with its index) on `threads` threads:
/// leases share nothing but read-only tables, so workers take runs of
/// leases from a shared cursor until none are left, each with its own
/// scratch.
fn in_runs<F>(states: &mut [LeaseState], threads: usize, f: F)
where
    F: Fn(usize, &mut LeaseState, &mut Scratch) + Sync,
{
    let runs = std::sync::Mutex::new(states.chunks_mut(PARALLEL_RUN_LEASES).enumerate());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut scratch = Scratch::default();
                loop {
                    let Some((run, states)) = runs.lock().unwrap_or_else(|e| e.into_inner()).next()
                    else {
                        break;
                    };
                    for (i, state) in states.iter_mut().enumerate() {
                        f(run * PARALLEL_RUN_LEASES + i, state, &mut scratch);
                    }
                }
            });
        }
    });
}

impl Default for Auditor {
    fn default() -> Self {
        Auditor::new(AuditConfig::default())
    }
}

impl Auditor {
    /// An empty auditor with these tolerances.
    pub fn new(config: AuditConfig) -> Auditor {
        Auditor {
            tol: Tolerances::from(&config),
            config,
            leases: Interner::default(),
            states: Vec::new(),
            strings: Interner::default(),
            strings_kept: 0,
            ids: EventIds::default(),
            id_info: Vec::new(),
            log: Vec::new(),
            events: 0,
            latest: None,
            dirty: Vec::new(),
            undrained: Vec::new(),
            sorted: Vec::new(),
            scratch: Scratch::default(),
            stale: Vec::new(),
            stale_leases: 0,
            voided: Vec::new(),
            stored: None,
            expected_per_lease: 0,
            generation: 0,
        }
    }

    /// Makes room for about `events` more events, spread over leases of
    /// about `per_lease` events each. A reader that knows how many rows
    /// it will push (a lake's manifest counts them) has the auditor's
    /// tables grown once rather than doubled again and again, each time
    /// into freshly faulted pages. Each lease first met after this takes
    /// room for `per_lease` events (at most 1,024).
    pub fn reserve(&mut self, events: usize, per_lease: usize) {
        // Lake event ids are UUIDs or the like: 36 bytes is a fair
        // guess before any is held.
        let id_len = self.ids.mean_len().unwrap_or(36);
        self.ids.reserve(events, id_len);
        self.id_info.reserve(events);
        // A guess that is far off must not cost every lease megabytes:
        // past this, a lease's vector doubles as it fills.
        self.expected_per_lease = per_lease.min(1024);
    }

    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// Distinct events kept (duplicates of an `event_id` count once).
    pub fn len(&self) -> usize {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// `event_id`s known, for de-duplication: those of the events held,
    /// and of settled ones until they are compacted away.
    pub fn ids_known(&self) -> usize {
        self.ids.len()
    }

    /// Holder ids, backends and trace ids interned: those of the events
    /// held and of settled leases, and of settled events until they are
    /// compacted away.
    pub fn strings_known(&self) -> usize {
        self.strings.len()
    }

    /// Events held in memory: [`Auditor::len`] less what
    /// [`Auditor::settle`] let go of.
    pub fn held(&self) -> usize {
        self.log.len() + self.states.iter().map(|s| s.events.len()).sum::<usize>()
    }

    /// The latest event time seen in the whole history (microseconds), the
    /// instant open and lapsed grants are judged at.
    pub fn latest_ts(&self) -> Option<i64> {
        self.latest
    }

    /// The audit's own copy of a pushed event's lease id, so that callers
    /// keeping per-lease state share it instead of keeping another.
    pub fn lease_name(&self, lease_id: &str) -> Option<std::sync::Arc<str>> {
        self.leases
            .find(lease_id)
            .map(|s| self.leases.get(s).clone())
    }

    /// The audit's own copy of a string events carry (holder ids,
    /// backends), added if new: one allocation per distinct string for
    /// the audit and its callers together.
    pub fn intern(&mut self, s: &str) -> std::sync::Arc<str> {
        let sym = self.strings.intern_opt(Some(s));
        self.strings.get(sym).clone()
    }

    /// Adds one event. Returns false when its `event_id` was already seen:
    /// the event is a duplicate and counts once everywhere. Should two
    /// events share an `event_id` but differ, the one first in canonical
    /// order (lease id, then event content) is kept, so the outcome does not
    /// depend on which arrived first.
    pub fn push(&mut self, event: &LeaseEvent<'_>) -> bool {
        let hashes = self.prepare(event, Ids::Check);
        self.push_prepared(event, hashes, Ids::Check)
    }

    /// Adds many events, as [`Auditor::push`] each in turn, and returns how
    /// many were not duplicates. Faster than `push` in a loop: the lookups
    /// of the next events are started while the current one is added.
    pub fn push_all<'e, I>(&mut self, events: I) -> usize
    where
        I: IntoIterator<Item = &'e LeaseEvent<'e>>,
    {
        self.push_many(events, Ids::Check)
    }

    /// [`Auditor::push_all`] for events whose `event_id`s are known to
    /// differ from each other and from those of every event pushed before:
    /// a lake's `lease_events`, de-duplicated when they were ingested. The
    /// ids are kept without the de-duplication lookup, a cache miss into a
    /// table as big as the history and the costliest part of auditing a
    /// big lake; the index is built only if a later [`Auditor::push`] or
    /// [`Auditor::push_all`] needs it. Events that do share an id are
    /// then all kept. Returns how many events were added (all of them).
    pub fn push_all_unique<'e, I>(&mut self, events: I) -> usize
    where
        I: IntoIterator<Item = &'e LeaseEvent<'e>>,
    {
        self.push_many(events, Ids::Unique)
    }

    /// Builds the `event_id` index now for ids that
    /// [`Auditor::push_all_unique`] added without it, so that the next
    /// checked push (on this auditor or on each of its clones) does not.
    pub fn index_event_ids(&mut self) {
        self.ids.index_appended();
    }

    fn push_many<'e, I>(&mut self, events: I, ids: Ids) -> usize
    where
        I: IntoIterator<Item = &'e LeaseEvent<'e>>,
    {
        const AHEAD: usize = 8;
        let mut ring: [Option<(&LeaseEvent<'_>, Hashes)>; AHEAD] = [None; AHEAD];
        let (mut added, mut n) = (0, 0);
        for event in events {
            let hashes = self.prepare(event, ids);
            if let Some((old, h)) = ring[n % AHEAD].replace((event, hashes)) {
                added += usize::from(self.push_prepared(old, h, ids));
            }
            n += 1;
        }
        // The oldest entry left follows the last one written.
        for k in 0..AHEAD {
            if let Some((event, h)) = ring[(n + k) % AHEAD].take() {
                added += usize::from(self.push_prepared(event, h, ids));
            }
        }
        added
    }

    /// Hashes the event's strings and asks for the table slots their
    /// lookups will read: three lookups at random places in memory, started
    /// together and used later.
    fn prepare(&self, event: &LeaseEvent<'_>, ids: Ids) -> Hashes {
        let id = match ids {
            Ids::Unique | Ids::Replay => None,
            Ids::Check => event.event_id.as_deref().map(|id| {
                let hash = self.ids.hash(id);
                self.ids.prefetch(hash);
                hash
            }),
        };
        let lease = self.leases.prepare(&event.lease_id);
        let holder = event.holder_id.as_deref().map(|h| self.strings.prepare(h));
        Hashes { id, lease, holder }
    }

    fn push_prepared(&mut self, event: &LeaseEvent<'_>, hashes: Hashes, ids: Ids) -> bool {
        let (lease, new_lease) = self.leases.intern_hashed(&event.lease_id, hashes.lease);
        if new_lease {
            let mut state = LeaseState::new(self.leases.get(lease).clone());
            state.events.reserve(self.expected_per_lease);
            self.states.push(state);
        }
        let holder = match (event.holder_id.as_deref(), hashes.holder) {
            (Some(h), Some(hash)) => self.strings.intern_hashed(h, hash).0,
            _ => NONE,
        };
        let mut ev = Ev::new(event, lease, holder, &mut self.strings, NONE);
        let state = &mut self.states[lease as usize];
        if ids != Ids::Replay && !state.stale && state.would_unsettle(&ev, self.tol) {
            state.stale = true;
            self.stale.push(lease);
            self.stale_leases += 1;
        }
        if let (Ids::Replay, Some(id)) = (ids, event.event_id.as_deref()) {
            let fingerprint = ev.fingerprint(self.strings.hasher());
            let hash = self.ids.hash(id);
            let (sym, new_id) = self.ids.intern_hashed(id, hash);
            ev.event_id = sym;
            let info = IdInfo { lease, fingerprint };
            if new_id {
                self.id_info.push(info);
            } else {
                self.id_info[sym as usize] = info;
            }
            self.append(ev);
            return true;
        }
        if let (Ids::Unique, Some(id)) = (ids, event.event_id.as_deref()) {
            let fingerprint = ev.fingerprint(self.strings.hasher());
            ev.event_id = self.ids.append_unindexed(id);
            self.id_info.push(IdInfo { lease, fingerprint });
            self.append(ev);
            return true;
        }
        let (Some(id), Some(id_hash)) = (event.event_id.as_deref(), hashes.id) else {
            self.append(ev);
            return true;
        };
        let fingerprint = ev.fingerprint(self.strings.hasher());
        let (sym, new_id) = self.ids.intern_hashed(id, id_hash);
        ev.event_id = sym;
        if new_id {
            self.id_info.push(IdInfo { lease, fingerprint });
            self.append(ev);
            return true;
        }
        if self.id_info[sym as usize].fingerprint != fingerprint {
            self.resolve_conflict(sym, ev, fingerprint);
        }
        false
    }

    fn append(&mut self, ev: Ev) {
        self.latest = Some(self.latest.map_or(ev.ts, |l| l.max(ev.ts)));
        self.events += 1;
        self.log.push(ev);
        // Filed in batches small enough to stay in cache.
        if self.log.len() >= LOG_BATCH {
            self.file_log();
        }
    }

    /// Files the logged events under their leases, marking those leases for
    /// recompute and for the next `drain_changes`.
    fn file_log(&mut self) {
        // Every event lands in a different lease's memory: fetch the lease
        // two steps ahead and the end of its events one step ahead, so the
        // misses overlap instead of following one another.
        const AHEAD: usize = 8;
        let log = std::mem::take(&mut self.log);
        for (i, &ev) in log.iter().enumerate() {
            if let Some(next) = log.get(i + 2 * AHEAD) {
                prefetch(&self.states[next.lease as usize]);
            }
            if let Some(next) = log.get(i + AHEAD) {
                let events = &self.states[next.lease as usize].events;
                prefetch(events.as_ptr().wrapping_add(events.len()));
            }
            self.states[ev.lease as usize].push(ev);
            self.touch(ev.lease);
        }
        self.log = log;
        self.log.clear();
    }

    /// Marks a lease for recompute and for the next `drain_changes`.
    fn touch(&mut self, lease: Sym) {
        let state = &mut self.states[lease as usize];
        state.dirty = true;
        if !state.listed {
            state.listed = true;
            self.dirty.push(lease);
        }
        if !state.undrained {
            state.undrained = true;
            self.undrained.push(lease);
        }
    }

    /// Two different events with one `event_id`: keep the canonically
    /// smaller.
    fn resolve_conflict(&mut self, sym: Sym, ev: Ev, fingerprint: u64) {
        self.file_log();
        let old_lease = self.id_info[sym as usize].lease;
        let old_state = &self.states[old_lease as usize];
        let Some(pos) = old_state.events.iter().position(|e| e.event_id == sym) else {
            return;
        };
        let old = &old_state.events[pos];
        let order = self
            .leases
            .get(ev.lease)
            .cmp(self.leases.get(old_lease))
            .then_with(|| canonical_cmp(&ev, old, &self.strings, &self.ids));
        if order.is_ge() {
            return;
        }
        let old = self.states[old_lease as usize].remove(pos);
        self.events -= 1;
        self.touch(old_lease);
        self.id_info[sym as usize] = IdInfo {
            lease: ev.lease,
            fingerprint,
        };
        self.append(ev);
        if Some(old.ts) == self.latest {
            self.file_log();
            self.latest = self
                .states
                .iter()
                .filter(|s| !s.events.is_empty())
                .map(|s| s.max_ts)
                .max();
        }
    }

    /// Recomputes every lease whose events changed.
    fn refresh(&mut self) {
        self.file_log();
        let dirty = std::mem::take(&mut self.dirty);
        for &lease in &dirty {
            self.states[lease as usize].listed = false;
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if dirty.len() >= PARALLEL_MIN_LEASES && threads > 1 {
            self.recompute_parallel(threads);
        } else {
            for lease in dirty {
                self.recompute(lease);
            }
        }
        if self.sorted.len() != self.states.len() {
            // Leases are only ever added, each with the next symbol, so
            // `sorted` is still the order of the older ones: only the new
            // ones are sorted, then merged in. A live audit of hundreds of
            // thousands of leases derives its tables for queries every few
            // seconds, under the lock ingest's alert engine waits on, and
            // sorting every lease id again for each lease met since took
            // most of a read: 204 ms against 7.7 ms among 300,000 leases
            // (BENCHMARKS.md, `audit-new-lease`).
            let old = self.sorted.len();
            let states = &self.states;
            let by_id = |a: &Sym, b: &Sym| states[*a as usize].id.cmp(&states[*b as usize].id);
            let mut new: Vec<Sym> = (old as Sym..states.len() as Sym).collect();
            new.sort_unstable_by(by_id);
            self.sorted = merge_in(&self.sorted, &new, by_id);
        }
    }

    /// A big refresh (a lake audited from scratch) uses every core.
    fn recompute_parallel(&mut self, threads: usize) {
        let (strings, ids, tol) = (&self.strings, &self.ids, self.tol);
        in_runs(&mut self.states, threads, |_, state, scratch| {
            if state.dirty {
                state.recompute(strings, ids, tol, scratch);
            }
        });
    }

    fn recompute(&mut self, lease: Sym) {
        let state = &mut self.states[lease as usize];
        if state.dirty {
            state.recompute(&self.strings, &self.ids, self.tol, &mut self.scratch);
        }
    }

    fn sorted_states(&self) -> impl Iterator<Item = &LeaseState> {
        self.sorted.iter().map(|&l| &self.states[l as usize])
    }

    /// Every grant, ordered by lease id, then acquisition time, then token.
    pub fn timeline(&mut self) -> Vec<Grant> {
        self.refresh();
        let latest = self.latest.unwrap_or(i64::MIN);
        let total = self.states.iter().map(|s| s.grants.len()).sum();
        let mut out = Vec::with_capacity(total);
        for state in self.sorted_states() {
            // Kept rows were acquired before the cut, the others from it on.
            out.extend(state.kept_grants.iter().cloned());
            out.extend(state.grants.iter().map(|g| g.resolve(latest)));
        }
        out
    }

    /// Every violation, ordered by lease id, then time, then kind.
    pub fn violations(&mut self) -> Vec<Violation> {
        self.refresh();
        let mut out = Vec::new();
        for state in self.sorted_states() {
            out.extend(state.kept_violations.iter().cloned());
            out.extend(state.violations.iter().cloned());
        }
        out
    }

    /// The last grant (by acquisition time) of every lease that has one,
    /// ordered by lease id, and whether it is still valid.
    pub fn holders(&mut self) -> Vec<LeaseHolder> {
        self.refresh();
        let latest = self.latest.unwrap_or(i64::MIN);
        self.sorted_states()
            .filter_map(|s| s.grants.last())
            .map(|g| {
                let grant = g.resolve(latest);
                LeaseHolder {
                    valid: grant.is_open(),
                    grant,
                }
            })
            .collect()
    }

    /// One lease's grants and violations; `None` when no event names it.
    pub fn lease(&mut self, lease_id: &str) -> Option<LeaseAudit> {
        let lease = self.leases.find(lease_id)?;
        self.file_log();
        self.recompute(lease);
        let latest = self.latest.unwrap_or(i64::MIN);
        let state = &self.states[lease as usize];
        if state.events.is_empty() {
            return None;
        }
        Some(LeaseAudit {
            lease_id: state.id.clone(),
            grants: (state.kept_grants.iter().cloned())
                .chain(state.grants.iter().map(|g| g.resolve(latest)))
                .collect(),
            violations: (state.kept_violations.iter())
                .chain(&state.violations)
                .cloned()
                .collect(),
        })
    }

    /// Leases named by an event pushed so far.
    pub fn lease_count(&self) -> usize {
        self.states.len()
    }

    /// Lease ids with at least one event, sorted.
    pub fn lease_ids(&mut self) -> Vec<std::sync::Arc<str>> {
        self.refresh();
        self.sorted_states()
            .filter(|s| !s.events.is_empty())
            .map(|s| s.id.clone())
            .collect()
    }

    /// Lets go of what can no longer change (see `settle.rs` for the
    /// protocol): for each lease with a new cut at or before `cutoff`
    /// (Unix microseconds; the caller's watermark minus its lateness
    /// horizon), the rows before the cut, which the auditor no longer
    /// answers, and whose events it drops but for the few later rows
    /// are judged against. The rows handed out by every call, plus what
    /// the auditor answers afterwards, are what an auditor holding every
    /// event would answer, as long as the caller replays each lease
    /// [`Auditor::take_stale`] names ([`Auditor::reload`]).
    ///
    /// A caller that alerts calls [`Auditor::drain_changes`] first: a
    /// violation settled is no longer reported as appearing (nor, later,
    /// as retracted). An auditor that settled answers a snapshot's tables
    /// only together with the rows it handed out, so it is not one a
    /// [`crate::SharedAuditor`] may mark as covering a snapshot, unless
    /// it kept them ([`Auditor::settle_keeping`]) and has no stale lease
    /// ([`Auditor::stale_leases`]).
    pub fn settle(&mut self, cutoff: i64) -> Vec<Settled> {
        self.file_log();
        let latest = self.latest.unwrap_or(i64::MIN);
        let mut out = Vec::new();
        for lease in 0..self.states.len() {
            let state = &mut self.states[lease];
            if state.stale || state.events.is_empty() {
                continue;
            }
            // No event of a quiet lease is newer than the cutoff: it may
            // get none for the rest of the process's life.
            let quiet = state.max_ts < cutoff;
            // The derived grants of this lease must be in the scratch.
            state.recompute(&self.strings, &self.ids, self.tol, &mut self.scratch);
            let Some(cut) =
                crate::settle::find_cut(&state.events, &self.scratch, self.tol, cutoff, state.cut)
            else {
                if quiet {
                    state.shrink();
                }
                continue;
            };
            let grants = state
                .grants
                .iter()
                .filter(|g| g.grant.acquired_at < cut.ts)
                .map(|g| g.resolve(latest))
                .collect();
            let violations = state
                .violations
                .iter()
                .filter(|v| v.at < cut.ts)
                .cloned()
                .collect();
            let ts = cut.ts;
            state.apply_cut(cut, &self.scratch);
            // Answers from the kept events, filtered at the new cut.
            state.recompute(&self.strings, &self.ids, self.tol, &mut self.scratch);
            if quiet {
                state.shrink();
            }
            out.push(Settled {
                lease_id: state.id.clone(),
                grants,
                violations,
                cut: ts,
                context: Vec::new(),
            });
        }
        if self.ids.len() > 2 * self.held() + MIN_ID_COMPACTION {
            self.compact_ids();
        }
        out
    }

    /// [`Auditor::settle`], keeping the settled rows: the auditor goes on
    /// answering every row, holding a settled grant as a row rather than
    /// as its events. Returns the grants settled. For an auditor whose
    /// tables are read (SQL); the caller re-audits the leases
    /// [`Auditor::take_stale`] names, as for `settle`.
    pub fn settle_keeping(&mut self, cutoff: i64) -> usize {
        let mut grants = 0;
        for s in self.settle(cutoff) {
            let Some(lease) = self.leases.find(&s.lease_id) else {
                continue;
            };
            let state = &mut self.states[lease as usize];
            grants += s.grants.len();
            state.kept_grants.extend(s.grants);
            state.kept_violations.extend(s.violations);
        }
        grants
    }

    /// The rows settled and kept, not released yet, per lease with its
    /// cut: what to store.
    pub fn kept(&mut self) -> Vec<Settled> {
        self.file_log();
        self.states
            .iter()
            .filter(|s| !s.kept_grants.is_empty() || !s.kept_violations.is_empty())
            .map(|s| Settled {
                lease_id: s.id.clone(),
                grants: s.kept_grants.clone(),
                violations: s.kept_violations.clone(),
                cut: s.cut,
                // What a cut keeps from before it, and only that, is held
                // before it.
                context: s
                    .events
                    .iter()
                    .filter(|e| e.ts < s.cut)
                    .map(|e| e.to_event(&s.id, &self.strings, self.ids.get_opt(e.event_id)))
                    .collect(),
            })
            .collect()
    }

    /// The kept rows are stored in `stored` (with those released before)
    /// and the rows of the leases [`Auditor::voided`] names are gone from
    /// it: the auditor stops answering them. Returns the violations
    /// released, which a caller that alerts keeps to tell what a later
    /// replay of their lease changes ([`Auditor::reload`]).
    pub fn release_kept(&mut self, stored: std::sync::Arc<StoredFiles>) -> Vec<Violation> {
        self.file_log();
        let mut released = Vec::new();
        for state in &mut self.states {
            state.kept_grants = Vec::new();
            released.append(&mut state.kept_violations);
        }
        self.voided.clear();
        self.stored = Some(stored);
        self.generation += 1;
        released
    }

    /// Leases replayed whole since the last release, whose stored rows
    /// are void; while any is, the stored rows and the auditor's answers
    /// overlap.
    pub fn voided(&self) -> Vec<std::sync::Arc<str>> {
        self.voided
            .iter()
            .map(|&l| self.states[l as usize].id.clone())
            .collect()
    }

    /// The stored files as they are now, with no new release: the files
    /// another writer's commit or a compaction changed.
    pub fn set_stored(&mut self, stored: std::sync::Arc<StoredFiles>) {
        if self.stored.as_deref() != Some(&*stored) {
            self.stored = Some(stored);
            self.generation += 1;
        }
    }

    /// Where the released rows are stored, once any were.
    pub fn stored(&self) -> Option<std::sync::Arc<StoredFiles>> {
        self.stored.clone()
    }

    /// Counts releases (see [`Auditor::release_kept`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Settles `lease_id` at exactly `cut`, dropping its rows from before
    /// it: a writer that restarted replays a lease's history and finds its
    /// rows before `cut` stored already. The cut is found as
    /// [`Auditor::settle`] finds one, so it is made only if the events the
    /// auditor holds allow it; otherwise (an event arrived since that
    /// changes a row before it) the lease is voided ([`Auditor::voided`])
    /// and answered whole until its next cut. Returns the violations
    /// dropped, `None` if the cut was not made.
    pub fn resume(&mut self, lease_id: &str, cut: i64) -> Option<Vec<Violation>> {
        self.file_log();
        let lease = self.leases.find(lease_id)?;
        let state = &mut self.states[lease as usize];
        let Some(dropped) =
            state.cut_at(cut, &self.strings, &self.ids, self.tol, &mut self.scratch)
        else {
            if state.cut < cut && !self.voided.contains(&lease) {
                self.voided.push(lease);
            }
            return None;
        };
        state.recompute(&self.strings, &self.ids, self.tol, &mut self.scratch);
        self.touch(lease);
        // Rows are now answered by the stored tables only.
        self.generation += 1;
        Some(dropped)
    }

    /// [`Auditor::resume`] of many leases at once, over every core, for a
    /// reader that holds each lease's stored context and its events from
    /// its cut on (`query/src/stored.rs`); leases it does not hold are
    /// skipped. Returns the leases whose cut was not made, which are
    /// voided as `resume` voids them.
    pub fn resume_all<'l>(
        &mut self,
        cuts: impl IntoIterator<Item = (&'l str, i64)>,
    ) -> Vec<std::sync::Arc<str>> {
        self.file_log();
        let mut want: Vec<Option<i64>> = vec![None; self.states.len()];
        for (lease, cut) in cuts {
            if let Some(l) = self.leases.find(lease) {
                want[l as usize] = Some(cut);
            }
        }
        let (strings, ids, tol) = (&self.strings, &self.ids, self.tol);
        let failed = std::sync::Mutex::new(Vec::new());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        in_runs(&mut self.states, threads, |lease, state, scratch| {
            let Some(cut) = want[lease] else { return };
            if state.cut_at(cut, strings, ids, tol, scratch).is_none() && state.cut < cut {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(lease as Sym);
            }
        });
        let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
        for (lease, cut) in want.iter().enumerate() {
            if cut.is_some() {
                // A cut that dropped events leaves its lease marked but
                // perhaps not listed for the next refresh: list it. Either
                // way its answers are new to a caller that drains changes.
                let state = &mut self.states[lease];
                if std::mem::take(&mut state.dirty) {
                    self.touch(lease as Sym);
                } else if !state.undrained {
                    state.undrained = true;
                    self.undrained.push(lease as Sym);
                }
            }
        }
        for &lease in &failed {
            if !self.voided.contains(&lease) {
                self.voided.push(lease);
            }
        }
        self.generation += 1;
        failed
            .into_iter()
            .map(|l| self.states[l as usize].id.clone())
            .collect()
    }

    /// Forgets the ids of events no longer held, so that the table of ids
    /// follows what is held rather than the history. A settled event's id
    /// is then unknown, so a duplicate of it is taken for a new event; it
    /// is older than its lease's cut, so it makes the lease stale, and the
    /// replay from the lake (which holds each id once) puts it right.
    fn compact_ids(&mut self) {
        self.file_log();
        let mut ids = EventIds::default();
        let mut info = Vec::with_capacity(self.held());
        for state in &mut self.states {
            for ev in state.events.iter_mut().filter(|e| e.event_id != NONE) {
                info.push(self.id_info[ev.event_id as usize]);
                ev.event_id = ids.append_unindexed(self.ids.get(ev.event_id));
            }
        }
        self.ids = ids;
        self.id_info = info;
        if self.strings.len() > 2 * self.strings_kept + MIN_STRING_COMPACTION {
            self.compact_strings();
        }
    }

    /// Forgets the holder ids, backends and trace ids that no event held
    /// and no settled lease names any more. Symbols are handles within one
    /// interner, so every holder of one is moved to the new table, and the
    /// fingerprints of the ids kept, which hash symbols, are taken again.
    fn compact_strings(&mut self) {
        self.file_log();
        let old = std::mem::take(&mut self.strings);
        let mut strings = Interner::default();
        let mut moved = vec![NONE; old.len()];
        let mut to_new = |sym: Sym| {
            if sym == NONE {
                return NONE;
            }
            let slot = &mut moved[sym as usize];
            if *slot == NONE {
                *slot = strings.adopt(old.get(sym));
            }
            *slot
        };
        for state in &mut self.states {
            for ev in &mut state.events {
                ev.holder = to_new(ev.holder);
                ev.backend = to_new(ev.backend);
                ev.trace = to_new(ev.trace);
            }
            for h in &mut state.settled_holders {
                *h = to_new(*h);
            }
            for (h, _) in &mut state.holders_from_cut {
                *h = to_new(*h);
            }
        }
        for state in &self.states {
            for ev in state.events.iter().filter(|e| e.event_id != NONE) {
                self.id_info[ev.event_id as usize].fingerprint = ev.fingerprint(strings.hasher());
            }
        }
        self.strings_kept = strings.len();
        self.strings = strings;
        // The scratch's grants name the old symbols.
        self.scratch = Scratch::default();
    }

    /// Leases whose answers are wrong until [`Auditor::reload`] replays
    /// them: given an event that changes rows already settled, whether
    /// [`Auditor::take_stale`] handed them out or not.
    pub fn stale_leases(&self) -> usize {
        self.stale_leases
    }

    /// The leases that were given an event changing rows already settled
    /// (one older than their cut, a token settled, a `renew_failed` that
    /// counts against a settled grant), each once. Their answers are
    /// wrong until the caller replays each with [`Auditor::reload`].
    pub fn take_stale(&mut self) -> Vec<std::sync::Arc<str>> {
        let stale = std::mem::take(&mut self.stale);
        stale
            .into_iter()
            .map(|l| self.states[l as usize].id.clone())
            .collect()
    }

    /// Replaces what the auditor holds of `lease_id` with its whole
    /// history, `events` (a lake's rows of that lease: distinct event
    /// ids), as if nothing of it had been settled. The rows of the lease
    /// handed out by [`Auditor::settle`] before are void: the auditor
    /// answers for all of them again until the next cut hands them out
    /// anew. `settled_violations` are those void rows' violations: the
    /// next [`Auditor::drain_changes`] reports only what the replay
    /// changed against them.
    pub fn reload<'e, I>(&mut self, lease_id: &str, events: I, settled_violations: &[Violation])
    where
        I: IntoIterator<Item = &'e LeaseEvent<'e>>,
    {
        self.file_log();
        let lease = self.leases.find(lease_id);
        if let Some(lease) = lease {
            let state = &mut self.states[lease as usize];
            self.events -= state.count;
            if state.stale {
                self.stale_leases -= 1;
            }
            let kept = std::mem::take(&mut state.kept_violations);
            state.reset();
            state.drained.extend(kept);
            state.drained.extend(settled_violations.iter().cloned());
            state.drained.sort_unstable();
            state.drained.dedup();
            self.touch(lease);
        }
        if let Some(lease) = lease.filter(|l| !self.voided.contains(l)) {
            self.voided.push(lease);
        }
        for event in events {
            if event.lease_id != lease_id {
                continue;
            }
            let hashes = self.prepare(event, Ids::Unique);
            self.push_prepared(event, hashes, Ids::Replay);
        }
        self.file_log();
        if let Some(lease) = self.leases.find(lease_id) {
            self.stale.retain(|&l| l != lease);
        }
    }

    /// The violations that appeared, and those that went away, since the
    /// previous call (since the start on the first call), each list sorted
    /// like [`Auditor::violations`]. The answer depends only on the sets of
    /// events pushed before this call and before the previous one. Only
    /// leases with new events are compared, so a call costs what changed.
    pub fn drain_changes(&mut self) -> ViolationChanges {
        self.file_log();
        let mut changes = ViolationChanges::default();
        for lease in std::mem::take(&mut self.undrained) {
            self.recompute(lease);
            let state = &mut self.states[lease as usize];
            state.undrained = false;
            diff(&state.drained, &state.violations, &mut changes);
            state.drained.clone_from(&state.violations);
        }
        changes.appeared.sort_unstable();
        changes.retracted.sort_unstable();
        changes
    }
}

/// Merges two sorted lists into what is only in `new` (appeared) and only
/// in `old` (retracted).
fn diff(old: &[Violation], new: &[Violation], out: &mut ViolationChanges) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) => match o.cmp(n) {
                std::cmp::Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => {
                    out.retracted.push(o.clone());
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    out.appeared.push(n.clone());
                    j += 1;
                }
            },
            (Some(o), None) => {
                out.retracted.push(o.clone());
                i += 1;
            }
            (None, Some(n)) => {
                out.appeared.push(n.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
}

/// `old` and `new`, both sorted by `cmp` and sharing no element, as one
/// sorted list. Each new element finds its place by binary search in
/// what is left of `old`, and the old elements between are copied without
/// a comparison: k·log n comparisons for k new among n, where a merge
/// compares every element, each a lookup of two lease ids.
fn merge_in<T: Copy>(old: &[T], new: &[T], cmp: impl Fn(&T, &T) -> std::cmp::Ordering) -> Vec<T> {
    let mut out = Vec::with_capacity(old.len() + new.len());
    let mut rest = old;
    for n in new {
        let at = rest.partition_point(|o| cmp(o, n).is_lt());
        out.extend_from_slice(&rest[..at]);
        out.push(*n);
        rest = &rest[at..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::Auditor;

    fn event(lease: &str, i: usize) -> leaseline_schema::LeaseEvent<'static> {
        let line = format!(
            r#"{{"event_id":"{lease}-{i}","ts":"2026-09-14T10:{:02}:{:02}Z","kind":"renewed","source":"holder","lease_id":"{lease}","holder_id":"h","fencing_token":7}}"#,
            i / 60,
            i % 60
        );
        leaseline_schema::decode(line.as_bytes())
            .expect("a contract event")
            .into_owned()
    }

    /// The live engine drains changes after every batch and reads no
    /// table; each lease must stay listed for recompute once, not once
    /// per batch that touched it.
    #[test]
    fn leases_drained_between_refreshes_are_listed_once() {
        let mut a = Auditor::default();
        for i in 0..600 {
            for lease in ["a", "b", "c"] {
                a.push(&event(lease, i));
            }
            a.drain_changes();
            assert!(a.dirty.len() <= 3, "listed {} times", a.dirty.len());
        }
        // A refresh still recomputes what changed since the last drain.
        a.push(&event("a", 600));
        a.timeline();
        assert!(a.dirty.is_empty());
        assert!(a.states.iter().all(|s| !s.dirty && !s.listed));
    }

    #[test]
    fn merge_in_places_each_new_element_among_the_old() {
        let by = |a: &u32, b: &u32| a.cmp(b);
        assert_eq!(
            super::merge_in(&[2, 4, 6], &[1, 5, 9], by),
            [1, 2, 4, 5, 6, 9]
        );
        assert_eq!(super::merge_in(&[], &[3, 7], by), [3, 7]);
        assert_eq!(super::merge_in(&[3, 7], &[], by), [3, 7]);
        assert_eq!(super::merge_in(&[1, 2], &[8, 9], by), [1, 2, 8, 9]);
        assert_eq!(super::merge_in(&[8, 9], &[1, 2], by), [1, 2, 8, 9]);
        assert_eq!(
            super::merge_in(&[10, 20, 30], &[11, 12, 13], by),
            [10, 11, 12, 13, 20, 30]
        );
    }

    /// After `reserve`, a lease's vector of events is sized once, at its
    /// first event; a guess far off takes no more than 1,024 events' room.
    #[test]
    fn a_reserve_sizes_each_leases_events_once() {
        let mut sized = Auditor::default();
        sized.reserve(1000, 200);
        let mut doubled = Auditor::default();
        for i in 0..150 {
            sized.push(&event("a", i));
            doubled.push(&event("a", i));
        }
        assert_eq!(sized.timeline(), doubled.timeline());
        assert_eq!(sized.states[0].events.len(), 150);
        assert_eq!(sized.states[0].events.capacity(), 200);
        assert_eq!(doubled.states[0].events.capacity(), 256);
        let mut far_off = Auditor::default();
        far_off.reserve(10, usize::MAX);
        far_off.push(&event("a", 0));
        far_off.timeline();
        assert_eq!(far_off.states[0].events.capacity(), 1024);
    }

    /// Leases met between reads join the order of those met before: every
    /// read lists every lease by id, in whatever order they arrived.
    #[test]
    fn leases_added_between_reads_are_listed_by_id() {
        let mut a = Auditor::default();
        let mut expected: Vec<String> = Vec::new();
        let rounds = [
            vec!["m", "c", "x"],
            vec!["a"],
            vec!["z", "n", "b", "y"],
            vec![],
            vec!["d", "0", "~"],
        ];
        for (i, leases) in rounds.iter().enumerate() {
            for lease in leases {
                a.push(&event(lease, i));
                expected.push(lease.to_string());
            }
            expected.sort();
            let listed: Vec<String> = a.lease_ids().iter().map(|l| l.to_string()).collect();
            assert_eq!(listed, expected, "after round {i}");
        }
    }
}
