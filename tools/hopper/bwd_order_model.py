#!/usr/bin/env python3
"""List-scheduling model of the Hopper backward's causal grid: how much of the main kernel's time
the SMs sit idle at the end, for the order in which the key-tile CTAs are dispatched.

One CTA per (key tile n, kv head, batch); causally key tile n visits the query tiles from n BN / BM
to the last, so its work is (n_m - n BN / BM) iterations plus a fixed cost for its prologue and
epilogue (OVERHEAD iterations). CTAs are dispatched in linear block index order, one per SM (the
kernels' shared memory allows one), each to the SM that frees first. The model prints the makespan
over the ideal (total work / SMs) for:

  group-major   blocks in (n, head, batch) order, x fastest: every group's tiles in turn (the plain
                grid order, for comparison)
  chunk C       bwd_tile_idx with causal_chunk = C: chunks of C groups, key-tile-major inside
  chosen        the C that choose_causal_chunk (csrc/cuda/hopper/tuning.h) picks

on the benchmark's shapes (bf16, b*s = 16k tokens, h*d = 2048: d = 64 h 32, d = 128 h 16, d = 256
h 8; tiles BM x BN = 128 x 128, 64 x 128, 64 x 64) and the H200's 132 SMs.

    python tools/hopper/bwd_order_model.py [--sms 132] [--overhead 2]

It models dispatch and work only: not the L2 reuse a chunk keeps (its C groups' Q, dO and dQ rows),
which is why C is kept as small as the balance allows.
"""

from __future__ import annotations

import argparse
import heapq


def choose_chunk(key_tiles: int, groups: int, sms: int) -> int:
    """tuning.h's choose_causal_chunk, mirrored (tests/cpp/test_hopper_tuning.cc checks the C++)."""
    if sms <= 0 or key_tiles <= 0 or groups <= 1:
        return 1
    want = 2 * sms // key_tiles
    c = 1
    while c * 2 <= want:
        c *= 2
    return max(1, min(c, groups))


def order(n_kt: int, groups: int, chunk: int):
    """(n, group) of each linear block index, as bwd_tile_idx maps them."""
    if chunk <= 1:
        return [(n, g) for g in range(groups) for n in range(n_kt)]
    out = []
    for lin in range(n_kt * groups):
        g0 = lin // (chunk * n_kt) * chunk
        cc = min(chunk, groups - g0)
        within = lin - g0 * n_kt
        out.append((within // cc, g0 + within % cc))
    return out


def makespan(works, sms: int) -> float:
    free = [0.0] * sms
    for w in works:
        t = heapq.heappop(free)
        heapq.heappush(free, t + w)
    return max(free)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=2.0, help="fixed cost per CTA, in iterations")
    args = ap.parse_args()
    print(f"| d | s | groups | key tiles | group-major | C=2 | C=4 | C=8 | C=16 | chosen C | chosen |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, h, bm, bn in ((64, 32, 128, 128), (128, 16, 64, 128), (256, 8, 64, 64)):
        for s in (1024, 2048, 4096, 8192, 16384):
            b = 16384 // s
            groups, n_kt, n_m = b * h, s // bn, s // bm

            def ratio(chunk: int) -> float:
                works = [n_m - n * bn // bm + args.overhead for n, _ in order(n_kt, groups, chunk)]
                return makespan(works, args.sms) / (sum(works) / args.sms)

            c = choose_chunk(n_kt, groups, args.sms)
            cols = " | ".join(f"{ratio(x):.3f}" for x in (1, 2, 4, 8, 16))
            print(f"| {d} | {s} | {groups} | {n_kt} | {cols} | {c} | {ratio(c):.3f} |")


if __name__ == "__main__":
    main()
