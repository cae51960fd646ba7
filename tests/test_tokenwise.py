"""Attention token by token (layers.tokenwise_sdpa): each new token of a verify block gets the bits of the one-token
step at its place, so an int4 target's chains return the target alone's tokens on every CPU."""

import pytest
import torch

from blockdraft.model import scripted
from blockdraft.model.layers import attention_bias, grouped_sdpa, tokenwise_sdpa
from blockdraft.model.span import on_span_grid
from tiny_models import needs_smollm2

GROUPS, KV_HEADS, HEAD_DIM = 3, 3, 64  # SmolLM2's attention: 9 query heads over 3 key/value heads of 64


def block_case(rows: int, tokens: int, span: int, dtype: torch.dtype, seed: int):
    """q [B, H, T, Dh], k/v [B, Hkv, S, Dh] and a causal mask [B, T, S] of a block ending 5 slots before the span."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, GROUPS * KV_HEADS, tokens, HEAD_DIM, generator=generator).to(dtype)
    k, v = (torch.randn(rows, KV_HEADS, span, HEAD_DIM, generator=generator).to(dtype) for _ in range(2))
    first = span - 5 - tokens  # the block's first position
    mask = torch.arange(span)[None, :] <= (first + torch.arange(tokens))[:, None]  # [T, S]
    return q, k, v, mask.expand(rows, tokens, span)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,tokens", [(1, 2), (1, 5), (1, 9), (2, 4)])
def test_each_token_has_the_bits_of_its_one_token_step(dtype, rows, tokens):
    # The folded rows of grouped_sdpa parted here (an AMD EPYC, Zen 5) on 32 of 90 such bf16 blocks and on 90 of 90
    # float32 ones; token by token none may.
    for seed, span in enumerate(on_span_grid(n) for n in (130, 200, 290, 410)):
        q, k, v, mask = block_case(rows, tokens, span, dtype, seed)
        bias = attention_bias(mask, GROUPS, dtype)
        together = tokenwise_sdpa(q, k, v, bias)
        for t in range(tokens):
            step = grouped_sdpa(q[:, :, t: t + 1], k, v, attention_bias(mask[:, t: t + 1], GROUPS, dtype))
            assert torch.equal(together[:, :, t: t + 1], step), f"token {t} of {tokens} (span {span})"
        assert torch.equal(tokenwise_sdpa(q, k, v, None)[:, :, 1:2], grouped_sdpa(q[:, :, 1:2], k, v, None))


def test_the_scripted_twin_is_the_same_function():
    q, k, v, mask = block_case(2, 6, 208, torch.bfloat16, 7)
    bias = attention_bias(mask, GROUPS, torch.bfloat16)
    twin = torch.jit.script(scripted.tokenwise_sdpa_twin)
    assert torch.equal(twin(q, k, v, bias), tokenwise_sdpa(q, k, v, bias))
    assert torch.equal(twin(q, k, v, None), tokenwise_sdpa(q, k, v, None))


@needs_smollm2
@pytest.mark.parametrize("weights", ["q4", "bf16"])
@torch.inference_mode()
def test_a_verify_block_equals_its_one_token_steps_bit_for_bit(weights):
    # With each key/value head's rows folded together, rows of such blocks of the embedded target parted from their
    # steps for 3 of 3 of these prompts here (an AMD EPYC, Zen 5; bf16 activations over int4 or packed bf16
    # products, which keep a row's bits at every row count). A tiny random target did not show it.
    from blockdraft.io.targets import load_target

    target = load_target(weights=weights)
    last = target.num_layers - 1
    for seed, (n, tokens) in enumerate([(166, 9), (159, 4), (122, 9)]):
        ids = torch.randint(3, 49152, (1, n + tokens), generator=torch.Generator().manual_seed(seed))
        prompt, new = ids[:, :n], ids[:, n:]
        outputs = []
        for width in (tokens, 1):  # the block at once, then token by token
            cache = target.new_cache(1, on_span_grid(n + tokens))
            target.forward(prompt, torch.arange(n)[None], cache, prompt=True)
            logits, features = [], []
            for at in range(0, tokens, width):
                out = target.forward(new[:, at: at + width], torch.arange(n + at, n + at + width)[None], cache,
                                     tap_layer_ids=(3, 15, last), logit_rows=torch.arange(width)[None])
                logits.append(out.logits)
                features.append(out.features)
            outputs.append((torch.cat(logits, 1), torch.cat(features, 1)))
        (block_logits, block_features), (step_logits, step_features) = outputs
        assert torch.equal(block_features, step_features), f"prompt {seed}: a block row's features left its step's"
        assert torch.equal(block_logits, step_logits), f"prompt {seed}: a block row's logits left its step's"
