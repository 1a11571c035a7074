#!/usr/bin/env python3
"""Draws serve --ingest's resident memory against the events it has
ingested, from the CSV files scripts/bench-stored.sh writes next to its
lake (seconds,events,rss_mib, one row every 2 s).

Usage: scripts/plot_rss.py OUT.png TITLE LABEL=FILE.csv [LABEL=FILE.csv ...]

Prints, per file, the RSS at the sample nearest 10 M events and at the
last sample, and their ratio: the benchmark's figure (BENCHMARKS.md).
"""
import csv
import sys


def load(path):
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["events"] and int(r["events"]) > 0]
    return [(int(r["events"]), int(r["rss_mib"])) for r in rows]


def main():
    out, title, series = sys.argv[1], sys.argv[2], sys.argv[3:]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5), constrained_layout=True)
    for spec in series:
        label, path = spec.split("=", 1)
        pts = load(path)
        ax.plot([e / 1e6 for e, _ in pts], [r for _, r in pts], "-", marker=".", ms=3, label=label)
        at10 = min(pts, key=lambda p: abs(p[0] - 10_000_000))
        last = pts[-1]
        print("%s: %d MiB at %.2f M events, %d MiB at %.2f M events (%.2f); peak %d MiB"
              % (label, at10[1], at10[0] / 1e6, last[1], last[0] / 1e6, last[1] / at10[1],
                 max(r for _, r in pts)))
    ax.set_xlabel("events ingested (millions)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
