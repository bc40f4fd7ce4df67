"""What the kernel-list generators share (tc/gen_kernels.py, hopper/gen_kernels.py): reading a
kernels.list, and bringing a generated/ folder to the files a list implies, or with --check saying
whether it holds them."""

import sys
from pathlib import Path


def list_lines(path: Path):
    """(line number, whitespace-split fields) of each line of a kernel list that holds more than a
    comment."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            yield n, line.split()


def unique_rows(rows: list) -> list:
    """rows, after checking that no line repeats another."""
    if len(set(rows)) != len(rows):
        sys.exit("kernels.list: duplicate lines")
    return rows


def sync_generated(out: Path, want: dict, script: str, check: bool) -> None:
    """Makes `out` hold exactly the files `want` maps names to (stale ones rewritten, others removed);
    with `check`, exits 1 naming what differs instead of writing."""
    have = {p.name for p in out.glob("*")} if out.exists() else set()
    stale = sorted(n for n, text in want.items() if not (out / n).exists() or (out / n).read_text() != text)
    extra = sorted(have - set(want))
    if check:
        if stale or extra:
            sys.exit(f"{out.name}/ is stale (changed: {stale}, extra: {extra}); run python3 {script}")
        return
    out.mkdir(exist_ok=True)
    for n in extra:
        (out / n).unlink()
    for n in stale:
        (out / n).write_text(want[n])
