#!/usr/bin/env bash
# lease_timeline over a 10-million-event lake against DuckDB computing the
# same grants table with window functions (same files, same run), and the
# lease_holders lookup latency of `leaseline serve` on that lake.
# Usage: scripts/bench-timeline.sh [EVENTS] [ROUNDS] [LOOKUPS] [LAKE_DIR]
# The lake is built once (simulator -> import) and kept in LAKE_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-10000000}
rounds=${2:-5}
lookups=${3:-500}
lake=${4:-target/bench-lake-$events}
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -c "import duckdb, deltalake, pytz" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check duckdb deltalake pytz
cargo build --release -p leaseline --bin leaseline
bin=target/release/leaseline
if [ ! -d "$lake/lease_events/_delta_log" ]; then
  rm -rf "$lake"
  # 20,000 leases, 3 holders each, 6 s TTL; keepalive blips, crashes
  # (forced expiries) and pauses (rejected stale writes) as in production.
  /usr/bin/time -f "lake built in %e s, import peak RSS %M KiB" sh -c \
    "$bin simulate --seed 7 --leases 20000 --events $events --start 2026-11-01T00:00:00Z \
       --blip 0.002 --crash 0.001 --pause 0.0005 \
     | LEASELINE_LOG=warn $bin import --lake '$lake' - >/dev/null"
  # One file per day partition and flush, as a long-running ingester leaves them
  # after compaction.
  LEASELINE_LOG=warn $bin compact --lake "$lake"
fi
python3 scripts/bench_timeline.py "$bin" "$lake" "$rounds" "$lookups"
