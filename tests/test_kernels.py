"""The CPU's fast paths (model/kernels.py): chosen once from what the CPU can do, a class switch that takes them away
as another CPU would lack them, and every documented --dtype/--weights choice decoding or refused by name on each
class."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from blockdraft import cpu_switch
from blockdraft.cli import main
from blockdraft.errors import ConfigError
from blockdraft.io.targets import parse_dtype, resolve_weights, weights_dtype
from blockdraft.model import kernels
from blockdraft.model.packed import packing_supported

from tiny_models import needs_smollm2

CLASSES = list(cpu_switch.CLASSES)


@pytest.fixture
def cpu_class(monkeypatch):
    """Set $BLOCKDRAFT_CPU for the paths asked from here on (the kernels' probes still run this machine's)."""

    def switch(name: str | None):
        if name is None:
            monkeypatch.delenv(cpu_switch.ENV, raising=False)
        else:
            monkeypatch.setenv(cpu_switch.ENV, name)
        kernels.cpu_paths.cache_clear()
        return kernels.cpu_paths()

    yield switch
    kernels.cpu_paths.cache_clear()


def test_a_switched_class_takes_away_what_that_cpu_lacks(cpu_class):
    here = cpu_class(None)
    avx2 = cpu_class("avx2")
    assert (avx2.cpu_class, avx2.switched, avx2.native_bf16, avx2.packed_bf16) == ("avx2", True, False, False), \
        "an AVX2 CPU has neither native bf16 nor oneDNN's packed bf16 linear: taking them there is a crash"
    assert not packing_supported(torch.zeros(1, 1, dtype=torch.bfloat16)), "packing must follow the class"
    avx512 = cpu_class("avx512")
    assert not avx512.native_bf16 and not avx512.packed_bf16, "emulated bf16 packs apart from F.linear: no packing"
    assert cpu_class("avx512-bf16").native_bf16 == here.native_bf16, "a class never adds what this CPU lacks"


def test_an_unknown_class_is_refused_by_name(cpu_class):
    with pytest.raises(ConfigError, match="avx2, avx512, avx512-bf16 or auto"):
        cpu_class("avx3")


def test_the_switch_caps_torch_and_onednn_before_their_first_kernel():
    # Run as a fresh process would: the caps must be set at import, before torch dispatches anything.
    code = ("import blockdraft, torch\n"
            "from blockdraft.model.kernels import _packed_bf16_runs\n"
            "print(torch.backends.cpu.get_cpu_capability(), _packed_bf16_runs())")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], env=env | {cpu_switch.ENV: "avx2"}, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["AVX2", "False"], f"under the avx2 switch torch dispatched as {out}"


# (dtype, weights) -> what each class loads: (weights, dtype), or the words of the refusal.
Q4_WITH_FLOAT = "--weights q4 runs in bfloat16, but --dtype is float32"
EXPECTED = {
    ("auto", "auto"): ("q4", "bfloat16"),  # wherever the int4 kernel runs: 3x float32 on every class measured
    ("auto", "q4"): ("q4", "bfloat16"),
    ("auto", "bf16"): ("bf16", "bfloat16"),
    ("auto", "fp32"): ("fp32", "float32"),
    ("float32", "auto"): (None, "float32"),
    ("float32", "q4"): Q4_WITH_FLOAT,
    ("float32", "fp32"): ("fp32", "float32"),
    ("bfloat16", "auto"): (None, "bfloat16"),
    ("bfloat16", "bf16"): ("bf16", "bfloat16"),
    ("bfloat16", "fp32"): "--weights fp32 runs in float32, but --dtype is bfloat16",
    ("float16", "auto"): (None, "float16"),
    ("float16", "q4"): "--weights q4 runs in bfloat16, but --dtype is float16",
}


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("dtype, weights", list(EXPECTED))
def test_every_dtype_and_weights_choice_resolves_or_is_refused_by_name(cpu_class, name, dtype, weights):
    if name == "avx512-bf16" and not cpu_class(None).native_bf16:
        pytest.skip("this CPU has no native bf16: the avx512-bf16 class cannot be taken here")
    cpu_class(name)
    expected = EXPECTED[(dtype, weights)]
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected.replace("--", "-+")):
            weights_dtype(resolve_weights(weights, dtype, None, "cpu"), dtype, None, "cpu")
        return
    resolved = resolve_weights(weights, dtype, None, "cpu")
    got = (resolved, str(parse_dtype(weights_dtype(resolved, dtype, None, "cpu"))).removeprefix("torch."))
    assert got == tuple(expected), f"{name}: --dtype {dtype} --weights {weights} loaded {got}, not {expected}"


def test_q4_is_refused_before_loading_where_the_int4_kernel_does_not_run(monkeypatch):
    lacking = kernels.CpuPaths("arm", False, native_bf16=False, packed_bf16=False, int4=False)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: lacking)
    with pytest.raises(ConfigError, match="int4 kernel, which does not run on this CPU"):
        weights_dtype("q4", "auto", None, "cpu")
    assert resolve_weights("auto", "auto", None, "cpu") is None, "auto must not pick a path that cannot run"


@pytest.mark.parametrize("native, noted", [(True, False), (False, True)])
def test_bf16_without_native_products_is_one_line_of_note(monkeypatch, native, noted):
    paths = kernels.CpuPaths("test", True, native_bf16=native, packed_bf16=native, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)
    note = kernels.check_bf16_note(torch.bfloat16, torch.device("cpu"))
    assert (note is not None) == noted and (note is None or "\n" not in note)
    assert kernels.check_bf16_note(torch.float32, torch.device("cpu")) is None


@pytest.mark.parametrize("native", [True, False])
def test_a_draft_beside_a_bf16_target_runs_where_its_products_are_fastest(monkeypatch, native):
    """Beside a bf16 target the draft runs bf16 where bf16 is native and float32 where it is emulated (its
    products are faster there); either way every token is the target's: its features, embeddings and head rows
    cross into the draft's dtype, and the verify decides."""
    from blockdraft.decode.options import DecodeOptions
    from blockdraft.io.drafts import LoadedDraft, place
    from blockdraft.model.target import Target

    from step_fakes import assert_drafted_tokens_are_the_targets
    from tiny_models import random_prompts, tiny_draft, tiny_target

    paths = kernels.CpuPaths("test", True, native_bf16=native, packed_bf16=False, int4=True)
    monkeypatch.setattr(kernels, "cpu_paths", lambda: paths)
    want = torch.bfloat16 if native else torch.float32
    assert kernels.draft_dtype(torch.bfloat16, torch.device("cpu")) == want
    assert kernels.draft_dtype(torch.float32, torch.device("cpu")) == torch.float32, "a float32 target's own"
    tiny = tiny_target("llama", seed=3)
    draft = tiny_draft(tiny, block_size=4)
    with torch.no_grad():
        tiny.lm_head.weight.div_(8.0)  # near-ties back, as in test_decode's bf16 tests
    target = Target(tiny.model.bfloat16())
    placed = place(LoadedDraft(draft, vocab=torch.arange(3, 60)), target)
    assert placed.module.fc.weight.dtype == want
    options = DecodeOptions(block_size=4, tree=False, adaptive=False, lookup=False)
    assert_drafted_tokens_are_the_targets(target, placed, options, random_prompts([9, 17], seed=1))


@needs_smollm2
@pytest.mark.parametrize("argv", [["--weights", "q4"], ["--dtype", "bfloat16"]])
def test_the_avx2_class_decodes_what_crashed_there(cpu_class, argv, capsys):
    # On an AVX2 CPU both died in oneDNN's bf16 packing at load; the class must take F.linear instead.
    cpu_class("avx2")
    code = main(["generate", "Say hi", "--max-new-tokens", "4", "--no-ngrams", *argv])
    captured = capsys.readouterr()
    assert code == 0 and "Traceback" not in captured.err, captured.err
    assert ("no native bf16 products" in captured.err) == ("--dtype" in argv), \
        "plain bf16 emulated must say so in one line; q4, whose bf16 activations pay anyway, must not"


@needs_smollm2
@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("argv", [[], ["--weights", "q4"], ["--weights", "bf16"], ["--weights", "fp32"],
                                  ["--dtype", "float16"]])
def test_every_documented_choice_decodes_on_each_class(cpu_class, name, argv, capsys):
    if name == "avx512-bf16" and not cpu_class(None).native_bf16:
        pytest.skip("this CPU has no native bf16: the avx512-bf16 class cannot be taken here")
    cpu_class(name)
    code = main(["generate", "Say hi", "--max-new-tokens", "4", "--no-ngrams", *argv])
    assert code == 0, capsys.readouterr().err


@needs_smollm2
def test_float32_gives_the_same_text_as_an_avx2_cpu_would():
    # Fresh processes, so torch and oneDNN really dispatch to AVX2 kernels in one of them.
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    argv = [sys.executable, "-m", "blockdraft.cli", "generate", "--dtype", "float32", "--max-new-tokens", "32",
            "--threads", "1", "--baseline", "Write a Python function that merges two sorted lists."]
    texts = []
    for name in ("auto", "avx2"):
        out = subprocess.run(argv, env=env | {cpu_switch.ENV: name}, capture_output=True, text=True, check=True)
        texts.append([line for line in out.stdout.splitlines() if not line.startswith("[")])
    assert texts[0] and texts[0] == texts[1], "float32 text must not depend on the CPU class"
