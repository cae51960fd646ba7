"""`torch.compile` for the training step's draft forward (docs/training.md §7), where it can build kernels.

Eager PyTorch runs the draft's norms, SwiGLU, rotary embeddings and the attention's mask and softmax as many
passes over memory, one per operation and as many again backward; compiled, they fuse. On a 2-core Intel Xeon
(model 167, bf16 autocast) the K = 8 recipe runs 1.55x the steps a minute, after about 75 s of compiling in
the first step. Compiling needs a C++ compiler on a CPU (Triton on a GPU). The draft's function is the same;
its float arithmetic is not bit for bit eager's (fused reductions round in another order), which is why the
mode is a setting of the process, not of the run: a resume may change it.

Modes: `off` runs eager; `on` compiles and refuses to start where compiling fails; `auto` compiles a run long
enough to pay back the compile (a time budget of AUTO_MIN_SECONDS or more, or AUTO_MIN_STEPS planned steps)
and otherwise, or where compiling fails, runs eager with a note saying why.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..errors import ConfigError

COMPILE_MODES = ("auto", "on", "off")
AUTO_MIN_SECONDS = 600.0  # about 75 s of compiling, then 0.3 s saved a step of 8 sequences: paid in ~250 steps
AUTO_MIN_STEPS = 500


def wants_compile(mode: str, time_budget: float | None, total_steps: int) -> bool:
    """Whether a run of `total_steps` (and `time_budget` seconds, if any) compiles its forward under `mode`."""
    if mode == "off":
        return False
    if mode == "on":
        return True
    return (time_budget is not None and time_budget >= AUTO_MIN_SECONDS) or total_steps >= AUTO_MIN_STEPS


def compile_problem(device: torch.device) -> str | None:
    """None where torch.compile builds and runs a kernel on `device`; else why not, in one line.

    On a CPU, only where torch's kernels run AVX512: with them capped at AVX2 (BLOCKDRAFT_CPU=avx2, as on AMD Zen
    2/3) the compiled draft forward returned NaN everywhere (torch 2.13, tests/test_train_compile.py), so such a
    CPU trains eager. Then a probe of one tiny function, forward and backward (a few seconds): a missing C++
    compiler or Triton fails here, not mid-run."""
    if device.type == "cpu" and not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return (f"its compiled kernels gave NaN on this CPU class ({torch.backends.cpu.get_cpu_capability()}); "
                "it is used only where torch runs AVX512")
    try:
        probe = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1, dynamic=False)
        probe(torch.ones(8, device=device, requires_grad=True)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - every failure to build means: stay eager (or refuse under `on`)
        return _one_line(exc)
    return None


def _one_line(exc: Exception) -> str:
    """`Type: first line of the message`, for a note or an error."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}"


class CompiledForward:
    """Calls `module` (the BlockForward, or DDP around it) through torch.compile; `no_sync` as DDP's.

    Shapes change from batch to batch (sequence lengths), so the graph is traced with dynamic shapes once.
    Where the first compiled call fails and `strict` is off, the run goes on eager with a note (the same
    function); under `strict` the failure is a ConfigError that names `--compile off`.
    """

    def __init__(self, module: torch.nn.Module, strict: bool, say=print) -> None:
        self.module = module
        self.strict = strict
        self.say = say
        self.compiled = torch.compile(module, dynamic=True)
        self.proven = False

    def __call__(self, *args):
        if self.compiled is None:
            return self.module(*args)
        if self.proven:
            return self.compiled(*args)
        try:
            out = self.compiled(*args)
            with torch.no_grad():
                reference = self.module(*args)
            if not _agrees(out.detach(), reference):
                raise ArithmeticError("its output differs from eager's on the first batch (NaN, or beyond rounding)")
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a graph torch.compile cannot build runs eager, the same function
            if self.strict:
                raise ConfigError(f"torch.compile failed on the draft's forward ({_one_line(exc)}); train with "
                                  "--compile off (or auto) to run it eager") from exc
            self.say(f"note: torch.compile failed on the draft's forward ({_one_line(exc)}); training eager")
            self.compiled = None
            return self.module(*args)
        self.proven = True
        return out

    def no_sync(self):
        """DDP's gradient-sync pause, or nothing to pause on one process."""
        return self.module.no_sync() if hasattr(self.module, "no_sync") else nullcontext()


def _agrees(fused: torch.Tensor, eager: torch.Tensor) -> bool:
    """The first batch's states, compiled and eager: finite alike and within a few bf16 roundings of each other."""
    if not torch.equal(torch.isfinite(fused), torch.isfinite(eager)):
        return False
    scale = float(eager.float().abs().max()) if eager.numel() else 0.0
    return bool(((fused.float() - eager.float()).abs() <= 0.05 * scale + 1e-3).all())


def compiled_model(module: torch.nn.Module, mode: str, time_budget: float | None, total_steps: int,
                   device: torch.device, say=print):
    """`module` itself, or a CompiledForward around it: what `mode` asks for and this machine can build."""
    if not wants_compile(mode, time_budget, total_steps):
        return module
    problem = compile_problem(device)
    if problem is not None:
        if mode == "on":
            raise ConfigError(f"--compile on, but torch.compile is not usable here ({problem}); install a C++ "
                              "compiler (a GPU needs Triton) where that is the cause, or train with --compile off")
        say(f"note: torch.compile is not used here ({problem}); training eager")
        return module
    return CompiledForward(module, strict=mode == "on", say=say)
