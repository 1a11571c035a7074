#!/usr/bin/env python3
"""Each query of docs/incident-queries.md over HTTP and over PostgreSQL,
against one `leaseline serve` (no ingest) on an existing lake: the same
query, the same process, one surface after the other. Prints the median
seconds of RUNS runs per query and surface, so that a query one surface
plans differently from the other stands out.

Usage: scripts/bench_surfaces.py --lake DIR [--config FILE] [--runs 3]
           [--lease orders/00004] [--now 2026-11-01T00:10:00Z] BIN

Every query runs once over HTTP first, so that both surfaces read the
audit's tables from the cache. PostgreSQL is psycopg 3, one connection,
the extended protocol (as Grafana's and most drivers' queries are).
"""
import argparse
import http.client
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_incident_queries import serve  # noqa: E402
from bench_load import incident_queries  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lake", required=True)
    ap.add_argument("--config")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lease", default="orders/00004")
    ap.add_argument("--now", default="2026-11-01T00:10:00Z")
    ap.add_argument("bin")
    args = ap.parse_args()
    import psycopg

    proc, api, pg_port = serve(args.bin, args.lake, args.config, pg=True)
    try:
        doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "incident-queries.md")
        queries = incident_queries(doc, args.lease, "TIMESTAMP '%s'" % args.now)
        host, port = api.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        pg = psycopg.connect(host="127.0.0.1", port=pg_port, user="leaseline", dbname="leaseline",
                             sslmode="disable", autocommit=True)

        def over_http(sql):
            conn.request("POST", "/api/v1/sql", body=sql.encode(),
                         headers={"Content-Type": "text/plain", "Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                sys.exit("HTTP %d: %s" % (resp.status, body[:300]))

        def over_pg(sql):
            with pg.cursor() as cur:
                cur.execute(sql)
                cur.fetchall()

        for _, sql in queries:
            over_http(sql)
        print("| query | HTTP s | PostgreSQL s |\n|---|---|---|")
        for title, sql in queries:
            medians = []
            for run in (over_http, over_pg):
                times = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    run(sql)
                    times.append(time.perf_counter() - t)
                medians.append(statistics.median(times))
            print("| %s | %.3f | %.3f |" % (title, medians[0], medians[1]), flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
