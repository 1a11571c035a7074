#!/usr/bin/env python3
"""Load test of `leaseline serve --ingest`: ingest at full rate from Kafka
while 16 clients run the incident queries, against the same run with no
queries. Started by scripts/bench-load.sh (see BENCHMARKS.md), which starts
the broker and fills the topic.

Two phases, one after the other, each a fresh `serve --ingest` with its own
lake and consumer group on the same topic, with the same flags:

- baseline: no queries;
- load: 8 HTTP and 8 PostgreSQL clients run every query of
  docs/incident-queries.md in a loop, and one more client sends a runaway
  query every 30 s, which the query timeout is expected to end.

Each phase lasts DURATION seconds from the start of the serve process.
The baseline's serve then ingests on for --baseline-extra seconds (half
the phase unless set), sampled but not counted in its rate: the load
phase's peak RSS is held against the baseline's at the same number of
events committed (`memory_budget`).
Writes a JSON of the results and a PNG of throughput and latency over time.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone

HTTP_CLIENTS = 8
PG_CLIENTS = 8
RUNAWAY_EVERY_S = 30.0
RUNAWAY_SQL = "SELECT count(*) FROM lease_events a CROSS JOIN lease_events b"
WINDOW_S = 10.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def incident_queries(doc_path, lease, now_sql):
    """(title, sql) for every query of the doc, with the lease and "now"
    replaced: the data has its own time range, far from the wall clock."""
    text = open(doc_path, encoding="utf-8").read()
    out = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        for block in re.findall(r"```sql\n(.*?)```", section, flags=re.S):
            sql = block.strip().replace("'orders/00004'", "'%s'" % lease.replace("'", "''"))
            out.append((title, sql.replace("now()", now_sql)))
    return out


class CommittedRows:
    """Rows of the lake's `lease_events` Delta table at its newest commit:
    committed events. Reads each commit file of `_delta_log` once, in
    version order, adding each `add` action's `numRecords` and taking away
    each `remove`'s (compaction removes and adds the same rows)."""

    def __init__(self, lake):
        self.log = os.path.join(lake, "lease_events", "_delta_log")
        self.files = {}
        self.next_version = 0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            return self._read()

    def _read(self):
        while True:
            path = os.path.join(self.log, "%020d.json" % self.next_version)
            try:
                with open(path, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                break
            try:
                actions = [json.loads(line) for line in lines if line.strip()]
            except ValueError:
                break  # not whole yet: read again at the next sample
            for action in actions:
                if "add" in action:
                    add = action["add"]
                    stats = json.loads(add.get("stats") or "{}")
                    self.files[add["path"]] = stats.get("numRecords", 0)
                elif "remove" in action:
                    self.files.pop(action["remove"]["path"], None)
            self.next_version += 1
        return sum(self.files.values())


def proc_status(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def proc_cpu_seconds(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def mib(size):
    """MiB in a size such as 1GiB, 512MiB or 1073741824."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?|B)?\s*", size, flags=re.I)
    if not m:
        raise ValueError("not a size: %r" % size)
    unit = (m.group(2) or "B").upper()[0]
    return float(m.group(1)) * {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit] / 1024**2


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Phase:
    def __init__(self, name, args, queries):
        self.name = name
        self.args = args
        self.queries = queries
        self.lake = os.path.join(args.work, "lake-" + name)
        self.committed = CommittedRows(self.lake)
        self.http_port = free_port()
        self.pg_port = free_port()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.samples = []  # (t, committed rows, rss KiB, hwm KiB, ingest events counter, cpu s, broker rss KiB)
        self.results = []  # dicts, one per query
        self.runaways = []

    def elapsed(self):
        return time.perf_counter() - self.t0

    def record(self, **r):
        with self.lock:
            self.results.append(r)

    # --- the server ---------------------------------------------------

    def start(self):
        a = self.args
        cmd = [
            a.bin, "serve", "--ingest", "--lake", self.lake,
            "--brokers", a.brokers, "--topic", a.topic, "--group-id", "load-%s-%d" % (self.name, os.getpid()),
            "--http-listen", "127.0.0.1:%d" % self.http_port,
            "--pg-listen", "127.0.0.1:%d" % self.pg_port,
            "--query-memory-pool-bytes", a.pool,
        ] + a.serve_arg
        env = dict(os.environ, LEASELINE_LOG="warn")
        self.log = open(os.path.join(a.work, "serve-%s.log" % self.name), "wb")
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                sys.exit("serve exited at start (%s): see %s" % (self.proc.returncode, self.log.name))
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % self.http_port, timeout=2).read()
                break
            except Exception:
                if time.time() > deadline:
                    sys.exit("serve did not answer /health within 60 s")
                time.sleep(0.1)

    def sampler(self):
        while not self.stop.is_set():
            t = self.elapsed()
            rows = self.committed()
            st = proc_status(self.proc.pid)
            events = allocated = None
            try:
                text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.http_port, timeout=5).read().decode()
                events = metric(text, "leaseline_ingest_events_total")
                allocated = metric(text, 'leaseline_allocator_bytes{kind="allocated"}')
                self.audit_reads = {k: metric(text, 'leaseline_query_audit_reads_total{from="%s"}' % k)
                                    for k in ("alert_engine", "alert_engine_earlier_commit", "lake")}
            except Exception:
                pass
            with self.lock:
                broker = proc_status(self.args.broker_pid).get("VmRSS") if self.args.broker_pid else None
                self.samples.append((t, rows, st.get("VmRSS"), st.get("VmHWM"), events,
                                     proc_cpu_seconds(self.proc.pid), broker, allocated))
            self.stop.wait(max(0.0, 1.0 - (self.elapsed() - t)))

    # --- the clients --------------------------------------------------

    def http_client(self, i):
        conn = None
        n = 0
        while not self.stop.is_set():
            title, sql = self.queries[(i + n) % len(self.queries)]
            n += 1
            start = self.elapsed()
            t = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=300)
                conn.request("POST", "/api/v1/sql", body=sql.encode(),
                             headers={"Content-Type": "text/plain", "Accept": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                latency = time.perf_counter() - t
                if resp.status == 200:
                    self.record(surface="http", query=title, start=start, latency=latency, ok=True,
                                rows=len(json.loads(body)))
                else:
                    self.record(surface="http", query=title, start=start, latency=latency, ok=False,
                                error="HTTP %d: %s" % (resp.status, body.decode(errors="replace")[:500]))
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                self.record(surface="http", query=title, start=start, latency=time.perf_counter() - t,
                            ok=False, error="%s: %s" % (type(e).__name__, e))
                conn = None

    def pg_client(self, i):
        import psycopg

        conn = None
        n = 0
        while not self.stop.is_set():
            title, sql = self.queries[(i + n) % len(self.queries)]
            n += 1
            start = self.elapsed()
            t = time.perf_counter()
            try:
                if conn is None:
                    conn = psycopg.connect(host="127.0.0.1", port=self.pg_port, user="leaseline",
                                           dbname="leaseline", sslmode="disable", autocommit=True)
                with conn.cursor() as cur:
                    cur.execute(sql)
                    rows = cur.fetchall()
                latency = time.perf_counter() - t
                self.record(surface="pg", query=title, start=start, latency=latency, ok=True, rows=len(rows))
            except Exception as e:  # noqa: BLE001
                code = getattr(e, "sqlstate", None)
                self.record(surface="pg", query=title, start=start, latency=time.perf_counter() - t, ok=False,
                            error="%s%s: %s" % (type(e).__name__, " [%s]" % code if code else "", str(e).strip()[:500]))
                if conn is not None and conn.closed:
                    conn = None
                elif conn is not None and conn.broken:
                    conn = None

    def runaway_client(self):
        k = 1
        while not self.stop.wait(max(0.0, k * RUNAWAY_EVERY_S - self.elapsed())):
            k += 1
            start = self.elapsed()
            t = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=300)
                conn.request("POST", "/api/v1/sql", body=RUNAWAY_SQL.encode(), headers={"Content-Type": "text/plain"})
                resp = conn.getresponse()
                body = resp.read().decode(errors="replace")
                conn.close()
                outcome = "HTTP %d: %s" % (resp.status, body[:300])
                timed_out = resp.status == 503 and "time" in body.lower()
            except Exception as e:  # noqa: BLE001
                outcome = "%s: %s" % (type(e).__name__, e)
                timed_out = False
            with self.lock:
                self.runaways.append({"start": start, "seconds": time.perf_counter() - t,
                                      "ended_by_timeout": timed_out, "outcome": outcome})

    # --- one phase ----------------------------------------------------

    def run(self, with_queries):
        self.start()
        threads = [threading.Thread(target=self.sampler, daemon=True)]
        if with_queries:
            threads += [threading.Thread(target=self.http_client, args=(i,), daemon=True) for i in range(HTTP_CLIENTS)]
            threads += [threading.Thread(target=self.pg_client, args=(i,), daemon=True) for i in range(PG_CLIENTS)]
            threads.append(threading.Thread(target=self.runaway_client, daemon=True))
        for th in threads:
            th.start()
        time.sleep(max(0.0, self.args.duration - self.elapsed()))
        rows_end = self.committed()
        t_end = self.elapsed()
        self.hwm_at_end = proc_status(self.proc.pid).get("VmHWM")
        if not with_queries:
            # Ingest alone goes on, sampled, so that the load phase's peak
            # can be held against this one's at the same point of the
            # topic (see `memory_budget`); the rate is that of the phase.
            time.sleep(self.args.baseline_extra)
        self.stop.set()
        hwm = proc_status(self.proc.pid).get("VmHWM")
        if self.proc.poll() is not None:
            self.log.flush()
            with open(self.log.name, "rb") as f:
                tail = f.read()[-4000:].decode(errors="replace")
            print("serve (%s) exited during the phase with %s; its log ends:\n%s"
                  % (self.name, self.proc.returncode, tail), file=sys.stderr, flush=True)
        # Queries still running finish (or time out) before the server stops,
        # so that their outcome is known; they count if they started in time.
        # One deadline for them all: a join each would wait up to 18 times
        # as long when the server hangs.
        deadline = time.monotonic() + self.args.query_timeout + 30
        for th in threads:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        hwm = max(hwm or 0, proc_status(self.proc.pid).get("VmHWM") or 0)
        # Ingest went on while the last queries ran: the peak is that of
        # the topic up to here.
        self.rows_at_peak = self.committed()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = "killed after 300 s"
        self.log.close()
        return self.summary(rows_end, t_end, hwm, code)

    def summary(self, rows_end, t_end, hwm, code):
        s = self.samples
        warm = [x for x in s if self.args.warmup <= x[0] <= t_end]
        steady = None
        if warm and warm[-1][0] > warm[0][0]:
            steady = (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0])
        cpu = [x[5] for x in s if x[5] is not None]
        out = {
            "phase": self.name,
            "seconds": t_end,
            "committed_events": rows_end,
            "events_per_s": rows_end / t_end,
            "events_per_s_after_warmup": steady,
            "warmup_s": self.args.warmup,
            "peak_rss_mib": hwm / 1024 if hwm else None,
            "committed_at_peak_read": self.rows_at_peak,
            "peak_rss_at_phase_end_mib": self.hwm_at_end / 1024 if self.hwm_at_end else None,
            "serve_cpu_seconds": cpu[-1] if cpu else None,
            "serve_exit": code,
            "topic_drained": rows_end >= self.args.topic_events,
            "samples": [{"t": x[0], "committed": x[1], "rss_kib": x[2], "hwm_kib": x[3],
                         "ingest_events_total": x[4], "cpu_s": x[5], "broker_rss_kib": x[6],
                         "allocated_bytes": x[7]} for x in s],
            # Where the audit tables' answers came from, at the last sample.
            "audit_reads": getattr(self, "audit_reads", None),
        }
        if self.results or self.runaways:
            out["queries"] = self.query_summary()
            out["runaways"] = self.runaways
        return out

    def query_summary(self):
        res = [r for r in self.results if r["start"] < self.args.duration]
        per = {}
        for r in res:
            for key in ((r["surface"], r["query"]), ("all", r["query"]), (r["surface"], "*"), ("all", "*")):
                per.setdefault(key, []).append(r)
        table = []
        for (surface, query), rs in sorted(per.items()):
            ok = [r["latency"] for r in rs if r["ok"]]
            table.append({
                "surface": surface, "query": query, "ok": len(ok), "errors": len(rs) - len(ok),
                "p50_ms": percentile(ok, 0.5) * 1000 if ok else None,
                "p99_ms": percentile(ok, 0.99) * 1000 if ok else None,
                "max_ms": max(ok) * 1000 if ok else None,
                "rows_median": statistics.median([r["rows"] for r in rs if r["ok"]]) if ok else None,
            })
        errors = [{"t": r["start"], "surface": r["surface"], "query": r["query"], "error": r["error"]}
                  for r in res if not r["ok"]]
        return {"per_query": table, "errors": errors, "raw": res}


def memory_budget(base, load, pool_mib):
    """The load phase's peak RSS against what ingest alone held at the same
    point of the topic, plus the query pool: queries may add at most their
    pool. What the audit holds grows with the events taken in, and the load
    phase takes in a different number of them than the baseline (more when
    its rate is higher, and more while the last queries finish), so the
    baseline's peak is read where it had committed as many events as the
    load phase had when its peak was read. The baseline runs on past its
    measured span for that; when it still falls short, its own peak is the
    budget's base, and the figures say so."""
    target = load.get("committed_at_peak_read") or load["committed_events"]
    reached = [x for x in base["samples"] if x["committed"] >= target and x["hwm_kib"]]
    base_mib = reached[0]["hwm_kib"] / 1024 if reached else (base["peak_rss_mib"] or 0)
    budget = base_mib + pool_mib
    return {
        "rss_budget_mib": budget,
        "rss_budget_at_events": target,
        "rss_budget_baseline_reached": bool(reached),
        "rss_within_budget": (load["peak_rss_mib"] or 0) <= budget,
        # The rule before the baseline ran on: its peak at the end of its
        # measured span, whatever the load phase took in.
        "rss_budget_at_phase_end_mib": (base["peak_rss_at_phase_end_mib"] or 0) + pool_mib,
    }


def windows(phase):
    """Committed events/s per WINDOW_S window, at the window's middle."""
    pts = []
    s = phase["samples"]
    t = WINDOW_S
    while t <= phase["seconds"] + 1e-9:
        before = [x for x in s if x["t"] <= t - WINDOW_S + 0.5]
        upto = [x for x in s if x["t"] <= t + 0.5]
        if before and upto:
            a, b = before[-1], upto[-1]
            if b["t"] > a["t"]:
                pts.append((t - WINDOW_S / 2, (b["committed"] - a["committed"]) / (b["t"] - a["t"])))
        t += WINDOW_S
    return pts


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, load = results["baseline"], results["load"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8.5), sharex=True, constrained_layout=True)
    for ph, style, label in ((base, "-", "without queries (baseline)"), (load, "-", "with 16 query clients + runaway")):
        pts = windows(ph)
        ax1.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], style, marker="o", ms=3, label=label)
    ax1.axhline(base["events_per_s"] / 1000, color="C0", ls=":", lw=1,
                label="baseline mean %.1f k/s" % (base["events_per_s"] / 1000))
    ax1.axhline(load["events_per_s"] / 1000, color="C1", ls=":", lw=1,
                label="with queries mean %.1f k/s (ratio %.2f)" % (load["events_per_s"] / 1000, results["throughput_ratio"]))
    ax1.set_ylabel("events committed to the lake\n(thousand events/s, per 10 s)")
    ax1.set_title("Ingest throughput of serve --ingest")
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(loc="lower right", fontsize=9)

    raw = load["queries"]["raw"]
    colors = {"http": "C2", "pg": "C4"}
    for surface, name in (("http", "HTTP"), ("pg", "PostgreSQL")):
        xs, p50, p99 = [], [], []
        t = 0.0
        while t < load["seconds"]:
            lat = [r["latency"] * 1000 for r in raw if r["surface"] == surface and r["ok"]
                   and t <= r["start"] < t + WINDOW_S]
            if lat:
                xs.append(t + WINDOW_S / 2)
                p50.append(percentile(lat, 0.5))
                p99.append(percentile(lat, 0.99))
            t += WINDOW_S
        ax2.plot(xs, p50, "-", color=colors[surface], marker="o", ms=3, label="%s p50" % name)
        ax2.plot(xs, p99, "--", color=colors[surface], marker="^", ms=3, label="%s p99" % name)
    for i, r in enumerate(load["runaways"]):
        ax2.axvline(r["start"], color="red", alpha=0.35, lw=1,
                    label="runaway query sent" if i == 0 else None)
    errs = [r for r in raw if not r["ok"]]
    if errs:
        ax2.plot([e["start"] for e in errs], [e["latency"] * 1000 for e in errs], "rx",
                 label="failed queries (%d), at their latency" % len(errs))
    ax2.set_xlim(0, max(base["seconds"], load["seconds"]))
    ax2.set_yscale("log")
    ax2.set_ylabel("query latency (ms, log scale)\nper 10 s window, all incident queries")
    ax2.set_xlabel("seconds since serve started")
    ax2.set_title("Incident-query latency during ingest (8 HTTP + 8 PostgreSQL clients)")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(loc="upper left", fontsize=9, ncol=3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)


def markdown(r):
    """The per-query table for BENCHMARKS.md."""
    rows = {}
    for q in r["load"]["queries"]["per_query"]:
        rows.setdefault(q["query"], {})[q["surface"]] = q
    f = lambda q, k: "%.0f" % q[k] if q and q.get(k) is not None and q[k] >= 10 else (  # noqa: E731
        "%.1f" % q[k] if q and q.get(k) is not None else "–")
    out = ["| query | HTTP p50 / p99 ms (n) | PostgreSQL p50 / p99 ms (n) | both p50 / p99 ms | rows |",
           "|---|---|---|---|---|"]
    titles = [t["title"] for t in r["queries"]] + ["*"]
    for t in dict.fromkeys(titles):
        q = rows.get(t, {})
        h, g, a = q.get("http"), q.get("pg"), q.get("all")
        out.append("| %s | %s / %s (%d) | %s / %s (%d) | %s / %s | %s |" % (
            "all queries" if t == "*" else t, f(h, "p50_ms"), f(h, "p99_ms"), (h or {}).get("ok", 0),
            f(g, "p50_ms"), f(g, "p99_ms"), (g or {}).get("ok", 0), f(a, "p50_ms"), f(a, "p99_ms"),
            "–" if t == "*" or not a or a["rows_median"] is None else "%g" % a["rows_median"]))
    return "\n".join(out)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--report":
        # Again from a results JSON: the figures, and the plot when a PNG is named.
        r = json.load(open(sys.argv[2]))
        report(r)
        print(markdown(r))
        if len(sys.argv) == 4:
            plot(r, sys.argv[3], r.get("label", ""))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--topic-events", type=int, required=True)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--warmup", type=float, default=10)
    p.add_argument("--work", required=True)
    p.add_argument("--doc", default="docs/incident-queries.md")
    p.add_argument("--lease", required=True)
    p.add_argument("--now", required=True, help="RFC 3339 time that stands for now() in the queries")
    p.add_argument("--pool", default="1GiB", help="--query-memory-pool-bytes")
    p.add_argument("--query-timeout", type=float, default=30)
    p.add_argument("--baseline-extra", type=float,
                   help="seconds the baseline's ingest runs on after its phase, for the memory budget "
                        "(default: half the phase)")
    p.add_argument("--serve-arg", action="append", default=[], help="another flag for both serves")
    p.add_argument("--json", required=True)
    p.add_argument("--png", required=True)
    p.add_argument("--label", default="")
    p.add_argument("--broker-pid", type=int, help="the broker's process, whose memory is sampled too")
    a = p.parse_args()
    if a.baseline_extra is None:
        a.baseline_extra = a.duration / 2

    now_sql = "TIMESTAMP '%s'" % a.now
    queries = incident_queries(a.doc, a.lease, now_sql)
    results = {"label": a.label, "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "duration_s": a.duration, "http_clients": HTTP_CLIENTS, "pg_clients": PG_CLIENTS,
               "runaway_sql": RUNAWAY_SQL, "runaway_every_s": RUNAWAY_EVERY_S,
               "query_memory_pool": a.pool, "serve_args": a.serve_arg, "lease": a.lease, "now": a.now,
               "queries": [{"title": t, "sql": q} for t, q in queries]}
    for name, with_queries in (("baseline", False), ("load", True)):
        print("phase %s: %.0f s ..." % (name, a.duration), file=sys.stderr, flush=True)
        results[name] = Phase(name, a, queries).run(with_queries)
        r = results[name]
        print("  %s events committed, %.0f events/s, peak RSS %.0f MiB" % (
            r["committed_events"], r["events_per_s"], r["peak_rss_mib"] or 0), file=sys.stderr, flush=True)
    results["throughput_ratio"] = results["load"]["events_per_s"] / results["baseline"]["events_per_s"]
    b, l = results["baseline"]["events_per_s_after_warmup"], results["load"]["events_per_s_after_warmup"]
    results["throughput_ratio_after_warmup"] = l / b if b and l else None
    results.update(memory_budget(results["baseline"], results["load"], mib(a.pool)))
    results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1)
    plot(results, a.png, a.label)
    report(results)
    print(markdown(results))


def report(r):
    base, load = r["baseline"], r["load"]
    print("ingest, events committed per second: baseline %.0f, with queries %.0f, ratio %.3f (after %.0f s warm-up: %s)" % (
        base["events_per_s"], load["events_per_s"], r["throughput_ratio"], base["warmup_s"],
        "%.3f" % r["throughput_ratio_after_warmup"] if r["throughput_ratio_after_warmup"] else "n/a"))
    for ph in (base, load):
        if ph["topic_drained"]:
            print("WARNING: phase %s consumed the whole topic before the end: its rate is a lower bound" % ph["phase"])
    if "rss_budget_at_events" in r:
        print("peak RSS (VmHWM) with queries %.0f MiB, read at %d events committed; budget (the baseline's peak "
              "up to as many events%s, + query pool %s) %.0f MiB: %s" % (
                  load["peak_rss_mib"] or 0, r["rss_budget_at_events"],
                  "" if r["rss_budget_baseline_reached"] else ": NOT REACHED, its peak instead",
                  r["query_memory_pool"], r["rss_budget_mib"], "within" if r["rss_within_budget"] else "OVER"))
        print("  baseline peak at the end of its %.0f s: %.0f MiB (+ pool: %.0f MiB)" % (
            base["seconds"], base["peak_rss_at_phase_end_mib"] or 0, r["rss_budget_at_phase_end_mib"]))
    else:
        print("peak RSS (VmHWM): baseline %.0f MiB, with queries %.0f MiB; budget (baseline + query pool %s) %.0f MiB: %s" % (
            base["peak_rss_mib"] or 0, load["peak_rss_mib"] or 0, r["query_memory_pool"], r["rss_budget_mib"],
            "within" if r["rss_within_budget"] else "OVER"))
    br = [x["broker_rss_kib"] for ph in (base, load) for x in ph["samples"] if x.get("broker_rss_kib")]
    if br:
        print("broker RSS at most %.0f MiB" % (max(br) / 1024))
    print("%-6s %-70s %6s %5s %10s %10s %10s" % ("surface", "query", "ok", "err", "p50 ms", "p99 ms", "max ms"))
    for q in load["queries"]["per_query"]:
        f = lambda v: "%10.1f" % v if v is not None else "%10s" % "-"  # noqa: E731
        print("%-6s %-70s %6d %5d %s %s %s" % (q["surface"], q["query"][:70], q["ok"], q["errors"],
                                                f(q["p50_ms"]), f(q["p99_ms"]), f(q["max_ms"])))
    errs = load["queries"]["errors"]
    print("errors (other than the runaway query): %d" % len(errs))
    seen = {}
    for e in errs:
        seen.setdefault((e["surface"], e["error"][:200]), []).append(e)
    for (surface, msg), es in seen.items():
        print("  %dx %s: %s" % (len(es), surface, msg))
    for x in load["runaways"]:
        print("runaway at %5.1f s: %.1f s, %s: %s" % (x["start"], x["seconds"],
                                                      "timed out" if x["ended_by_timeout"] else "NOT a timeout",
                                                      x["outcome"][:160]))


if __name__ == "__main__":
    main()
