#!/usr/bin/env bash
# Runs every test of leaseline on this machine, installing what the tests
# need when it is missing:
#   - tansu, the Kafka-protocol broker the ingest tests start (each test
#     starts its own on a free loopback port with memory:// storage and
#     stops it when done), built once with cargo and kept in ~/.cargo/bin;
#   - DuckDB for Python, to read the lake back with another engine;
#   - curl and psql (Debian's postgresql-client), the clients of the HTTP
#     and PostgreSQL-protocol tests of `leaseline serve`;
#   - Prometheus, promtool and Alertmanager (Debian's prometheus and
#     prometheus-alertmanager): the alert tests start an Alertmanager and a
#     Prometheus of their own on free loopback ports, and run promtool on
#     the shipped rules.
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
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} =="
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  # --no-install-recommends: the services are started by the tests, not
  # by the package (and not as system services).
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${missing[@]}" | sort -u)
fi

# A run from a clean checkout gains nothing from incremental state, and
# that state roughly doubles the disk a cold build takes (CI once ran out
# of space mid-build). Set CARGO_INCREMENTAL=1 to keep it between runs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Say how much disk there is before the build, so a build that dies of a
# full disk is recognised as such from the log.
df -h . 2>/dev/null | tail -n 1 | awk '{print "== disk: " $4 " free on " $6 " =="}' || true

echo "== cargo test =="
cargo test --workspace --no-fail-fast "$@"
