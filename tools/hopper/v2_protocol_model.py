# Protocol model of the v2 Hopper forward kernel (csrc/cuda/hopper/fwd_mainloop.cuh, one tile per CTA),
# one CTA: the producer thread, the two consumer warpgroups (each one agent; its
# 4 warps' arrivals count 4), asynchronous TMA completions, in-order wgmma-group
# completions and the ping-pong named barriers, under random interleavings; the
# softmax's slow path (S_n issued again before K_n's release) taken at random.
# Checks: no deadlock, every S / PV GEMM reads the right tile, no slot is
# refilled while a GEMM still reads it, barriers balanced at the end; a seeded
# bug must be caught. tests/test_protocol_models.py runs it on fewer seeds.
# Run: python3 tools/hopper/v2_protocol_model.py
# Keep it in step with the kernel when the pipeline changes.
import random, sys

class MBar:
    def __init__(s, count): s.count=count; s.pending=count; s.tx=0; s.phase=0
    def arrive(s, n=1):
        s.pending-=n; assert s.pending>=0, "over-arrival"; s.check()
    def expect_tx(s, b): s.tx+=b; s.arrive()
    def complete_tx(s, b):
        s.tx-=b; assert s.tx>=0; s.check()
    def check(s):
        if s.pending==0 and s.tx==0: s.phase^=1; s.pending=s.count
    def try_wait(s, parity): return s.phase != parity

class NBar:  # named barrier, count in WG units (256 threads = 2 WGs)
    def __init__(s): s.arrived=0; s.gen=0
    def arrive(s):
        s.arrived+=1
        if s.arrived==2: s.arrived=0; s.gen+=1
    def sync(s):  # returns generation to wait past
        g=s.gen; s.arrive(); return g

def run(n_blocks, ST, PP, seed, bug=None):
    rnd=random.Random(seed)
    q=MBar(1); kf=[MBar(1) for _ in range(ST)]; vf=[MBar(1) for _ in range(ST)]
    ke=[MBar(8) for _ in range(ST)]; ve=[MBar(8) for _ in range(ST)]
    nb=[NBar(), NBar()]  # ids 1,2
    kslot=[None]*ST; vslot=[None]*ST          # tile id in slot (None: empty/being written)
    kread=[0]*ST; vread=[0]*ST                # active readers
    kwriting=[False]*ST; vwriting=[False]*ST
    tma=[]   # pending (kind, slot, tile)
    def producer():
        tma.append(('q',0,0)); q.expect_tx(1)
        def load_k(n):
            s=n%ST; par=((n//ST)&1)^1
            while not ke[s].try_wait(par): yield
            assert kread[s]==0, "K slot overwritten while read"
            kwriting[s]=True; kslot[s]=None; kf[s].expect_tx(1); tma.append(('k',s,n))
            yield
        def load_v(n):
            s=n%ST; par=((n//ST)&1)^1
            while not ve[s].try_wait(par): yield
            assert vread[s]==0, "V slot overwritten while read"
            vwriting[s]=True; vslot[s]=None; vf[s].expect_tx(1); tma.append(('v',s,n))
            yield
        yield from load_k(0)
        for n in range(n_blocks):
            if n+1<n_blocks: yield from load_k(n+1)
            yield from load_v(n)
    def consumer(cw, groups):
        # groups: list of pending wgmma groups (list of release callbacks), completes in order
        def issue(reads):
            groups.append(reads)
        def wait_group(N):
            while len(groups)>N: yield
        def wait_turn():
            if PP:
                g=nb[cw].sync()
                while nb[cw].gen==g: yield
        def pass_turn():
            if PP: nb[cw^1].arrive()
        if PP and cw==1: pass_turn()
        while not q.try_wait(0): yield
        while not kf[0].try_wait(0): yield
        yield from wait_turn()
        assert kslot[0]==0 and not kwriting[0], ("S0 reads", kslot[0])
        kread[0]+=1; issue([('k',0)])
        pass_turn()
        yield from wait_group(0)
        for _ in range(4): ke[0].arrive()
        for n in range(1,n_blocks):
            s=n%ST; ph=(n//ST)&1; sp=(n-1)%ST; php=((n-1)//ST)&1
            while not kf[s].try_wait(ph): yield
            yield from wait_turn()
            assert kslot[s]==n and not kwriting[s], ("S reads wrong K", n, kslot[s])
            kread[s]+=1; issue([('k',s)])
            yield
            while not vf[sp].try_wait(php): yield
            assert vslot[sp]==n-1 and not vwriting[sp], ("PV reads wrong V", n-1, vslot[sp])
            vread[sp]+=1; issue([('v',sp)])
            pass_turn()
            yield from wait_group(1)
            if bug=='k_release_before_redo':
                for _ in range(4): ke[s].arrive()
            yield  # softmax
            if rnd.random()<0.3:  # slow path (v2_softmax_steady): S_n again, a group of its own
                assert kslot[s]==n and not kwriting[s], ("S redo reads wrong K", n, kslot[s])
                kread[s]+=1; issue([('k',s)])
                yield from wait_group(0)
            if bug!='k_release_before_redo':
                for _ in range(4): ke[s].arrive()
            yield from wait_group(0)
            for _ in range(4): ve[sp].arrive()
        last=n_blocks-1; s=last%ST; ph=(last//ST)&1
        while not vf[s].try_wait(ph): yield
        yield from wait_turn()
        assert vslot[s]==last and not vwriting[s]
        vread[s]+=1; issue([('v',s)])
        if not (cw==1): pass_turn()
        yield from wait_group(0)
        for _ in range(4): ve[s].arrive()
    g0=[];g1=[]
    agents={'P':producer(),'C0':consumer(0,g0),'C1':consumer(1,g1)}
    steps=0
    while agents or tma or g0 or g1:
        steps+=1
        if steps>200000: raise Exception("deadlock/livelock n=%d ST=%d PP=%d"%(n_blocks,ST,PP))
        choices=list(agents.keys())+(['T'] if tma else [])+(['G0'] if g0 else [])+(['G1'] if g1 else [])
        c=rnd.choice(choices)
        if c=='T':
            i=rnd.randrange(len(tma)) if rnd.random()<0.3 else 0
            kind,s,n=tma.pop(i)
            if kind=='q': q.complete_tx(1)
            elif kind=='k': kslot[s]=n; kwriting[s]=False; kf[s].complete_tx(1)
            else: vslot[s]=n; vwriting[s]=False; vf[s].complete_tx(1)
        elif c in ('G0','G1'):
            g=g0 if c=='G0' else g1
            for kind,s in g.pop(0):
                if kind=='k': kread[s]-=1
                else: vread[s]-=1
        else:
            try: next(agents[c])
            except StopIteration: del agents[c]
    assert nb[0].arrived==0 and nb[1].arrived==0, ("named barrier unbalanced", nb[0].arrived, nb[1].arrived)
    assert all(b.pending==b.count and b.tx==0 for b in kf+vf+ke+ve+[q])
    return steps


def randomised_runs(seeds=60):
    """Every configuration (STAGES 2-4, ping-pong on/off, 1-13 key tiles) on `seeds` seeds; raises on a
    violation. Returns the number of runs."""
    cnt = 0
    for ST in (2, 3, 4):
        for PP in (0, 1):
            for n_blocks in (1, 2, 3, 4, 5, 7, 9, 13):
                for seed in range(seeds):
                    run(n_blocks, ST, PP, seed * 1000 + n_blocks)
                    cnt += 1
    return cnt


def seeded_bug_caught(seeds=200):
    """K released at the S wait, before the slow path reads it again: (ST, n_blocks, seed, message) of
    the first run that catches it, None if none does."""
    for ST in (2, 3):
        for n_blocks in (3, 5, 9):
            for seed in range(seeds):
                try:
                    run(n_blocks, ST, 1, seed, bug='k_release_before_redo')
                except AssertionError as e:
                    return (ST, n_blocks, seed, str(e)[:80])
    return None


def main():
    print("ok", randomised_runs(), "runs")
    caught = seeded_bug_caught()
    print("seeded bug k_release_before_redo:", "CAUGHT ST=%d n_blocks=%d seed=%d: %s" % caught if caught else "NOT CAUGHT")
    if not caught:
        sys.exit(1)


if __name__ == "__main__":
    main()
