#!/usr/bin/env python3
"""Counts a table's rows in a leaseline lake with DuckDB, reading the files
the newest manifest names: proof that the lake is plain Parquet any engine
can read. Usage: lake_count.py LAKE_DIR TABLE"""
import glob, json, os, sys

import duckdb

lake, table = sys.argv[1], sys.argv[2]
manifests = sorted(glob.glob(os.path.join(lake, "_manifest", "*.json")))
if not manifests:
    print(0)
    sys.exit(0)
with open(manifests[-1]) as f:
    m = json.load(f)
files = [os.path.join(lake, x["path"]) for x in m["files"] if x["table"] == table]
if not files:
    print(0)
    sys.exit(0)
con = duckdb.connect()
n = con.execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone()[0]
# The schema version travels in every file's key-value metadata.
meta = con.execute(
    "SELECT DISTINCT decode(value) FROM parquet_kv_metadata(?) WHERE decode(key) = 'leaseline.schema_version'",
    [files],
).fetchall()
assert meta == [("1",)], meta
print(n)
