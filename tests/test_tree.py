"""Token trees: best-first construction, the ancestor mask, greedy path acceptance, the tree forward, and a
tree decode that stays the target's own greedy output while accepting the draft's runners-up."""

from __future__ import annotations

import pytest
import torch

from blockdraft.io.drafts import LoadedDraft
from blockdraft.cache import KVCache
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.policy import TreeWidth, make_policy
from blockdraft.decode.tree import TOP_K, Tree, ancestors, build_grafted_tree, build_tree, max_nodes, top_candidates
from blockdraft.sampling.tree import accept_path, accepted_depth, accepted_nodes, deepest_node
from blockdraft.sampling import greedy_step

from step_fakes import COSTS, ScriptedDrafter, own_proposer, proposer
from tiny_models import VOCAB, tiny_draft, tiny_target

PROMPTS = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]]


def random_log_q(B=2, n=4, V=VOCAB, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, n, V, generator=g) * 3).log_softmax(-1)


# ---------------------------------------------------------------------------------------------------------
# construction


def test_tree_is_best_first_and_parents_come_first():
    log_q = random_log_q()
    tree = build_tree(torch.tensor([5, 6]), log_q, 12)
    for b in range(2):
        scores = [0.0]
        for i in range(1, 12):
            parent, depth = int(tree.parents[b, i]), int(tree.depths[b, i])
            assert 0 <= parent < i and int(tree.depths[b, parent]) == depth - 1
            scores.append(scores[parent] + float(log_q[b, depth - 1, tree.tokens[b, i]]))
        assert all(x >= y - 1e-6 for x, y in zip(scores, scores[1:])), "nodes must come best first"
        children = {}
        for i in range(1, 12):
            children.setdefault(int(tree.parents[b, i]), []).append(int(tree.tokens[b, i]))
        assert all(len(set(c)) == len(c) for c in children.values()), "siblings must differ"
    assert tree.tokens[:, 0].tolist() == [5, 6] and tree.parents[:, 0].tolist() == [-1, -1]


def test_the_first_w_nodes_are_the_tree_of_w_nodes():
    log_q = random_log_q(seed=1)
    big = build_tree(torch.tensor([5, 6]), log_q, 16)
    for w in (1, 2, 5, 9):
        small = build_tree(torch.tensor([5, 6]), log_q, w)
        assert torch.equal(small.tokens, big.tokens[:, :w]) and torch.equal(small.parents, big.parents[:, :w])


def check_shape(tree: Tree) -> None:
    """Parents come first, depths follow parents, siblings differ."""
    for b in range(tree.tokens.shape[0]):
        children = {}
        for i in range(1, tree.size):
            parent = int(tree.parents[b, i])
            assert 0 <= parent < i and int(tree.depths[b, i]) == int(tree.depths[b, parent]) + 1
            children.setdefault(parent, []).append(int(tree.tokens[b, i]))
        assert all(len(set(c)) == len(c) for c in children.values()), "siblings must differ"


def test_a_grafted_run_reuses_the_drafts_nodes_and_comes_after_them():
    log_q = random_log_q(B=1, n=3, seed=2)
    anchors = torch.tensor([5])
    plain = build_tree(anchors, log_q, 6)
    best = [int(plain.tokens[0, 1]), int(log_q[0, 1].argmax())]  # the draft's first node, then a new token
    missing = next(t for t in range(VOCAB) if t not in plain.tokens[0].tolist())
    run = torch.tensor([best + [missing]])
    tree, run_nodes = build_grafted_tree(anchors, top_candidates(log_q), 6, runs=run, run_lengths=torch.tensor([3]))
    check_shape(tree)
    assert torch.equal(tree.tokens[:, :6], plain.tokens), "the first `size` nodes stay the draft's tree"
    assert int(run_nodes[0, 0]) == 1, "a run token the draft also guessed reuses its node"
    assert tree.tokens[0, run_nodes[0]].tolist() == run[0].tolist()
    assert tree.depths[0, run_nodes[0]].tolist() == [1, 2, 3]
    assert [int(tree.parents[0, n]) for n in run_nodes[0]] == [0, *run_nodes[0, :2].tolist()]
    assert int(run_nodes[0, 2]) >= 6, "a new run token is a new node after the draft's"


def test_grafted_rows_are_filled_to_one_node_count_with_draft_nodes():
    log_q = random_log_q(B=3, n=4, seed=3)
    runs = torch.tensor([[40, 41, 42, 43], [40, 41, 0, 0], [0, 0, 0, 0]])
    tree, run_nodes = build_grafted_tree(torch.tensor([5, 6, 7]), top_candidates(log_q), 4, runs=runs,
                                         run_lengths=torch.tensor([4, 2, 0]))
    check_shape(tree)
    assert tree.size == 8, "the longest graft sets the node count"
    assert torch.equal(tree.tokens[:, :4], build_tree(torch.tensor([5, 6, 7]), log_q, 4).tokens)
    assert tree.tokens[0, run_nodes[0]].tolist() == [40, 41, 42, 43]
    assert tree.tokens[1, run_nodes[1, :2]].tolist() == [40, 41] and run_nodes[2].tolist() == [0, 0, 0, 0]
    assert torch.equal(tree.tokens[2], build_tree(torch.tensor([7]), log_q[2:], 8).tokens[0]), \
        "a row without a run is filled with the draft's next likeliest nodes"


def test_a_confident_draft_gives_its_chain_first():
    log_q = torch.full((1, 3, VOCAB), -20.0)
    for d, token in enumerate([11, 12, 13]):
        log_q[0, d, token] = 0.0
    tree = build_tree(torch.tensor([4]), log_q, 4)
    assert tree.tokens[0].tolist() == [4, 11, 12, 13] and tree.parents[0].tolist() == [-1, 0, 1, 2]


def test_an_impossible_size_is_refused():
    with pytest.raises(ValueError, match="holds 1..5 nodes"):
        build_tree(torch.tensor([1]), random_log_q(B=1, n=1), 6, top_k=4)
    assert max_nodes(2, 4) == 21


# ---------------------------------------------------------------------------------------------------------
# mask and acceptance


HAND = Tree(tokens=torch.tensor([[9, 20, 21, 30, 31, 40]]),  # anchor 9; 20, 21 at depth 1; 30 under 20,
            parents=torch.tensor([[-1, 0, 0, 1, 2, 4]]),  # 31 under 21; 40 under 31
            depths=torch.tensor([[0, 1, 1, 2, 2, 3]]))


def test_ancestor_mask_of_a_hand_built_tree():
    mask = ancestors(HAND.parents)[0]
    assert mask[5].nonzero()[:, 0].tolist() == [0, 2, 4, 5]
    assert mask[3].nonzero()[:, 0].tolist() == [0, 1, 3]
    assert mask[1].nonzero()[:, 0].tolist() == [0, 1]


def test_the_path_through_a_runner_up_is_accepted():
    # The target wants 21 after the anchor, then 31, then 40, then 77.
    argmax = torch.tensor([[21, 0, 31, 0, 40, 77]])
    ok = accepted_nodes(HAND, argmax)
    path, num_accepted = accept_path(HAND, ok)
    assert path[0].tolist() == [0, 2, 4, 5] and num_accepted.tolist() == [3] and deepest_node(ok).tolist() == [5]
    assert accepted_depth(HAND, ok, 3).tolist() == [1] and accepted_depth(HAND, ok, 2).tolist() == [0]
    miss = torch.tensor([[50, 0, 0, 0, 0, 0]])  # nothing agrees: the target's own token after the anchor
    path, num_accepted = accept_path(HAND, accepted_nodes(HAND, miss))
    assert path[0].tolist() == [0] and num_accepted.tolist() == [0]


def chain(anchors: torch.Tensor, proposals: torch.Tensor) -> Tree:
    """The block [anchor, d1..dn] as a tree: each node's parent is the one before it."""
    B, n = proposals.shape
    index = torch.arange(n + 1, device=anchors.device).expand(B, n + 1)
    return Tree(torch.cat([anchors[:, None], proposals], dim=1), index - 1, index)


def test_a_chain_accepts_as_the_block_does():
    g = torch.Generator().manual_seed(3)
    anchors = torch.randint(0, 5, (64,), generator=g)
    proposals = torch.randint(0, 3, (64, 5), generator=g)  # few symbols: every acceptance length occurs
    logits = torch.randn(64, 6, 3, generator=g)
    tree = chain(anchors, proposals)
    argmax = logits.argmax(-1)
    ok = accepted_nodes(tree, argmax)
    path, num_accepted = accept_path(tree, ok)
    bonus = argmax.gather(1, deepest_node(ok)[:, None])[:, 0]
    expected_accepted, expected_bonus = greedy_step(logits, proposals)
    assert torch.equal(num_accepted, expected_accepted) and torch.equal(bonus, expected_bonus)


def test_cache_move_copies_slots_per_row():
    cache = KVCache(2, 2, 1, 6, 1, torch.float32, "cpu")
    for layer in range(2):
        cache.keys[layer][:, 0, :, 0] = torch.arange(12.0).view(2, 6)
    cache.move(torch.tensor([[3, 5], [2, 4]]), torch.tensor([[1, 2], [1, 2]]))
    assert cache.keys[1][:, 0, :, 0].tolist() == [[0, 3, 5, 3, 4, 5], [6, 8, 10, 9, 10, 11]]
    # Leading columns in place in every row are skipped; a column in place in one row only is still copied in the
    # other, and a later column's move still reads its source before any write.
    cache.move(torch.tensor([[0, 1, 4], [0, 3, 1]]), torch.tensor([[0, 1, 2], [0, 1, 2]]))
    assert cache.keys[0][:, 0, :, 0].tolist() == [[0, 3, 4, 3, 4, 5], [6, 9, 8, 9, 10, 11]]
    cache.move(torch.tensor([[0, 1], [0, 1]]), torch.tensor([[0, 1], [0, 1]]))  # all in place: nothing moves
    assert cache.keys[0][:, 0, :, 0].tolist() == [[0, 3, 4, 3, 4, 5], [6, 9, 8, 9, 10, 11]]


# ---------------------------------------------------------------------------------------------------------
# the tree forward


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_each_tree_node_sees_exactly_its_path(family):
    """Verifying a tree in one forward gives every node the logits of a plain causal forward of its path."""
    target = tiny_target(family)
    context = torch.tensor([[1, 5, 9, 13, 17, 21]])
    tree = HAND
    T, N = context.shape[1], tree.size
    cache = target.new_cache(1, T + N)
    target.forward(context, torch.arange(T)[None], cache)
    index = torch.arange(N)[None]
    out = target.forward(tree.tokens, T + tree.depths, cache, logit_rows=index, slots=T + index,
                         block_mask=ancestors(tree.parents))
    mask = ancestors(tree.parents)[0]
    for node in range(N):
        path = tree.tokens[0, mask[node]]  # ancestors in depth order
        ids = torch.cat([context[0], path])[None]
        alone = target.forward(ids, torch.arange(ids.shape[1])[None], target.new_cache(1, ids.shape[1]),
                               logit_rows=torch.tensor([[ids.shape[1] - 1]]))
        torch.testing.assert_close(out.logits[0, node], alone.logits[0, 0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# decoding


class RankedDrafter(ScriptedDrafter):
    """A fake draft that is unsure at slot 1, where its first choice is wrong and its runner-up right, and
    right but less sure at later slots. A chain accepts nothing from it; a tree of three nodes or more holds
    the runner-up (best-first: slot 1's two guesses outscore any slot-2 guess) and accepts it every step."""

    def propose(self, anchors, anchor_positions, slots=None):
        K = self.block_size
        logits = torch.zeros(anchors.shape[0], K - 1, VOCAB)
        for b, (row, s) in enumerate(zip(self.rows.tolist(), anchor_positions.tolist())):
            ref = self.reference[row]
            for k in range(1, K):
                truth = ref[s + k] if s + k < len(ref) else 0
                logits[b, k - 1, truth] = 10.0 if k == 1 else 3.0
            truth = ref[s + 1] if s + 1 < len(ref) else 0
            logits[b, 0, (truth + 1) % VOCAB] = 10.5  # the wrong token ranks first
        return logits[:, :slots]


def _reference(target, max_new):
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=max_new + 16, stop_token_ids=[])
    return [p + r.tokens for p, r in zip(PROMPTS, base)]


@pytest.mark.parametrize("adaptive", [False, True])
def test_tree_decode_equals_target_greedy_with_every_acceptance_length(adaptive):
    target = tiny_target("qwen3")
    reference = _reference(target, 60)
    guesses = proposer(target, ScriptedDrafter(reference, 4), "adaptive" if adaptive else "tree")
    spec = generate(target, guesses, PROMPTS, max_new_tokens=60, stop_token_ids=[])
    for ref, p, s in zip(reference, PROMPTS, spec):
        assert s.tokens == ref[len(p): len(p) + 60], "a tree step changed the target's greedy output"


def test_a_tree_accepts_the_runner_up_that_a_chain_rejects():
    target = tiny_target("llama")
    reference = _reference(target, 40)
    runs = {tree: generate(target, proposer(target, RankedDrafter(reference, 4), tree=tree), PROMPTS,
                           max_new_tokens=40, stop_token_ids=[]) for tree in (False, True)}
    for ref, p, s in zip(reference, PROMPTS, runs[True]):
        assert s.tokens == ref[len(p): len(p) + 40]
    chain_tau = [r.stats.mean_tau for r in runs[False]]
    tree_tau = [r.stats.mean_tau for r in runs[True]]
    assert all(t == 1.0 for t in chain_tau), chain_tau
    # Every step returns 2 tokens or more but the last, which the budget may cut to one (tau counts returned tokens).
    steps = [r.stats.histogram for r in runs[True]]
    assert all(h[0] <= 1 for h in steps) and all(t > 1.9 for t in tree_tau), (
        f"a 4-node tree must accept the runner-up and more: tau {tree_tau}, histograms {steps}")


def test_tree_decode_with_a_real_draft_equals_target_greedy():
    target = tiny_target("qwen3")
    draft = tiny_draft(target, block_size=8)
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    spec = generate(target, proposer(target, draft, "adaptive"), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    assert [s.tokens for s in spec] == [b.tokens for b in base]


def test_tree_width_learns_from_what_narrower_trees_would_have_accepted():
    policy = make_policy(4, True, COSTS, tree=True)
    assert isinstance(policy, TreeWidth) and policy.widths == [1, 2, 4, 8]
    for _ in range(20):
        policy.observe(8, [3], within={2: [0], 4: [1], 8: [3]})
    gains = policy.gains()
    assert gains[0] == 1.0 and gains[1] < 1.3 and 1.7 < gains[3] < 2.1 and 3.5 < gains[7] <= 4.0
    assert all(a <= b for a, b in zip(gains, gains[1:])), "more nodes never expect fewer tokens"


@pytest.mark.parametrize("coupled", [False, True], ids=["rejection", "coupled"])
def test_a_sampled_tree_step_tells_what_narrower_trees_would_have_accepted(coupled):
    """Sampled trees inform the width policy as greedy ones do (exactly when coupled, in distribution under
    rejection sampling: test_sampling_tree.py), so it need not time every width on its own to learn it."""
    from blockdraft.decode.selection import Selector
    from blockdraft.sampling import SamplingParams

    target = tiny_target("llama")
    policy = make_policy(4, True, COSTS, tree=True)
    seen = []
    policy.choose = lambda: 8
    observe = policy.observe
    policy.observe = lambda width, accepted, within=None: (seen.append(sorted(within or {})),
                                                           observe(width, accepted, within))
    selector = Selector(SamplingParams(temperature=1.0, seed=3), len(PROMPTS), coupled=coupled)
    generate(target, own_proposer(target, tiny_draft(target, block_size=4), policy, tree=True), PROMPTS,
             max_new_tokens=12, stop_token_ids=[], selector=selector)
    assert seen and all(widths == [2, 4, 8] for widths in seen), seen


@pytest.mark.parametrize("vocab", [None, [0, 3, 5, 8, 13, 21, 34, 40]], ids=["full", "proposal-vocab"])
def test_a_drafts_tree_candidates_are_the_top_of_its_distribution(vocab):
    """`propose_top` normalises over the proposal vocabulary only: the same log-probs as the full q, whose
    entries outside that vocabulary are -inf."""
    from blockdraft.decode.drafter import Drafter

    target = tiny_target("llama")
    drafter = Drafter(LoadedDraft(tiny_draft(target, block_size=4), vocab=None if vocab is None else torch.tensor(vocab)), target)
    prompt = [[1, 2, 3, 4, 5]]
    drafter.start(1, 32, prompt)
    out = target.forward(torch.tensor(prompt), torch.arange(5)[None], target.new_cache(1, 32),
                         drafter.tap_layer_ids)
    drafter.append_context(out.features, torch.tensor([5]))
    anchors, s = torch.tensor([6]), torch.tensor([5])
    scores, tokens = drafter.propose_top(anchors, s, 3, TOP_K)
    expected = top_candidates(drafter.propose(anchors, s, slots=3).log_softmax(-1), TOP_K)
    torch.testing.assert_close(scores, expected[0])
    assert torch.equal(tokens, expected[1])
    if vocab is not None:
        assert set(tokens.flatten().tolist()) <= set(vocab) | set(prompt[0]), "proposals stay in the vocabulary"


def test_tree_width_re_measures_the_widest_tree_as_well_as_the_runner_up():
    """While plain steps win, every other re-try is of the widest tree, whose step tells what every
    narrower tree would have accepted: a width judged on a few early steps does not stay judged."""
    policy = TreeWidth(8, COSTS)  # widths 1, 2, 4, 8

    def step(width: int) -> None:
        within = {w: [0] for w in policy.widths if 1 < w <= width}
        policy.observe(width, [0], within=within)

    picks = []
    for _ in range(200):
        width = policy.choose()
        picks.append(width)
        step(width)
    explored = [w for w in picks if w != 1]
    assert picks.count(1) > 150, "a draft that never hits leaves plain steps in charge"
    assert 8 in explored and 2 in explored, f"re-measured: {sorted(set(explored))}"


def test_one_unlucky_early_step_does_not_switch_a_tree_off():
    """The first width's estimate starts from an even 0.5 accepted guesses: one early miss leaves it near 1.33
    expected tokens, not at 1.0 (which, with drafted steps costing more, would keep plain steps in charge)."""
    policy = TreeWidth(8, COSTS)
    policy.observe(2, [0], within={2: [0]})
    assert policy.gains()[1] > 1.3
    for _ in range(30):  # a draft that keeps missing is still found out
        policy.observe(2, [0], within={2: [0]})
    assert policy.gains()[1] < 1.1
