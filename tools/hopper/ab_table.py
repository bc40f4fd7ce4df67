#!/usr/bin/env python3
"""A/B/A table of two harness builds' timing lines.

    ab_table.py BASE_1 NEW [BASE_2 ...]

Each file is one harness run (fwdh bench3, bwdh bench, ...). Lines that carry
`d=.. s=.. causal=..` and a `TF/s` figure are matched by everything but the
numbers (tag, shape, configuration); the table gives each run's TF/s and
NEW over the mean of the baseline runs, with the two baselines' spread, since a
ratio smaller than the drift between identical builds means nothing.
"""
import re
import sys

NUM = re.compile(r"[0-9]+\.[0-9]+ (ms|TF/s)")
TFS = re.compile(r"([0-9]+\.[0-9]+) TF/s")
SHAPE = re.compile(r"d=\d+ s=\d+ causal=\d")


def read(path):
    rows = {}
    with open(path) as f:
        for line in f:
            m = TFS.search(line)
            if m is None or SHAPE.search(line) is None:
                continue
            key = " ".join(NUM.sub("", line).split())
            rows.setdefault(key, float(m.group(1)))
    return rows


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    runs = [read(p) for p in argv[1:]]
    new, bases = runs[1], [runs[0]] + runs[2:]
    print(f"{'point':70s} {'base':>8s} {'new':>8s} {'new/base':>9s} {'base spread':>11s}")
    for key, tf_new in new.items():
        vals = [b[key] for b in bases if key in b]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        spread = (max(vals) - min(vals)) / mean if len(vals) > 1 else float("nan")
        print(f"{key[:70]:70s} {mean:8.1f} {tf_new:8.1f} {tf_new / mean:9.3f} {spread:11.3f}")


if __name__ == "__main__":
    main(sys.argv)
