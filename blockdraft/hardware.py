"""A one-line description of where numbers were measured: device, cores, library versions, dtype."""

from __future__ import annotations

import os
import platform

import torch


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The vector ISA torch dispatches to, and whether bf16 matmuls are native (they decide CPU speed); the class
    $BLOCKDRAFT_CPU set, when it did."""
    from .cpu_switch import ENV
    from .model.kernels import cpu_paths

    paths = cpu_paths()
    bf16 = "native bf16" if paths.native_bf16 else "no native bf16"
    switched = f", as {paths.cpu_class} (${ENV})" if paths.switched else ""
    return f"{torch.backends.cpu.get_cpu_capability()}, {bf16}{switched}"


def describe(device: str | torch.device = "cpu", dtype: torch.dtype | None = None, quantized: bool = False) -> dict:
    """Where a number was measured; `quantized`: the target's layers run as int4 (`--weights q4`), which the dtype
    of its activations alone would not say."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{cpu_name()} ({torch.get_num_threads()} threads, {os.cpu_count()} cores, {cpu_isa()})"
    import transformers

    info = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__}
    if dtype is not None:
        info["dtype"] = str(dtype).replace("torch.", "")
    if quantized:
        info["weights"] = "q4 (int4 layers)"
    return info


def describe_line(device="cpu", dtype=None, quantized: bool = False) -> str:
    info = describe(device, dtype, quantized)
    return ", ".join(f"{k} {v}" if k != "device" else v for k, v in info.items())
