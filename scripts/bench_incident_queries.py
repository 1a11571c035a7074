#!/usr/bin/env python3
"""Each query of docs/incident-queries.md, one at a time, against `leaseline
serve` (no ingest) on an existing lake, for one or more leaseline binaries
taking turns: every round starts each binary's serve afresh and runs every
query RUNS times over HTTP. Prints a markdown table of the median seconds
per query and binary, and the ratio of each binary to the first.

Usage: scripts/bench_incident_queries.py --lake DIR [--config FILE]
           [--rounds 2] [--runs 3] [--lease orders/00004]
           [--now 2026-11-01T00:10:00Z] BIN [BIN...]

The first run of a query that reads an audit table includes computing that
audit for the lake's version; later runs read it from the cache, as a
dashboard does.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_load import incident_queries  # noqa: E402


def serve(binary, lake, config, pg=False):
    """Starts `serve` on free loopback ports: the process, its HTTP address
    and, with `pg`, its PostgreSQL port (else None)."""
    env = dict(os.environ, LEASELINE_LOG="info")
    if config:
        env["LEASELINE_CONFIG"] = config
    listen = ["--pg-listen", "127.0.0.1:0"] if pg else ["--no-pg"]
    p = subprocess.Popen([binary, "serve", "--lake", lake, "--http-listen", "127.0.0.1:0"] + listen,
                         env=env, stderr=subprocess.PIPE, text=True)
    api = port = None
    for line in p.stderr:
        m = re.search(r"HTTP API listening on http://([0-9.:]+)", line)
        if m:
            api = m.group(1)
        m = re.search(r"PostgreSQL listening on [0-9.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if api and (port or not pg):
            # serve logs on; a full pipe would stop it.
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, api, port
    raise SystemExit("%s serve exited before listening" % binary)


def run(api, sql):
    req = urllib.request.Request("http://%s/api/v1/sql" % api, data=sql.encode(),
                                 headers={"Content-Type": "text/plain"})
    t = time.perf_counter()
    urllib.request.urlopen(req, timeout=600).read()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lake", required=True)
    ap.add_argument("--config")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lease", default="orders/00004")
    ap.add_argument("--now", default="2026-11-01T00:10:00Z")
    ap.add_argument("bins", nargs="+")
    a = ap.parse_args()
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "incident-queries.md")
    queries = incident_queries(doc, a.lease, "TIMESTAMP '%s'" % a.now)
    times = {}
    for r in range(a.rounds):
        for b in a.bins:
            p, api, _ = serve(b, a.lake, a.config)
            try:
                for title, sql in queries:
                    for _ in range(a.runs):
                        times.setdefault((title, b), []).append(run(api, sql))
            finally:
                p.terminate()
                p.wait()
            print("round %d, %s: done" % (r + 1, b), file=sys.stderr, flush=True)
    first = a.bins[0]
    print("| query | " + " | ".join("%s s" % os.path.basename(b) for b in a.bins) +
          "".join(" | %s / %s" % (os.path.basename(b), os.path.basename(first)) for b in a.bins[1:]) + " |")
    print("|---" * (1 + 2 * len(a.bins) - 1) + "|")
    for title, _ in queries:
        med = [statistics.median(times[(title, b)]) for b in a.bins]
        ratios = ["%.2f" % (m / med[0]) if med[0] >= 0.005 else "–" for m in med[1:]]
        print("| %s | %s |" % (title, " | ".join(["%.2f" % m for m in med] + ratios)))


if __name__ == "__main__":
    main()
