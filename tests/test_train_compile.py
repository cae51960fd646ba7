"""torch.compile of the training forward (blockdraft/train/compiled.py): when it is used, that it computes the
eager function, and that a machine which cannot compile trains eager (auto) or is refused with the fix (on)."""

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.train import compiled
from blockdraft.train.compiled import CompiledForward, compiled_model, wants_compile
from blockdraft.train.settings import TrainConfig

from tiny_models import tiny_draft, tiny_target


def test_auto_compiles_only_runs_long_enough_to_pay_it_back():
    assert not wants_compile("off", 3600, 10_000)
    assert wants_compile("on", None, 3)
    assert wants_compile("auto", 600, 3) and wants_compile("auto", None, 500)
    assert not wants_compile("auto", 599, 499) and not wants_compile("auto", None, 499)


def test_train_config_refuses_an_unknown_mode_and_lets_a_resume_change_it():
    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(data_dirs="d", out_dir="o", compile="always")
    assert "compile" not in TrainConfig(data_dirs="d", out_dir="o", compile="on").run_fields()


def _broken_compile(*args, **kwargs):
    raise RuntimeError("no C++ compiler found")


def test_a_machine_that_cannot_compile_trains_eager_under_auto_and_is_refused_under_on(monkeypatch):
    monkeypatch.setattr(compiled.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(compiled.torch, "compile", _broken_compile)
    module = torch.nn.Linear(2, 2)
    notes = []
    assert compiled_model(module, "auto", 3600, 10, torch.device("cpu"), say=notes.append) is module
    assert "no C++ compiler found" in notes[0] and "eager" in notes[0]
    with pytest.raises(ConfigError, match="--compile off"):
        compiled_model(module, "on", None, 10, torch.device("cpu"), say=notes.append)


def test_a_graph_that_fails_to_compile_runs_eager_or_is_refused(monkeypatch):
    def failing(module, **kwargs):
        def call(*args):
            raise RuntimeError("unsupported operator")
        return call

    monkeypatch.setattr(compiled.torch, "compile", failing)
    module = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    notes = []
    lenient = CompiledForward(module, strict=False, say=notes.append)
    torch.testing.assert_close(lenient(x), module(x))
    assert lenient.compiled is None and "eager" in notes[0]
    with pytest.raises(ConfigError, match="unsupported operator.*--compile off"):
        CompiledForward(module, strict=True)(x)


def test_compiled_output_that_disagrees_with_eager_is_refused_or_dropped(monkeypatch):
    """Compiled kernels that return NaN (as they did with torch's kernels capped at AVX2) never train."""
    monkeypatch.setattr(compiled.torch, "compile", lambda module, **kwargs: lambda *args: module(*args) * float("nan"))
    module = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    notes = []
    lenient = CompiledForward(module, strict=False, say=notes.append)
    torch.testing.assert_close(lenient(x), module(x))
    assert lenient.compiled is None and "differs from eager" in notes[0]
    with pytest.raises(ConfigError, match="differs from eager.*--compile off"):
        CompiledForward(module, strict=True)(x)


def test_a_cpu_capped_below_avx512_trains_eager(monkeypatch):
    monkeypatch.setattr(compiled.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    problem = compiled.compile_problem(torch.device("cpu"))
    assert problem is not None and "AVX2" in problem


def test_compiled_training_forward_computes_the_eager_function():
    """The real thing, on a tiny draft: states and gradients of the compiled forward match eager's to float32
    rounding, over two sequence lengths (shapes traced as dynamic)."""
    from blockdraft.train.forward import BlockForward
    from blockdraft.train.objective import sample_anchors

    if compiled.compile_problem(torch.device("cpu")) is not None:
        pytest.skip("torch.compile is not used on this machine (no C++ compiler, or torch's kernels below AVX512)")
    target = tiny_target("llama")
    forward = BlockForward(tiny_draft(target, layers=2, block_size=8), target)
    fast = CompiledForward(forward, strict=True)
    for length in (30, 37):
        tokens = torch.randint(3, 90, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            features = target.forward(tokens, torch.arange(length).expand(2, length), target.new_cache(2, length),
                                      (1, 4)).features
        anchors, keep = sample_anchors(torch.ones(2, length), 5, torch.Generator().manual_seed(1))
        results = []
        for call in (forward, fast):
            forward.zero_grad(set_to_none=True)
            hidden = call(tokens, anchors, keep, features)
            (hidden * torch.linspace(-1, 1, hidden.numel()).view_as(hidden)).sum().backward()
            results.append((hidden.detach(), {n: p.grad.clone() for n, p in forward.named_parameters()}))
        (eager, eager_grads), (fused, fused_grads) = results
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)
        for name, grad in eager_grads.items():
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-3, atol=1e-5 * float(grad.abs().max()),
                                       msg=name)
    assert fast.proven and fast.compiled is not None
