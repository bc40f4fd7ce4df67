# Protocol model of the three-consumer Hopper forward (csrc/cuda/hopper/fwd_kernel.cuh, three consumer warpgroups), one CTA,
# with SKIP, and of its persistent candidate (the persistent scheduler: several tiles per CTA, two Q slots): the producer thread, three consumer warpgroups (each one agent; its 4
# warps' arrivals count 4 on the 12-warp empty barriers), asynchronous TMA completions, in-order
# wgmma-group completions per warpgroup, the 3-way rotation on named barriers 1-3 (consumer c syncs
# on bar c, 256 threads = its own 128 plus the 128 of pred(c) arriving), and the lazy max's slow path
# (S_n issued again before K_n's release) at random. Each consumer has its own n_eff (SKIP: the key
# tiles its rows see, >= 1); for n_eff <= n < n_blocks it runs the skip loop (K_n waited and released
# unread, PV_{n-1} only). Random interleavings; checks: no deadlock, every S / PV GEMM reads the right
# tile, no slot refilled while a GEMM still reads it, barriers balanced at the end. Seeded bugs (a
# skip iteration that releases K_n without waiting for it, one that leaves out its turn; persistent:
# Q released after S_0 whatever the tile's length, the rotation's pass skipped at every tile's end)
# must be caught. tests/test_protocol_models.py runs it on fewer seeds.
# Run: python3 tools/hopper/w3_protocol_model.py
# Keep it in step with the kernel when the pipeline changes.
import random
import sys


class MBar:
    def __init__(s, count):
        s.count = count
        s.pending = count
        s.tx = 0
        s.phase = 0

    def arrive(s, n=1):
        s.pending -= n
        assert s.pending >= 0, "over-arrival"
        s.check()

    def expect_tx(s, b):
        s.tx += b
        s.arrive()

    def complete_tx(s, b):
        s.tx -= b
        assert s.tx >= 0
        s.check()

    def check(s):
        if s.pending == 0 and s.tx == 0:
            s.phase ^= 1
            s.pending = s.count

    def try_wait(s, parity):
        return s.phase != parity


class NBar:  # named barrier of 256 threads, counted in warpgroups (2)
    def __init__(s):
        s.arrived = 0
        s.gen = 0

    def arrive(s):
        s.arrived += 1
        if s.arrived == 2:
            s.arrived = 0
            s.gen += 1

    def sync(s):  # the generation to wait past
        g = s.gen
        s.arrive()
        return g


NC = 3


def run(tiles, ST, PP, seed, bug=None):
    """tiles: the CTA's work tiles in order, each (n_blocks, n_eff) with n_eff per consumer,
    1 <= n_eff[c] <= n_blocks. One tile is the one-tile-per-CTA kernel; several
    are the persistent kernel: two Q slots, each released by every consumer
    warp after its warpgroup's last S of the tile, K / V rings and the rotation running across
    tiles."""
    rnd = random.Random(seed)
    QBUF = 2
    qf = [MBar(1) for _ in range(QBUF)]
    qe = [MBar(4 * NC) for _ in range(QBUF)]
    kf = [MBar(1) for _ in range(ST)]
    vf = [MBar(1) for _ in range(ST)]
    ke = [MBar(4 * NC) for _ in range(ST)]
    ve = [MBar(4 * NC) for _ in range(ST)]
    rot = [NBar() for _ in range(NC)]  # ids 1..3: consumer c waits on rot[c]
    qslot = [None] * QBUF
    qread = [0] * QBUF
    qwriting = [False] * QBUF
    kslot = [None] * ST
    vslot = [None] * ST
    kread = [0] * ST
    vread = [0] * ST
    kwriting = [False] * ST
    vwriting = [False] * ST
    tma = []
    base = [0]
    for nb, _ in tiles:
        base.append(base[-1] + nb)

    def producer():
        def load(kind, it):
            empty, full, read, writing, slot = ((ke, kf, kread, kwriting, kslot) if kind == 'k' else
                                                (ve, vf, vread, vwriting, vslot))
            s = it % ST
            par = ((it // ST) & 1) ^ 1
            while not empty[s].try_wait(par):
                yield
            assert read[s] == 0, kind.upper() + " slot overwritten while read"
            writing[s] = True
            slot[s] = None
            full[s].expect_tx(1)
            tma.append((kind, s, it))
            yield

        def load_k(it):
            yield from load('k', it)

        def load_v(it):
            yield from load('v', it)

        for j, (nb, _) in enumerate(tiles):
            kv = base[j]
            yield from load_k(kv)
            qs = j % QBUF
            while not qe[qs].try_wait(((j // QBUF) & 1) ^ 1):
                yield
            assert qread[qs] == 0, "Q slot overwritten while read"
            qwriting[qs] = True
            qslot[qs] = None
            qf[qs].expect_tx(1)
            tma.append(('q', qs, j))
            yield
            for n in range(nb):
                if n + 1 < nb:
                    yield from load_k(kv + n + 1)
                yield from load_v(kv + n)

    def consumer(cw, groups):
        def issue(reads):
            groups.append(reads)

        def wait_group(n):
            while len(groups) > n:
                yield

        def wait_turn():
            if PP:
                g = rot[cw].sync()
                while rot[cw].gen == g:
                    yield

        def pass_turn():
            if PP:
                rot[(cw + 1) % NC].arrive()

        def release(bars, s):
            for _ in range(4):
                bars[s].arrive()

        def read_s(qs, j, s, it, what):
            assert qslot[qs] == j and not qwriting[qs], (what + " reads wrong Q", j, qslot[qs])
            assert kslot[s] == it and not kwriting[s], (what + " reads wrong K", it, kslot[s])
            qread[qs] += 1
            kread[s] += 1
            issue([('q', qs), ('k', s)])

        if PP and cw == NC - 1:
            pass_turn()
        for j, (nb, n_eff_t) in enumerate(tiles):
            kv = base[j]
            n_eff = n_eff_t[cw]
            last_tile = j == len(tiles) - 1
            qs = j % QBUF
            while not qf[qs].try_wait((j // QBUF) & 1):
                yield
            # prologue: S_0
            s = kv % ST
            while not kf[s].try_wait((kv // ST) & 1):
                yield
            yield from wait_turn()
            read_s(qs, j, s, kv, "S0")
            pass_turn()
            yield from wait_group(0)
            release(ke, s)
            if n_eff == 1 or bug == 'q_early':
                release(qe, qs)
            # steady: n < n_eff
            for n in range(1, n_eff):
                it = kv + n
                s, ph, sp, php = it % ST, (it // ST) & 1, (it - 1) % ST, ((it - 1) // ST) & 1
                while not kf[s].try_wait(ph):
                    yield
                yield from wait_turn()
                read_s(qs, j, s, it, "S")
                yield
                while not vf[sp].try_wait(php):
                    yield
                assert vslot[sp] == it - 1 and not vwriting[sp], ("PV reads wrong V", it - 1, vslot[sp])
                vread[sp] += 1
                issue([('v', sp)])
                pass_turn()
                yield from wait_group(1)
                yield  # softmax
                if rnd.random() < 0.3:  # slow path: S_n again, a group of its own
                    read_s(qs, j, s, it, "S redo")
                    yield from wait_group(0)
                release(ke, s)
                if n == n_eff - 1 and bug != 'q_early':
                    release(qe, qs)
                yield from wait_group(0)
                release(ve, sp)
            # SKIP: n_eff <= n < n_blocks
            for n in range(n_eff, nb):
                it = kv + n
                s, ph, sp, php = it % ST, (it // ST) & 1, (it - 1) % ST, ((it - 1) // ST) & 1
                if bug != 'skip_no_k_wait':
                    while not kf[s].try_wait(ph):
                        yield
                if bug != 'skip_no_turn':
                    yield from wait_turn()
                while not vf[sp].try_wait(php):
                    yield
                assert vslot[sp] == it - 1 and not vwriting[sp], ("skip PV reads wrong V", it - 1, vslot[sp])
                vread[sp] += 1
                issue([('v', sp)])
                if bug != 'skip_no_turn':
                    pass_turn()
                release(ke, s)
                yield from wait_group(0)
                release(ve, sp)
            # PV_last
            it = kv + nb - 1
            s, ph = it % ST, (it // ST) & 1
            while not vf[s].try_wait(ph):
                yield
            yield from wait_turn()
            assert vslot[s] == it and not vwriting[s]
            vread[s] += 1
            issue([('v', s)])
            skip_pass = cw == NC - 1 and (last_tile or bug == 'rot_per_tile')
            if not skip_pass:
                pass_turn()
            yield from wait_group(0)
            release(ve, s)
            yield  # epilogue: stores

    gs = [[] for _ in range(NC)]
    agents = {'P': producer()}
    for c in range(NC):
        agents['C%d' % c] = consumer(c, gs[c])
    steps = 0
    while agents or tma or any(gs):
        steps += 1
        if steps > 600000:
            raise Exception("deadlock/livelock tiles=%s ST=%d PP=%d" % (tiles, ST, PP))
        choices = list(agents.keys()) + (['T'] if tma else []) + ['G%d' % c for c in range(NC) if gs[c]]
        c = rnd.choice(choices)
        if c == 'T':
            i = rnd.randrange(len(tma)) if rnd.random() < 0.3 else 0
            kind, s, n = tma.pop(i)
            if kind == 'q':
                qslot[s] = n
                qwriting[s] = False
                qf[s].complete_tx(1)
            elif kind == 'k':
                kslot[s] = n
                kwriting[s] = False
                kf[s].complete_tx(1)
            else:
                vslot[s] = n
                vwriting[s] = False
                vf[s].complete_tx(1)
        elif c[0] == 'G':
            for kind, s in gs[int(c[1])].pop(0):
                if kind == 'k':
                    kread[s] -= 1
                elif kind == 'q':
                    qread[s] -= 1
                else:
                    vread[s] -= 1
        else:
            try:
                next(agents[c])
            except StopIteration:
                del agents[c]
    assert all(b.arrived == 0 for b in rot), ("rotation barrier unbalanced", [b.arrived for b in rot])
    assert all(b.pending == b.count and b.tx == 0 for b in kf + vf + ke + ve + qf + qe), "mbarrier unbalanced"
    return steps


def n_eff_cases(n_blocks):
    """Per-consumer key-tile counts: none skipping, the causal pattern (consumer c of a 192-row tile
    sees up to 1-2 fewer 128-key tiles), rows past s_q (1), and mixed random ones."""
    out = [(n_blocks,) * NC]
    out.append(tuple(max(1, n_blocks - (NC - 1 - c)) for c in range(NC)))
    out.append((n_blocks, 1, 1))
    rnd = random.Random(n_blocks)
    for _ in range(4):
        out.append(tuple(rnd.randint(1, n_blocks) for _ in range(NC)))
    return out


def tile_cases(rnd, n_tiles):
    """A persistent CTA's tiles: causal-like lengths (decreasing, 1-block tiles included) or equal
    ones, each with an n_eff pattern of n_eff_cases."""
    out = []
    for _ in range(n_tiles):
        nb = rnd.choice((1, 1, 2, 3, 4, 5, 7))
        out.append((nb, rnd.choice(n_eff_cases(nb))))
    return out


def one_tile_runs(seeds=12):
    """The one-tile-per-CTA kernel: STAGES 2-4, rotation on/off, 1-9 key tiles, every n_eff pattern, `seeds`
    seeds each; raises on a violation. Returns the number of runs."""
    cnt = 0
    for ST in (2, 3, 4):
        for PP in (0, 1):
            for n_blocks in (1, 2, 3, 4, 5, 7, 9):
                for n_eff in n_eff_cases(n_blocks):
                    for seed in range(seeds):
                        run([(n_blocks, n_eff)], ST, PP, seed * 1000 + n_blocks)
                        cnt += 1
    return cnt


def persistent_runs(seeds=60):
    """The persistent kernel: 2-5 tiles per CTA, STAGES 2-4, rotation on/off, `seeds` tile lists each."""
    cnt = 0
    for ST in (2, 3, 4):
        for PP in (0, 1):
            for n_tiles in (2, 3, 5):
                for seed in range(seeds):
                    rnd = random.Random(seed * 7 + n_tiles + 100 * ST + 1000 * PP)
                    run(tile_cases(rnd, n_tiles), ST, PP, seed)
                    cnt += 1
    return cnt


# Seeded bugs and the rotation setting (PP) each is looked for with. The rotation keeps the consumers
# within a turn of each other, so the missing K wait only bites without it (PP = 0: each consumer free
# to run ahead and release a slot's next tile early). Persistent-only bugs: Q released after S_0
# whatever n_eff (later S GEMMs of the tile then read a slot the producer may refill), and the
# rotation's pass skipped at the end of every tile. (An early Q release bites only when the producer
# can run two tiles ahead: a deep ring and short tiles after a long one.)
SEEDED_BUGS = (('skip_no_k_wait', 0), ('skip_no_turn', 1), ('q_early', 1), ('q_early', 0), ('rot_per_tile', 1))


def seeded_bug(bug, pp):
    """A description of the first run that catches `bug`, None if none does."""
    if bug.startswith('skip_'):
        for ST in (2, 3):
            for n_blocks in (3, 5, 9):
                for n_eff in ((1, 1, 1), (n_blocks, 1, 2), (2, n_blocks, 1)):
                    for seed in range(100):
                        try:
                            run([(n_blocks, n_eff)], ST, pp, seed, bug=bug)
                        except Exception as e:  # an AssertionError, or the deadlock's Exception
                            return "ST=%d n_blocks=%d n_eff=%s seed=%d: %s" % (ST, n_blocks, n_eff, seed, str(e)[:70])
        return None
    for ST in (2, 4):
        for seed in range(200):
            rnd = random.Random(seed)
            tiles = [(nb, (nb,) * NC) for nb in [rnd.choice((3, 4, 5))] + [rnd.choice((1, 1, 2)) for _ in range(3)]]
            try:
                run(tiles, ST, pp, seed, bug=bug)
            except Exception as e:
                return "ST=%d tiles=%s seed=%d: %s" % (ST, tiles, seed, str(e)[:70])
    return None


def main():
    print("ok", one_tile_runs(), "one-tile runs")
    print("ok", persistent_runs(), "persistent runs (2-5 tiles per CTA)")
    missed = []
    for bug, pp in SEEDED_BUGS:
        hit = seeded_bug(bug, pp)
        print("seeded bug %s (PP=%d):" % (bug, pp), "CAUGHT " + hit if hit else "NOT CAUGHT")
        if not hit:
            missed.append(bug)
    if missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
