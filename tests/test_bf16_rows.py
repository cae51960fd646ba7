"""bf16 products where bf16 is emulated run ATen's own kernel (kernels.aten_bf16_products): a row's bits do not
depend on the rows beside it, so a request's tokens do not depend on its batch-mates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.model import kernels
from blockdraft.model.target import Target

from tiny_models import needs_smollm2, tiny_target

CPU = torch.device("cpu")


@pytest.fixture
def emulated(monkeypatch):
    """This process's CPU as one without native bf16 products (an Ice Lake, a Zen 3)."""
    paths = kernels.CpuPaths("test", True, native_bf16=False, packed_bf16=False, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)


@pytest.fixture
def two_threads():
    """oneDNN's emulated bf16 product split rows over 2 threads by their count: the case that parted."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_inside_it_each_row_keeps_its_bits_at_every_row_count(emulated, two_threads):
    # SmolLM2's head shape: oneDNN's emulated product rounded rows apart at 1-3 and every odd count from 5 on
    # (an Ice Lake, 2 threads); its MLP's up projection at counts 2-35.
    generator = torch.Generator().manual_seed(0)
    for n, d in ((49152, 576), (1536, 576)):
        weight = torch.randn(n, d, generator=generator).mul_(0.05).bfloat16()
        rows = torch.randn(12, d, generator=generator).bfloat16()
        with kernels.aten_bf16_products(CPU, torch.bfloat16):
            together = F.linear(rows, weight)
            for count in range(1, 12):
                assert torch.equal(F.linear(rows[:count].contiguous(), weight), together[:count]), (n, d, count)


def test_it_gives_onednn_back_and_leaves_native_bf16_and_float32_alone(emulated, monkeypatch):
    assert torch.backends.mkldnn.enabled
    with kernels.aten_bf16_products(CPU, torch.bfloat16):
        assert not torch.backends.mkldnn.enabled
    assert torch.backends.mkldnn.enabled
    with pytest.raises(RuntimeError), kernels.aten_bf16_products(CPU, torch.bfloat16):
        raise RuntimeError("a failed forward")
    assert torch.backends.mkldnn.enabled, "restored after an error too"
    with kernels.aten_bf16_products(CPU, torch.float32):
        assert torch.backends.mkldnn.enabled
    native = kernels.CpuPaths("test", True, native_bf16=True, packed_bf16=True, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: native)
    with kernels.aten_bf16_products(CPU, torch.bfloat16):
        assert torch.backends.mkldnn.enabled


def test_a_bf16_targets_forward_and_head_run_inside_it(emulated):
    target = Target(tiny_target("llama").model.to(torch.bfloat16))
    seen = []
    head = target.head

    def spy(x):
        seen.append(torch.backends.mkldnn.enabled)
        return head(x)

    target.head = spy
    ids = torch.tensor([[3, 5, 7, 9]])
    target.forward(ids, torch.arange(4)[None], target.new_cache(1, 16), logit_rows=torch.tensor([[3]]))
    target.logits(torch.zeros(1, target.config.hidden_size, dtype=torch.bfloat16))
    assert seen == [False, False] and torch.backends.mkldnn.enabled


@needs_smollm2
def test_smollm2_in_bf16_gives_a_prompt_the_same_logits_batched_as_alone(two_threads):
    """On every CPU class: prefilled beside prompts of its padded width, then stepped beside rows at other
    positions (a longer span), a prompt's logits are those of the prompt alone, bit for bit."""
    from blockdraft.io.targets import load_target

    target = load_target(weights="bf16")
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (3, 29), generator=generator)  # [3, 29]: one padded width
    nexts = torch.randint(100, 40000, (3, 1), generator=generator)

    def logits(rows: torch.Tensor, steps: torch.Tensor, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = rows.shape
        cache = target.new_cache(B, T + extra + 8)
        first = target.forward(rows, torch.arange(T).expand(B, T), cache, logit_rows=torch.full((B, 1), T - 1))
        positions = torch.full((B, 1), T) + torch.tensor([[extra]] * B) * (torch.arange(B)[:, None] > 0)
        second = target.forward(steps, positions, cache, logit_rows=torch.zeros(B, 1, dtype=torch.long))
        return first.logits, second.logits

    together = logits(prompts, nexts, extra=20)  # rows 1-2 step at position 49: row 0's step spans 64 keys
    alone = logits(prompts[:1], nexts[:1])
    assert torch.equal(together[0][:1], alone[0]), "the prefill"
    assert torch.equal(together[1][:1], alone[1]), "the step"
