"""Several sampled answers per prompt (train/answers.py): `blockdraft data --answers N --temperature T` writes N
seeded samples a prompt, the same in any batch and on resume, and `train` keeps each distinct one."""

from __future__ import annotations

import json

import pytest

from blockdraft.errors import InputError
from blockdraft.train.answers import Answers, answer_id, answer_seed, example_key, is_sampled
from blockdraft.train.batches import load_split, split_by_prompt
from blockdraft.train.data import Example, example_prompt_key, read_examples, write_shard

from train_fakes import build_greedy, prompted_target

SAMPLED = Answers(3, 0.9)


@pytest.fixture
def target(monkeypatch):
    return prompted_target(monkeypatch)


def build(target, out, count, **overrides):
    return build_greedy(target, out, count, **{"answers": SAMPLED, "max_new_tokens": 8, "batch_size": 4,
                                               "shard_size": 5, **overrides})


def by_id(folder):
    return {e.id: (e.input_ids, e.loss_mask) for e in read_examples(folder)}


@pytest.mark.parametrize(("settings", "words"), [
    (dict(count=0), "--answers 1 or more"),
    (dict(count=2), "need sampling.*--temperature 0.8"),
    (dict(temperature=-0.5), "--temperature 0.8"),
    (dict(temperature=0.8, top_p=0), "--top-p 0.95"),
])
def test_answer_settings_that_cannot_work_are_refused_by_flag(settings, words):
    with pytest.raises(InputError, match=words):
        Answers(**settings)


def test_ids_name_the_answer_and_only_sampled_ones_carry_the_tag():
    assert answer_id("sharegpt-turns:x:2", 1) == "sharegpt-turns:x:2#a1" and is_sampled("magpie:3#a0")
    assert not any(map(is_sampled, ["magpie:3", "#a1", "a#ab", "x#a"]))
    assert answer_seed(1, "p#a0") != answer_seed(1, "p#a1") != answer_seed(2, "p#a1")
    assert Answers().expand([("p", [1])]) == [("p", [1])], "greedy: one example a prompt, its id unchanged"


def test_n_sampled_answers_a_prompt_the_same_in_any_batch(target, tmp_path):
    meta = build(target, tmp_path / "a", count=4)
    examples = by_id(tmp_path / "a")
    prompts = {i.rpartition("#a")[0] for i in examples}
    # count counts prompts; 3 answers each (the random target ends one at once: an empty answer is not written)
    assert len(prompts) == 4 and len(examples) == meta["examples"] == 12 - meta["skipped"]["empty_response"] >= 9
    assert meta["sampling"]["answers"] == 3 and meta["decoding"].startswith("sampled: 3 answer(s)")
    responses = {}
    for example_id, (ids, mask) in examples.items():
        responses.setdefault(example_id.rpartition("#a")[0], set()).add(tuple(ids[mask.index(1):]))
    assert any(len(answers) > 1 for answers in responses.values()), "the answers are samples, not one answer thrice"
    # Each answer's draw depends on its seed alone, not on its batch-mates (a row-index seed fails this).
    build(target, tmp_path / "b", count=4, batch_size=5)
    assert by_id(tmp_path / "b") == examples


def test_a_resumed_sampled_folder_equals_one_run_and_greedy_and_sampled_do_not_mix(target, tmp_path):
    build(target, tmp_path / "grown", count=2)
    build(target, tmp_path / "grown", count=5)
    build(target, tmp_path / "once", count=5)
    assert by_id(tmp_path / "grown") == by_id(tmp_path / "once")
    with pytest.raises(InputError, match="sampling.*new --out"):
        build(target, tmp_path / "grown", count=6, answers=Answers())
    build(target, tmp_path / "greedy", count=2, answers=Answers())
    assert json.loads((tmp_path / "greedy" / "meta.json").read_text())["sampling"] is None
    with pytest.raises(InputError, match="sampling.*new --out"):
        build(target, tmp_path / "greedy", count=3)


def test_train_keeps_every_distinct_sampled_answer_and_one_greedy_answer(tmp_path):
    greedy = [Example("p", [1, 5, 6, 7], [0, 0, 1, 1]), Example("q", [1, 9, 6], [0, 0, 1])]
    sampled = [Example("p#a0", [1, 5, 8, 8], [0, 0, 1, 1]), Example("p#a1", [1, 5, 6, 7], [0, 0, 1, 1]),
               Example("p#a2", [1, 5, 8, 8], [0, 0, 1, 1]),  # the same sample as answer 0: a repeat
               Example("p", [1, 5, 6, 6], [0, 0, 1, 1])]  # another greedy answer to p: a repeat
    for name, examples in (("greedy", greedy), ("sampled", sampled)):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "data-00000.jsonl", examples)
    notes = []
    examples, train, held = load_split([tmp_path / "greedy", tmp_path / "sampled"], 0, seed=0, notes=notes)
    assert [e.id for e in examples] == ["p", "q", "p#a0", "p#a1"], "the sampled answer equal to the greedy one stays"
    assert notes and notes[0].startswith("2 examples repeat")
    assert example_key(examples[0]) != example_key(examples[3]), "greedy and sampled answers are keyed apart"
    # A held-out folder's sampled answer to a trained prompt is left out: its prompt is trained on.
    (tmp_path / "sampled" / "val").mkdir()
    write_shard(tmp_path / "sampled" / "val" / "data-00000.jsonl",
                [Example("p#a7", [1, 5, 9, 9], [0, 0, 1, 1]), Example("r#a0", [1, 3, 4], [0, 0, 1])])
    examples, train, held = load_split([tmp_path / "greedy", tmp_path / "sampled"], 0, seed=0)
    assert [examples[i].id for i in held] == ["r#a0"] and len(train) == 4


def test_a_prompts_answers_are_held_out_together_or_not_at_all():
    examples = [Example(f"{p}#a{j}", [1, 10 + p, 20 + j], [0, 0, 1]) for p in range(40) for j in range(3)]
    train, held = split_by_prompt(examples, 0.25, seed=3)
    held_prompts = {example_prompt_key(examples[i]) for i in held}
    assert 0 < len(held) < len(examples) and len(held) % 3 == 0
    assert not held_prompts & {example_prompt_key(examples[i]) for i in train}, "no prompt on both sides"
    assert sorted(train + held) == list(range(len(examples)))
    # One example a prompt: the same split as before sampled answers existed.
    from blockdraft.train.batches import split_heldout

    singles = examples[::3]
    assert split_by_prompt(singles, 0.25, seed=3) == split_heldout(len(singles), 0.25, seed=3)
