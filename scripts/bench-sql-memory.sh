#!/usr/bin/env bash
# `leaseline sql`'s peak memory and time on the audit's table
# (`SELECT count(*) FROM lease_timeline`) with its audit keeping a window of
# event time as events (audit.event_window, the default 10m) against keeping
# every event ("0s"), on the same lake, in one run; the two must give the
# same rows of lease_timeline and lease_violations.
# Usage: scripts/bench-sql-memory.sh [EVENTS...] [-- debug|release]
#   EVENTS: sizes of the history (default 1000000 3000000); 200 leases, so
#   a million events cover about 54 minutes of event time.
source "$(dirname "$0")/bench-common.sh"
printf 'events\twindow\tpeak_rss_mib\tseconds\tgrants\n'
for n in "${sizes[@]}"; do
  "$bin" simulate --seed 7 --leases 200 --events "$n" --start 2026-09-14T00:00:00Z \
    --crash 0.01 --double-grant 0.005 --output "$work/history.ndjson" >/dev/null 2>&1
  rm -rf "$work/lake"
  "$bin" import --lake "$work/lake" "$work/history.ndjson" >/dev/null 2>&1
  for w in 0s 10m; do
    printf '[audit]\nevent_window = "%s"\n' "$w" >"$work/w.toml"
    /usr/bin/time -f '%M %e' -o "$work/time" \
      "$bin" sql --lake "$work/lake" --config "$work/w.toml" --format csv \
      "SELECT count(*) AS n FROM lease_timeline" >"$work/count-$w" 2>/dev/null
    read -r kib secs <"$work/time"
    printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$w" "$((kib / 1024))" "$secs" "$(tail -1 "$work/count-$w")"
    "$bin" sql --lake "$work/lake" --config "$work/w.toml" --format csv \
      "SELECT * FROM lease_timeline ORDER BY lease_id, acquired_at, fencing_token, holder_id" \
      | md5sum >"$work/rows-$w"
    "$bin" sql --lake "$work/lake" --config "$work/w.toml" --format csv \
      "SELECT kind, lease_id, fencing_token, holder_id, at, other_fencing_token, other_holder_id,
       detail, array_to_string(evidence, ' ') AS e
       FROM lease_violations ORDER BY kind, lease_id, fencing_token, at, e, detail" \
      | md5sum >>"$work/rows-$w"
  done
  cmp -s "$work/rows-0s" "$work/rows-10m" ||
    { echo "the two audits' rows differ at $n events" >&2; exit 1; }
done
