#!/usr/bin/env bash
# Time from producing an event to Kafka until Alertmanager lists its alert,
# p50 and p99 over ALERTS alerts (default 200): tansu, Debian's
# Alertmanager and `leaseline serve --ingest` on loopback.
# Usage: scripts/bench-alert-latency.sh [ALERTS] [debug|release]
set -euo pipefail
cd "$(dirname "$0")/.."
alerts=${1:-200}
profile=${2:-debug}
export PATH="$HOME/.cargo/bin:$PATH"
command -v tansu >/dev/null || cargo install tansu --locked --features dynostore
if [ "$profile" = release ]; then
  cargo build --release -p leaseline --bin leaseline --example bench_alert_latency
else
  # The test build's profile and features: nothing to rebuild after scripts/test.sh.
  cargo test --workspace --no-run >/dev/null 2>&1
fi
dir=target/$profile
work=$(mktemp -d)
. scripts/bench-broker.sh
trap 'kill ${tansu_pid:-} ${am_pid:-} 2>/dev/null; rm -rf "$work"' EXIT
start_broker
kport=$port; aport=$(free_port)
printf 'route:\n  receiver: devnull\n  group_wait: 1s\nreceivers:\n  - name: devnull\n' >"$work/am.yml"
prometheus-alertmanager --config.file="$work/am.yml" --storage.path="$work/am" \
  --web.listen-address="127.0.0.1:$aport" --cluster.listen-address= >"$work/am.log" 2>&1 &
am_pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$aport/-/ready" >/dev/null && break; sleep 0.1; done
"$dir/examples/bench_alert_latency" "127.0.0.1:$kport" "http://127.0.0.1:$aport" "$dir/leaseline" "$work" "$alerts"
