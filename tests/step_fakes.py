"""Fakes for decode-step tests: a fixed step-cost model, a CPU-wait watch, a scripted drafter, width policies and
lookups that visit every kind of step (test_sampling_decode, test_lookup, test_policy), proposers as a Decoder builds
them, a tiny target whose step costs a test writes to the disk cache, and the check that a draft's proposals leave
the target's tokens unchanged.

Imported by test modules as `from step_fakes import ...`.
"""

from __future__ import annotations

import torch

from blockdraft.decode.costs import linear_costs
from blockdraft.decode.lookup import PromptLookup
from blockdraft.model.target import Target

from tiny_models import VOCAB, tiny_draft, tiny_target


# A fixed step-cost model (decode/costs.py) for tests that build adaptive policies and lookups themselves: a plain
# step costs 1, the draft a third of one more, each verified position 2 % of one.
COSTS = linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)


def fixed_watch(share):
    """A cpu_wait.WaitWatch stand-in whose threads waited `share()` of every block it watches."""

    class Watch:
        def __init__(self, threads: int = 1) -> None:
            self.share = None

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.share = share()

    return Watch


QuietWatch = fixed_watch(lambda: 0.0)  # a machine whose threads never wait for a CPU


def cached_for_a_tiny_target(tmp_path, monkeypatch, cached):
    """A named tiny target and its K = 4 drafter, with `cached` written as their step costs' disk cache (None:
    none) and the process's memory of cost models emptied: what a decode finds on a machine that measured before."""
    import blockdraft.decode.measure as generate
    from blockdraft.decode.cost_key import cost_key
    from blockdraft.decode.costs import write_cached
    from blockdraft.decode.drafter import Drafter

    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(generate, "_COSTS", {})
    target = tiny_target("llama")
    target.name = "tiny-test-target"
    drafter = Drafter(tiny_draft(target, block_size=4), target)
    if cached is not None:
        write_cached(tmp_path / "costs", cost_key(target, drafter.config, 4, True, None), cached)
    return target, drafter



def assert_drafted_tokens_are_the_targets(target, draft, options, prompts, max_new_tokens: int = 24) -> None:
    """Each prompt decoded with `draft` under `options` gives the target alone's tokens, and the draft ran."""
    from blockdraft.decode.decoder import Decoder

    for prompt in prompts:
        alone = Decoder(target, None).generate([prompt], max_new_tokens=max_new_tokens, stop_token_ids=[])[0]
        drafted = Decoder(target, draft, options).generate([prompt], max_new_tokens=max_new_tokens,
                                                           stop_token_ids=[])[0]
        assert drafted.stats.slot_reached, "the draft never ran: the test would prove nothing"
        assert drafted.tokens == alone.tokens, f"prompt of {len(prompt)} tokens: the draft's proposals left the " \
                                               "target's own tokens"


def proposer(target: Target, draft, preset: str = "chain", *, rows: int = 1, costs=None, **changes):
    """What a Decoder builds for one decode of `rows` rows from a bench preset (decode/options.py PRESETS: chain,
    tree, adaptive, default) with `changes` (block_size=4, lookup=True, ...): the proposer tests hand the engine
    (decode/generate.py), with selectors of their own where they need them. The target alone without a draft."""
    from dataclasses import replace

    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import PRESETS

    return Decoder(target, draft, replace(PRESETS[preset], **changes), costs=costs).proposer(rows)


def own_proposer(target: Target, draft, policy, lookup=None, *, tree: bool = False, block_size: int | None = None):
    """A proposer of a test's own width policy (CyclingWidth) and lookup (AlternatingLookup, a
    PromptLookup it inspects afterwards), over the draft's runner as a Decoder builds it; the target alone without
    a draft."""
    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.decode.proposers import ChainProposer, TargetAlone, TreeProposer

    if draft is None:
        return TargetAlone()
    drafter = Decoder(target, draft, DecodeOptions(block_size=block_size)).drafter()
    if tree:
        return TreeProposer(drafter, policy, lookup, int(target.lm_head.weight.shape[0]))
    return ChainProposer(drafter, policy, lookup, int(target.lm_head.weight.shape[0]))


class ScriptedDrafter:
    """A fake draft whose proposals are right for exactly the first j slots of each step.

    It knows the target's own greedy continuation of each row (`reference[row]`, prompt included) and
    cycles j through 0..K-1, so every acceptance length 1..K occurs. Wrong slots propose the correct token
    plus one (mod V), which the target never agrees with.
    """

    def __init__(self, reference: list[list[int]], block_size: int) -> None:
        self.reference = reference
        self.block_size = block_size
        self.trained_block_size = block_size
        self.tap_layer_ids = ()
        self.calls = 0
        self.rows = torch.arange(len(reference))

    def start(self, batch: int, capacity: int, prompts=None) -> None:
        self.rows = torch.arange(batch)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.rows = self.rows[rows]

    def append_context(self, features, counts) -> None:
        pass

    def propose_top(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int, top_k: int,
                    score=None):
        """A token tree's candidates, from `propose` (as the real Drafter's, normalised over what it scores)."""
        from blockdraft.decode.tree import top_candidates

        logits = self.propose(anchors, anchor_positions, slots)
        scores = logits.log_softmax(-1) if score is None else score(logits, None, logits.shape[-1])
        return top_candidates(scores, top_k)

    def propose(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        K = self.block_size
        right = self.calls % K
        self.calls += 1
        logits = torch.zeros(anchors.shape[0], K - 1, VOCAB)
        for b, (row, s) in enumerate(zip(self.rows.tolist(), anchor_positions.tolist())):
            ref = self.reference[row]
            for k in range(1, K):
                truth = ref[s + k] if s + k < len(ref) else 0
                token = truth if k <= right else (truth + 1) % VOCAB
                logits[b, k - 1, token] = 10.0
        return logits[:, :slots]


class CyclingWidth:
    """A verify-width policy that cycles 1, 2, ..., K: every width, plain steps included, within a few steps."""

    def __init__(self, block_size: int) -> None:
        self.block_size, self.calls = block_size, 0

    def choose(self) -> int:
        self.calls += 1
        return 1 + (self.calls - 1) % self.block_size

    def at_batch(self, rows) -> None:
        pass

    def observe(self, width, num_accepted, within=None) -> None:
        pass


class AlternatingLookup(PromptLookup):
    """Takes every other step it can, at widths cycling 1..K: lookup, drafted and plain steps interleave."""

    def __init__(self, block_size: int, policy=None) -> None:
        super().__init__(block_size, policy=policy or CyclingWidth(block_size), min_ngram=1)
        self.asked = 0

    def preferred_over(self, draft_policy) -> bool:
        self.asked += 1
        return self.asked % 2 == 1
