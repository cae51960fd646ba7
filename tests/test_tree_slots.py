"""Where a tree's nodes sit during their verify (decode/tree_slots.py): each node's keys in the lanes and attention
block of its own position, so an int4 target's tree nodes have the bits of their one-token steps."""

import torch
from hypothesis import given, settings, strategies as st

from blockdraft.decode.tree import ancestors
from blockdraft.decode.tree_slots import ATTENTION_BLOCK, in_own_block, lane_offsets, lane_room
from blockdraft.model.span import SPAN_GRID, on_span_grid
from tiny_models import needs_smollm2, quantized_target, tiny_target


def depths_of(parents: list[int]) -> torch.Tensor:
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    return torch.tensor(depths)


trees = st.integers(1, 40).flatmap(
    lambda n: st.tuples(*[st.just(-1)] + [st.integers(0, i - 1) for i in range(1, n)]).map(list))


@settings(max_examples=200, deadline=None)
@given(trees)
def test_every_node_sits_in_its_depths_lane_after_its_ancestors(parents):
    depths = depths_of(parents)[None]
    offsets = lane_offsets(depths)[0]
    assert len(set(offsets.tolist())) == len(parents), "two nodes share a slot"
    assert torch.equal(offsets % SPAN_GRID, depths[0] % SPAN_GRID)
    assert int(offsets.max()) < lane_room(len(parents))
    for i in range(len(parents)):  # along every path, an ancestor in a node's lane sits before it
        above = parents[i]
        while above >= 0:
            if offsets[above] % SPAN_GRID == offsets[i] % SPAN_GRID:
                assert offsets[above] < offsets[i]
            above = parents[above]


def test_a_chain_keeps_its_slots_and_a_sibling_takes_the_next_lane_row():
    assert lane_offsets(torch.arange(20)[None]).tolist() == [list(range(20))]
    # anchor; two guesses for slot 1; one under each
    assert lane_offsets(depths_of([-1, 0, 0, 1, 2])[None]).tolist() == [[0, 1, 1 + SPAN_GRID, 2, 2 + SPAN_GRID]]


def test_nodes_pushed_past_their_positions_attention_block_are_left_out_with_their_subtrees():
    parents = torch.tensor([[-1, 0, 0, 2, 1]])
    depths = depths_of(parents[0].tolist())[None]
    offsets = lane_offsets(depths)
    assert offsets.tolist() == [[0, 1, 1 + SPAN_GRID, 2, 2 + SPAN_GRID]]
    ancestry = ancestors(parents.clamp(min=0))
    far = torch.tensor([0, ATTENTION_BLOCK - 10])  # row 1: node 2 in slot 519 stands for position 503, node 4 in
    kept = in_own_block(far, depths.expand(2, -1), offsets.expand(2, -1), ancestry.expand(2, -1, -1))  # 520 for 504
    assert kept.tolist() == [[True] * 5, [True, True, False, False, False]]  # node 3 under node 2


@needs_smollm2
def test_an_int4_tree_verify_equals_each_nodes_one_token_steps():
    # Slots s + i in node order parted from the steps at some node for each of these seeds here (an AMD EPYC,
    # Zen 5; 6 of 12 seeds); the lanes' slots at none.
    from blockdraft.io.targets import load_target

    target = load_target(weights="q4")
    parents = [-1, 0, 1, 1, 1, 0, 2, 6, 5, 0, 9]
    tree_parents, depths = torch.tensor(parents)[None].clamp(min=0), depths_of(parents)[None]
    offsets, N = lane_offsets(depths), len(parents)
    for seed in (1, 3, 5, 7):
        generator = torch.Generator().manual_seed(seed)
        n = int(torch.randint(60, 200, (), generator=generator))
        ids = torch.randint(3, 49152, (1, n + N), generator=generator)
        prompt, tokens = ids[:, :n], ids[:, n:]
        cache = target.new_cache(1, on_span_grid(n + lane_room(N)))
        target.forward(prompt, torch.arange(n)[None], cache, prompt=True)
        tree = target.forward(tokens, depths + n, cache, logit_rows=torch.arange(N)[None], slots=offsets + n,
                              block_mask=ancestors(tree_parents)).logits[0]  # [N, V]
        for node in range(N):
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            steps = target.new_cache(1, on_span_grid(n + len(path)))
            target.forward(prompt, torch.arange(n)[None], steps, prompt=True)
            for depth, on_path in enumerate(reversed(path)):
                step = target.forward(tokens[:, on_path: on_path + 1], torch.tensor([[n + depth]]), steps,
                                      logit_rows=torch.zeros(1, 1, dtype=torch.long)).logits[0, 0]
            assert torch.equal(tree[node], step), f"seed {seed}: node {node} left its steps' logits"


def test_a_left_out_node_is_not_accepted_and_its_token_comes_as_the_targets_own():
    from blockdraft.decode.selection import Selector
    from blockdraft.decode.tree import Tree
    from blockdraft.sampling import SamplingParams

    V = 6
    tree = Tree(torch.tensor([[0, 2, 3, 4]]), torch.tensor([[-1, 0, 0, 1]]), torch.tensor([[0, 1, 1, 2]]))
    logits = torch.zeros(1, 4, V)
    logits[0, 0, 3] = logits[0, 2, 5] = logits[0, 1, 4] = 1.0  # the target picks 3 after the anchor, then 5
    selector = Selector(SamplingParams(), 1)
    ok, token = selector.tree_accept(logits, tree, torch.tensor([0]))
    assert ok.tolist() == [[True, False, True, False]] and token.tolist() == [5]
    ok, token = selector.tree_accept(logits, tree, torch.tensor([0]), kept=torch.tensor([[True, True, False, False]]))
    assert ok.tolist() == [[True, False, False, False]] and token.tolist() == [3]


def test_nodes_take_their_lanes_only_where_blocks_keep_their_steps_bits():
    from blockdraft.decode.tree_slots import tree_offsets

    depths = depths_of([-1, 0, 0, 1, 2])[None]
    assert tree_offsets(depths, lanes=True).tolist() == lane_offsets(depths).tolist()
    assert tree_offsets(depths, lanes=False).tolist() == [[0, 1, 2, 3, 4]]
    int4, bf16 = quantized_target()
    assert int4.tokenwise and bf16.tokenwise and not tiny_target().tokenwise  # float32 products part anyway
