#!/usr/bin/env python3
"""Summary of scripts/gpu_ab.sh's rows: per case and build, the median of the rounds' figures
(each round's figure is the bench's own median: `ms` of `bench model` and `bench bevseg`, the
latency p50 of `bench pipeline`), their spread (min-max over rounds), and after/before (builds: sptr over sptr-before; kernel paths:
portable over native; point uploads: pinned over pageable; split sums: onchip over partials)."""
import json
import statistics
import sys


def figure(line):
    """The bench's median frame time, ms."""
    if "latency" in line:  # bench pipeline
        return line["latency"]["p50_ms"]
    return line["ms"]  # bench model, bench bevseg


def p99(line):
    return line["latency"]["p99_ms"] if "latency" in line else line.get("p90_ms")


def main(path):
    rows = {}
    with open(path) as f:
        for text in f:
            r = json.loads(text)
            rows.setdefault(r["case"], {}).setdefault(r["ab"], []).append(r["line"])
    out = {}
    for case, builds in rows.items():
        entry = {}
        for b, lines in builds.items():
            v = [figure(x) for x in lines]
            t = [p99(x) for x in lines if p99(x) is not None]
            entry[b] = {
                "rounds": len(v),
                "median_ms": statistics.median(v),
                "spread_ms": [min(v), max(v)],
                "tail_ms": statistics.median(t) if t else None,
            }
        if "sptr" in entry and "sptr-before" in entry:
            entry["after_over_before"] = round(entry["sptr"]["median_ms"] / entry["sptr-before"]["median_ms"], 4)
        if "portable" in entry and "native" in entry:
            entry["portable_over_native"] = round(entry["portable"]["median_ms"] / entry["native"]["median_ms"], 4)
        if "pinned" in entry and "pageable" in entry:
            entry["pinned_over_pageable"] = round(entry["pinned"]["median_ms"] / entry["pageable"]["median_ms"], 4)
        if "onchip" in entry and "partials" in entry:
            entry["onchip_over_partials"] = round(entry["onchip"]["median_ms"] / entry["partials"]["median_ms"], 4)
        out[case] = entry
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
