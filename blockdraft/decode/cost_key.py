"""The disk-cache key of a step-cost table (costs.py): what makes a step cost what it does, the code included.

A table is read back only where every part of its key is the same: the target and the draft's geometry and
proposal vocabulary, dtype, device, threads, torch, how the products run, the timing's design and the kinds it
times, and a digest of the source of the code a step runs (`code_digest`), so that an edit or an upgrade times
the steps again instead of pricing them by a table of other code.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch

from .. import __version__
from ..hardware import cpu_name
from ..model.kernels import cpu_paths, draft_dtype
from .costs import PROMPT_LENGTH, RAGGED_EXTRA, ROUNDS, STEPS_PER_ROUND, TIMED_WIDTHS


def cost_key(target, draft_config, block_size: int, tree: bool, proposal_ids: int | None) -> str | None:
    """The disk-cache key of a cost model: what makes a step cost what it does. None for a target without a name
    (a model built in memory), whose costs are kept for the process only. `proposal_ids`: how many ids the draft's
    head scores (its proposal vocabulary's size), None for every id: the head is a large part of a draft step."""
    if not getattr(target, "name", ""):
        return None
    device = target.device
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    described = dict(target=target.name, layers=target.num_layers, vocab=int(target.lm_head.weight.shape[0]),
                     dtype=str(target.dtype), device=hardware, threads=torch.get_num_threads(),
                     torch=torch.__version__, packed=bool(getattr(target, "packed", False)),
                     # how int4 products run; the earlier form (bf16 products above 4 rows) timed otherwise
                     int4="q4_1 every row, 4k + 1 rows split" if getattr(target, "quantized", False) else False,
                     # the step's form: model/lean.py, scripted.py, packed.single_row_differs, step.py's plain steps;
                     # the draft's: model/draft_lean.py
                     forward="lean layers, paired single rows, lean plain steps, ragged steps",
                     draft=dict(layers=draft_config.num_hidden_layers, hidden=draft_config.hidden_size, lean=True,
                                taps=list(draft_config.target_layer_ids), proposal_ids=proposal_ids,
                                dtype=str(draft_dtype(target.dtype, device, bool(target.quantized))),
                                int4=bool(target.quantized)),
                     block_size=block_size, tree=tree, rounds=ROUNDS, steps=STEPS_PER_ROUND,
                     statistic="every kind in turn; plain min x median of ratios to the cycle's plain step",
                     # a cache without it may have been timed on a busy machine unseen: measured once more
                     waited="share of the timing our threads waited for a CPU, kept per bucket",
                     prompt=PROMPT_LENGTH, ragged=dict(extra=list(RAGGED_EXTRA)), timed_widths=list(TIMED_WIDTHS),
                     code=step_code_digest())
    if device.type == "cpu" and target.dtype == torch.bfloat16 and not cpu_paths().native_bf16:
        # bf16 emulated: its products run ATen's kernel (kernels.aten_bf16_products), whose many-row heads cost
        # otherwise than oneDNN's did; tables timed before are measured again
        described["bf16_products"] = "aten"
    if getattr(target, "screened", False):  # greedy verify blocks cost little more than a plain step's head
        described["greedy_screen"] = "int8 head, exact near the top"
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


# The packages whose code runs a decode step: a table timed before any of it changed is measured again. A change
# that moved step costs once went unnoticed by the hand-kept strings above (a cached table priced a 2-position
# drafted q4 step at 1.34 plain steps where the code then took 1.48, and the default mode drafted where it lost).
STEP_CODE = ("model", "decode", "sampling")


@functools.cache
def step_code_digest() -> str:
    """`code_digest` of this installation: part of every cost key."""
    return code_digest(Path(__file__).resolve().parent.parent)


def code_digest(root: Path) -> str:
    """A digest of the source of the code a step runs under the package folder `root` (STEP_CODE's packages and
    the caches' module), the same on every machine that has the same code."""
    files = sorted(path for package in STEP_CODE for path in (root / package).glob("*.py"))
    files += [root / "cache.py"] if (root / "cache.py").is_file() else []
    digest = hashlib.sha256(__version__.encode())  # an install of bytecode only: its version at least
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
