#!/usr/bin/env python3
"""`leaseline sql` answering the audit's tables from the stored audit rows
against auditing every event, on the same lake, in the same run.

Usage: bench_stored.py LEASELINE_BIN LAKE CONFIG ROUNDS

LAKE must hold stored audit rows (scripts/bench-stored.sh builds it).
Each round runs two fresh processes, in alternating order:

- stored: `audit.read_stored = true` (the default): the stored rows plus
  an audit of each lease's context and its events from its cut on;
- all: `audit.read_stored = false`: an audit of every event.

Each runs `SELECT count(*) FROM lease_timeline` under /usr/bin/time
(wall seconds, peak RSS). The stored reader must say (debug log) that it
answered from the stored rows, and both must give the same count. Then
`lease_timeline` and `lease_violations` are compared whole, row by row.
"""

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

COUNT = "SELECT count(*) FROM lease_timeline"
STORED_MARK = "the audit's tables are the stored audit rows and the events after them"
TIMELINE = (
    "SELECT lease_id, fencing_token, holder_id, backend, acquired_at, ended_at, end_kind, "
    "ttl_ms, renewals, renew_failures, max_renew_gap_ms, writes_accepted, "
    "stale_writes_rejected, trace_id FROM lease_timeline ORDER BY lease_id, fencing_token"
)
VIOLATIONS = (
    "SELECT kind, lease_id, fencing_token, holder_id, at, other_fencing_token, detail "
    "FROM lease_violations ORDER BY kind, lease_id, fencing_token, at, other_fencing_token, detail"
)


def run(bin_, lake, cfg, read_stored, sql, timed=False):
    env = {
        **os.environ,
        "LEASELINE_CONFIG": cfg,
        "LEASELINE_AUDIT_READ_STORED": "true" if read_stored else "false",
        "LEASELINE_LOG": "warn,leaseline_query=debug",
        "NO_COLOR": "1",
        # The comparison reads whole tables; the limit is not what is measured.
        "LEASELINE_QUERY_MAX_MEMORY_BYTES": "8GiB",
        "LEASELINE_QUERY_MEMORY_POOL_BYTES": "8GiB",
    }
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        cmd = [bin_, "sql", "--lake", lake, "--format", "csv", sql]
        if timed:
            cmd = ["/usr/bin/time", "-o", t.name, "-f", "%e %M"] + cmd
        out = subprocess.run(cmd, capture_output=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"leaseline sql failed ({out.returncode}):\n{out.stderr.decode()[-3000:]}")
        stderr = out.stderr.decode()
        if read_stored and STORED_MARK not in stderr:
            raise SystemExit(f"the stored reader audited every event instead:\n{stderr[-3000:]}")
        if not read_stored and STORED_MARK in stderr:
            raise SystemExit("read_stored = false read the stored rows")
        if timed:
            secs, kib = t.read().split()
            return out.stdout.decode(), float(secs), int(kib) / 1024
        return out.stdout.decode(), None, None


def main():
    bin_, lake, cfg, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    times = {True: [], False: []}
    rss = {True: [], False: []}
    answers = set()
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        line = []
        for mode in order:
            out, secs, mib = run(bin_, lake, cfg, mode, COUNT, timed=True)
            answers.add(out.strip().splitlines()[-1])
            times[mode].append(secs)
            rss[mode].append(mib)
            line.append(f"{'stored' if mode else 'all'} {secs:.2f} s {mib:.0f} MiB")
        print(f"round {r}: " + ", ".join(line), flush=True)
    if len(answers) != 1:
        raise SystemExit(f"the two readers disagree on count(*): {answers}")
    agree = {}
    for name, sql in (("lease_timeline", TIMELINE), ("lease_violations", VIOLATIONS)):
        a, _, _ = run(bin_, lake, cfg, True, sql)
        b, _, _ = run(bin_, lake, cfg, False, sql)
        rows = a.count("\n") - 1
        same = hashlib.sha256(a.encode()).digest() == hashlib.sha256(b.encode()).digest()
        agree[name] = {"rows": rows, "identical": same}
        print(f"{name}: {rows:,} rows, identical from both readers: {same}")
        if not same:
            raise SystemExit(f"{name} differs between the readers")
    med = {m: statistics.median(times[m]) for m in times}
    med_rss = {m: statistics.median(rss[m]) for m in rss}
    print(
        f"count(*) FROM lease_timeline ({answers.pop()} grants): "
        f"stored median {med[True]:.2f} s, peak RSS median {med_rss[True]:.0f} MiB; "
        f"every event median {med[False]:.2f} s, {med_rss[False]:.0f} MiB; "
        f"time ratio stored/all {med[True] / med[False]:.2f}, RSS ratio {med_rss[True] / med_rss[False]:.2f}"
    )
    print(json.dumps({"stored_s": times[True], "all_s": times[False],
                      "stored_rss_mib": rss[True], "all_rss_mib": rss[False], "agree": agree}))


if __name__ == "__main__":
    main()
