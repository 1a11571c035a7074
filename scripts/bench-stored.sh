#!/usr/bin/env bash
# The audit's tables read from the lake's stored audit rows against an
# audit of every event (BENCHMARKS.md), on a lake built the way production
# builds it: the simulator's fleet (20,000 leases, 3 holders each, 6 s TTL,
# faults on) is produced to a tansu topic, and `serve --ingest` consumes it
# with `audit.event_window = WINDOW`, storing its settled rows. It is
# stopped as soon as every event is committed, while the last WINDOW of
# event time is still unsettled, as it is in a live run. Then
# scripts/bench_stored.py times fresh `leaseline sql` processes on that
# lake with `audit.read_stored` true and false, and
# scripts/bench_timeline.py compares lease_timeline with DuckDB.
#
# serve's log and its RSS samples are kept next to the lake, as
# bench-stored-EVENTS-WINDOW.serve.log and .rss.csv.
#
# Usage: scripts/bench-stored.sh [EVENTS] [WINDOW] [ROUNDS] [LAKE]
#   EVENTS  size of the history (default 10000000; the fleet emits about
#           29,000 events per second of event time)
#   WINDOW  audit.event_window of the writer and the readers (default 1m)
#   ROUNDS  timed runs of each reader (default 5; 0 builds the lake only)
#   LAKE    where the lake is built once and kept
#           (default target/bench-stored-EVENTS-WINDOW)
#
# With LEASELINE_HEAP_PROFILE=DIR, serve (and only serve) runs with
# jemalloc's heap profiler and writes profiles of what is live to DIR
# (scripts/bench-broker.sh); read
# two of them with `jeprof --text --base=EARLIER BINARY LATER`.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-10000000}
window=${2:-1m}
rounds=${3:-5}
lake=${4:-target/bench-stored-$events-$window}
. scripts/bench-broker.sh
bench_prepare duckdb deltalake pytz
trap 'kill ${serve_pid:-} ${tansu_pid:-} 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$lake"
cfg=$(realpath "$lake")/../bench-stored-$events-$window.toml
# The watermark must follow the events only: a topic read to its end would
# otherwise let the wall clock move it past the history after 10 s.
printf '[audit]\nevent_window = "%s"\n[alerts]\npartition_idle_timeout = "1h"\n' "$window" >"$cfg"

# Where the newest settle of the audit cut, in ms (0 before the first).
settled_ms() {
  python3 - "$work/serve.log" <<'PY'
import re, sys, datetime
cut = 0
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"settled the audit.* before=(\S+)", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        cut = int(t.timestamp() * 1000)
print(cut)
PY
}

if [ ! -d "$lake/lease_events/_delta_log" ]; then
  start_broker
  "$bin" simulate --seed 7 --leases 20000 --events "$events" --start 2026-11-01T00:00:00Z \
    --blip 0.002 --crash 0.001 --pause 0.0005 --double-grant 0.0002 --output "$work/fleet.ndjson" 2>/dev/null
  "$target"/release/examples/bench_load "127.0.0.1:$port" stored-leases "$work/fleet.ndjson" 1 |
    tee "$work/fill.json"
  rm "$work/fleet.ndjson"
  # Live, the audit settles up to the watermark (the newest event less the
  # 30 s lateness) less the window, every half window: once it has settled
  # that close to the history's end, the lake is as a live run leaves it.
  window_ms=$(python3 -c 'import sys; v=sys.argv[1]; u={"s":1,"m":60,"h":3600}[v[-1]]; print(int(float(v[:-1])*u*1000))' "$window")
  last_ms=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["last_ts_ms"])' "$work/fill.json")
  target_ms=$((last_ms - 30000 - window_ms * 3 / 2 - 5000))
  start=$(date +%s.%N)
  # Partitions read in step (kafka.max_drift): without it, serve reading
  # this backlog holds minutes of events past its watermark. On tansu each
  # resume loses the rest of a record batch (docs/configuration.md), a few
  # thousand of the 50 M events; serve logs each gap.
  env "${profile_env[@]}" LEASELINE_LOG=info LEASELINE_KAFKA_MAX_DRIFT=30s "$bin" serve --config "$cfg" --lake "$lake" --ingest \
    --brokers "127.0.0.1:$port" --topic stored-leases --group-id bench-stored \
    --http-listen 127.0.0.1:0 --no-pg >"$work/serve.log" 2>&1 &
  serve_pid=$!
  # RSS against events committed, every 2 s, for the memory curve
  # (docs/serve-rss.png is drawn from such a file by scripts/plot_rss.py).
  rss_csv=$(realpath "$lake")/../bench-stored-$events-$window.rss.csv
  # allocated_mib: what the process's data holds (jemalloc's count), so
  # that a rising RSS can be told apart as data or as the allocator's.
  # resident_mib: the pages jemalloc holds in RAM, its own included; RSS
  # beyond it is memory jemalloc does not manage (librdkafka's and other C
  # libraries' allocations through the system malloc, thread stacks).
  # lag_spread: the largest less the smallest of the partitions' lags, in
  # messages; the partitions carry the same rate of event time, so a
  # spread is a watermark held back by the partition read slowest.
  echo "seconds,events,rss_mib,allocated_mib,lag_spread,resident_mib" >"$rss_csv"
  (
    until api=$(grep -o 'HTTP API listening on http://[0-9.:]*' "$work/serve.log" | sed 's|.*http://||'); do sleep 0.2; done
    t0=$(date +%s.%N)
    while kill -0 "$serve_pid" 2>/dev/null; do
      metrics=$(curl -s "http://$api/metrics")
      n=$(awk '/^leaseline_ingest_events_total/ {s += $2} END {printf "%d", s}' <<<"$metrics")
      allocated=$(awk '/^leaseline_allocator_bytes\{kind="allocated"\}/ {printf "%d", $2 / 1048576}' <<<"$metrics")
      resident=$(awk '/^leaseline_allocator_bytes\{kind="resident"\}/ {printf "%d", $2 / 1048576}' <<<"$metrics")
      spread=$(awk '/^leaseline_ingest_partition_lag\{/ {if (n++ == 0 || $2 > hi) hi = $2; if (n == 1 || $2 < lo) lo = $2} END {printf "%d", hi - lo}' <<<"$metrics")
      rss=$(awk '/VmRSS/ {printf "%d", $2 / 1024}' "/proc/$serve_pid/status" 2>/dev/null) || break
      echo "$(echo "$(date +%s.%N) - $t0" | bc),$n,$rss,$allocated,$spread,$resident" >>"$rss_csv"
      sleep 2
    done
  ) &
  until [ "$(settled_ms)" -ge "$target_ms" ]; do
    kill -0 "$serve_pid" 2>/dev/null || { tail -50 "$work/serve.log"; exit 1; }
    sleep 1
  done
  awk '/VmHWM/ {printf "serve --ingest peak RSS: %d MiB\n", $2 / 1024}' "/proc/$serve_pid/status"
  kill -TERM "$serve_pid"
  wait "$serve_pid" || true
  serve_pid=
  # Kept beside the samples: each settle's line gives the events the audit
  # held then, to read against the RSS curve.
  cp "$work/serve.log" "$(realpath "$lake")/../bench-stored-$events-$window.serve.log"
  echo "lake built by serve --ingest in $(echo "$(date +%s.%N) - $start" | bc) s"
  { grep -c "stored the audit's settled rows" "$work/serve.log" || true; } | sed 's/^/store commits: /'
  grep "settled the audit" "$work/serve.log" | tail -1
  grep "settled the audit" "$work/serve.log" | sed 's/.*events_held=//' | sort -n | tail -1 |
    sed 's/^/most events held after a settle: /'
  kill "$tansu_pid"
fi
# ROUNDS 0 builds the lake only.
[ "$rounds" -gt 0 ] || exit 0
python3 scripts/bench_stored.py "$bin" "$lake" "$cfg" "$rounds"
LEASELINE_CONFIG=$cfg python3 scripts/bench_timeline.py "$bin" "$lake" "$rounds" 0
