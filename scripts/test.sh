#!/usr/bin/env bash
# Runs every test of leaseline on this machine, installing what the tests
# need when it is missing:
#   - tansu, the Kafka-protocol broker the ingest tests start (each test
#     starts its own on a free loopback port with memory:// storage and
#     stops it when done), built once with cargo and kept in ~/.cargo/bin;
#   - DuckDB for Python, to read the lake back with another engine;
#   - PostgreSQL (Debian's postgresql): the `watch postgres` test starts a
#     server of its own on a free loopback port;
#   - ZooKeeper (Debian's zookeeper, and its Java runtime): the `watch
#     zookeeper` test starts a standalone server of its own and zkCli;
#   - curl and psql (Debian's postgresql-client), the clients of the HTTP
#     and PostgreSQL-protocol tests of `leaseline serve`, and the openssl
#     command, which makes the TLS tests' certificates and reads the one
#     served;
#   - Prometheus, promtool and Alertmanager (Debian's prometheus and
#     prometheus-alertmanager): the alert tests start an Alertmanager and a
#     Prometheus of their own on free loopback ports, and run promtool on
#     the shipped rules;
#   - the jsonschema package for Python, which checks
#     docs/lease-event.schema.json against the decoder;
#   - psycopg for Python, the client whose cancel request the PostgreSQL
#     tests send;
#   - the OpenTelemetry SDK for Python (opentelemetry-sdk and its OTLP/HTTP
#     exporter), the real OTLP client of the log intake tests;
#   - the bcrypt package for Python: the alert tests put Alertmanager
#     behind basic auth (bcrypt-hashed in its web configuration) and TLS
#     with certificates of a private CA made with the openssl command.
# Before any of that it makes sure the build itself can run (README.md,
# "Building"): Rust at least the workspace's rust-version, which it cannot
# install, and the Debian packages of a C toolchain, pkg-config, the OpenSSL
# and zlib headers, Python 3 with pip, and protoc with the protobuf
# well-known types (etcd-client's build), which it installs when missing.
# Anything it cannot provide stops it with one line naming what to install,
# and exit status 2.
# Usage: scripts/test.sh [extra cargo test args]
#   LEASELINE_TEST_PREREQS_ONLY=1 scripts/test.sh   only the build prerequisites
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
# Debian 12 and later refuse `pip install` outside a virtualenv (PEP 668);
# the test machine's Python is meant to carry these test tools. Older pips
# ignore the variable.
export PIP_BREAK_SYSTEM_PACKAGES=1

die() {
  echo "scripts/test.sh: $*" >&2
  exit 2
}

# Installs Debian packages as root, or through sudo when there is one.
apt_install() {
  local sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo: install the Debian packages $* first"
    sudo_cmd="sudo"
  fi
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install the equivalents of the Debian packages $* first"
  echo "== installing $* =="
  $sudo_cmd apt-get update -qq || die "apt-get update failed; install the Debian packages $* first"
  # --no-install-recommends: the services are started by the tests, not
  # by the package (and not as system services).
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "$@" ||
    die "apt-get install failed; install the Debian packages $* first"
}

# Succeeds when every python package NAME==VERSION given is installed at
# that version.
pins_installed() {
  python3 - "$@" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name) == want, pin
PY
}

# Succeeds when dotted version $1 is at least $2.
version_at_least() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

# --- Build prerequisites ---------------------------------------------------
# Rust comes from rustup, not Debian (whose rustc is older than the
# workspace needs), so it is only checked.
rust_min=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)
command -v cargo >/dev/null 2>&1 && command -v rustc >/dev/null 2>&1 ||
  die "cargo and rustc not found: install Rust $rust_min or newer with rustup (https://rustup.rs)"
rust_have=$(rustc --version | awk '{print $2}')
version_at_least "${rust_have%%-*}" "$rust_min" ||
  die "rustc $rust_have is older than the workspace's rust-version $rust_min: rustup update stable"

# One Debian package per missing piece. A C compiler and make build
# librdkafka (rdkafka-sys runs its configure script and make; no cmake),
# zstd, ring and psm; openssl-sys links the system OpenSSL, found by
# pkg-config, for rdkafka's `ssl` feature; librdkafka links zlib.
build_missing() {
  command -v cc >/dev/null 2>&1 || echo build-essential
  command -v make >/dev/null 2>&1 || echo build-essential
  command -v pkg-config >/dev/null 2>&1 || echo pkg-config
  pkg-config --exists openssl 2>/dev/null || echo libssl-dev
  pkg-config --exists zlib 2>/dev/null || echo zlib1g-dev
  command -v python3 >/dev/null 2>&1 || echo python3
  python3 -m pip --version >/dev/null 2>&1 || echo python3-pip
  # etcd-client's build script compiles etcd's .proto files with protoc,
  # which needs the well-known types (google/protobuf/*.proto).
  command -v protoc >/dev/null 2>&1 || echo protobuf-compiler
  [ -f /usr/include/google/protobuf/descriptor.proto ] || echo libprotobuf-dev
}
build_need=$(build_missing | sort -u | paste -sd ' ')
if [ -n "$build_need" ]; then
  # shellcheck disable=SC2086 # one word per package
  apt_install $build_need
  still=$(build_missing | sort -u | paste -sd ' ')
  [ -z "$still" ] || die "still missing after apt-get: the Debian packages $still"
fi
echo "== build prerequisites: rustc $rust_have (>= $rust_min), cc, make, pkg-config, OpenSSL, zlib, python3 with pip, protoc =="
if [ "${LEASELINE_TEST_PREREQS_ONLY:-0}" = 1 ]; then
  exit 0
fi

# --- Test tools --------------------------------------------------------------
# tansu builds beside the tests' own build: each leaves a core idle at
# times (single-threaded crates, linking), so together they finish sooner.
tansu_pid=
tansu_log=
if ! command -v tansu >/dev/null 2>&1; then
  echo "== installing tansu (Kafka-protocol broker) in the background =="
  tansu_log=$(mktemp)
  cargo install tansu --locked --features dynostore >"$tansu_log" 2>&1 &
  tansu_pid=$!
fi

# Independent readers of the lake's Delta tables, pinned together (the
# DuckDB extensions are built for one DuckDB release), and moto's S3 server
# for lakes on object storage.
lake_readers=(duckdb==1.4.4 duckdb-ext-delta==1.4.4.20260205 duckdb-ext-httpfs==1.4.4.20260205 deltalake==1.6.6 polars==2.1.0 moto==5.2.1)
if ! pins_installed "${lake_readers[@]}"; then
  echo "== installing the lake's other readers for python: ${lake_readers[*]} =="
  python3 -m pip install --quiet --disable-pip-version-check "${lake_readers[@]}" 'moto[server]==5.2.1'
fi

if ! python3 -c "import psycopg" >/dev/null 2>&1; then
  echo "== installing psycopg for python =="
  python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]'
fi

# The OpenTelemetry Python SDK, a real OTLP/HTTP client of `serve --otlp-logs`
# and the encoder of the Collector's otlp_proto Kafka messages.
otel_sdk=(opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2)
if ! pins_installed "${otel_sdk[@]}"; then
  echo "== installing the OpenTelemetry SDK for python: ${otel_sdk[*]} =="
  python3 -m pip install --quiet --disable-pip-version-check "${otel_sdk[@]}"
fi

if ! python3 -c "import jsonschema" >/dev/null 2>&1; then
  echo "== installing jsonschema for python =="
  python3 -m pip install --quiet --disable-pip-version-check jsonschema
fi

if ! python3 -c "import bcrypt" >/dev/null 2>&1; then
  echo "== installing bcrypt for python =="
  python3 -m pip install --quiet --disable-pip-version-check bcrypt
fi

missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v prlimit >/dev/null 2>&1 || missing+=(util-linux)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
# `watch redis` tests start their own redis-server and drive it with
# redis-cli (redis-tools, which redis-server depends on).
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# `watch postgres` tests run their own initdb and postgres (Debian's
# postgresql, the server binaries in /usr/lib/postgresql/<version>/bin), as
# the postgres user that the package creates when the test runs as root;
# setpriv (util-linux, above) switches to it.
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
# `watch etcd` tests start their own etcd and take locks with etcdctl.
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
# `watch zookeeper` tests start their own standalone ZooKeeper and zkCli
# from the jar of Debian's ZooKeeper (zookeeperd pulls it in with a Java
# runtime; its system service is not used).
{ [ -f /usr/share/java/zookeeper.jar ] && [ -f /etc/init.d/zookeeper ] && command -v java >/dev/null 2>&1; } || missing+=(zookeeperd)
if [ ${#missing[@]} -gt 0 ]; then
  # shellcheck disable=SC2046 # one word per package
  apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
fi

# A run from a clean checkout gains nothing from incremental state, and
# that state roughly doubles the disk a cold build takes (CI once ran out
# of space mid-build). Set CARGO_INCREMENTAL=1 to keep it between runs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Say how much disk there is before the build, so a build that dies of a
# full disk is recognised as such from the log.
df -h . 2>/dev/null | tail -n 1 | awk '{print "== disk: " $4 " free on " $6 " =="}' || true

echo "== cargo test: build =="
cargo test --workspace --no-fail-fast --no-run
if [ -n "$tansu_pid" ]; then
  echo "== waiting for tansu =="
  if ! wait "$tansu_pid"; then
    tail -n 50 "$tansu_log" >&2
    die "cargo install tansu failed (its log is above)"
  fi
  rm -f "$tansu_log"
fi

echo "== cargo test =="
cargo test --workspace --no-fail-fast "$@"
