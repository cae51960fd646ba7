"""An int4 target's prompts over packed bf16 copies of its weights (model/prompt_path.py): the copies are the
int4 kernel's own weights, a prefill over them is the bf16 target's prefill bit for bit, decode steps stay int4,
a row's prefill is the same in any batch, and a CPU without packed bf16 keeps the int4 prefill."""

from __future__ import annotations

import torch

from blockdraft.model import kernels, prompt_path
from blockdraft.model.target import Target

from tiny_models import needs_packing, quantized_target


def prefill_logits(target: Target, prompt: torch.Tensor, prompt_path_on: bool) -> torch.Tensor:
    """[B, V] logits after prompt [B, T] from one prefill."""
    B, T = prompt.shape
    cache = target.new_cache(B, 32)
    out = target.forward(prompt, torch.arange(T).expand(B, T), cache, logit_rows=torch.full((B, 1), T - 1),
                         prompt=prompt_path_on)
    return out.logits[:, 0]


@needs_packing
def test_the_copies_are_the_kernels_weights_in_bf16():
    quantized, plain = quantized_target()
    for layer, twin in zip(quantized.linears, plain.model.model.layers):
        weight = prompt_path.bf16_weight(layer["down"])
        assert torch.equal(weight, twin.mlp.down_proj.weight), "the identity through the kernel is its weight"


@needs_packing
def test_a_prompt_runs_over_the_bf16_copies_and_a_step_over_int4():
    quantized, plain = quantized_target()
    assert quantized._prompt_plans is not None and plain._prompt_plans is None
    prompt = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    over_copies = prefill_logits(quantized, prompt, True)
    assert torch.equal(over_copies, prefill_logits(plain, prompt, True)), "a prompt: the bf16 target's bits"
    assert not torch.equal(prefill_logits(quantized, prompt, False), over_copies), "int4 prefill rounds otherwise"
    # A decode step (prompt=False) stays on the int4 products.
    cache = quantized.new_cache(1, 32)
    quantized.forward(prompt[:1], torch.arange(16)[None], cache, prompt=True)
    step = quantized.forward(torch.tensor([[5]]), torch.tensor([[16]]), cache, logit_rows=torch.tensor([[0]]))
    cache = plain.new_cache(1, 32)
    plain.forward(prompt[:1], torch.arange(16)[None], cache, prompt=True)
    bf16_step = plain.forward(torch.tensor([[5]]), torch.tensor([[16]]), cache, logit_rows=torch.tensor([[0]]))
    assert not torch.equal(step.logits, bf16_step.logits), "the step ran int4, not the bf16 copies"


@needs_packing
def test_a_rows_prefill_is_the_same_in_a_batch_as_alone():
    from blockdraft.decode.decoder import Decoder

    quantized, _ = quantized_target(seed=3)
    prompts = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 12, 30)]
    together = Decoder(quantized, None).generate(prompts, max_new_tokens=12, stop_token_ids=[])
    for prompt, result in zip(prompts, together):
        alone = Decoder(quantized, None).generate([prompt], max_new_tokens=12, stop_token_ids=[])[0]
        assert alone.tokens == result.tokens


def test_without_packed_bf16_the_prompt_stays_int4(monkeypatch):
    paths = kernels.cpu_paths()
    monkeypatch.setattr(prompt_path.kernels, "cpu_paths", lambda: type(paths)(
        "avx2", True, False, False, paths.int4))
    quantized, _ = quantized_target()
    assert quantized._prompt_plans is None
    prompt = torch.randint(3, 96, (1, 16), generator=torch.Generator().manual_seed(2))
    assert torch.equal(prefill_logits(quantized, prompt, True), prefill_logits(quantized, prompt, False))
