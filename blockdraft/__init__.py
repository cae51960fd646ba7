"""blockdraft: exact DFlash block-diffusion speculative decoding.

Public API: load_target, load_draft, generate, Completion, DraftConfig, SamplingParams, AcceptanceStats. They are imported
on first use, so `import blockdraft.<module>` stays light.
"""

from . import cpu_switch, mkl_mode

__version__ = "0.1.0"

cpu_switch.apply()  # $BLOCKDRAFT_CPU caps torch's kernels before any of them runs
mkl_mode.request()  # MKL's strict mode before its first call: batched rows keep their bits alone

_PUBLIC = {
    "load_target": "blockdraft.io.targets",
    "load_draft": "blockdraft.api",
    "generate": "blockdraft.api",
    "Completion": "blockdraft.api",
    "DraftConfig": "blockdraft.config",
    "AcceptanceStats": "blockdraft.metrics",
    "SamplingParams": "blockdraft.sampling",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'blockdraft' has no attribute {name!r}")
