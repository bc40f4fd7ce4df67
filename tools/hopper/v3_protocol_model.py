# Protocol model of the v3 Hopper forward kernel (csrc/cuda/hopper/fwd_kernel.cuh with the persistent scheduler):
# one persistent CTA looping over several work tiles. Agents: the producer
# thread, the two consumer warpgroups (each one agent; its 4 warps' arrivals
# count 4), asynchronous TMA completions (any order), in-order wgmma-group
# completions per consumer, the ping-pong named barriers (counted in threads:
# 128 per warpgroup arrival, a generation completes at 256) -- random
# interleavings. The Q ring (QBUF slots, full/empty pair per slot) and the K/V
# rings continue across tiles (kv counter over the CTA's life). The softmax's
# slow path (S_n issued again before the K / last Q release) is taken at random.
# With Q in registers (kFwdQInRegs) a consumer reads its Q fragments right after
# the Q barrier and releases the slot at once; every run is made both ways.
# Checks: no deadlock; every S GEMM reads the right Q (tile) and K (tile,
# block), every PV the right V; no Q/K/V slot is refilled while a GEMM reads
# it; no named-barrier generation completes with the same warpgroup arriving
# twice (turns mixed); all barriers balanced at the end.
# Also checks the static schedule (decode of work tiles): every (m, head,
# batch) exactly once over the grid, causal tiles non-increasing in length
# per CTA. Then seeds bugs and requires the model to catch each of them.
# tests/test_protocol_models.py runs it on fewer seeds.
# Run: python3 tools/hopper/v3_protocol_model.py [SEEDS_PER_POINT=80]
# Keep it in step with the kernel when the pipeline changes.
import random, sys


class ModelError(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise ModelError(msg)


class MBar:
    def __init__(s, count):
        s.count = count; s.pending = count; s.tx = 0; s.phase = 0

    def arrive(s, n=1):
        s.pending -= n
        check(s.pending >= 0, "mbarrier over-arrival")
        s.fire()

    def expect_tx(s, b):
        s.tx += b; s.arrive()

    def complete_tx(s, b):
        s.tx -= b; check(s.tx >= 0, "tx underflow"); s.fire()

    def fire(s):
        if s.pending == 0 and s.tx == 0:
            s.phase ^= 1; s.pending = s.count

    def try_wait(s, parity):  # phase with this parity has completed
        return s.phase != parity


class NBar:  # hardware named barrier, 256 threads; arrivals in warpgroups
    def __init__(s):
        s.arrivers = []; s.gen = 0

    def arrive(s, who):
        check(who not in s.arrivers, "named barrier: warpgroup %s arrives twice in one generation (turns mixed)" % who)
        s.arrivers.append(who)
        if len(s.arrivers) == 2:
            s.arrivers = []; s.gen += 1

    def sync(s, who):
        g = s.gen; s.arrive(who); return g


def run(tiles, ST, QBUF, PP, seed, bug=None, qreg=False):
    """tiles: n_blocks of each of this CTA's tiles, in order. qreg: Q held in registers (kFwdQInRegs):
    each consumer warp reads its Q fragments once, right after the Q barrier, and releases the slot
    at once; no S GEMM reads Q from shared memory."""
    rnd = random.Random(seed)
    T = len(tiles)
    qf = [MBar(1) for _ in range(QBUF)]; qe = [MBar(8) for _ in range(QBUF)]
    kf = [MBar(1) for _ in range(ST)]; vf = [MBar(1) for _ in range(ST)]
    ke = [MBar(8) for _ in range(ST)]; ve = [MBar(8) for _ in range(ST)]
    nb = [NBar(), NBar()]  # ids 1, 2: consumer c waits on nb[c]
    qslot = [None] * QBUF; kslot = [None] * ST; vslot = [None] * ST
    qread = [0] * QBUF; kread = [0] * ST; vread = [0] * ST
    tma = []
    bufs = {'q': (qslot, qread), 'k': (kslot, kread), 'v': (vslot, vread)}
    done_tiles = [0, 0]
    overlap = [0]  # next tile's Q issued before both consumers finished the current tile

    def producer():
        kv = 0
        for j, nbk in enumerate(tiles):
            def load(kind, full, empty, s, par, tag):
                while not empty[s].try_wait(par):
                    yield 'spin'
                slot, rd = bufs[kind]
                check(rd[s] == 0, "%s slot %d overwritten while read (loading %s)" % (kind.upper(), s, tag))
                slot[s] = None; full[s].expect_tx(1); tma.append((kind, s, tag))
                if kind == 'q' and j > 0 and min(done_tiles) < j:
                    overlap[0] = 1
                yield 'prog'

            def load_k(n):
                it = kv + n; s = it % ST
                yield from load('k', kf, ke, s, ((it // ST) & 1) ^ 1, (j, n))

            def load_v(n):
                it = kv + n; s = it % ST
                yield from load('v', vf, ve, s, ((it // ST) & 1) ^ 1, (j, n))

            def load_q():
                s = j % QBUF
                if bug == 'no_q_empty_wait':
                    check(qread[s] == 0, "Q slot %d overwritten while read (loading tile %d)" % (s, j))
                    qslot[s] = None; qf[s].expect_tx(1); tma.append(('q', s, j)); yield 'prog'
                else:
                    yield from load('q', qf, qe, s, ((j // QBUF) & 1) ^ 1, j)

            yield from load_k(0)
            yield from load_q()
            for n in range(nbk):
                if n + 1 < nbk:
                    yield from load_k(n + 1)
                yield from load_v(n)
            kv += nbk

    def consumer(cw, groups):
        def issue(reads):
            for kind, s in reads:
                bufs[kind][1][s] += 1
            groups.append(reads)

        def wait_group(N):
            while len(groups) > N:
                yield 'spin'

        def wait_mbar(bar, parity):
            while not bar.try_wait(parity):
                yield 'spin'

        def wait_turn():
            if PP:
                g = nb[cw].sync(cw)
                while nb[cw].gen == g:
                    yield 'spin'

        def pass_turn():
            if PP:
                nb[cw ^ 1].arrive(cw)

        def arrive4(bar):
            for _ in range(4):
                bar.arrive()

        if PP and cw == 1:
            pass_turn()
        kv = 0
        for j, nbk in enumerate(tiles):
            if bug == 'kv_reset_per_tile':
                kv = 0
            last_tile = j == T - 1
            qs = j % QBUF
            yield from wait_mbar(qf[qs], (j // QBUF) & 1)
            q_reads = [] if qreg else [('q', qs)]
            if qreg:
                if bug == 'qreg_release_before_load':
                    arrive4(qe[qs])
                yield 'prog'
                check(qslot[qs] == j, ("Q fragments read from the wrong Q", cw, j, qslot[qs]))
                if bug != 'qreg_release_before_load':
                    arrive4(qe[qs])
            # prologue: S_0
            s = kv % ST
            yield from wait_mbar(kf[s], (kv // ST) & 1)
            yield from wait_turn()
            check(qreg or qslot[qs] == j, ("S_0 reads wrong Q", cw, j, qslot[qs]))
            check(kslot[s] == (j, 0), ("S_0 reads wrong K", cw, (j, 0), kslot[s]))
            issue([('k', s)] + q_reads)
            if bug == 'q_release_at_issue' and nbk == 1:
                arrive4(qe[qs])
            pass_turn()
            yield from wait_group(0)
            arrive4(ke[s])
            if nbk == 1 and bug != 'q_release_at_issue' and not qreg:
                arrive4(qe[qs])
            if bug == 'q_release_after_s0' and nbk > 1:
                arrive4(qe[qs])
            yield 'prog'  # softmax
            for n in range(1, nbk):
                it = kv + n; s = it % ST; ph = (it // ST) & 1
                sp = (it - 1) % ST; php = ((it - 1) // ST) & 1
                yield from wait_mbar(kf[s], ph)
                yield from wait_turn()
                check(qreg or qslot[qs] == j, ("S reads wrong Q", cw, j, qslot[qs]))
                check(kslot[s] == (j, n), ("S reads wrong K", cw, (j, n), kslot[s]))
                issue([('k', s)] + q_reads)
                if bug == 'q_release_at_issue' and n == nbk - 1:
                    arrive4(qe[qs])
                yield 'prog'  # rescale O
                yield from wait_mbar(vf[sp], php)
                check(vslot[sp] == (j, n - 1), ("PV reads wrong V", cw, (j, n - 1), vslot[sp]))
                issue([('v', sp)])
                pass_turn()
                yield from wait_group(1)
                last_s = n == nbk - 1 and bug not in ('q_release_at_issue', 'q_release_after_s0') and not qreg
                if bug == 'k_release_before_redo':
                    arrive4(ke[s])
                    if last_s:
                        arrive4(qe[qs])
                yield 'prog'  # softmax under PV
                if rnd.random() < 0.3:  # slow path (v2_softmax_steady): S_n again, a group of its own
                    check(qreg or qslot[qs] == j, ("S redo reads wrong Q", cw, j, qslot[qs]))
                    check(kslot[s] == (j, n), ("S redo reads wrong K", cw, (j, n), kslot[s]))
                    issue([('k', s)] + q_reads)
                    yield from wait_group(0)
                if bug != 'k_release_before_redo':
                    arrive4(ke[s])
                    if last_s:
                        arrive4(qe[qs])
                yield from wait_group(0)
                arrive4(ve[sp])
            it = kv + nbk - 1; s = it % ST
            yield from wait_mbar(vf[s], (it // ST) & 1)
            yield from wait_turn()
            check(vslot[s] == (j, nbk - 1), ("PV_last reads wrong V", cw, (j, nbk - 1), vslot[s]))
            issue([('v', s)])
            if bug == 'pp_skip_every_tile':
                skip = cw == 1            # v2's rule repeated per tile without the per-tile initial arrive
            elif bug == 'pp_never_skip':
                skip = False
            else:
                skip = cw == 1 and last_tile
            if not skip:
                pass_turn()
            yield from wait_group(0)
            if bug != 'no_last_v_release':
                arrive4(ve[s])
            kv += nbk
            for _ in range(rnd.randint(1, 3)):
                yield 'prog'  # epilogue stores
            done_tiles[cw] += 1

    g = [[], []]
    agents = {'P': producer(), 'C0': consumer(0, g[0]), 'C1': consumer(1, g[1])}
    spins = 0; steps = 0
    while agents or tma or g[0] or g[1]:
        steps += 1
        choices = list(agents) + (['T'] if tma else []) + (['G0'] if g[0] else []) + (['G1'] if g[1] else [])
        c = rnd.choice(choices)
        if c == 'T':
            spins = 0
            kind, s, tag = tma.pop(rnd.randrange(len(tma)) if rnd.random() < 0.3 else 0)
            bufs[kind][0][s] = tag
            {'q': qf, 'k': kf, 'v': vf}[kind][s].complete_tx(1)
        elif c in ('G0', 'G1'):
            spins = 0
            for kind, s in g[int(c[1])].pop(0):
                bufs[kind][1][s] -= 1
        else:
            try:
                r = next(agents[c])
            except StopIteration:
                del agents[c]; spins = 0; continue
            if r == 'spin':
                spins += 1
                if spins > 3000 and not tma and not g[0] and not g[1]:
                    raise ModelError("deadlock: %s" % sorted(agents))
            else:
                spins = 0
    check(done_tiles == [T, T], "tiles not all done")
    check(not nb[0].arrivers and not nb[1].arrivers,
          ("named barrier unbalanced at the end", nb[0].arrivers, nb[1].arrivers))
    for b in qf + qe + kf + vf + ke + ve:
        check(b.pending == b.count and b.tx == 0, "mbarrier left mid-phase")
    return overlap[0]


# ------------------------------------------------------------ the schedule
def decode(t, n_m, h, b, causal, head_major=False):
    n_hb = h * b
    if causal and not head_major:
        m_idx = t // n_hb; hb = t - m_idx * n_hb; m_blk = n_m - 1 - m_idx
    else:
        hb = t // n_m; m_blk = t - hb * n_m
        if causal:
            m_blk = n_m - 1 - m_blk
    batch = hb // h; head = hb - batch * h
    return m_blk, head, batch


def n_blocks(m_blk, s_kv, BN, causal, BM=128):
    nb = (s_kv + BN - 1) // BN
    if causal:
        nb = min(nb, ((m_blk + 1) * BM + BN - 1) // BN)
    return nb


def next_tile(t, j, cta, G, snake):
    """v3_next: the CTA's (j+1)-th tile after its j-th, t; snake reverses the CTA order in odd rounds."""
    if not snake:
        return t + G
    r = j + 1
    return r * G + (G - 1 - cta if r & 1 else cta)


# The kernel's SCHED: (snake, head-major causal order).
SCHEDS = {"round-robin": (False, False), "snake": (True, False), "snake-head-major": (True, True)}


def cta_tiles(cta, G, s, h, b, BN, causal, sched="round-robin"):
    snake, head_major = SCHEDS[sched]
    n_m = (s + 127) // 128
    n_tiles = n_m * h * b
    out = []
    t, j = cta, 0
    while t < n_tiles:
        m, hd, bt = decode(t, n_m, h, b, causal, head_major)
        out.append((m, hd, bt, n_blocks(m, s, BN, causal)))
        t, j = next_tile(t, j, cta, G, snake and causal), j + 1
    return out


def balance(s, h, b, BN, G):
    """Per schedule: causal work of the busiest CTA over the mean (kv blocks), and the most distinct
    heads among the tiles of one round (how many heads' K/V the concurrent CTAs read at once)."""
    n_m = (s + 127) // 128
    G = min(G, n_m * h * b)
    res = {}
    for sched in SCHEDS:
        lists = [cta_tiles(cta, G, s, h, b, BN, True, sched) for cta in range(G)]
        work = [sum(x[3] for x in tl) for tl in lists]
        heads0 = len({(x[1], x[2]) for tl in lists for x in tl[:1]})  # round 0
        res[sched] = (max(work) / (sum(work) / G), heads0)
    return res


def check_schedule():
    cnt = 0
    for sched in SCHEDS:
     for s in (1, 17, 128, 200, 333, 512, 1024, 2000):
         for h in (1, 3, 4):
             for b in (1, 2, 5):
                 for BN in (80, 128):
                     for causal in (0, 1):
                         n_m = (s + 127) // 128
                         n_tiles = n_m * h * b
                         for sms in (1, 3, 7, 132):
                             G = min(n_tiles, sms)
                             seen = set()
                             for cta in range(G):
                                 tl = cta_tiles(cta, G, s, h, b, BN, causal, sched)
                                 assert len(tl) >= 1, "CTA without a tile"
                                 for x in tl:
                                     assert x[:3] not in seen, "tile twice"
                                     seen.add(x[:3])
                                 if causal and not SCHEDS[sched][1]:  # m-major: rounds shrink
                                     nbs = [x[3] for x in tl]
                                     assert nbs == sorted(nbs, reverse=True), ("causal order", nbs)
                             assert seen == {(m, hd, bt) for m in range(n_m) for hd in range(h) for bt in range(b)}
                             cnt += 1
    return cnt


def tile_sets():
    sets = [[1], [3], [5], [1, 1, 1], [1, 2, 1], [2, 1, 3, 1], [4, 4, 4, 4], [7, 6, 5, 4, 3, 2], [5, 4, 3, 2, 1, 1],
            [2, 7, 1, 3], [6, 1, 6]]
    # per-CTA tile lists of real schedules (small grids so CTAs loop)
    for (s, h, b, BN, causal, G) in ((333, 2, 2, 128, 1, 3), (1024, 1, 2, 128, 1, 5), (200, 3, 1, 80, 0, 2),
                                     (512, 2, 2, 128, 0, 7), (900, 1, 1, 80, 1, 2)):
        for cta in range(min(G, 2)):
            sets.append([x[3] for x in cta_tiles(cta, G, s, h, b, BN, causal)])
    return sets


def randomised_runs(seeds):
    """Every configuration (STAGES 2-4, QBUF 1-2, ping-pong on/off, Q in shared memory / registers) on
    every tile list, `seeds` seeds each; raises ModelError on a violation. Returns (runs, runs whose
    next tile's Q load was issued before both consumers had finished the current tile, multi-tile runs)."""
    cnt = ovl = multi = 0
    for ST in (2, 3, 4):
        for QBUF in (1, 2):
            for PP in (0, 1):
                for qreg in (False, True):
                    for tiles in tile_sets():
                        for seed in range(seeds):
                            ovl += run(tiles, ST, QBUF, PP, seed * 7919 + 31 * len(tiles) + sum(tiles), qreg=qreg)
                            cnt += 1
                            multi += len(tiles) > 1
    return cnt, ovl, multi


# Seeded bugs: each must be caught on at least one of seeded_bug's configurations.
SEEDED_BUGS = {
    'no_q_empty_wait': "producer loads the next Q without waiting for the Q slot's empty barrier",
    'q_release_at_issue': "consumer releases Q when it issues its last S GEMM, not after it completed",
    'q_release_after_s0': "consumer releases Q after S_0 instead of after the tile's last S GEMM",
    'pp_skip_every_tile': "consumer 1 skips its last ping-pong arrival in every tile (v2's rule per tile)",
    'pp_never_skip': "consumer 1 also arrives after its very last turn (unbalanced at the end)",
    'no_last_v_release': "last kv block's V slot not released (v2's 'no waiter' arrival dropped)",
    'kv_reset_per_tile': "consumers restart the ring counter every tile, producer does not",
    'k_release_before_redo': "K (and last Q) released after the S wait, before the softmax's slow path reads them",
    'qreg_release_before_load': "Q in registers: the slot released before the fragments are read",
}


def seeded_bug(bug, seeds=25):
    """(ST, QBUF, tiles, seed, message) of the first run that catches `bug`, None if none does."""
    for ST in (2, 3):
        for QBUF in (1, 2):
            for tiles in ([3, 2, 1], [1, 1, 1], [2, 7, 1, 3], [4, 4, 4]):
                for seed in range(seeds):
                    try:
                        run(tiles, ST, QBUF, 1, seed, bug=bug, qreg=bug.startswith('qreg'))
                    except ModelError as e:
                        return (ST, QBUF, tiles, seed, str(e)[:110])
    return None


def main():
    ns = check_schedule()
    print("schedule: %d (shape, grid, schedule) combinations: every tile once, at least one per CTA, causal"
          " lengths non-increasing per CTA in the m-major orders" % ns)
    # The bench grid's causal shapes (b*s = 16k tokens, h*d = 2048) on 132 SMs: busiest CTA / mean,
    # and how many heads the first round's 132 tiles touch.
    for d, BN in ((64, 128), (128, 128), (256, 80)):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            r = balance(s, 2048 // d, 16384 // s, BN, 132)
            print("balance d=%d s=%5d causal: busiest CTA / mean work (heads in round 0): " % (d, s) +
                  ", ".join("%s %.3f (%d)" % (k, v[0], v[1]) for k, v in r.items()))
    cnt, ovl, multi = randomised_runs(int(sys.argv[1]) if len(sys.argv) > 1 else 80)
    print("ok: %d randomised runs (STAGES 2-4, QBUF 1-2, ping-pong on/off, Q in shared memory / registers, %d tile"
          " lists); in %d of the %d multi-tile"
          " runs the next tile's Q load was issued before both consumers had finished the current tile"
          % (cnt, len(tile_sets()), ovl, multi))
    caught = 0
    for bug, what in SEEDED_BUGS.items():
        hit = seeded_bug(bug)
        caught += hit is not None
        print("seeded bug %-20s %s  (%s)" % (bug, ("CAUGHT ST=%d QBUF=%d tiles=%s seed=%d: %s" % hit) if hit else "NOT CAUGHT",
                                             what))
    print("seeded bugs caught: %d/%d" % (caught, len(SEEDED_BUGS)))
    if caught != len(SEEDED_BUGS):
        sys.exit(1)


if __name__ == '__main__':
    main()
