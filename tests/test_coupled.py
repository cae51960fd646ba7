"""Coupled sampling through the decode loop: a seeded sample equals the target-alone sample of the same seed,
token for token in float32, whatever the draft proposes, the step shapes and the batch.

Its distribution is tested in test_sampling_decode.py (chi-square); here its determinism, which is what lets a
seeded request adapt its widths and still reproduce, and what makes sampled output testable like greedy output.
"""

from __future__ import annotations

import pytest

import blockdraft.api as api
from blockdraft.decode.generate import generate
from blockdraft.decode.selection import Selector
from blockdraft.sampling import SamplingParams

from step_fakes import ScriptedDrafter, proposer
from tiny_models import random_prompts, tiny_draft, tiny_target

SAMPLING = SamplingParams(temperature=1.0, top_p=0.95, seed=77)
PROMPT_LENGTHS = [4, 11, 2, 7]
MAX_NEW = 40
K = 6


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    prompts = random_prompts(PROMPT_LENGTHS, seed=3)
    alone = [coupled(target, None, [p], seed=SAMPLING.seed + i, max_new=MAX_NEW + K)[0]
             for i, p in enumerate(prompts)]  # row i of a batch seeded s is seeded s + i
    return target, prompts, [p + a for p, a in zip(prompts, alone)]


def coupled(target, draft, prompts, seed=SAMPLING.seed, max_new=MAX_NEW, **modes) -> list[list[int]]:
    selector = Selector(SamplingParams(temperature=1.0, top_p=0.95, seed=seed), len(prompts), coupled=True)
    results = generate(target, proposer(target, draft, block_size=K, **modes), prompts, max_new_tokens=max_new,
                       stop_token_ids=[], selector=selector)
    return [r.tokens for r in results]


MODES = {"chain": {}, "tree": dict(tree=True), "adaptive-trees-lookup": dict(tree=True, adaptive=True, lookup=True)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter_kind", ["scripted", "tiny_draft"])
def test_seeded_sample_equals_target_alone_sample(setup, mode, drafter_kind):
    """A scripted draft (right for exactly the first j guesses, every j in turn) and a random one, in a ragged
    batch: every row is the target's own sample of its seed, whatever was accepted at each step."""
    target, prompts, references = setup
    draft = ScriptedDrafter(references, K) if drafter_kind == "scripted" else tiny_draft(target, block_size=K)
    got = coupled(target, draft, prompts, **MODES[mode])
    for i, (row, ref, prompt) in enumerate(zip(got, references, prompts)):
        assert row == ref[len(prompt): len(prompt) + MAX_NEW], (
            f"row {i} ({mode}, {drafter_kind}) differs from the target-alone sample of its seed: coupled "
            "verification picked another token than the target would alone")


def test_a_scripted_draft_is_accepted_under_coupled_sampling(setup):
    """The equality test must exercise long acceptances, not only plain steps."""
    target, prompts, references = setup
    selector = Selector(SAMPLING, len(prompts), coupled=True)
    results = generate(target, proposer(target, ScriptedDrafter(references, K), block_size=K), prompts,
                       max_new_tokens=MAX_NEW, stop_token_ids=[], selector=selector)
    histogram = [sum(h) for h in zip(*(r.stats.histogram[:K] for r in results))]  # a chain has no overflow
    assert all(count > 0 for count in histogram), f"every acceptance length 1..K should occur: {histogram}"


def test_noise_at_the_wrong_position_fails_the_equality_test(setup, monkeypatch):
    """Verifying with the noise of the next position is still an exact sampler, but not the target-alone sample
    of the seed: the equality test must catch it."""
    target, prompts, references = setup
    accept = Selector.accept
    monkeypatch.setattr(Selector, "accept", lambda self, logits, q, proposals, rows, positions, limits=None:
                        accept(self, logits, q, proposals, rows, positions + 1, limits))
    got = coupled(target, tiny_draft(target, block_size=K), prompts)
    assert got != [ref[len(p): len(p) + MAX_NEW] for ref, p in zip(references, prompts)], (
        "noise at the wrong position passed the equality test; the test has no power")


def test_a_seed_reproduces_its_sample_and_another_seed_changes_it(setup):
    target, prompts, _ = setup
    draft = tiny_draft(target, block_size=K)
    first = coupled(target, draft, prompts, tree=True, adaptive=True)
    assert coupled(target, draft, prompts, tree=True, adaptive=True) == first
    assert coupled(target, draft, prompts, seed=SAMPLING.seed + 100, tree=True, adaptive=True) != first


def test_the_api_couples_seeded_sampling(setup):
    """`api.generate` with a seed samples coupled by default: the speculative text is the target-alone text."""
    target, prompts, _ = setup
    draft = tiny_draft(target, block_size=K)
    spec = api.generate(target, draft, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[], sampling=SAMPLING,
                        tree=True, adaptive=True)
    alone = api.generate(target, None, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[], sampling=SAMPLING)
    assert [c.tokens for c in spec] == [c.tokens for c in alone]


def test_an_unknown_sampler_is_refused_with_the_known_ones(setup):
    from blockdraft.errors import InputError

    target, prompts, _ = setup
    with pytest.raises(InputError, match="`sampler` must be one of auto, coupled, rejection"):
        api.generate(target, None, prompts[0], max_new_tokens=4, sampling=SAMPLING, sampler="gumbel")


def test_a_proposal_vocabulary_ranks_its_ids_under_their_own_noise():
    """The draft scoring only the ids of a proposal vocabulary must see each id's own noise: its ranking is the
    full-vocabulary ranking restricted to those ids (a wrong gather would still be exact, only worse guesses).
    The noise enters the ranking (at weight RANK_NOISE), so the top candidate follows it."""
    import torch

    from blockdraft.decode.selection import RANK_NOISE

    selector = Selector(SamplingParams(temperature=0.8, seed=3), 1, coupled=True)
    V, ids = 50, torch.tensor([4, 9, 17, 30, 41])
    logits = torch.randn(1, 2, V, generator=torch.Generator().manual_seed(0))  # [B, n, V]
    rows, positions = torch.tensor([0]), torch.tensor([[5, 6]])
    full = selector.draft_scores(logits, None, V, positions, rows)  # [1, 2, V]
    part = selector.draft_scores(logits[..., ids], ids, V, positions, rows)  # [1, 2, 5]
    assert torch.equal(full[..., ids].argsort(dim=-1), part.argsort(dim=-1))
    noise = selector.noise(rows, positions, V)
    expected = (logits / 0.8 + RANK_NOISE * noise).argmax(-1)
    assert torch.equal(full.argmax(-1), expected), "the top candidate must be argmax(log q + RANK_NOISE * g)"


def test_a_finished_rows_noise_is_freed(setup):
    """Rows that finish stop being asked for noise, and what was cached for them is freed: a server batch that
    keeps admitting requests would otherwise keep a few MB per finished row for its whole life."""
    target, prompts, _ = setup
    selector = Selector(SAMPLING, 2, coupled=True)
    generate(target, proposer(target, tiny_draft(target, block_size=K), "tree", block_size=K), prompts[:2],
             max_new_tokens=[3, 30], stop_token_ids=[], selector=selector)
    assert not selector._noise[0], "the row that finished first still holds its noise"
    assert selector._noise[1], "the last live row's noise is kept (it is freed with the selector)"


def test_coupled_selection_without_positions_is_refused():
    import torch

    from blockdraft.errors import InputError

    selector = Selector(SAMPLING, 1, coupled=True)
    with pytest.raises(InputError, match="positions"):
        selector.accept(torch.zeros(1, 2, 8), None, torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]))
