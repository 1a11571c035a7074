#!/usr/bin/env bash
# `leaseline import`'s peak memory with its alert replay keeping a window of
# event time (alerts.replay_audit_window, the default 10m) against keeping
# every event ("0s"), on the same simulated history, in one run; the alerts
# of the two must be the same.
# Usage: scripts/bench-import-memory.sh [EVENTS...] [-- debug|release]
#   EVENTS: sizes of the history (default 1000000 3000000); 200 leases, so
#   a million events cover about 54 minutes of event time.
source "$(dirname "$0")/bench-common.sh"
printf 'events\twindow\tpeak_rss_mib\tseconds\talerts\n'
for n in "${sizes[@]}"; do
  "$bin" simulate --seed 7 --leases 200 --events "$n" --start 2026-09-14T00:00:00Z \
    --crash 0.01 --double-grant 0.005 --output "$work/history.ndjson" >/dev/null 2>&1
  for w in 0s 10m; do
    printf '[alerts]\nreplay_audit_window = "%s"\n' "$w" >"$work/w.toml"
    rm -rf "$work/lake"
    /usr/bin/time -f '%M %e' -o "$work/time" \
      "$bin" import --lake "$work/lake" --config "$work/w.toml" "$work/history.ndjson" \
      >"$work/out-$w" 2>/dev/null
    read -r kib secs <"$work/time"
    grep '^  ' "$work/out-$w" | sort >"$work/alerts-$w"
    printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$w" "$((kib / 1024))" "$secs" "$(wc -l <"$work/alerts-$w")"
  done
  cmp -s "$work/alerts-0s" "$work/alerts-10m" ||
    { echo "the two replays' alerts differ at $n events" >&2; exit 1; }
done
