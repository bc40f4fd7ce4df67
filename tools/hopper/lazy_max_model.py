#!/usr/bin/env python3
"""Float32 model of the Hopper forwards' online softmax with the lazy row max (softmax.cuh:
v2_softmax for a row's first key tile and the slow path, v2_softmax_steady for the others),
against float64 attention, on the score profiles of tests/gpu/test_hopper.py's rising-scores test.

Per warpgroup (64 query rows) and key tile of BN columns, as the kernels do it: a steady tile is
exponentiated against the row's reference max in fp32 (exp2, log2-scaled scores), each thread sums
its 2 x BN / 8 columns of a row (a quad of 4 threads per row, thread qd holding columns 8j + 2qd and
8j + 2qd + 1), and the tile takes the slow path when any of the warpgroup's partial sums is above
2^15 or not finite; the slow path recomputes S and runs the kept-max softmax (the reference moves
when the tile's max exceeds it by more than 8 in log2, and O is rescaled then). P is rounded to the
16-bit type before P V, as the kernels' A fragments are; the row sum l uses the fp32 P.

    python tools/hopper/lazy_max_model.py [--d 128] [--bn 128] [--dtype bf16|fp16]

Prints, per profile and causal flag, the largest error of O and of the LSE against float64, and the
share of warpgroup-tiles that took the slow path. The rising-scores test's tolerances are
1e-2 (bf16) / 2e-3 (fp16) on O and 1e-5 relative + 1e-3 absolute on the LSE.
"""

from __future__ import annotations

import argparse
import math

import torch

SLACK = 8.0
P_BOUND = 32768.0
LOG2E = 1.4426950408889634


def inputs(profile: str, s: int, d: int, dtype: torch.dtype, seed: int):
    """The test's q, k, v (one kv head; q's first head) and softmax scale."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(s, d, generator=gen)
    k = torch.randn(s, d, generator=gen)
    v = torch.randn(s, d, generator=gen)
    ramp = torch.linspace(1, 7, s)
    if profile == "fall":
        ramp = ramp.flip(0)
    if profile == "jump":
        ramp = torch.ones(s)
        ramp[s // 2:s // 2 + 96] = 15
    q, k, v = q.to(dtype), (k * ramp.view(s, 1)).to(dtype), v.to(dtype)
    return q, k, v, 4 / math.sqrt(d)


def kept_max_softmax(st, m, l, o, p_dtype):
    """v2_softmax on one tile: st [rows, bn] fp32 log2-scaled scores (masked = -inf)."""
    mx = st.max(dim=1).values
    grow = mx > m + SLACK
    m_new = torch.where(grow, mx, m)
    m_use = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    corr = torch.where(grow, torch.exp2(m - m_use), torch.ones_like(m))
    p = torch.exp2(st - m_use[:, None])
    l = l * corr + p.sum(dim=1)
    o = o * corr[:, None]
    return m_new, l, o, p


def model(q, k, v, scale, causal, bn, p_dtype):
    s, d = q.shape
    sl2 = scale * LOG2E
    kf, vf = k.float(), v.float()
    out = torch.empty(s, d, dtype=torch.float64)
    lse = torch.empty(s, dtype=torch.float64)
    slow = tiles = 0
    for r0 in range(0, s, 64):
        rows = torch.arange(r0, min(r0 + 64, s))
        qf = q[rows].float()
        m = torch.full((len(rows),), -math.inf)
        l = torch.zeros(len(rows))
        o = torch.zeros(len(rows), d)
        last_row = (r0 // 128) * 128 + 127  # the CTA's tile of 128 rows sets the tile count
        n_blocks = math.ceil(s / bn)
        if causal:
            n_blocks = min(n_blocks, math.ceil((last_row + 1) / bn))
        for n in range(n_blocks):
            cols = torch.arange(n * bn, min((n + 1) * bn, s))
            st = (qf @ kf[cols].T) * sl2
            if causal:
                st = st.masked_fill(cols[None, :] > rows[:, None], -math.inf)
            if n == 0:
                m, l, o, p = kept_max_softmax(st, m, l, o, p_dtype)
            else:
                tiles += 1
                p = torch.exp2(st - m[:, None])
                # Partial sums of the quad's threads: column c belongs to thread (c % 8) // 2.
                owner = (torch.arange(len(cols)) % 8) // 2
                part = torch.stack([p[:, owner == t].sum(dim=1) for t in range(4)], dim=1)
                if bool((~(part <= P_BOUND)).any()):
                    slow += 1
                    m, l, o, p = kept_max_softmax(st, m, l, o, p_dtype)
                else:
                    l = l + p.sum(dim=1)
            o = o + p.to(p_dtype).float() @ vf[cols]
        out[rows] = (o / l[:, None]).double()
        lse[rows] = (m.double() / LOG2E + torch.log(l.double()))
    return out, lse, slow, tiles


def reference(q, k, v, scale, causal):
    st = (q.double() @ k.double().T) * scale
    if causal:
        i = torch.arange(q.shape[0]).view(-1, 1)
        st = st.masked_fill(torch.arange(k.shape[0]).view(1, -1) > i, -math.inf)
    return torch.softmax(st, dim=1) @ v.double(), torch.logsumexp(st, dim=1)


PROFILES = (("rise_fast", 1024), ("rise_slow", 4096), ("fall", 2048), ("jump", 2048))  # (profile, s)


def errors(profile: str, s: int, d: int, dtype: torch.dtype, causal: bool, bn: int):
    """(O error, LSE error, slow-path tiles, tiles) of the model against float64 on one profile, both
    errors as the test's assert_close reads them: O within tol * (1 + |ref|), the LSE within
    1e-3 + 1e-5 |ref| (the LSE error as a fraction of that allowance)."""
    q, k, v, scale = inputs(profile, s, d, dtype, seed=s + d + causal)
    out, lse, slow, tiles = model(q, k, v, scale, causal, bn, dtype)
    ref, ref_lse = reference(q, k, v, scale, causal)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    o_err = ((out - ref).abs() / (1 + ref.abs())).max().item()
    lse_frac = ((lse - ref_lse).abs() / (1e-3 + 1e-5 * ref_lse.abs())).max().item()
    return o_err, lse_frac, slow, tiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--bn", type=int, default=128, help="key tile width (d = 256: 80)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    tol = 1e-2 if a.dtype == "bf16" else 2e-3
    for profile, s in PROFILES:
        for causal in (False, True):
            o_err, lse_frac, slow, tiles = errors(profile, s, a.d, dtype, causal, a.bn)
            print(f"{profile:9s} s={s:5d} causal={int(causal)}  O err {o_err:.2e} (tol {tol:g})  "
                  f"LSE err {lse_frac:.2f} of the allowance  slow path {slow}/{tiles} warpgroup-tiles")


if __name__ == "__main__":
    main()
