"""Magpie prompts (train/magpie.py): the user-turn header taken from a chat template, the screening of candidates,
and seeded, resumable generation on a tiny target."""

from __future__ import annotations

import json

import pytest

from blockdraft.decode.decoder import Decoder
from blockdraft.errors import InputError
from blockdraft.train.magpie import (
    FILE,
    MagpieSettings,
    end_of_turn_ids,
    magpie_prompts,
    screen,
    special_ids,
    user_turn_header,
)

from tiny_models import char_tokenizer, tiny_target

# A template in the manner of ChatML: a default system turn when none is given, each turn closed by </s> (id 2).
CHATML = ("{% if messages[0]['role'] != 'system' %}<s>system: be kind</s>{% endif %}"
          "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant: {% endif %}")
SETTINGS = MagpieSettings(min_chars=1)  # the tiny target's random prompts are short


def chars(tokenizer, text: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(c) for c in text]


@pytest.fixture
def target():
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target


def test_the_header_is_the_template_up_to_the_user_message_default_system_included():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHATML
    expected = [1, *chars(tokenizer, "system: be kind"), 2, 1, *chars(tokenizer, "user: ")]
    assert user_turn_header(tokenizer) == expected, "the bare user-turn header, nothing of the user's message"
    assert end_of_turn_ids(tokenizer) == {2}, "the special token closing a user turn"
    assert user_turn_header(char_tokenizer()) == chars(tokenizer, "<user>")
    assert end_of_turn_ids(char_tokenizer()) == set(), "this template closes a turn with no special token"


def test_a_template_that_hides_the_message_is_refused():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{% endfor %}"
    with pytest.raises(InputError, match="leave `magpie` out"):
        user_turn_header(tokenizer)


@pytest.mark.parametrize("text, finish, verdict", [
    ("Name an even prime.", "stop", "kept"),
    ("Name an even prime.", "length", "too_long"),  # never ended its turn within max_tokens
    ("   ", "stop", "empty"),
    ("Hi", "stop", "too_short"),
    ("name  a PRIME number.", "stop", "duplicate"),  # case and spacing aside, the first one again
    ("Tell me<s>more about it", "stop", "special_token"),  # a turn opened inside the prompt
])
def test_screening_drops_each_kind_of_bad_candidate(text, finish, verdict):
    tokenizer = char_tokenizer()
    settings, seen = MagpieSettings(min_chars=5), set()
    first = chars(tokenizer, "Name a prime number.") + [2]
    assert screen(first, "stop", tokenizer, special_ids(tokenizer), settings, seen) == ("Name a prime number.",
                                                                                         "kept")
    tokens = tokenizer.encode(text, add_special_tokens=False) + ([2] if finish == "stop" else [])
    got, why = screen(tokens, finish, tokenizer, special_ids(tokenizer), settings, seen)
    assert why == verdict and (got is None) == (verdict != "kept")


def test_prompts_are_reproducible_from_the_seed(target, tmp_path):
    first, stats = magpie_prompts(target, tmp_path / "a", 4, seed=3, batch_size=4, settings=SETTINGS)
    again, _ = magpie_prompts(target, tmp_path / "b", 4, seed=3, batch_size=4, settings=SETTINGS)
    other, _ = magpie_prompts(target, tmp_path / "c", 4, seed=4, batch_size=4, settings=SETTINGS)
    assert len(first) == 4 and first == again, "the same seed writes the same prompts"
    assert [p.messages for p in first] != [p.messages for p in other], "another seed writes others"
    assert all(p.set == "magpie" and p.messages[0]["role"] == "user" for p in first)
    assert stats["kept"] + sum(stats["skipped"].values()) == stats["candidates"], "every candidate is accounted for"
    texts = [p.messages[0]["content"] for p in first]
    assert len(set(texts)) == len(texts) and all(t == t.strip() and t for t in texts)


def test_a_larger_count_continues_the_saved_list(target, tmp_path, monkeypatch):
    magpie_prompts(target, tmp_path / "grown", 2, seed=0, batch_size=4, settings=SETTINGS)
    tried = json.loads((tmp_path / "grown" / FILE).read_text().splitlines()[0])["candidates"]
    seeds, generate = [], Decoder.generate
    monkeypatch.setattr(Decoder, "generate", lambda decoder, prompts, **kw: (seeds.append(kw["options"].sampling.seed),
                                                                              generate(decoder, prompts, **kw))[1])
    grown, _ = magpie_prompts(target, tmp_path / "grown", 5, seed=0, batch_size=4, settings=SETTINGS)
    resumed, seeds[:] = list(seeds), []
    fresh, _ = magpie_prompts(target, tmp_path / "fresh", 5, seed=0, batch_size=4, settings=SETTINGS)
    assert grown == fresh, "growing a saved list gives the list one run would write"
    assert tried and resumed == seeds[tried // 4 :], "the saved candidates are not drawn again"


def test_candidates_that_never_end_are_counted_and_given_up_on(target, tmp_path):
    prompts, stats = magpie_prompts(target, tmp_path, 2, seed=0, batch_size=4,
                                    settings=MagpieSettings(max_tokens=1, min_chars=1))
    assert stats["candidates"] == 8 and stats["skipped"]["too_long"] >= 1, "at most 4 candidates per prompt"
    assert len(prompts) == stats["kept"] <= 2


def test_a_saved_list_of_other_settings_is_refused(target, tmp_path):
    magpie_prompts(target, tmp_path, 1, seed=0, batch_size=4, settings=SETTINGS)
    with pytest.raises(InputError, match="magpie.jsonl holds magpie prompts of another seed"):
        magpie_prompts(target, tmp_path, 1, seed=1, batch_size=4, settings=SETTINGS)
    with pytest.raises(InputError, match="another settings"):
        magpie_prompts(target, tmp_path, 1, seed=0, batch_size=4, settings=MagpieSettings(min_chars=2))
