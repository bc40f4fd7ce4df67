"""Plots of bench/RESULTS.md's model-zoo and attention-grid tables, for docs/api.md.

    python bench/plot_results.py [--results bench/RESULTS.md] [--out docs/img]

Writes zoo.png (fusedattn / best peer per configuration and s, forward and forward+backward, with the
bar at 1.0) and grid.png (fusedattn / cuDNN over the dense grid). Needs matplotlib (not a dependency of
fusedattn itself).
"""

from __future__ import annotations

import argparse
import os
import re


def table(md, heading):
    """The rows (lists of cells) of the first markdown table after the line starting with `heading`."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(heading))
    rows = []
    for ln in lines[start + 1:]:
        if ln.startswith("## "):
            break
        if ln.startswith("|") and not ln.startswith("|---"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows[0], rows[1:]


def number(cell):
    m = re.match(r"[-+]?[0-9.]+", cell)
    return float(m.group()) if m else float("nan")


def plot_zoo(md, out, plt):
    head, rows = table(md, "## Model zoo")
    col = {name: i for i, name in enumerate(head)}
    labels, fwd, fb = [], {}, {}
    for r in rows:
        key = f"{r[col['config']]}\n{int(r[col['s']]) // 1024}k"
        if key not in labels:
            labels.append(key)
        (fwd if r[col["mode"]] == "fwd" else fb)[key] = number(r[col["ratio"]])
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(labels)), 4))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [fwd.get(k, float("nan")) for k in labels], 0.4, label="forward")
    ax.bar([i + 0.2 for i in x], [fb.get(k, float("nan")) for k in labels], 0.4, label="forward+backward")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("fusedattn / best peer")
    ax.set_title("Model zoo on H200 (bf16): fusedattn against the fastest peer that runs each call")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "zoo.png"), dpi=120)


def plot_grid(md, out, plt):
    head, rows = table(md, "## Attention grid")
    col = {name: i for i, name in enumerate(head)}
    fig, ax = plt.subplots(figsize=(9, 4))
    for causal in ("no", "yes"):
        for d in sorted({r[col["d"]] for r in rows}, key=int):
            pts = sorted((int(r[col["s"]]), number(r[col["f+b vs cuDNN"]])) for r in rows
                         if r[col["d"]] == d and r[col["causal"]] == causal)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    ls="-" if causal == "no" else "--", label=f"d={d}{' causal' if causal == 'yes' else ''}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("fusedattn / cuDNN, forward+backward")
    ax.set_title("Dense grid on H200 (bf16, b*s = 16k, h*d = 2048)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "grid.png"), dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "RESULTS.md"))
    ap.add_argument("--out", default=os.path.join(here, "..", "docs", "img"))
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(a.out, exist_ok=True)
    md = open(a.results).read()
    plot_zoo(md, a.out, plt)
    plot_grid(md, a.out, plt)


if __name__ == "__main__":
    main()
