"""The peer on the same device call: torch SDPA's FLASH_ATTENTION backend (FA2)
on the shapes of tc_harness bench (bf16, b*s = 16k tokens, h*d = 2048),
TFLOP/s counted as FlashAttention does (forward 4*b*h*s*s*d, halved when
causal; forward+backward 3.5x forward)."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

SHAPES = [(64, 512, False), (64, 2048, False), (64, 8192, True), (64, 16384, False), (128, 512, False),
          (128, 2048, False), (128, 2048, True), (128, 8192, False), (128, 8192, True), (128, 16384, False),
          (256, 2048, False), (256, 8192, False), (256, 16384, True)]

for d, s, causal in SHAPES:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = fwd()
        tf = do_bench(fwd, warmup=25, rep=100, return_mode="median")
        tfb = do_bench(lambda: torch.autograd.grad(fwd(), (q, k, v), g), warmup=25, rep=100, return_mode="median")
    print(f"PEER fa2 d={d} s={s} causal={int(causal)} | fwd {tf:.3f} ms {flops / tf / 1e9:.0f} TF/s | "
          f"fwd+bwd {tfb:.3f} ms {3.5 * flops / tfb / 1e9:.0f} TF/s", flush=True)
