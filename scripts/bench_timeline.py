#!/usr/bin/env python3
"""lease_timeline over a big lake, side by side with DuckDB; lease_holders lookups.

Usage: bench_timeline.py LEASELINE_BIN LAKE ROUNDS LOOKUPS

LAKE must already hold the events (scripts/bench-timeline.sh builds it).
Each round runs, one after the other on the same Parquet files:

- `leaseline sql --lake LAKE` aggregating every column of `lease_timeline`
  (a fresh process: reading the files, auditing, deriving the table);
- DuckDB (Python module, in-process, all cores) computing the same grants
  table from `lease_events` with window functions, aggregated the same way.

Then it checks that the two tables agree row by row, starts
`leaseline serve` on the lake, warms it with one query and times LOOKUPS
single-lease `lease_holders` queries over HTTP (keep-alive connection).
"""

import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

# The grants table with window functions: per grant the coordinator's
# acquisition (else the earliest), the first end event, the successful
# keepalives up to it (LAG for the gap, LAST_VALUE for the TTL in force,
# ROW_NUMBER for the last one), per-source keepalive counts, write counts,
# and lapsed/open against the latest event time.
GRANTS_SQL = """
WITH ev AS (
  SELECT ts, kind, source, lease_id, holder_id, fencing_token, ttl_ms, backend, trace_id
  FROM read_parquet($files)
),
latest AS (SELECT max(ts) AS latest FROM ev),
acq AS (
  SELECT lease_id, fencing_token,
         arg_min(ts, (source <> 'coordinator', ts)) AS acquired_at,
         arg_min(holder_id, (source <> 'coordinator', ts)) AS holder_id,
         arg_min(backend, ts) FILTER (WHERE backend IS NOT NULL) AS backend,
         arg_min(trace_id, ts) FILTER (WHERE trace_id IS NOT NULL) AS trace_id
  FROM ev WHERE kind = 'acquired' GROUP BY ALL
),
ends AS (
  SELECT lease_id, fencing_token, min(ts) AS end_ts, arg_min(kind, ts) AS end_kind
  FROM ev WHERE kind IN ('released', 'expired', 'revoked') GROUP BY ALL
),
succ AS (
  SELECT e.lease_id, e.fencing_token, e.kind, e.ts,
         last_value(e.ttl_ms IGNORE NULLS) OVER w AS ttl_ms,
         epoch_us(e.ts) - epoch_us(lag(e.ts) OVER w) AS gap_us,
         row_number() OVER (PARTITION BY e.lease_id, e.fencing_token ORDER BY e.ts DESC) AS from_last
  FROM ev e LEFT JOIN ends n USING (lease_id, fencing_token)
  WHERE e.kind IN ('acquired', 'renewed') AND (n.end_ts IS NULL OR e.ts <= n.end_ts)
  WINDOW w AS (PARTITION BY e.lease_id, e.fencing_token ORDER BY e.ts
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
keep AS (
  SELECT lease_id, fencing_token,
         max(gap_us) FILTER (WHERE kind = 'renewed') / 1000.0 AS max_renew_gap_ms,
         max(ts + to_milliseconds(ttl_ms)) FILTER (WHERE from_last = 1) AS ttl_deadline,
         max(ttl_ms) FILTER (WHERE from_last = 1) AS ttl_ms
  FROM succ GROUP BY ALL
),
counts AS (
  SELECT lease_id, fencing_token,
         greatest(count(*) FILTER (WHERE kind = 'renewed' AND source = 'coordinator'),
                  count(*) FILTER (WHERE kind = 'renewed' AND source = 'holder'),
                  count(*) FILTER (WHERE kind = 'renewed' AND source = 'resource')) AS renewals,
         greatest(count(*) FILTER (WHERE kind = 'renew_failed' AND source = 'coordinator'),
                  count(*) FILTER (WHERE kind = 'renew_failed' AND source = 'holder'),
                  count(*) FILTER (WHERE kind = 'renew_failed' AND source = 'resource')) AS renew_failures,
         count(*) FILTER (WHERE kind = 'write_accepted') AS writes_accepted,
         count(*) FILTER (WHERE kind = 'stale_write_rejected') AS stale_writes_rejected
  FROM ev WHERE fencing_token IS NOT NULL GROUP BY ALL
)
SELECT a.lease_id, a.fencing_token, a.holder_id, a.backend, a.acquired_at,
       CASE WHEN n.end_ts IS NOT NULL THEN greatest(a.acquired_at, least(n.end_ts, coalesce(k.ttl_deadline, n.end_ts)))
            WHEN k.ttl_deadline <= l.latest THEN k.ttl_deadline END AS ended_at,
       coalesce(n.end_kind, CASE WHEN k.ttl_deadline <= l.latest THEN 'lapsed' ELSE 'open' END) AS end_kind,
       k.ttl_ms, c.renewals, c.renew_failures, k.max_renew_gap_ms,
       c.writes_accepted, c.stale_writes_rejected, a.trace_id
FROM acq a
CROSS JOIN latest l
LEFT JOIN ends n USING (lease_id, fencing_token)
LEFT JOIN keep k USING (lease_id, fencing_token)
LEFT JOIN counts c USING (lease_id, fencing_token)
"""

# Touches every column, so neither side can skip computing one.
AGGREGATE = """
SELECT count(*) AS grants, count(DISTINCT end_kind) AS end_kinds,
       sum(renewals) AS renewals, sum(renew_failures) AS renew_failures,
       max(max_renew_gap_ms) AS max_gap_ms, sum(writes_accepted) AS writes,
       sum(stale_writes_rejected) AS stale, max(ended_at) AS last_end,
       min(acquired_at) AS first_acquired, count(holder_id) AS holders,
       count(backend) AS backends, count(trace_id) AS traces,
       sum(ttl_ms) AS ttl_sum, max(fencing_token) AS max_token,
       count(DISTINCT lease_id) AS leases
FROM {table}
"""

COMPARE_COLUMNS = (
    "lease_id, fencing_token, holder_id, end_kind, renewals, renew_failures, "
    "writes_accepted, stale_writes_rejected"
)


def live_files(lake: Path) -> list[str]:
    """The Parquet files of lease_events' newest Delta version."""
    from deltalake import DeltaTable

    return DeltaTable(str(lake / "lease_events")).file_uris()


def leaseline_sql(bin_: str, lake: Path, sql: str) -> str:
    out = subprocess.run(
        [bin_, "sql", "--lake", str(lake), "--format", "csv", sql],
        capture_output=True, text=True,
        # The recorded runs set this: before the derived tables came in
        # 8,192-row batches, this aggregate exceeded the default 1 GiB
        # per-query limit in about one run in four. The limit does not
        # change the speed measured here.
        env={**os.environ, "LEASELINE_LOG": "warn", "LEASELINE_QUERY_MAX_MEMORY_BYTES": "8GiB"},
    )
    if out.returncode != 0:
        raise SystemExit(f"leaseline sql failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    bin_, lake, rounds, lookups = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    files = live_files(lake)
    # Each side runs alone, so every DuckDB connection is closed as soon as
    # it is done: one left open slows the next `leaseline sql` by a quarter
    # to a half (measured on 2026-11-30: 3.2-3.35 s with it closed,
    # 4.0-5.75 s with it open).
    with duckdb.connect() as con:
        events = con.execute("SELECT count(*) FROM read_parquet($files)", {"files": files}).fetchone()[0]
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    size = sum(os.path.getsize(f) for f in files)
    print(f"lake: {events:,} events in {len(files)} Parquet files, {size / 2**20:.0f} MiB")
    print(f"duckdb {duckdb.__version__}, threads {threads}")

    ours, theirs, ratios = [], [], []
    for r in range(rounds):
        t = time.perf_counter()
        ll = leaseline_sql(bin_, lake, AGGREGATE.format(table="lease_timeline"))
        ll_s = time.perf_counter() - t
        with duckdb.connect() as con:  # no state carried between rounds
            t = time.perf_counter()
            dd = con.execute(AGGREGATE.format(table=f"({GRANTS_SQL})"), {"files": files}).fetchone()
            dd_s = time.perf_counter() - t
        ours.append(ll_s)
        theirs.append(dd_s)
        ratios.append(ll_s / dd_s)
        print(f"round {r}: leaseline {ll_s:.2f} s, duckdb {dd_s:.2f} s, ratio {ll_s / dd_s:.2f}")
        if r == 0:
            print(f"  leaseline: {ll.strip().splitlines()[-1]}")
            print(f"  duckdb:    {','.join(str(x) for x in dd)}")

    # Row-by-row agreement of the two grants tables.
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "timeline.csv"
        csv.write_text(leaseline_sql(bin_, lake, f"SELECT {COMPARE_COLUMNS} FROM lease_timeline"))
        with duckdb.connect() as con:
            con.execute(f"CREATE TABLE ours AS SELECT {COMPARE_COLUMNS} FROM read_csv('{csv}', header=true, all_varchar=true)")
            con.execute(
                f"CREATE TABLE theirs AS SELECT {', '.join(f'CAST({c.strip()} AS VARCHAR) AS {c.strip()}' for c in COMPARE_COLUMNS.split(','))} "
                f"FROM ({GRANTS_SQL})", {"files": files})
            n_ours = con.execute("SELECT count(*) FROM ours").fetchone()[0]
            n_theirs = con.execute("SELECT count(*) FROM theirs").fetchone()[0]
            only_ours = con.execute("SELECT count(*) FROM (SELECT * FROM ours EXCEPT ALL SELECT * FROM theirs)").fetchone()[0]
            only_theirs = con.execute("SELECT count(*) FROM (SELECT * FROM theirs EXCEPT ALL SELECT * FROM ours)").fetchone()[0]
            print(f"agreement: leaseline {n_ours:,} grants, duckdb {n_theirs:,}; "
                  f"rows only in leaseline {only_ours}, only in duckdb {only_theirs} "
                  f"(columns {COMPARE_COLUMNS})")
            if only_ours:
                for row in con.execute("SELECT * FROM (SELECT * FROM ours EXCEPT ALL SELECT * FROM theirs) LIMIT 3").fetchall():
                    print(f"  e.g. leaseline: {row}")
                for row in con.execute("SELECT * FROM (SELECT * FROM theirs EXCEPT ALL SELECT * FROM ours) LIMIT 3").fetchall():
                    print(f"  e.g. duckdb:    {row}")
            leases = [r[0] for r in con.execute("SELECT DISTINCT lease_id FROM ours").fetchall()]

    print(f"leaseline timeline build: median {statistics.median(ours):.2f} s; "
          f"duckdb: median {statistics.median(theirs):.2f} s; "
          f"ratio leaseline/duckdb: median {statistics.median(ratios):.2f}")

    if lookups:
        holders_latency(bin_, lake, leases, lookups)


def holders_latency(bin_: str, lake: Path, leases: list[str], lookups: int):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [bin_, "serve", "--lake", str(lake), "--http-listen", "127.0.0.1:0", "--pg-listen", "127.0.0.1:0"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LEASELINE_LOG": "info"},
    )
    try:
        marker = "HTTP API listening on http://"
        deadline = time.time() + 120
        addr = None
        while addr is None:
            text = Path(log.name).read_text()
            if marker in text:
                addr = text.split(marker, 1)[1].split()[0]
            elif time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"serve did not start:\n{text}")
            else:
                time.sleep(0.05)
        host, port = addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=600)

        def query(sql):
            conn.request("POST", "/api/v1/sql", body=json.dumps({"query": sql}),
                         headers={"Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise SystemExit(f"{resp.status}: {body[:500]!r}")
            return json.loads(body)

        t = time.perf_counter()
        first = query("SELECT count(*) AS n FROM lease_holders")
        print(f"serve: first lease_holders query (audits the lake) {time.perf_counter() - t:.2f} s, {first}")
        rng = random.Random(1)
        samples = []
        for _ in range(lookups):
            lease = rng.choice(leases).replace("'", "''")
            t = time.perf_counter()
            rows = query(f"SELECT * FROM lease_holders WHERE lease_id = '{lease}'")
            samples.append((time.perf_counter() - t) * 1000)
            assert len(rows) == 1, rows
        print(f"lease_holders lookup over HTTP, {lookups} random leases: "
              f"median {statistics.median(samples):.2f} ms, p90 {pct(samples, 0.9):.2f} ms, "
              f"p99 {pct(samples, 0.99):.2f} ms, max {max(samples):.2f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        os.unlink(log.name)


if __name__ == "__main__":
    main()
