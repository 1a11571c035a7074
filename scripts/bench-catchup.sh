#!/usr/bin/env bash
# Catching up a backlog with alerts on, against ingest with alerting off, on
# one topic in one run (tansu on loopback); every alert of `check FILE` must
# be sent and no other.
# Usage: scripts/bench-catchup.sh [EVENTS] [ROUNDS] [debug|release]
#   EVENTS: about how many events the simulated history holds (default
#   1000000, over about ten minutes of event time).
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-1000000}
rounds=${2:-3}
profile=${3:-release}
export PATH="$HOME/.cargo/bin:$PATH"
command -v tansu >/dev/null || cargo install tansu --locked --features dynostore
if [ "$profile" = release ]; then
  cargo build --release -p leaseline --bin leaseline --example bench_catchup
else
  # The test build's profile and features: nothing to rebuild after scripts/test.sh.
  cargo test --workspace --no-run >/dev/null 2>&1
fi
dir=target/$profile
work=$(mktemp -d)
. scripts/bench-broker.sh
trap 'kill ${tansu_pid:-} 2>/dev/null; rm -rf "$work"' EXIT
start_broker
# Faults on; a lease makes about 1.3 events a second, so EVENTS/800 leases
# make EVENTS events in about ten minutes of event time.
"$dir/leaseline" simulate --seed 11 --start 2026-11-01T00:00:00Z --leases $((events / 800)) \
  --events "$events" --crash 0.02 --pause 0.02 --double-grant 0.01 --late-fence 0.01 \
  --output "$work/history.ndjson" >/dev/null
"$dir/examples/bench_catchup" "127.0.0.1:$port" "$dir/leaseline" "$work" "$work/history.ndjson" "$rounds"
