"""The decode loop's spine: speculative greedy output is the target's own greedy output, token for token."""

from __future__ import annotations

import pytest
import torch

from blockdraft.decode.decoder import Decoder
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.errors import InputError

from step_fakes import ScriptedDrafter, proposer
from tiny_models import random_prompts, tiny_draft, tiny_target

PROMPTS = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_speculative_greedy_equals_target_greedy(family, block_size):
    target = tiny_target(family)
    draft = tiny_draft(target, block_size=16)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    spec = generate(target, proposer(target, draft, block_size=block_size), PROMPTS, max_new_tokens=40,
                    stop_token_ids=[])
    for b, s in zip(base, spec):
        assert s.tokens == b.tokens, "speculative decoding changed the target's greedy output"
        assert len(s.tokens) == 40 and s.finish_reason == "length"


def test_baseline_equals_hf_generate():
    """Our target-only loop is the oracle; it must itself agree with transformers' greedy generate."""
    target = tiny_target("llama")
    ours = generate(target, TargetAlone(), [PROMPTS[0]], max_new_tokens=30, stop_token_ids=[])[0].tokens
    hf = target.model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=30, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    assert hf[0, len(PROMPTS[0]):].tolist() == ours


@pytest.mark.parametrize("block_size", [4, 16])
def test_partial_acceptance_every_length_is_exact(block_size):
    target = tiny_target("qwen3")
    max_new = block_size * (block_size + 1) // 2 + 8  # one full cycle of j = 0..K-1 and then some
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=max_new + block_size, stop_token_ids=[])
    reference = [p + r.tokens for p, r in zip(PROMPTS, base)]
    drafter = ScriptedDrafter(reference, block_size)
    spec = generate(target, proposer(target, drafter), PROMPTS, max_new_tokens=max_new, stop_token_ids=[])
    for ref, p, s in zip(reference, PROMPTS, spec):
        assert s.tokens == ref[len(p): len(p) + max_new], "a partially accepted block changed the output"
    hist = spec[0].stats.merge(spec[1].stats).merge(spec[2].stats).histogram
    assert all(n > 0 for n in hist[:block_size]), f"every acceptance length 1..K must occur, histogram {hist}"
    assert hist[block_size] == 0, f"a block of K slots cannot commit more than K tokens, histogram {hist}"


def test_stop_token_ends_row_and_is_included():
    target = tiny_target("llama")
    base = generate(target, TargetAlone(), [PROMPTS[0]], max_new_tokens=30, stop_token_ids=[])[0].tokens
    stop = base[7]
    first = base.index(stop)
    draft = tiny_draft(target)
    for d in (None, draft):
        out = generate(target, proposer(target, d), [PROMPTS[0]], max_new_tokens=30, stop_token_ids=[stop])[0]
        assert out.tokens == base[: first + 1] and out.finish_reason == "stop"


def test_rows_finishing_at_different_steps_match_rows_alone():
    target = tiny_target("llama")
    draft = tiny_draft(target)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    # A stop token that ends the rows after different numbers of tokens (or not at all).
    lengths = lambda stop: {r.tokens.index(stop) if stop in r.tokens else 40 for r in base}
    stop = next(t for t in base[0].tokens if len(lengths(t)) > 1)
    batch = generate(target, proposer(target, draft, block_size=8), PROMPTS, max_new_tokens=40, stop_token_ids=[stop])
    for prompt, row in zip(PROMPTS, batch):
        alone = generate(target, proposer(target, draft, block_size=8), [prompt], max_new_tokens=40,
                         stop_token_ids=[stop])[0]
        assert row.tokens == alone.tokens and row.finish_reason == alone.finish_reason
    assert len({len(r.tokens) for r in batch}) > 1, "rows should finish at different steps"


def test_acceptance_stats_convention():
    target = tiny_target("llama")
    base = generate(target, TargetAlone(), [PROMPTS[0]], max_new_tokens=80, stop_token_ids=[])[0]
    drafter = ScriptedDrafter([PROMPTS[0] + base.tokens], 8)
    out = generate(target, proposer(target, drafter), [PROMPTS[0]], max_new_tokens=64, stop_token_ids=[])[0]
    stats = out.stats
    assert stats.steps == sum(stats.histogram)
    # The prefill token is not a speculative step; every later token is counted once in tau.
    assert stats.tokens == len(out.tokens) - 1 == 63
    # The scripted draft is right for j = 0, 1, ..., 7, 0, ... proposals at step 1, 2, ...: tau cycles 1..8, and
    # the budget cuts the 15th step (tau 7) to the 6 tokens left.
    taus, left = [], 63
    while left:
        taus.append(min(len(taus) % 8 + 1, left))
        left -= taus[-1]
    assert stats.histogram == [taus.count(t) for t in range(1, 9)] + [0], "a step was binned under the wrong tau"
    assert stats.mean_tau == pytest.approx(63 / 15)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(prompts=[[]]), "empty"),
        (dict(prompts=[]), "no prompts"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(prompts=[[1] * 500]), "context"),
        (dict(block_size=32), "block_size"),
        (dict(block_size=1), "block_size"),
    ],
)
def test_bad_input_is_refused_before_compute(kwargs, word):
    target = tiny_target("llama")
    draft = tiny_draft(target)
    args = dict(prompts=[[1, 2, 3]], max_new_tokens=20, block_size=16)
    args.update(kwargs)
    with pytest.raises(InputError, match=word):
        guesses = proposer(target, draft, block_size=args.pop("block_size"))
        generate(target, guesses, args.pop("prompts"), **args)


def test_per_row_budgets_equal_rows_alone():
    target = tiny_target("llama")
    draft = tiny_draft(target)
    budgets = [5, 23, 12]
    batch = generate(target, proposer(target, draft, block_size=8), PROMPTS, max_new_tokens=budgets, stop_token_ids=[])
    for prompt, budget, row in zip(PROMPTS, budgets, batch):
        alone = generate(target, proposer(target, draft, block_size=8), [prompt], max_new_tokens=budget,
                         stop_token_ids=[])[0]
        assert row.tokens == alone.tokens and len(row.tokens) == budget and row.finish_reason == "length"


def test_dropped_row_stops_at_once_and_leaves_the_others_alone():
    from blockdraft.decode.generate import stream

    target = tiny_target("llama")
    draft = tiny_draft(target)
    base = generate(target, proposer(target, draft, block_size=4), PROMPTS, max_new_tokens=30, stop_token_ids=[])
    got, dropped = [[] for _ in PROMPTS], []

    def drop():
        if len(got[1]) >= 6 and not dropped:
            dropped.append(len(got[1]))
        return [1] if dropped else []

    for event in stream(target, proposer(target, draft, block_size=4), PROMPTS, max_new_tokens=30, stop_token_ids=[],
                        drop=drop):
        assert not (dropped and event.row == 1), "a dropped row must get no further event"
        got[event.row].extend(event.tokens)
    assert got[1] == base[1].tokens[: dropped[0]]
    assert got[0] == base[0].tokens and got[2] == base[2].tokens


@pytest.mark.parametrize("budget", [0, -1, [4, 4], [4, 0, 4], 2.5])
def test_bad_budgets_are_refused(budget):
    target = tiny_target("llama")
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(target, TargetAlone(), PROMPTS, max_new_tokens=budget)


def test_bf16_chain_speculation_returns_the_target_alones_tokens():
    # In bf16 a verify row rounds apart from a one-token step unless both attend over spans on one grid
    # (span.SPAN_GRID): with exact spans 3 of these 12 prompts part from the target alone here.
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.model.target import Target

    tiny = tiny_target("llama", layers=4, seed=3)
    with torch.no_grad():
        tiny.lm_head.weight.div_(8.0)  # near-ties back: bf16 rounding must not decide them differently
    target = Target(tiny.model.bfloat16())
    options = DecodeOptions(block_size=6, tree=False, adaptive=False, lookup=False)
    for prompt in random_prompts([5, 9, 13, 17, 22, 30, 31, 40, 7, 11, 19, 25], seed=1):
        alone = Decoder(target, None).generate([prompt], max_new_tokens=48, stop_token_ids=[])[0].tokens
        drafted = Decoder(target, ScriptedDrafter([prompt + alone], 6), options).generate(
            [prompt], max_new_tokens=48, stop_token_ids=[])[0].tokens
        assert drafted == alone, f"prompt of {len(prompt)} tokens: bf16 verify blocks left the target's tokens"


def assert_bf16_batch_rows_equal_alone(seed: int, lengths: list[int], prompt_seed: int, max_new_tokens: int):
    """A 4-layer bf16 target with near-ties (its head scaled down): every row of one batch of random prompts of
    `lengths` must give the tokens its prompt gives alone."""
    from blockdraft.model.target import Target

    tiny = tiny_target("llama", layers=4, seed=seed)
    with torch.no_grad():
        tiny.lm_head.weight.div_(8.0)  # near-ties back: bf16 rounding must not decide them differently
    target = Target(tiny.model.bfloat16())
    prompts = random_prompts(lengths, seed=prompt_seed)
    batched = Decoder(target, None).generate(prompts, max_new_tokens=max_new_tokens, stop_token_ids=[])
    for prompt, result in zip(prompts, batched):
        alone = Decoder(target, None).generate([prompt], max_new_tokens=max_new_tokens, stop_token_ids=[])[0].tokens
        assert result.tokens == alone, f"prompt of {len(prompt)} tokens: its row in a bf16 batch left its tokens alone"


def test_prompts_of_other_widths_are_prefilled_apart_and_keep_their_tokens_alone():
    # The CPU attention kernel's result for a prompt depends on the width the forward is padded to: padded to the
    # batch's longest prompt (304), the 230-token prompt (240 alone) parted from its tokens alone in bf16. Prompts of one padded width are now prefilled together, apart from the others (230 and 228 here).
    assert_bf16_batch_rows_equal_alone(0, [60, 100, 140, 150, 170, 200, 230, 250, 300, 228], 0, 24)


def test_bf16_rows_in_a_batch_return_their_tokens_alone():
    # A batch is right-padded to its longest prompt; unless every prefill's span lies on span.SPAN_GRID, the
    # causal attention kernel sums a shorter row's keys in other lanes and bf16 rounds its cache apart (1 of these
    # 12 prompts parted, and 6 of 8 HumanEval answers of SmolLM2 in a batch of 8).
    assert_bf16_batch_rows_equal_alone(3, [5, 9, 13, 17, 22, 30, 31, 40, 7, 11, 19, 25], 1, 32)
