#!/usr/bin/env python3
"""Writes samples/lease-events.ndjson: a small, deterministic history for
the quick start. It has the contract's paused-holder example, ordinary
handoffs with renewals on three backends, a duplicate (a producer retry)
and a few malformed lines that end up in lease_rejects."""
import json, random, datetime

random.seed(7)
T0 = datetime.datetime(2026, 9, 14, 10, 0, 0, tzinfo=datetime.timezone.utc)
lines = []

def ts(ms):
    return (T0 + datetime.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")

n = 0
def ev(ms, **kw):
    global n
    n += 1
    e = {"ts": ts(ms), **kw}
    e.setdefault("event_id", f"s-{n:05d}")
    lines.append(json.dumps(e, separators=(",", ":")))

# The contract's example: worker-1 stalls, its lease expires, worker-2 takes
# over and worker-1's late write is refused.
L = "orders/order-123"
ev(0, kind="acquired", source="coordinator", lease_id=L, holder_id="worker-1", fencing_token=33, ttl_ms=10000, backend="etcd")
ev(3300, kind="renewed", source="holder", lease_id=L, holder_id="worker-1", fencing_token=33, ttl_ms=10000, latency_ms=4.2, mono_ms=3300.0, keepalive_sent_mono_ms=3295.8)
ev(13300, kind="expired", source="coordinator", lease_id=L, holder_id="worker-1", fencing_token=33)
ev(13500, kind="acquired", source="coordinator", lease_id=L, holder_id="worker-2", fencing_token=34, ttl_ms=10000)
ev(14000, kind="write_accepted", source="resource", lease_id=L, holder_id="worker-2", fencing_token=34)
ev(18000, kind="stale_write_rejected", source="resource", lease_id=L, holder_id="worker-1", fencing_token=33, max_token=34)

# Ordinary handoffs: acquire, renew every TTL/3, write, release.
backends = ["etcd", "redis", "postgres"]
for i in range(12):
    lease = f"jobs/batch-{i % 4}"
    holder = f"pod-{i % 5}"
    token = 100 + i
    start = 20000 + i * 4000
    ttl = 3000
    ev(start, kind="acquire_requested", source="holder", lease_id=lease, holder_id=holder, backend=backends[i % 3])
    ev(start + 12, kind="acquired", source="coordinator", lease_id=lease, holder_id=holder, fencing_token=token, ttl_ms=ttl, backend=backends[i % 3], latency_ms=12.0 + random.random() * 5)
    for r in range(1, 3):
        ev(start + 12 + r * 1000, kind="renewed", source="holder", lease_id=lease, holder_id=holder, fencing_token=token, ttl_ms=ttl, latency_ms=round(random.random() * 8, 2), attrs={"region": "eu-west-1"})
    ev(start + 2500, kind="write_accepted", source="resource", lease_id=lease, holder_id=holder, fencing_token=token)
    ev(start + 2900, kind="released", source="holder", lease_id=lease, holder_id=holder, fencing_token=token)

# A producer retry: the same event twice.
lines.append(lines[-1])
# Malformed input, kept in lease_rejects with its reason and line.
lines.append('{"ts":"2026-09-14T10:01:00Z","kind":"acquired","source":"coordinator","lease_id":"jobs/x","holder_id":"pod-9","ttl_ms":1000}')
lines.append('{"ts":"2026-09-14T10:01:00Z","kind":"teleported","source":"holder","lease_id":"jobs/x","holder_id":"pod-9"}')
lines.append('{"ts":"yesterday","kind":"released","source":"holder","lease_id":"jobs/x","holder_id":"pod-9","fencing_token":1}')
lines.append('not json at all')

with open("samples/lease-events.ndjson", "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} lines")
