"""Rows joining a running decode (continuous batching): each joining row's output is what it is alone."""

from __future__ import annotations

import pytest
import torch

from blockdraft.io.drafts import LoadedDraft
from blockdraft.decode.generate import Admission, generate, stream
from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.selection import Selector
from blockdraft.errors import InputError
from blockdraft.sampling import SamplingParams

from step_fakes import proposer
from tiny_models import tiny_draft, tiny_target

FIRST = [[1, 5, 9, 13, 17], [3, 4]]
LATER = [[7, 8, 9, 10, 11, 12, 13, 14, 15], [2, 6], [5, 5, 5, 9]]


def run_with_admissions(target, guesses, budgets_first, later, *, after: int, selector=None, room=None):
    """Decode FIRST with the proposer `guesses`, admitting one row of `later` [(prompt, budget, seed)] every `after`
    events; tokens per row."""
    queue, seen, rooms = list(later), [0], []
    got: dict[int, list[int]] = {}

    def admit(room: int) -> list[Admission]:
        rooms.append(room)
        if queue and seen[0] >= after:
            seen[0] = 0
            prompt, budget, seed = queue.pop(0)
            return [Admission(prompt, budget, seed)]
        return []

    for event in stream(target, guesses, FIRST, max_new_tokens=budgets_first, stop_token_ids=[], admit=admit,
                        selector=selector, room=room):
        got.setdefault(event.row, []).extend(event.tokens)
        seen[0] += 1
    assert not queue, "every later row must have been admitted"
    return got, rooms


@pytest.mark.parametrize("mode", ["alone", "chain", "adaptive-tree-lookup"])
def test_joining_rows_decode_as_they_would_alone(mode):
    target = tiny_target("llama")
    draft = None if mode == "alone" else tiny_draft(target, block_size=4)
    guesses = proposer(target, draft, "default" if mode == "adaptive-tree-lookup" else "chain", block_size=4)
    later = [(p, b, None) for p, b in zip(LATER, [12, 20, 7])]
    got, rooms = run_with_admissions(target, guesses, [30, 10], later, after=3)
    assert set(got) == {0, 1, 2, 3, 4} and min(rooms) >= 30 + 5
    for row, (prompt, budget) in enumerate(zip(FIRST + LATER, [30, 10, 12, 20, 7])):
        alone = generate(target, TargetAlone(), [prompt], max_new_tokens=budget, stop_token_ids=[])[0]
        assert got[row] == alone.tokens, f"row {row} ({mode}) differs from the target alone"


def test_a_joining_sampled_row_draws_what_it_draws_alone():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    params = SamplingParams(temperature=0.9, seed=0)
    later = [(LATER[0], 16, 1234)]
    selector = Selector(params, seeds=[11, 12])
    got, _ = run_with_admissions(target, proposer(target, draft, block_size=4), [24, 8], later, after=4,
                                 selector=selector)
    alone = generate(target, proposer(target, draft, block_size=4), [LATER[0]], max_new_tokens=16, stop_token_ids=[],
                     selector=Selector(params, seeds=[1234]))[0]
    # The draft's q enters every acceptance test, so this also checks that the joining row's prompt features
    # reached the draft's context (greedy output is exact whatever the draft sees).
    assert got[2] == alone.tokens, "a seeded row must draw the same tokens when it joins a running batch"


def test_joining_coupled_rows_draw_the_target_alone_samples_of_their_seeds():
    """Coupled rows joining adaptive trees with lookups: every row, first or joining, is the target-alone sample
    of its own seed (its noise is keyed by its seed and positions, whoever shares the batch)."""
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=0)
    later = [(p, b, seed) for p, b, seed in zip(LATER, [12, 20, 7], [31, 32, 33])]
    got, _ = run_with_admissions(target, proposer(target, draft, "default", block_size=4), [30, 10], later, after=3,
                                 selector=Selector(params, seeds=[21, 22], coupled=True))
    for row, (prompt, budget, seed) in enumerate(zip(FIRST + LATER, [30, 10, 12, 20, 7], [21, 22, 31, 32, 33])):
        alone = generate(target, TargetAlone(), [prompt], max_new_tokens=budget, stop_token_ids=[],
                         selector=Selector(params, seeds=[seed], coupled=True))[0]
        assert got[row] == alone.tokens, f"row {row} is not the target-alone sample of its seed {seed}"


@pytest.mark.parametrize("with_draft", [False, True])
def test_rows_can_join_after_every_row_has_finished(with_draft):
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4) if with_draft else None
    guesses = proposer(target, draft, "default", block_size=4)
    later = [(LATER[0], 20, None)]  # over the first rows' own need: it fits the room kept for joining rows
    got, rooms = run_with_admissions(target, guesses, [2, 2], later, after=4, room=64)
    assert got[2] == generate(target, TargetAlone(), [LATER[0]], max_new_tokens=20, stop_token_ids=[])[0].tokens
    assert rooms[0] == 64, "the caches keep the room asked for"


def test_a_row_that_does_not_fit_is_refused():
    target = tiny_target("llama")

    def admit(room):
        return [Admission([1] * room, 1)]

    with pytest.raises(InputError, match="within"):
        list(stream(target, TargetAlone(), [[1, 2]], max_new_tokens=3, admit=admit))


def test_stats_grow_with_the_joining_rows():
    from blockdraft.metrics import AcceptanceStats

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    stats = [AcceptanceStats(4), AcceptanceStats(4)]
    queue = [Admission(LATER[1], 6)]
    list(stream(target, proposer(target, draft, block_size=4), FIRST, max_new_tokens=8, stats=stats,
                admit=lambda room: [queue.pop()] if queue else []))
    assert len(stats) == 3 and stats[2].steps > 0 and sum(stats[2].histogram) == stats[2].steps



def test_a_joining_prompts_ids_join_the_proposal_vocabulary():
    from blockdraft.decode.drafter import Drafter

    target = tiny_target("llama")
    drafter = Drafter(LoadedDraft(tiny_draft(target, block_size=4), vocab=torch.arange(0, 40)), target)
    drafter.start(1, 64, [[1, 2, 50]])
    assert drafter.active_ids[40:].tolist() == [50]
    drafter.add_rows([[3, 60, 50, 70]])
    assert drafter.active_ids[40:].tolist() == [50, 60, 70] and drafter.cache.keys[0].shape[0] == 2
    logits, ids = drafter._logits(torch.tensor([1, 3]), torch.tensor([0, 0]), 2)
    assert logits.shape[-1] == ids.numel() == 43
    rows = torch.randn(3, target.config.hidden_size)
    assert torch.allclose(drafter.extra_head(rows).float(), target.logits(rows)[:, [50, 60, 70]], atol=1e-5), \
        "the extra head scores exactly the extra ids, in active_ids' order"


def test_pending_features_stay_as_wide_as_a_row_however_long_the_batch_runs(monkeypatch):
    """A batch that never drafts (every step plain, as at a wide batch on a CPU) keeps each row's tapped features
    for the draft's next step. Rows come and go for as long as a server is busy: the buffer must stay as wide as
    the longest row's context, not grow by a position every step."""
    import blockdraft.decode.generate as generate_module

    from step_fakes import own_proposer

    class PlainOnly:
        def at_batch(self, rows) -> None:
            pass

        def choose(self) -> int:
            return 1

        def observe(self, width, num_accepted, within=None) -> None:
            pass

    target = tiny_target("llama")
    guesses = own_proposer(target, tiny_draft(target, block_size=4), PlainOnly())
    widths, real = [], generate_module.step

    def step(state, *args):
        widths.append(state.pending.features.shape[1])
        return real(state, *args)

    monkeypatch.setattr(generate_module, "step", step)
    queue, live = [LATER[i % len(LATER)] for i in range(40)], [len(FIRST)]

    def admit(room: int) -> list[Admission]:  # a row joins as one leaves: two rows all along
        if not queue or live[0] >= 2:
            return []
        live[0] += 1
        return [Admission(queue.pop(), 6)]

    rows = 0
    for event in stream(target, guesses, FIRST, max_new_tokens=6, stop_token_ids=[], admit=admit, room=32):
        rows = max(rows, event.row + 1)
        live[0] -= event.finish_reason is not None
    assert rows == 42 and len(widths) > 100
    longest = max(len(p) for p in FIRST + LATER) + 6
    assert max(widths) <= longest, f"pending grew to {max(widths)} positions; no row has more than {longest}"
