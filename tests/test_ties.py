"""Where two decodes part ways: the first differing token and the target's margin there (decode/ties.py), which
tells a near-tie that rounding can flip from a difference that marks a bug."""

from __future__ import annotations

import pytest
import torch

from blockdraft.decode.generate import generate

from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.selection import Selector
from blockdraft.decode.ties import Split, first_split, is_rounding
from blockdraft.sampling import SamplingParams

from tiny_models import VOCAB, random_prompts, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def decode(target, prompts, selector=None, max_new=12) -> list[list[int]]:
    results = generate(target, TargetAlone(), prompts, max_new_tokens=max_new, stop_token_ids=[], selector=selector)
    return [r.tokens for r in results]


def changed(tokens: list[int], index: int) -> list[int]:
    return tokens[:index] + [(tokens[index] + 1) % VOCAB] + tokens[index + 1:]


def test_the_first_split_and_the_targets_margin_there(target):
    prompts = random_prompts([5, 9], seed=1)
    base = decode(target, prompts)
    assert first_split(target, prompts, base, [list(t) for t in base]) is None
    other = [base[0], changed(changed(base[1], 7), 4)]
    split = first_split(target, prompts, base, other)
    assert (split.row, split.index, split.base_token, split.other_token) == (1, 4, base[1][4], other[1][4])
    with torch.no_grad():
        logits = target.model(torch.tensor([prompts[1] + base[1][:4]])).logits[0, -1].float()
    assert split.margin == pytest.approx(float(logits[base[1][4]] - logits[other[1][4]]), abs=1e-4)
    assert split.margin > 0 and split.scale == pytest.approx(float(logits.abs().max()), abs=1e-4)
    assert not is_rounding(split, torch.float32), "the tiny target's picks are decisive: a changed token is a bug"


def test_a_near_tie_is_rounding_and_a_clear_margin_is_not():
    tie, clear = Split(0, 3, 5, 6, 2e-5, 20.0), Split(0, 3, 5, 6, 0.05, 20.0)
    assert is_rounding(tie, torch.float32) and not is_rounding(clear, torch.float32)
    assert is_rounding(clear, torch.bfloat16), "bf16 resolves a score of 20 to about 0.1"
    assert is_rounding(Split(0, 0, 1, 2, -2e-5, 20.0), torch.float32), "either order of a near-tie"


def test_a_coupled_samples_margin_is_taken_under_its_own_positions_noise(target):
    # Every token of a coupled sample is the argmax of log p + g at its position: against any other token its
    # margin is positive. Noise of a neighbouring position would make some of these margins negative.
    params = SamplingParams(temperature=1.0, seed=5)
    prompts = random_prompts([6], seed=2)
    base = decode(target, prompts, Selector(params, 1, coupled=True), max_new=16)
    selector = Selector(params, 1, coupled=True)

    def pick_scores(row, position, logits):
        return selector.pick_scores(logits[None, None], torch.tensor([row]), torch.tensor([[position]]))[0, 0]

    margins = [first_split(target, prompts, base, [changed(base[0], i)], pick_scores).margin for i in range(16)]
    assert min(margins) > 0, margins
