"""Batches and seeds through the whole decode loop (docs/design.md §4), and bad sampling input.

- Greedy rows of a ragged batch equal the same rows decoded alone.
- A sampled row's tokens depend only on its seed, not on the batch it shares; unseeded sampling leaves the
  caller's global generator alone.
- Bad sampling input fails before compute, naming the parameter; NaN draft logits fail loudly.
"""

from __future__ import annotations

import pytest
import torch

import blockdraft.api as api
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.errors import InputError
from blockdraft.sampling import SamplingParams

from step_fakes import ScriptedDrafter, proposer
from tiny_models import VOCAB, random_prompts, tiny_draft, tiny_target


# ---------------------------------------------------------------------------------------------- ragged batches

PROMPT_LENGTHS = [1, 9, 3, 14, 5, 2, 11, 7]
MAX_NEW = 28
K = 8


@pytest.fixture(scope="module")
def llama():
    target = tiny_target("llama")
    prompts = random_prompts(PROMPT_LENGTHS, seed=5)
    # The target's own greedy continuations, long enough for the scripted drafter to look K ahead.
    base = generate(target, TargetAlone(), prompts, max_new_tokens=MAX_NEW + K, stop_token_ids=[])
    references = [p + r.tokens for p, r in zip(prompts, base)]
    return target, prompts, references


def staggered_stop(prompts, references) -> int:
    """A stop token that ends the rows after the most different numbers of tokens (some rows not at all)."""
    outputs = [ref[len(p): len(p) + MAX_NEW] for p, ref in zip(prompts, references)]

    def ends(token):
        return {out.index(token) if token in out else MAX_NEW for out in outputs}

    return max(sorted({t for out in outputs for t in out}), key=lambda t: len(ends(t)))


@pytest.mark.parametrize("drafter_kind", ["tiny_draft", "scripted"])
def test_batch_equals_rows_alone(llama, drafter_kind):
    target, prompts, references = llama
    draft = tiny_draft(target, block_size=K)

    def drafter(rows: list[int]):
        if drafter_kind == "scripted":  # right for exactly the first j proposals, j cycling: every tau occurs
            return ScriptedDrafter([references[i] for i in rows], K)
        return draft

    stop = [staggered_stop(prompts, references)]
    alone = [generate(target, proposer(target, drafter([i]), block_size=K), [p], max_new_tokens=MAX_NEW,
                      stop_token_ids=stop)[0]
             for i, p in enumerate(prompts)]
    lengths = {len(r.tokens) for r in alone}
    assert len(lengths) >= 3 and {r.finish_reason for r in alone} == {"stop", "length"}, (
        f"rows should finish at different steps, got lengths {sorted(lengths)}"
    )
    for n in range(1, len(prompts) + 1):
        batch = generate(target, proposer(target, drafter(list(range(n))), block_size=K), prompts[:n],
                         max_new_tokens=MAX_NEW, stop_token_ids=stop)
        for i, (row, single) in enumerate(zip(batch, alone)):
            assert row.tokens == single.tokens and row.finish_reason == single.finish_reason, (
                f"row {i} of a batch of {n} differs from the row decoded alone: batching changed greedy output"
            )


# ---------------------------------------------------------------------------------------------- reproducibility

SAMPLING = SamplingParams(temperature=1.0, top_p=0.95, seed=41)


@pytest.mark.parametrize("with_draft", [True, False])
def test_sampled_row_depends_only_on_its_seed(llama, with_draft):
    """Row i of a batch seeded s equals row i alone seeded s + i, and a repeated call repeats every row."""
    target, prompts, _ = llama
    draft = tiny_draft(target, block_size=K) if with_draft else None
    rows = prompts[:4]
    batch = api.generate(target, draft, rows, max_new_tokens=20, stop_token_ids=[], sampling=SAMPLING)
    again = api.generate(target, draft, rows, max_new_tokens=20, stop_token_ids=[], sampling=SAMPLING)
    assert [c.tokens for c in again] == [c.tokens for c in batch], "the same seed must give the same tokens"
    for i, prompt in enumerate(rows):
        seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=SAMPLING.seed + i)
        alone = api.generate(target, draft, prompt, max_new_tokens=20, stop_token_ids=[], sampling=seeded)
        assert alone.tokens == batch[i].tokens, f"row {i}'s samples changed with the batch it shares"
    other = api.generate(target, draft, rows, max_new_tokens=20, stop_token_ids=[],
                         sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=1041))
    assert [c.tokens for c in other] != [c.tokens for c in batch], "a different seed should change the samples"


def test_unseeded_sampling_leaves_global_rng_alone(llama):
    target, prompts, _ = llama
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    api.generate(target, None, prompts[0], max_new_tokens=4, sampling=SamplingParams(temperature=1.0))
    assert torch.equal(torch.rand(3), expected), "generate must not re-seed the caller's global torch generator"


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "params, name",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=0.7, top_p=0.0), "top_p"),
        (dict(temperature=0.7, top_p=1.5), "top_p"),
        (dict(temperature=0.7, top_k=-1), "top_k"),
        (dict(temperature=0.7, min_p=1.0), "min_p"),
        (dict(temperature=0.7, min_p=-0.1), "min_p"),
    ],
)
def test_bad_sampling_params_name_the_parameter(llama, params, name):
    target, prompts, _ = llama
    with pytest.raises(InputError, match=f"`{name}`"):
        api.generate(target, None, prompts[0], max_new_tokens=4, sampling=SamplingParams(**params))


def test_sampling_must_be_sampling_params(llama):
    target, prompts, _ = llama
    with pytest.raises(InputError, match="`sampling`"):
        api.generate(target, None, prompts[0], max_new_tokens=4, sampling={"temperature": 0.7})


class NaNDrafter(ScriptedDrafter):
    """A draft whose logits overflowed: every entry NaN."""

    def propose(self, anchors, anchor_positions, slots=None):
        return torch.full((anchors.shape[0], slots or self.block_size - 1, VOCAB), float("nan"))


@pytest.mark.parametrize("draft_argmax", [False, True])
def test_nan_draft_logits_raise_under_sampling(llama, draft_argmax):
    target, prompts, _ = llama
    with pytest.raises(InputError, match="NaN"):
        api.generate(target, NaNDrafter([[0]], K), prompts[:2], max_new_tokens=8, draft_argmax=draft_argmax,
                     sampling=SamplingParams(temperature=0.7, seed=0))
