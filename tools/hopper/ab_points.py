#!/usr/bin/env python3
"""Table of ab_points.sh's timing lines: per point, each build's TF/s in every round and its ratio
to the first build's (sums over the rounds), in markdown.

    ab_points.py LOG
"""
import re
import sys
from collections import OrderedDict

LINE = re.compile(r"^r(\d+) (\S+) (.+?) ([0-9.]+) TF/s$")


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    points = OrderedDict()  # point -> build -> [TF/s per round]
    builds = []
    with open(argv[1]) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m is None:
                continue
            _, build, point, tf = m.groups()
            if build not in builds:
                builds.append(build)
            points.setdefault(point, OrderedDict()).setdefault(build, []).append(float(tf))
    base = builds[0]
    print("| point | " + " | ".join(builds) + " | " + " | ".join(f"{b}/{base}" for b in builds[1:]) + " |")
    print("|---" * (1 + 2 * len(builds) - 1) + "|")
    for point, per in points.items():
        cells = [" / ".join(f"{v:.1f}" for v in per.get(b, [])) or "-" for b in builds]
        ratios = []
        for b in builds[1:]:
            if b in per and base in per and sum(per[base]) > 0:
                ratios.append(f"{sum(per[b]) / sum(per[base]):.3f}")
            else:
                ratios.append("-")
        print(f"| {point} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main(sys.argv)
