# Timing model of the deterministic DQ_TMA Hopper backward (bwd_sm90_dqtma_det_kernel in
# csrc/cuda/hopper/bwd_common.cuh) against the library's default kernel, on the bench grid
# (bf16, b*s = 16k, h*d = 2048, h_kv = h) and 132 SMs with one CTA each.
#
# What it models. CTAs are dispatched in blockIdx order (x fastest) to the first SM that frees;
# every CTA walks its query tiles (the GQA heads of its group outer, query tiles inner) at T us per
# tile, split into the S^T / dP^T wgmmas (A * T), the dQ wgmma (B * T) and the dV / dK wgmmas
# (C * T, which run on while the dQ reduce is being issued). Per tile, the consumer's issuing
# thread
#   non-deterministic: issues the reduce when dQ is done; before the next tile's dS barrier it
#     waits until the reduce has read the staging tile (READ_US);
#   deterministic: waits until the tile's counter shows its turn (the previous adder's release,
#     seen `lat` after it), issues; right after issuing the next tile's S^T / dP^T wgmmas (or
#     after its last tile) it waits until the reduce has completed (`done` after the issue) and
#     releases.
# A wait holds the whole consumer warpgroup (wgmma is warpgroup-wide), so it delays the next tile.
# Orders of the additions into one query tile (the turns):
#   desc: the kernel's: key tiles in decreasing n, the key tiles dispatched in decreasing n
#         (the kernel's ticket t, drawn on arrival, gives n = N - 1 - t % N), so that a CTA only
#         waits for CTAs dispatched before it
#         (FlashAttention-3's deterministic causal backward does the same: SPT scheduler, lock
#         value n_max(m) - 1 - n). Without causal masking it is the mirror image of asc.
#   asc:  key tile n = 0, 1, ... (dispatched n = 0 first); causal only, to show why not.
# Deadlock freedom is structural here: a CTA's turn only depends on CTAs dispatched before it, so
# processing CTAs in dispatch order computes every time (an assertion checks it).
#
# Output per bench point: the DQ_TMA kernel's predicted TFLOP/s (to compare with the measured
# one), then DQ_TMA time / DET time (the harness's "x DQ_TMA") and DET's mean wait per tile at
# three handoff latencies (done + lat = 1.5, 2.3, 3.7 us; the middle one is the estimate), and
# for causal the same ratio for the increasing order at the estimate.
# Not a pytest module. Run: python3 tools/hopper/bwd_det_model.py [NOISE=0.03] [SEEDS=2]
import heapq
import random
import sys

SMS = 132
A, B, C = 0.4, 0.2, 0.4  # FLOP shares of an iteration: S^T + dP^T, dQ, dV + dK
START_US = 2.0  # CTA start: barrier init, K / V load
END_US = 1.0  # epilogue (dK, dV stores)
READ_US = 0.3  # a 16 KB reduce has read the staging tile
# (done, lat): a 16 KB reduce has completed in L2 (issue -> wait_group 0 returns); a release
# store is seen by the polling ld.acquire of another SM. Fast / estimate / slow.
HANDOFFS = ((1.0, 0.5), (1.5, 0.8), (2.5, 1.2))
# Per-tile time from the measured DQ_TMA kernel (perf-notes: d = 128 s = 16k 511 TFLOP/s,
# d = 64 ~ 430): 10.5 MFLOP per CTA tile (5 GEMMs of 128 x 64 x 128 or 128 x 128 x 64).
T_US = {128: 10.49e6 * SMS / 511e12 * 1e6, 64: 10.49e6 * SMS / 430e12 * 1e6}
TILE = {128: (64, 128), 64: (128, 128)}  # (BM, BN)


def simulate(d, s, causal, order, noise, seed, done=HANDOFFS[1][0], lat=HANDOFFS[1][1]):
    """order: None (DQ_TMA), 'desc' or 'asc'. Returns (time_us, mean wait per tile)."""
    rng = random.Random(seed)
    BM, BN = TILE[d]
    b, h = max(1, 16384 // s), 2048 // d
    N = (s + BN - 1) // BN
    n_m = (s + BM - 1) // BM
    T = T_US[d]
    m_start = lambda n: min(n * BN // BM, n_m) if causal else 0
    n_last = lambda m: min(N - 1, m * BM // BN) if causal else N - 1
    turn = lambda n, m: n_last(m) - n if order == "desc" else n

    published = {}  # (batch, head, m, turn) -> time its release is seen by the next adder
    free = [0.0] * SMS  # when each SM frees
    end = waited = 0.0
    tiles = 0
    for bb in range(b):
        for hh in range(h):
            for x in range(N):
                n = N - 1 - x if order == "desc" else x
                t = heapq.heappop(free) + START_US
                prev_issue = prev_key = None
                for m in range(m_start(n), n_m):
                    tt = T * (1.0 + noise * rng.gauss(0.0, 1.0))
                    t_sd = t + A * tt
                    t_bar = t_sd
                    if prev_issue is not None:
                        if order is None:
                            t_bar = max(t_sd, prev_issue + READ_US)
                        else:
                            t_rel = max(t, prev_issue + done)
                            published[prev_key] = t_rel + lat
                            t_bar = max(t_sd, t_rel)
                    t_dq = t_bar + B * tt
                    issue = t_dq
                    if order is not None:
                        k = turn(n, m)
                        if k > 0:
                            key = (bb, hh, m, k - 1)
                            assert key in published, "a turn waits for a CTA dispatched later"
                            issue = max(issue, published[key])
                        prev_key = (bb, hh, m, k)
                    waited += issue - t_dq
                    tiles += 1
                    prev_issue = issue
                    t = max(issue, t_dq + C * tt)
                if prev_issue is not None:
                    t = max(t, prev_issue + (READ_US if order is None else done))
                    if order is not None:
                        published[prev_key] = t + lat
                t += END_US
                end = max(end, t)
                heapq.heappush(free, t)
    return end, waited / max(tiles, 1)


def main():
    noise = float(sys.argv[1]) if len(sys.argv) > 1 else 0.03
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print("T per tile: d=128 %.2f us, d=64 %.2f us; noise %.0f%%; handoffs (done, lat) us %s"
          % (T_US[128], T_US[64], 100 * noise, HANDOFFS))

    def mean(d, s, causal, order, **kw):
        r = [simulate(d, s, causal, order, noise, k, **kw) for k in range(seeds)]
        return sum(x[0] for x in r) / seeds, sum(x[1] for x in r) / seeds

    for d in (128, 64):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (0, 1):
                base = mean(d, s, causal, None)[0]
                flops = 2.5 * 4.0 * (16384 // s) * (2048 // d) * s * s * d / (2 if causal else 1)
                line = "d=%3d s=%5d causal=%d  DQ_TMA %3.0f TF/s  DET" % (d, s, causal, flops / base / 1e6)
                for done, lat in HANDOFFS:
                    t, w = mean(d, s, causal, "desc", done=done, lat=lat)
                    line += " %.3fx (wait %.2f us)" % (base / t, w)
                if causal:
                    line += "  increasing order %.3fx" % (base / mean(d, s, causal, "asc")[0])
                print(line, flush=True)


if __name__ == "__main__":
    main()
