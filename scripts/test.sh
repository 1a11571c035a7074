#!/usr/bin/env bash
# Runs every test of leaseline on this machine, installing what the tests
# need when it is missing:
#   - tansu, the Kafka-protocol broker the ingest tests start (each test
#     starts its own on a free loopback port with memory:// storage and
#     stops it when done), built once with cargo and kept in ~/.cargo/bin;
#   - DuckDB for Python, to read the lake back with another engine;
#   - curl and psql (Debian's postgresql-client), the clients of the HTTP
#     and PostgreSQL-protocol tests of `leaseline serve`.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

if ! command -v tansu >/dev/null 2>&1; then
  echo "== installing tansu (Kafka-protocol broker) =="
  cargo install tansu --locked --features dynostore
fi

if ! python3 -c "import duckdb" >/dev/null 2>&1; then
  echo "== installing duckdb for python =="
  python3 -m pip install --quiet --disable-pip-version-check duckdb
fi

missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} =="
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

echo "== cargo test =="
cargo test --workspace --no-fail-fast "$@"
