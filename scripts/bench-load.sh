#!/usr/bin/env bash
# Load test: `leaseline serve --ingest` consuming a pre-filled topic at full
# rate while 8 HTTP and 8 PostgreSQL clients run docs/incident-queries.md in
# a loop and a runaway query comes every 30 s, against the same run with no
# queries (same broker, topic, events and serve flags). Prints and writes
# ingest throughput with and without queries, query latency p50/p99 per
# query and surface, errors, and the serve process's peak RSS; draws
# docs/load-test.png. See BENCHMARKS.md.
#
# Usage: scripts/bench-load.sh [SECONDS] [TOPIC_EVENTS]
#   SECONDS       length of each phase (default 300; 30 for a smoke test)
#   TOPIC_EVENTS  events to pre-fill (default: 40 million, or 2 million
#                 when SECONDS is under 60); the whole run must not drain it,
#                 which the script checks. The baseline's serve ingests on
#                 for half a phase more, for the memory budget (the load
#                 phase's peak against the baseline's at as many events):
#                 at 100 k events/s a 300 s run needs 45 million
# Environment: LEASELINE_BENCH_POOL (--query-memory-pool-bytes, default
# 1GiB), LEASELINE_BENCH_OUT (results JSON, default target/bench-load.json),
# LEASELINE_BENCH_PNG (default docs/load-test.png), LEASELINE_BENCH_BIN (the
# leaseline binary serve runs, default the release build made here: set it
# to compare two builds on the same machine, one run after the other).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
if [ "$seconds" -lt 60 ]; then default_events=2000000; else default_events=40000000; fi
topic_events=${2:-$default_events}
pool=${LEASELINE_BENCH_POOL:-1GiB}
out=${LEASELINE_BENCH_OUT:-target/bench-load.json}
png=${LEASELINE_BENCH_PNG:-docs/load-test.png}
. scripts/bench-broker.sh
bench_prepare "psycopg=psycopg[binary]" matplotlib
bin=${LEASELINE_BENCH_BIN:-$bin}
trap 'kill ${tansu_pid:-} 2>/dev/null; rm -rf "$work"' EXIT
start_broker

# One simulated fleet of 20,000 leases (3 holders each, 6 s TTL) with the
# faults of production: keepalive blips, crashes (forced expiries), pauses
# (rejected stale writes) and a few double grants (violations to explain).
per_copy=2000000
$bin simulate --seed 7 --leases 20000 --events $per_copy --start 2026-11-01T00:00:00Z \
  --blip 0.002 --crash 0.001 --pause 0.0005 --double-grant 0.0002 --output "$work/fleet.ndjson"
copies=$(( (topic_events + per_copy - 1) / per_copy ))
"$target"/release/examples/bench_load "127.0.0.1:$port" load-leases "$work/fleet.ndjson" "$copies" >"$work/fill.json"
cat "$work/fill.json"
produced=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events"])' "$work/fill.json")
# The lease of the queries is the docs' own when the fleet has it. now() in
# the queries becomes ten minutes of event time after the first event: the
# "last hour" covers everything, the "last 10 minutes" the first ones.
lease=orders/00004
grep -q "\"lease_id\":\"$lease\"" "$work/fleet.ndjson" ||
  lease=$(head -1 "$work/fleet.ndjson" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lease_id"])')
now=$(python3 -c 'import json,sys,datetime as d; t=json.load(open(sys.argv[1]))["first_ts_ms"]/1000+600; print(d.datetime.fromtimestamp(t, d.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))' "$work/fill.json")
rm -f "$work/fleet.ndjson"

mkdir -p "$(dirname "$out")" "$(dirname "$png")"
code=${LEASELINE_BENCH_BIN:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}
label="$(date -u +%Y-%m-%d) $code, $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -1)); \
${seconds} s per phase, ${produced} events in the topic, --query-memory-pool-bytes $pool"
python3 scripts/bench_load.py --bin "$bin" --brokers "127.0.0.1:$port" --topic load-leases \
  --topic-events "$produced" --duration "$seconds" --work "$work" --lease "$lease" --now "$now" \
  --pool "$pool" --json "$out" --png "$png" --label "$label" \
  --broker-pid "$tansu_pid"
echo "results: $out; plot: $png"
