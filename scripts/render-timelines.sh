#!/usr/bin/env bash
# Renders the timeline pictures of docs/audit-and-sql.md from three stories:
#
#   docs/timeline-paused-holder.png  worker-1 stalls past its TTL, the
#       coordinator expires it, worker-2 takes over with token 34 and
#       writes, worker-1 resumes and its write with token 33 is rejected;
#   docs/timeline-double-grant.png   a faulty coordinator grants the lease
#       to b-2 while b-1's grant is still valid (overlapping_ownership);
#   docs/timeline-busy-lease.png     about 200 grants of one simulated lease
#       among three holders, with crashes and pauses.
#
# Each story is imported into a temporary lake and drawn by
# `leaseline timeline ... --svg`, then converted with rsvg-convert.
#
# Usage: scripts/render-timelines.sh [OUT_DIR]   (default: docs)
#        LEASELINE_BIN=path/to/leaseline scripts/render-timelines.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/docs}
mkdir -p "$out"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# LEASELINE_BIN: a binary already built from this checkout, used as is.
bin=$tmp/leaseline
if [ -n "${LEASELINE_BIN:-}" ]; then
  cp "$LEASELINE_BIN" "$bin"
else
  (cd "$root" && cargo build -p leaseline)
  # A copy: a target directory shared with other checkouts may get another
  # build of the binary while this script runs.
  cp "$CARGO_TARGET_DIR/debug/leaseline" "$bin"
fi

if ! command -v rsvg-convert >/dev/null; then
  echo "installing librsvg2-bin for rsvg-convert" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq librsvg2-bin >/dev/null
fi

# One line of NDJSON: TS KIND SOURCE LEASE HOLDER TOKEN [EXTRA JSON MEMBERS].
ev() {
  local extra=${7:+,$7}
  printf '{"ts":"2026-09-14T%sZ","kind":"%s","source":"%s","lease_id":"%s","holder_id":"%s","fencing_token":%s%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$extra"
}

# (a) The paused holder.
lease=orders/order-123
{
  ev 10:00:00.000 acquired coordinator $lease worker-1 33 '"ttl_ms":10000'
  ev 10:00:01.200 write_accepted resource $lease worker-1 33
  ev 10:00:02.400 write_accepted resource $lease worker-1 33
  ev 10:00:03.300 renewed coordinator $lease worker-1 33 '"ttl_ms":10000'
  ev 10:00:03.900 write_accepted resource $lease worker-1 33
  # worker-1 stops the world from 10:00:04.1 to 10:00:18: no keepalive.
  ev 10:00:13.300 expired coordinator $lease worker-1 33
  ev 10:00:13.500 acquired coordinator $lease worker-2 34 '"ttl_ms":10000'
  ev 10:00:14.000 write_accepted resource $lease worker-2 34
  ev 10:00:15.600 write_accepted resource $lease worker-2 34
  ev 10:00:16.800 renewed coordinator $lease worker-2 34 '"ttl_ms":10000'
  ev 10:00:17.300 write_accepted resource $lease worker-2 34
  # worker-1 resumes: its write is refused, then its keepalive.
  ev 10:00:18.000 stale_write_rejected resource $lease worker-1 33 '"max_token":34'
  ev 10:00:18.040 renew_failed holder $lease worker-1 33
  ev 10:00:19.000 write_accepted resource $lease worker-2 34
  ev 10:00:20.100 renewed coordinator $lease worker-2 34 '"ttl_ms":10000'
  ev 10:00:21.500 write_accepted resource $lease worker-2 34
  ev 10:00:23.000 released holder $lease worker-2 34
} >"$tmp/paused-holder.ndjson"

# (b) The double grant.
lease2=pay/acct-9
{
  ev 10:00:00.000 acquired coordinator $lease2 b-1 7 '"ttl_ms":10000'
  ev 10:00:01.500 write_accepted resource $lease2 b-1 7
  ev 10:00:03.300 renewed coordinator $lease2 b-1 7 '"ttl_ms":10000'
  ev 10:00:05.000 acquired coordinator $lease2 b-2 8 '"ttl_ms":10000'
  ev 10:00:05.600 write_accepted resource $lease2 b-2 8
  ev 10:00:06.000 stale_write_rejected resource $lease2 b-1 7 '"max_token":8'
  ev 10:00:06.600 renewed coordinator $lease2 b-1 7 '"ttl_ms":10000'
  ev 10:00:08.300 renewed coordinator $lease2 b-2 8 '"ttl_ms":10000'
  ev 10:00:09.000 released holder $lease2 b-1 7
  ev 10:00:10.100 write_accepted resource $lease2 b-2 8
  ev 10:00:11.600 renewed coordinator $lease2 b-2 8 '"ttl_ms":10000'
  ev 10:00:14.000 released holder $lease2 b-2 8
  ev 10:00:15.000 acquired coordinator $lease2 b-3 9 '"ttl_ms":10000'
  ev 10:00:16.200 write_accepted resource $lease2 b-3 9
  ev 10:00:18.300 renewed coordinator $lease2 b-3 9 '"ttl_ms":10000'
  ev 10:00:20.000 released holder $lease2 b-3 9
} >"$tmp/double-grant.ndjson"

# (c) A busy lease: one simulated lease, about 200 grants.
"$bin" simulate --seed 7 --leases 1 --holders-per-lease 3 --events 3500 \
  --crash 0.03 --pause 0.02 --start 2026-09-14T10:00:00Z \
  --output "$tmp/busy-lease.ndjson" 2>/dev/null

render() {
  local story=$1 lease=$2
  local lake=$tmp/lake-$story
  "$bin" import --lake "$lake" "$tmp/$story.ndjson" >/dev/null
  "$bin" timeline --lake "$lake" "$lease" --svg "$tmp/$story.svg"
  rsvg-convert --background-color=white -o "$out/timeline-$story.png" "$tmp/$story.svg"
  echo "$out/timeline-$story.png"
}

render paused-holder $lease
render double-grant $lease2
# The simulator names its first lease orders/00000.
render busy-lease orders/00000
