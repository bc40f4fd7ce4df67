"""attn_implementation="fusedattn" in Hugging Face transformers (fusedattn.integrations.transformers).

Tiny randomly initialised models built from configs (no downloads): Llama, Qwen2, Qwen3,
Mistral (sliding window), Gemma 2 (sliding window on alternate layers; softcap), gpt-oss
(learnable sinks, sliding window on alternate layers, MoE).

* greedy generate() on a left-padded batch of 4 gives the tokens "eager" and "sdpa" give
  (gpt-oss has no sdpa path in transformers: eager only), and fusedattn's operator ran;
* right- and left-padded forwards match each sequence run alone, by FlashAttention's rule
  against float64 eager;
* one training step's gradients (every parameter, sinks included) match eager's by
  FlashAttention's rule: err(fusedattn fp32 vs eager fp64) <= 2 err(eager fp32 vs eager fp64) + eps;
* packed sequences through cu_seq_lens_q/k equal the sequences run alone, also compiled;
* a decode step with a StaticCache compiles with fullgraph=True into one graph and equals eager;
* dropout reaches the operator in training only; nothing is registered on import.

Windows of 4 keys and prompts of 9 tokens make the sliding windows bite. float32 throughout
(transformers' float64 eager path turns fully padded rows into NaN that leaks into other rows).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

T = pytest.importorskip("transformers")

from transformers import AttentionInterface, StaticCache  # noqa: E402

from conftest import DEVICE, tol_check  # noqa: E402
from fusedattn import FwdArgs  # noqa: E402
from fusedattn._ops import FWD_ARGUMENTS  # noqa: E402
from fusedattn.integrations import transformers as fi  # noqa: E402

REGISTERED_ON_IMPORT = fi.NAME in AttentionInterface._global_mapping
fi.register()

VOCAB, PROMPT, NEW = 64, 9, 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0)
# name -> (config class, model class, config overrides, has an sdpa path in transformers)
MODELS = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}, True),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}, True),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, {}, True),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(sliding_window=4), True),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(sliding_window=4, attn_logit_softcapping=None, final_logit_softcapping=None,
                    query_pre_attn_scalar=16), True),
    "gpt_oss": (T.GptOssConfig, T.GptOssForCausalLM, dict(sliding_window=4, num_local_experts=4,
                                                           num_experts_per_tok=2), False),
}


_DROPOUT_P_AT = FWD_ARGUMENTS.index("dropout_p")  # from the registered schema


class OpCalls(TorchDispatchMode):
    """Records the dropout_p of every fusedattn forward operator call under it."""

    def __init__(self):
        super().__init__()
        self.dropout_ps = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.fusedattn.fwd.default:
            self.dropout_ps.append(args[_DROPOUT_P_AT])
        return func(*args, **(kwargs or {}))


def config(name, **overrides):
    cfg_cls, _, extra, _ = MODELS[name]
    return cfg_cls(**{**COMMON, **extra, **overrides})


def weights(name, cfg):
    """One random state dict per model (gpt-oss's sinks are zeros at init: made non-zero)."""
    torch.manual_seed(0)
    model = MODELS[name][1](cfg)
    if name == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()
    return model.state_dict()


def build(name, cfg, impl, state, dtype=torch.float32):
    # gpt-oss's grouped-GEMM experts take no float64; the eager ones (not traceable) compute the same.
    experts = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = MODELS[name][1]._from_config(cfg, attn_implementation=impl, dtype=dtype, **experts)
    model.load_state_dict(state)
    return model.to(DEVICE).eval()


def padded_prompts(left=True):
    """Token ids [4, 9] with 0, 3, 1 and 5 pad tokens on the left (or right) and the mask."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, PROMPT), generator=gen)
    mask = torch.ones_like(ids)
    for i, pad in enumerate([0, 3, 1, 5]):
        sl = slice(0, pad) if left else slice(PROMPT - pad, PROMPT)
        ids[i, sl] = 0
        mask[i, sl] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def impls(name):
    return ("eager", "sdpa") if MODELS[name][3] else ("eager",)


def test_not_registered_on_import():
    assert not REGISTERED_ON_IMPORT
    assert fi.register() == "fusedattn"  # idempotent


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generate_matches_eager_and_sdpa(name):
    cfg = config(name)
    state = weights(name, cfg)
    ids, mask = padded_prompts()
    tokens = {}
    for impl in impls(name) + ("fusedattn",):
        model = build(name, cfg, impl, state)
        with OpCalls() as calls:
            tokens[impl] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW,
                                          do_sample=False)[:, PROMPT:].cpu()
        assert bool(calls.dropout_ps) == (impl == "fusedattn")
    for impl in impls(name):
        assert torch.equal(tokens["fusedattn"], tokens[impl]), (impl, tokens)


def _alone_logits(name, cfg, state, ids, mask, dtype):
    """Each sequence's logits run alone (no padding), in eager attention, placed at its positions."""
    model = build(name, cfg, "eager", state, dtype)
    out = torch.zeros(*ids.shape, VOCAB, dtype=dtype)
    with torch.no_grad():
        for i in range(ids.shape[0]):
            keep = mask[i].bool()
            out[i, keep.cpu()] = model(input_ids=ids[i, keep][None]).logits[0].cpu()
    return out


@pytest.mark.parametrize("left", [True, False], ids=["left_padded", "right_padded"])
@pytest.mark.parametrize("name", ["llama", "mistral", "gpt_oss"])
def test_padded_forward_matches_sequences_alone(name, left):
    cfg = config(name)
    state = weights(name, cfg)
    ids, mask = padded_prompts(left)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = build(name, cfg, "fusedattn", state)(input_ids=ids, attention_mask=mask,
                                                    position_ids=position_ids).logits.cpu()
    ref64 = _alone_logits(name, cfg, state, ids, mask, torch.float64)
    ref32 = _alone_logits(name, cfg, state, ids, mask, torch.float32)
    msg = tol_check("logits", got, ref64, ref32, torch.float32, where=mask.bool().cpu())
    assert msg is None, msg


def _loss(model, ids, labels):
    return model(input_ids=ids, labels=labels).loss


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_gradients_match_eager(name):
    cfg = config(name)
    state = weights(name, cfg)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (2, 12), generator=gen).to(DEVICE)
    grads = {}
    for impl, dtype in (("fusedattn", torch.float32), ("eager", torch.float32), ("eager", torch.float64)):
        model = build(name, cfg, impl, state, dtype).train()
        _loss(model, ids, ids).backward()
        grads[impl, dtype] = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    got, lp, ref = grads["fusedattn", torch.float32], grads["eager", torch.float32], grads["eager", torch.float64]
    assert set(got) == set(ref)
    if name == "gpt_oss":
        assert any(n.endswith("sinks") for n in got)
    msgs = [tol_check(n, got[n], ref[n], lp[n], torch.float32) for n in ref]
    assert not [m for m in msgs if m], "\n".join(m for m in msgs if m)


def _packed(lens):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=gen)
    position_ids = torch.cat([torch.arange(n) for n in lens])[None]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    return ids.to(DEVICE), position_ids.to(DEVICE), cu.to(DEVICE)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_packed_sequences_match_sequences_alone(name):
    lens = [5, 9, 3]
    cfg = config(name)
    state = weights(name, cfg)
    ids, position_ids, cu = _packed(lens)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
    model = build(name, cfg, "fusedattn", state)
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=position_ids, **kw).logits.cpu()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        got_compiled = compiled(input_ids=ids, position_ids=position_ids, **kw).logits.cpu()
    mask = torch.ones(1, sum(lens), dtype=torch.bool)
    starts = [0] + torch.tensor(lens).cumsum(0).tolist()
    seq = lambda dt: torch.cat([_alone_logits(name, cfg, state, ids[:, a:b], mask[:, a:b], dt)  # noqa: E731
                                for a, b in zip(starts[:-1], starts[1:])], dim=1)
    msg = tol_check("packed logits", got, seq(torch.float64), seq(torch.float32), torch.float32)
    assert msg is None, msg
    torch.testing.assert_close(got_compiled, got, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_static_cache_decode_step_compiles_to_one_graph(name):
    from torch._dynamo.testing import CompileCounterWithBackend

    cfg = config(name)
    state = weights(name, cfg)
    ids, mask = padded_prompts()
    model = build(name, cfg, "fusedattn", state)
    logits = {}
    for compiled in (False, True):
        cache = StaticCache(config=cfg, max_cache_len=PROMPT + 4)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
            step_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            counter = CompileCounterWithBackend("aot_eager")
            fwd = torch.compile(model.forward, fullgraph=True, backend=counter) if compiled else model.forward
            logits[compiled] = fwd(input_ids=step_ids, attention_mask=step_mask, past_key_values=cache,
                                   use_cache=True, cache_position=torch.tensor([PROMPT], device=DEVICE)).logits.cpu()
        if compiled:
            assert counter.frame_count == 1  # one graph, no break
    torch.testing.assert_close(logits[True], logits[False])


def test_dropout_reaches_the_operator_in_training_only():
    cfg = config("llama", attention_dropout=0.5)
    model = build("llama", cfg, "fusedattn", weights("llama", cfg))
    ids, _ = padded_prompts()
    with OpCalls() as calls:
        model.train()
        torch.manual_seed(5)
        a = model(input_ids=ids).logits
        torch.manual_seed(5)
        b = model(input_ids=ids).logits
        c = model(input_ids=ids).logits
        model.eval()
        with torch.no_grad():
            model(input_ids=ids)
    assert calls.dropout_ps == [0.5] * 6 + [0.0] * 2
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the dropout mask follows torch's seed
    assert not torch.equal(a, c)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_gemma2_softcap():
    cfg = config("gemma2", attn_logit_softcapping=20.0)
    state = weights("gemma2", cfg)
    ids, mask = padded_prompts()
    model = build("gemma2", cfg, "fusedattn", state)
    if "softcap" not in {f.name for f in dataclasses.fields(FwdArgs)}:
        with pytest.raises(NotImplementedError, match="softcap=20.0"):
            model(input_ids=ids, attention_mask=mask)
        return
    tokens = {impl: build("gemma2", cfg, impl, state).generate(input_ids=ids, attention_mask=mask,
                                                               max_new_tokens=NEW, do_sample=False)
              for impl in ("eager", "sdpa", "fusedattn")}
    assert torch.equal(tokens["fusedattn"], tokens["eager"]) and torch.equal(tokens["fusedattn"], tokens["sdpa"])

