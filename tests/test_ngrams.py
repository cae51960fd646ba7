"""The n-gram table of a draft's training answers (io/ngrams.py, built by train/ngrams.py): its build against its
definition, its file, and runs from it grafted onto the draft's trees, greedy and sampled, against the target
alone."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from blockdraft.decode.generate import generate
from blockdraft.decode.policy import make_policy

from blockdraft.decode.proposers import TargetAlone
from blockdraft.decode.lookup import PromptLookup
from blockdraft.io.ngrams import NGRAMS_FILE, NgramTable, context_hash, read_table, write_table
from blockdraft.train.ngrams import build_table
from blockdraft.decode.selection import Selector
from blockdraft.errors import CheckpointError
from blockdraft.sampling import SamplingParams

from step_fakes import COSTS, own_proposer
from tiny_models import tiny_draft, tiny_target
from exact_sampling import ALPHA, NUM_TOKENS, exact_joint, goodness_of_fit, joint_counts


def reference_table(sequences, orders, min_count, min_share) -> dict[int, int]:
    """The definition, with dicts: per context key, the likeliest next response token (smallest id on a tie)."""
    counts = collections.defaultdict(collections.Counter)
    for tokens, prompt_length in sequences:
        tokens = list(tokens)
        for t in range(prompt_length, len(tokens)):
            for n in orders:
                if t >= n:
                    counts[context_hash(tokens[t - n: t])][tokens[t]] += 1
    table = {}
    for key, seen in counts.items():
        total, best = sum(seen.values()), max(seen.values())
        if total >= min_count and best >= min_share * total:
            table[key] = min(token for token, count in seen.items() if count == best)
    return table


def random_sequences(generator, count=40, vocab=6):
    out = []
    for _ in range(count):
        length = int(generator.integers(1, 30))
        out.append((generator.integers(0, vocab, length), int(generator.integers(0, length + 1))))
    return out


@pytest.mark.parametrize("orders,min_count,min_share", [((2, 3), 1, 0.0), ((1, 2, 4), 2, 0.5), ((3,), 3, 0.7)])
def test_the_table_is_its_definition(orders, min_count, min_share):
    generator = np.random.default_rng(0)
    for _ in range(5):
        sequences = random_sequences(generator)
        table = build_table(sequences, orders, min_count, min_share)
        assert dict(zip(table.keys.tolist(), table.tokens.tolist())) == reference_table(
            sequences, orders, min_count, min_share)
        assert bool((table.keys[1:] > table.keys[:-1]).all())


def test_contexts_do_not_span_two_sequences_and_only_responses_are_counted():
    table = build_table([(np.array([1, 2]), 0), (np.array([3, 4, 5]), 2)], orders=(2,), min_count=1, min_share=0.0)
    # [1, 2] ends one sequence: nothing follows it; [3, 4] precedes the only response token, 5.
    assert table.next_token([1, 2]) is None and table.next_token([3, 4]) == 5 and len(table) == 1


def test_the_longest_known_context_wins_and_runs_follow_their_own_guesses():
    # After [7, 1] comes 2, after 1 alone mostly 9; then 2 -> 3 -> 4.
    sequences = [(np.array([7, 1, 2, 3, 4]), 0)] * 3 + [(np.array([5, 1, 9]), 0)] * 4
    table = build_table(sequences, orders=(1, 2), min_count=1, min_share=0.5)
    assert table.next_token([0, 1]) == 9 and table.next_token([7, 1]) == 2
    assert table.continuation([7, 1], 3) == [2, 3, 4] and table.continuation([8], 3) == []


def test_a_table_file_round_trips_and_a_bad_one_is_refused_by_name(tmp_path):
    table = build_table([(np.array([1, 2, 3, 1, 2, 3]), 1)], orders=(1, 2), min_count=1, min_share=0.0)
    write_table(table, tmp_path, vocab_size=10)
    back = read_table(tmp_path, vocab_size=10)
    assert np.array_equal(back.keys, table.keys) and np.array_equal(back.tokens, table.tokens)
    assert back.orders == table.orders and back.continuation([1], 2) == table.continuation([1], 2)
    assert read_table(tmp_path / "none", vocab_size=10) is None, "no file: no table"
    with pytest.raises(CheckpointError, match="another target"):
        read_table(tmp_path, vocab_size=11)
    with pytest.raises(CheckpointError, match="ngrams"):
        read_table(tmp_path, vocab_size=3)  # a token past the vocabulary
    (tmp_path / NGRAMS_FILE).write_bytes(b"not a table")
    with pytest.raises(CheckpointError, match=NGRAMS_FILE):
        read_table(tmp_path, vocab_size=10)
    shuffled = NgramTable(table.keys[::-1].copy(), table.tokens[::-1].copy(), table.orders)
    write_table(shuffled, tmp_path, vocab_size=10)
    with pytest.raises(CheckpointError, match="sorted"):
        read_table(tmp_path, vocab_size=10)


PROMPTS = [[1, 5, 9, 13, 17], [3, 4, 8, 2], [7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("source", ["the target's own answers", "wrong guesses"])
def test_greedy_output_with_table_runs_grafted_onto_trees_is_the_targets(source):
    """Runs from a table of the target's answers (they hit) or of the same contexts with every guess wrong (they
    miss): the output is the target's own either way."""
    target = tiny_target("llama")
    base = generate(target, TargetAlone(), PROMPTS, max_new_tokens=40, stop_token_ids=[])
    answers = [(np.array(p + r.tokens), len(p)) for p, r in zip(PROMPTS, base)]
    table = build_table(answers, orders=(2, 3), min_count=1, min_share=0.0)
    if source == "wrong guesses":
        V = int(target.lm_head.weight.shape[0])
        table = NgramTable(table.keys, (table.tokens + 1) % V, table.orders)
    # No context copy can be as long as 64 tokens here: every run is the table's.
    lookup = PromptLookup(8, COSTS, min_ngram=64, max_ngram=64, table=table)
    guesses = own_proposer(target, tiny_draft(target, block_size=8), make_policy(8, True, COSTS, tree=True), lookup,
                           tree=True)
    spec = generate(target, guesses, PROMPTS, max_new_tokens=40, stop_token_ids=[])
    for b, s in zip(base, spec):
        assert s.tokens == b.tokens, "a grafted table run changed the target's greedy output"
    assert lookup.steps > 0 and float(lookup.table_policy.reached.sum()) > 0, "table runs must be grafted"
    hits = float(lookup.table_policy.accepted.sum())
    assert hits > 0 if source == "the target's own answers" else hits == 0


def table_counts(target, draft, params, num_rows: int) -> tuple[np.ndarray, PromptLookup]:
    V = target.config.vocab_size
    cycle = np.arange(60) % V  # every token is followed by the next one: the table always has a guess
    table = build_table([(cycle, 0)], orders=(1,), min_count=1, min_share=0.0)
    lookup = PromptLookup(4, COSTS, min_ngram=6, table=table)  # no context copy of 6 tokens in 10: table runs
    guesses = own_proposer(target, draft, make_policy(4, False, tree=True), lookup, tree=True, block_size=4)
    results = generate(target, guesses, [[3, 0, 4, 2]] * num_rows, max_new_tokens=NUM_TOKENS, stop_token_ids=[],
                       selector=Selector(params, num_rows=num_rows))
    return joint_counts(results, V), lookup


def test_sampling_with_table_runs_grafted_onto_trees_matches_target_distribution(small_models):
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=140_000)
    counts, lookup = table_counts(target, draft, sampling, 8000)
    assert float(lookup.table_policy.reached.sum()) > 0, "the test must graft table runs"
    pvalue = goodness_of_fit(counts, exact_joint(target, [3, 0, 4, 2], sampling, NUM_TOKENS))
    assert pvalue > ALPHA, f"sampling over grafted table runs is not the target's distribution (p = {pvalue:.2e})"


def test_table_runs_with_the_wrong_q_fail_the_same_test(small_models, monkeypatch):
    """A table guess is a point mass; testing it as if drawn from a uniform q accepts it too often."""
    from blockdraft.decode import selection

    real = selection.tree_sample

    def uniform_q_tree_sample(p, tokens, parents, generators):
        flat = p.clone()
        flat[...] = 1.0 / p.shape[-1]  # the target's p replaced by a uniform one: the wrong acceptance test
        return real(flat, tokens, parents, generators)

    monkeypatch.setattr("blockdraft.decode.selection.tree_sample", uniform_q_tree_sample)
    target, draft = small_models
    sampling = SamplingParams(temperature=1.0, seed=150_000)
    counts, _ = table_counts(target, draft, sampling, 4000)
    pvalue = goodness_of_fit(counts, exact_joint(target, [3, 0, 4, 2], sampling, NUM_TOKENS))
    assert pvalue < ALPHA, f"a wrong acceptance test passed (p = {pvalue:.3f}); the test has no power"


def test_load_draft_reads_the_table_beside_the_weights_unless_told_not_to(tmp_path):
    from blockdraft.io.checkpoint import write_checkpoint
    from blockdraft.io.drafts import load_draft

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    write_checkpoint(tmp_path, draft.config, draft.state_dict())
    assert load_draft(tmp_path, target).ngrams is None
    V = int(target.lm_head.weight.shape[0])
    write_table(build_table([(np.arange(20) % V, 0)], orders=(2,), min_count=1, min_share=0.0), tmp_path, V)
    assert len(load_draft(tmp_path, target).ngrams) > 0
    assert load_draft(tmp_path, target, ngrams=False).ngrams is None


def test_the_ngrams_command_writes_a_table_from_data_and_refuses_bad_settings(tmp_path, capsys):
    """`blockdraft ngrams DRAFT --data DATA`: the table of the data's answers, beside the draft's weights; one
    example per prompt; bad settings and data of another target are refused with the fix."""
    from blockdraft.cli import main
    from blockdraft.io.checkpoint import write_checkpoint
    from blockdraft.train.data import Example, write_shard

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    write_checkpoint(tmp_path / "draft", draft.config, draft.state_dict())
    (tmp_path / "data").mkdir()
    examples = [Example(f"p{i}", [1, 2, 3, 4, 5, 6, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1, 1, 1]) for i in range(3)]
    write_shard(tmp_path / "data" / "data-00000.jsonl", examples)
    data = ["--data", str(tmp_path / "data")]
    assert main(["ngrams", str(tmp_path / "draft"), *data, "--min-count", "1"]) == 0
    assert "2 repeated prompts left out" in capsys.readouterr().out
    table = read_table(tmp_path / "draft", int(target.lm_head.weight.shape[0]))
    assert table.continuation([2, 3], 3) == [4, 5, 6]
    assert main(["ngrams", str(tmp_path / "draft"), *data, "--orders", "0,x"]) == 2
    assert "--orders" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    write_shard(tmp_path / "other" / "data-00000.jsonl", [Example("b", [1, 7, 10_000], [0, 1, 1])])
    assert main(["ngrams", str(tmp_path / "draft"), "--data", str(tmp_path / "other")]) == 2
    assert "another target" in capsys.readouterr().err
