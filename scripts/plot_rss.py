#!/usr/bin/env python3
"""Draws serve --ingest's resident memory against the events it has
ingested, from the CSV files scripts/bench-stored.sh writes next to its
lake (seconds,events,rss_mib, one row every 2 s).

Usage: scripts/plot_rss.py OUT.png TITLE LABEL=FILE.csv [LABEL=FILE.csv ...]

Prints, per file, the median RSS of the samples between 8 and 12 M
events and of those in the last 4 M events, and their ratio: the
benchmark's figure (BENCHMARKS.md). Medians, because RSS swings by a GB
with each settle, store and compaction.
"""
import csv
import statistics
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
        end = pts[-1][0]
        at10 = statistics.median(r for e, r in pts if 8e6 <= e <= 12e6)
        last = statistics.median(r for e, r in pts if e >= end - 4e6)
        print("%s: median %d MiB at 8-12 M events, %d MiB at %.1f-%.1f M (%.2f); peak %d MiB"
              % (label, at10, last, (end - 4e6) / 1e6, end / 1e6, last / at10,
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
