#!/usr/bin/env bash
# Kafka to durable Parquet against a read-and-discard consumer, same topic,
# same run; plus bytes per event and the ingester's peak RSS.
# Usage: scripts/bench-ingest.sh [EVENTS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-1000000}
rounds=${2:-3}
export PATH="$HOME/.cargo/bin:$PATH"
command -v tansu >/dev/null || cargo install tansu --locked --features dynostore
cargo build --release -p leaseline --bin leaseline --example bench_ingest
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=warn tansu broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
  --storage-engine memory://tansu/ >"$work/tansu.log" 2>&1 &
tansu_pid=$!
trap 'kill $tansu_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
target/release/examples/bench_ingest "127.0.0.1:$port" "$events" "$rounds" target/release/leaseline "$work"
