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
. scripts/bench-broker.sh
trap 'kill ${tansu_pid:-} 2>/dev/null; rm -rf "$work"' EXIT
start_broker
target/release/examples/bench_ingest "127.0.0.1:$port" "$events" "$rounds" target/release/leaseline "$work"
