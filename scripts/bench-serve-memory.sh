#!/usr/bin/env bash
# `serve --ingest` catching up a backlog from Kafka (tansu on loopback) with
# its audit keeping a window of event time as events (audit.event_window,
# the default 10m) against keeping every event ("0s"), one after the other
# on the same topic: the time until every alert `check FILE` finds is sent,
# and the process's peak RSS then. Each run must send exactly those alerts.
# Usage: scripts/bench-serve-memory.sh [EVENTS...] [-- debug|release]
#   EVENTS: sizes of the history (default 1000000 3000000); 200 leases, so
#   a million events cover about 54 minutes of event time.
source "$(dirname "$0")/bench-common.sh"
dir=$(dirname "$bin")
if [ "$profile" = release ]; then
  cargo build --release -p leaseline --example bench_catchup
fi
command -v tansu >/dev/null || cargo install tansu --locked --features dynostore
. scripts/bench-broker.sh
trap 'kill ${tansu_pid:-} 2>/dev/null; rm -rf "$work"' EXIT
for n in "${sizes[@]}"; do
  mkdir "$work/$n"
  "$bin" simulate --seed 7 --leases 200 --events "$n" --start 2026-09-14T00:00:00Z \
    --crash 0.01 --double-grant 0.005 --output "$work/$n/history.ndjson" >/dev/null 2>&1
  kill "${tansu_pid:-}" 2>/dev/null || true
  start_broker
  "$dir/examples/bench_catchup" "127.0.0.1:$port" "$bin" "$work/$n" "$work/$n/history.ndjson" 1 10m,0s
done
