"""A decode request's checks (decode/requests.py, api.generate): wrong types and values are refused by name
before any compute, and the forms a user plausibly passes (a tensor of ids, NumPy integers, one stop id) work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import blockdraft.api as api
from blockdraft.config import DraftConfig
from blockdraft.decode.drafter import Drafter
from blockdraft.decode.generate import generate
from blockdraft.decode.proposers import TargetAlone
from blockdraft.cache import ContextWindow
from blockdraft.errors import ConfigError, InputError

from step_fakes import proposer
from tiny_models import tiny_draft, tiny_target


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("llama")
    return target, tiny_draft(target, layers=1, block_size=4)


def alone(target, prompt, n=12):
    return generate(target, TargetAlone(), [prompt], max_new_tokens=n, stop_token_ids=[])[0].tokens


@pytest.mark.parametrize("form", [lambda s: torch.tensor([s]), lambda s: s, lambda s: np.array([s])],
                         ids=["tensor", "int", "numpy"])
def test_stop_ids_may_be_one_id_a_tensor_or_an_array(pair, form):
    target, draft = pair
    reference = alone(target, [5, 6, 7])
    stop = reference[4]
    first = reference.index(stop)
    result = generate(target, proposer(target, draft), [[5, 6, 7]], max_new_tokens=12, stop_token_ids=form(stop))[0]
    assert result.tokens == reference[: first + 1] and result.finish_reason == "stop"


@pytest.mark.parametrize("stop, word", [(["23"], "stop_token_ids"), ([10_000], "stop_token_ids"),
                                        ("eos", "stop_token_ids"), ([2.0], "stop_token_ids")])
def test_stop_ids_that_are_no_ids_are_refused(pair, stop, word):
    target, draft = pair
    with pytest.raises(InputError, match=word):
        generate(target, proposer(target, draft), [[5, 6, 7]], max_new_tokens=4, stop_token_ids=stop)


@pytest.mark.parametrize("options, word", [
    ({"block_size": "4"}, "block_size"), ({"block_size": 3.0}, "block_size"), ({"adaptive": "on"}, "adaptive"),
    ({"lookup": "off"}, "lookup"), ({"tree": "off"}, "tree"), ({"tree": 1}, "tree"),
])
def test_options_of_other_types_are_refused_not_reinterpreted(pair, options, word):
    """The one place decode switches enter, for every door (api, CLI, server, bench): DecodeOptions."""
    target, draft = pair
    with pytest.raises(InputError, match=f"`{word}` must be"):
        api.generate(target, draft, [[5, 6, 7]], max_new_tokens=4, **options)


def test_numpy_integers_count_as_integers(pair):
    target, draft = pair
    got = generate(target, proposer(target, draft, block_size=np.int64(3)), [np.array([5, 6, 7]).tolist()],
                   max_new_tokens=np.int64(6), stop_token_ids=[])[0]
    assert got.tokens == alone(target, [5, 6, 7], 6)


def test_a_draft_for_another_target_or_placed_elsewhere_is_refused(pair):
    target, _ = pair
    other = tiny_draft(tiny_target("llama", layers=8), layers=1, block_size=4)
    with pytest.raises(ConfigError, match="num_target_layers"):
        generate(target, proposer(target, other), [[5, 6, 7]], max_new_tokens=4)
    halved = tiny_draft(target, layers=1, block_size=4).to(torch.bfloat16)
    with pytest.raises(InputError, match="bfloat16 on cpu but beside this target it runs float32 on cpu; load the"):
        generate(target, proposer(target, halved), [[5, 6, 7]], max_new_tokens=4)


def test_the_api_takes_tensors_and_arrays_of_ids_and_refuses_what_is_no_prompt(pair):
    target, draft = pair
    reference = alone(target, [5, 6, 7], 6)
    for prompt in (torch.tensor([5, 6, 7]), np.array([5, 6, 7]), [np.int64(5), 6, 7]):
        completion = api.generate(target, draft, prompt, max_new_tokens=6, stop_token_ids=[])
        assert completion.tokens == reference, type(prompt)
    batch = api.generate(target, draft, torch.tensor([[5, 6, 7], [5, 6, 7]]), max_new_tokens=6, stop_token_ids=[])
    assert [c.tokens for c in batch] == [reference, reference], "2-D: a batch"
    with pytest.raises(InputError, match="wrap a single message in a list"):
        api.generate(target, draft, {"role": "user", "content": "hi"})
    for bad, word in ((None, "must be text"), (5, "must be text"), ([[5.0, 6.0]], "list of token ids"),
                      ([[5, 6, 999]], "prompt 0 holds 999, not a token id"), ([[-1, 6]], "prompt 0 holds -1")):
        with pytest.raises(InputError, match=word):
            api.generate(target, draft, bad, max_new_tokens=4)


def test_a_context_window_must_be_a_context_window(pair, tmp_path):
    target, draft = pair
    with pytest.raises(InputError, match="ContextWindow"):
        Drafter(draft, target, window=16)
    with pytest.raises(InputError, match="ContextWindow"):
        api.load_draft(None, target, context_window=16)
    assert isinstance(DraftConfig, type) and ContextWindow(16).capacity == 21
