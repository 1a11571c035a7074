#!/usr/bin/env python3
"""Reads one table of a leaseline lake with engines other than leaseline
(the Python `deltalake` package, polars, DuckDB's delta extension) and,
given the leaseline binary, with `leaseline sql`; prints, per reader, the
row count and a checksum of the rows' content as one JSON object.

Every reader goes through the Delta log only: none knows leaseline's file
layout. The checksum is a SHA-256 over the sorted rows of a few columns,
each written as text the same way by every reader, so equal checksums mean
the same rows.

For lease_context (not an SQL table of leaseline's), it says how many
cuts of one lease the table holds at most ("cuts_per_lease").

For the stored audit tables (lease_timeline, lease_violations), which hold
only the settled rows of what `leaseline sql` answers, it also says
whether the stored rows are among leaseline's, none twice ("within").

Usage: lake_readers.py [--leaseline BIN] LAKE TABLE
LAKE may be a directory or an s3:// URL (credentials and endpoint from the
AWS_* environment, as leaseline takes them).
"""
import argparse
import csv
import glob
import hashlib
import io
import json
import os
import subprocess
import sys

import duckdb
import polars as pl
from deltalake import DeltaTable, QueryBuilder

# The columns each checksum covers; timestamps as epoch microseconds.
COLUMNS = {
    "lease_events": ["event_id", "lease_id", "kind", "holder_id", "ts", "fencing_token", "max_token"],
    "lease_rejects": ["reason", "kafka_topic", "kafka_partition", "kafka_offset", "file_path", "file_line", "ingested_at"],
    "lease_alerts": ["alertname", "lease_id", "state", "starts_at", "recorded_at", "notified"],
    "lease_timeline": ["lease_id", "fencing_token", "holder_id", "acquired_at", "ended_at", "end_kind", "renewals"],
    "lease_violations": ["kind", "lease_id", "fencing_token", "at", "other_fencing_token"],
    "lease_context": ["lease_id", "event_id", "settled_before"],
}
TIMES = {"ts", "ingested_at", "starts_at", "recorded_at", "acquired_at", "ended_at", "at",
         "settled_before"}
# Tables leaseline's SQL does not serve (the audit's own bookkeeping).
UNSERVED = {"lease_context"}
# The stored audit tables hold the settled rows only; leaseline's SQL
# table of that name holds every row, so the stored rows must be a part of
# it, each once.
STORED = {"lease_timeline", "lease_violations"}
NULL = "\\N"


def checksum(rows):
    h = hashlib.sha256()
    for r in sorted(rows):
        h.update("\x1f".join(r).encode())
        h.update(b"\x1e")
    return {"rows": len(rows), "checksum": h.hexdigest()}


def text(v):
    if v is None:
        return NULL
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def table_uri(lake, table):
    return lake.rstrip("/") + "/" + table


def storage_options():
    opts = {k.lower(): v for k, v in os.environ.items() if k.startswith("AWS_")}
    if "aws_endpoint" in opts:
        opts.setdefault("aws_endpoint_url", opts["aws_endpoint"])
    return opts


def polars_rows(df, cols):
    exprs = []
    for c in cols:
        e = pl.col(c)
        if c in TIMES:
            e = e.dt.epoch("us")
        if df.schema[c] == pl.Boolean:
            e = pl.when(e).then(pl.lit("true")).otherwise(pl.lit("false"))
        exprs.append(e.cast(pl.Utf8).fill_null(NULL).alias(c))
    return [tuple(r) for r in df.select(exprs).iter_rows()]


def with_deltalake(lake, table, cols):
    dt = DeltaTable(table_uri(lake, table), storage_options=storage_options() or None)
    sel = ", ".join(cols)
    reader = QueryBuilder().register("t", dt).execute(f"SELECT {sel} FROM t")
    df = pl.DataFrame(reader.read_all())
    return polars_rows(df, cols)


def with_polars(lake, table, cols):
    df = pl.read_delta(table_uri(lake, table), storage_options=storage_options() or None)
    return polars_rows(df, cols)


def duckdb_extension_dir():
    for base in sys.path:
        for found in glob.glob(os.path.join(base, "duckdb_ext", "extensions")):
            return found
    raise SystemExit("duckdb-ext-delta is not installed (scripts/test.sh installs it)")


def with_duckdb(lake, table, cols):
    con = duckdb.connect(config={"extension_directory": duckdb_extension_dir(),
                                 "autoinstall_known_extensions": False})
    con.execute("LOAD delta")
    if lake.startswith("s3://"):
        o = storage_options()
        endpoint = o.get("aws_endpoint", "").split("://")[-1]
        con.execute("LOAD httpfs")
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
            [o.get("aws_access_key_id", ""), o.get("aws_secret_access_key", ""),
             o.get("aws_region", "us-east-1"), endpoint],
        )
    exprs = []
    for c in cols:
        # Quoted: `at` is a keyword of DuckDB's.
        e = f'epoch_us("{c}")' if c in TIMES else f'"{c}"'
        exprs.append(f"coalesce(CAST({e} AS VARCHAR), '{NULL}')")
    q = f"SELECT {', '.join(exprs)} FROM delta_scan(?)"
    rows = con.execute(q, [table_uri(lake, table)]).fetchall()
    return [tuple(r) for r in rows]


def with_leaseline(binary, lake, table, cols):
    exprs = []
    for c in cols:
        # A timestamp's value is microseconds since the epoch.
        e = f"CAST({c} AS BIGINT)" if c in TIMES else c
        exprs.append(f"coalesce(CAST({e} AS VARCHAR), '{NULL}') AS {c}")
    q = f"SELECT {', '.join(exprs)} FROM {table}"
    out = subprocess.run(
        [binary, "sql", "--lake", lake, "--format", "csv", q],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = list(csv.reader(io.StringIO(out)))[1:]
    return [tuple(r) for r in rows]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--leaseline")
    p.add_argument("lake")
    p.add_argument("table")
    a = p.parse_args()
    cols = COLUMNS[a.table]
    result = {
        "deltalake": checksum(with_deltalake(a.lake, a.table, cols)),
        "polars": checksum(with_polars(a.lake, a.table, cols)),
        "duckdb": checksum(with_duckdb(a.lake, a.table, cols)),
    }
    if a.table == "lease_context":
        # A lease's context is read at its latest cut only: how many cuts
        # of one lease the table still holds.
        from collections import defaultdict
        cuts = defaultdict(set)
        for r in with_deltalake(a.lake, a.table, cols):
            cuts[r[0]].add(r[2])
        result["cuts_per_lease"] = max((len(c) for c in cuts.values()), default=0)
    if a.leaseline and a.table not in UNSERVED:
        theirs = with_leaseline(a.leaseline, a.lake, a.table, cols)
        result["leaseline"] = checksum(theirs)
        if a.table in STORED:
            from collections import Counter
            stored = Counter(with_deltalake(a.lake, a.table, cols))
            answered = Counter(theirs)
            result["within"] = all(n <= answered[r] for r, n in stored.items()) and all(
                n == 1 for n in stored.values()
            )
            result["stored_leases"] = sorted({r[cols.index("lease_id")] for r in stored})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
