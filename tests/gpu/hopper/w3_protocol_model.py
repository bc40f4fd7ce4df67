# Protocol model of the three-consumer Hopper forward (csrc/cuda/hopper/fwd_sm90_v2w3.cuh), one CTA,
# with the SKIP candidate: the producer thread, three consumer warpgroups (each one agent; its 4
# warps' arrivals count 4 on the 12-warp empty barriers), asynchronous TMA completions, in-order
# wgmma-group completions per warpgroup, the 3-way rotation on named barriers 1-3 (consumer c syncs
# on bar c, 256 threads = its own 128 plus the 128 of pred(c) arriving), and the lazy max's slow path
# (S_n issued again before K_n's release) at random. Each consumer has its own n_eff (SKIP: the key
# tiles its rows see, >= 1); for n_eff <= n < n_blocks it runs the skip loop (K_n waited and released
# unread, PV_{n-1} only). Random interleavings; checks: no deadlock, every S / PV GEMM reads the right
# tile, no slot refilled while a GEMM still reads it, barriers balanced at the end. Seeded bugs (a
# skip iteration that releases K_n without waiting for it, one that leaves out its turn) must be
# caught.
# Not a pytest module (no test_ prefix). Run: python3 tests/gpu/hopper/w3_protocol_model.py
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


def run(n_blocks, n_eff, ST, PP, seed, bug=None):
    """n_eff: per consumer, 1 <= n_eff[c] <= n_blocks."""
    rnd = random.Random(seed)
    q = MBar(1)
    kf = [MBar(1) for _ in range(ST)]
    vf = [MBar(1) for _ in range(ST)]
    ke = [MBar(4 * NC) for _ in range(ST)]
    ve = [MBar(4 * NC) for _ in range(ST)]
    rot = [NBar() for _ in range(NC)]  # ids 1..3: consumer c waits on rot[c]
    kslot = [None] * ST
    vslot = [None] * ST
    kread = [0] * ST
    vread = [0] * ST
    kwriting = [False] * ST
    vwriting = [False] * ST
    tma = []

    def producer():
        tma.append(('q', 0, 0))
        q.expect_tx(1)

        def load_k(n):
            s = n % ST
            par = ((n // ST) & 1) ^ 1
            while not ke[s].try_wait(par):
                yield
            assert kread[s] == 0, "K slot overwritten while read"
            kwriting[s] = True
            kslot[s] = None
            kf[s].expect_tx(1)
            tma.append(('k', s, n))
            yield

        def load_v(n):
            s = n % ST
            par = ((n // ST) & 1) ^ 1
            while not ve[s].try_wait(par):
                yield
            assert vread[s] == 0, "V slot overwritten while read"
            vwriting[s] = True
            vslot[s] = None
            vf[s].expect_tx(1)
            tma.append(('v', s, n))
            yield

        yield from load_k(0)
        for n in range(n_blocks):
            if n + 1 < n_blocks:
                yield from load_k(n + 1)
            yield from load_v(n)

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

        if PP and cw == NC - 1:
            pass_turn()
        while not q.try_wait(0):
            yield
        # prologue: S_0
        while not kf[0].try_wait(0):
            yield
        yield from wait_turn()
        assert kslot[0] == 0 and not kwriting[0], ("S0 reads", kslot[0])
        kread[0] += 1
        issue([('k', 0)])
        pass_turn()
        yield from wait_group(0)
        release(ke, 0)
        # steady: n < n_eff
        for n in range(1, n_eff[cw]):
            s, ph, sp, php = n % ST, (n // ST) & 1, (n - 1) % ST, ((n - 1) // ST) & 1
            while not kf[s].try_wait(ph):
                yield
            yield from wait_turn()
            assert kslot[s] == n and not kwriting[s], ("S reads wrong K", n, kslot[s])
            kread[s] += 1
            issue([('k', s)])
            yield
            while not vf[sp].try_wait(php):
                yield
            assert vslot[sp] == n - 1 and not vwriting[sp], ("PV reads wrong V", n - 1, vslot[sp])
            vread[sp] += 1
            issue([('v', sp)])
            pass_turn()
            yield from wait_group(1)
            yield  # softmax
            if rnd.random() < 0.3:  # slow path: S_n again, a group of its own
                assert kslot[s] == n and not kwriting[s], ("S redo reads wrong K", n, kslot[s])
                kread[s] += 1
                issue([('k', s)])
                yield from wait_group(0)
            release(ke, s)
            yield from wait_group(0)
            release(ve, sp)
        # SKIP: n_eff <= n < n_blocks
        for n in range(n_eff[cw], n_blocks):
            s, ph, sp, php = n % ST, (n // ST) & 1, (n - 1) % ST, ((n - 1) // ST) & 1
            if bug != 'skip_no_k_wait':
                while not kf[s].try_wait(ph):
                    yield
            if bug != 'skip_no_turn':
                yield from wait_turn()
            while not vf[sp].try_wait(php):
                yield
            assert vslot[sp] == n - 1 and not vwriting[sp], ("skip PV reads wrong V", n - 1, vslot[sp])
            vread[sp] += 1
            issue([('v', sp)])
            if bug != 'skip_no_turn':
                pass_turn()
            release(ke, s)
            yield from wait_group(0)
            release(ve, sp)
        # epilogue: PV_last
        last = n_blocks - 1
        s, ph = last % ST, (last // ST) & 1
        while not vf[s].try_wait(ph):
            yield
        yield from wait_turn()
        assert vslot[s] == last and not vwriting[s]
        vread[s] += 1
        issue([('v', s)])
        if cw != NC - 1:
            pass_turn()
        yield from wait_group(0)
        release(ve, s)

    gs = [[] for _ in range(NC)]
    agents = {'P': producer()}
    for c in range(NC):
        agents['C%d' % c] = consumer(c, gs[c])
    steps = 0
    while agents or tma or any(gs):
        steps += 1
        if steps > 300000:
            raise Exception("deadlock/livelock n=%d n_eff=%s ST=%d PP=%d" % (n_blocks, n_eff, ST, PP))
        choices = list(agents.keys()) + (['T'] if tma else []) + ['G%d' % c for c in range(NC) if gs[c]]
        c = rnd.choice(choices)
        if c == 'T':
            i = rnd.randrange(len(tma)) if rnd.random() < 0.3 else 0
            kind, s, n = tma.pop(i)
            if kind == 'q':
                q.complete_tx(1)
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
                else:
                    vread[s] -= 1
        else:
            try:
                next(agents[c])
            except StopIteration:
                del agents[c]
    assert all(b.arrived == 0 for b in rot), ("rotation barrier unbalanced", [b.arrived for b in rot])
    assert all(b.pending == b.count and b.tx == 0 for b in kf + vf + ke + ve + [q]), "mbarrier unbalanced"
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


def main():
    cnt = 0
    for ST in (2, 3, 4):
        for PP in (0, 1):
            for n_blocks in (1, 2, 3, 4, 5, 7, 9):
                for n_eff in n_eff_cases(n_blocks):
                    for seed in range(12):
                        run(n_blocks, n_eff, ST, PP, seed * 1000 + n_blocks)
                        cnt += 1
    print("ok", cnt, "runs")
    missed = []
    # The rotation keeps the consumers within a turn of each other, so the missing K wait only bites
    # without it (PP = 0: each consumer free to run ahead and release a slot's next tile early).
    for bug, pp in (('skip_no_k_wait', 0), ('skip_no_turn', 1)):
        caught = None
        for ST in (2, 3):
            for n_blocks in (3, 5, 9):
                for n_eff in ((1, 1, 1), (n_blocks, 1, 2), (2, n_blocks, 1)):
                    for seed in range(100):
                        try:
                            run(n_blocks, n_eff, ST, pp, seed, bug=bug)
                        except (AssertionError, Exception) as e:  # noqa: B014 (deadlock raises Exception)
                            caught = (ST, n_blocks, n_eff, seed, str(e)[:70])
                            break
                    if caught:
                        break
                if caught:
                    break
            if caught:
                break
        print("seeded bug %s:" % bug, "CAUGHT ST=%d n_blocks=%d n_eff=%s seed=%d: %s" % caught if caught else "NOT CAUGHT")
        if not caught:
            missed.append(bug)
    if missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
