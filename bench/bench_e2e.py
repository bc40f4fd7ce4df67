"""End-to-end training step of a Llama-shaped Hugging Face model: fusedattn against torch's SDPA backends.

The model (random init from a config, no download): 8 layers, d_model 2048, 16 query / 4 key-value heads of
128, MLP 5632, vocabulary 32000, bf16 weights, AdamW. One step = forward with labels, backward,
optimizer step. Implementations, all in one process on the same token batches:

    fusedattn     attn_implementation="fusedattn" (fusedattn.integrations.transformers.register())
    sdpa          attn_implementation="sdpa", torch's own backend choice
    sdpa-cudnn    "sdpa" inside sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    sdpa-flash    "sdpa" inside sdpa_kernel(SDPBackend.FLASH_ATTENTION)

The bar compares fusedattn with the best of the sdpa rows. --rounds rounds, the order rotated; each
implementation's steps are timed with CUDA events after --warmup steps; the table gives tokens/s from the
median step over all rounds.

    python bench/bench_e2e.py [--s 4096,16384] [--tokens 16384] [--steps 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def build_model(impl):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                      max_position_embeddings=32768, attn_implementation=impl)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


IMPLS = {
    "fusedattn": ("fusedattn", contextlib.nullcontext),
    "sdpa": ("sdpa", contextlib.nullcontext),
    "sdpa-cudnn": ("sdpa", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "sdpa-flash": ("sdpa", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
}


def step_ms(model, opt, ids, ctx):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    with ctx():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch = tokens / s)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from fusedattn.integrations import transformers as fa_hf
    fa_hf.register()
    models = {name: build_model(impl) for name, (impl, _) in IMPLS.items()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    print("| s | batch | " + " | ".join(IMPLS) + " | fusedattn / best sdpa |")
    print("|---|---|" + "---|" * len(IMPLS) + "---|")
    for s in (int(x) for x in a.s.split(",")):
        b = max(1, a.tokens // s)
        ids = torch.randint(0, 32000, (b, s), device="cuda", generator=gen)
        times = {name: [] for name in IMPLS}
        names = list(IMPLS)
        for r in range(a.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                model, opt = models[name]
                ctx = IMPLS[name][1]
                try:
                    for _ in range(a.warmup):
                        step_ms(model, opt, ids, ctx)
                    times[name] += [step_ms(model, opt, ids, ctx) for _ in range(a.steps)]
                except RuntimeError as e:  # a backend that refuses the shape
                    print(f"  {name} s={s}: {str(e).splitlines()[0][:160]}")
                    opt.zero_grad(set_to_none=True)
        rate = {n: (b * s / statistics.median(t) * 1e3 if t else float("nan")) for n, t in times.items()}
        best = max((v for n, v in rate.items() if n.startswith("sdpa") and v == v), default=float("nan"))
        print(f"| {s} | {b} | " + " | ".join(f"{rate[n]:.0f}" for n in IMPLS) + f" | {rate['fusedattn'] / best:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
