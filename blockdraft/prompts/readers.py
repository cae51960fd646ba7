"""Raw records of each registered set, and the one function per set that turns a record into chat messages.

A converter returns `(id, messages)`, None for a record that gives no usable prompt (ShareGPT chunks that
start mid-conversation), or a list of them for a record that gives several (one per ShareGPT human turn).
Messages are plain `{"role", "content"}` dicts, the shape chat templates take.
"""

from __future__ import annotations

import ast
import gzip
import json
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from blockdraft.prompts.registry import PromptSet

Messages = list[dict]


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat messages ending with the user's turn; the response is left to the target."""

    id: str  # unique within `set`
    messages: tuple[dict, ...]
    set: str


def user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def read_records(spec: PromptSet, path: str) -> Iterator[dict]:
    """The raw records of `path`, in file order, read as `spec.fmt` says."""
    opener = gzip.open if spec.fmt.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        if spec.fmt.startswith("jsonl"):
            yield from (json.loads(line) for line in f if line.strip())
        elif spec.fmt.startswith("json"):
            yield from json.load(f)
        else:
            yield from _truncated_array(f.read())


def _truncated_array(text: str) -> Iterator[dict]:
    """Records of a JSON array cut off mid-record: every complete record before the cut (docs/data.md §2)."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the record the cut went through (or the closing bracket of a complete array)
        yield record


def _humaneval(r: dict):
    # A bare function stub reads as text to continue; the instruction makes it a chat request.
    return r["task_id"], user(f"Complete the following Python function:\n```python\n{r['prompt']}```")


def _mt_bench(r: dict):
    # The second turn refers to the first answer, which only the target can write: first turn only.
    return str(r["question_id"]), user(r["turns"][0])


def _healthbench(r: dict):
    # Only role and content are copied: the record's `canary` string must never reach any text.
    turns = [{"role": m["role"], "content": m["content"]} for m in r["prompt"]]
    last_user = max(i for i, m in enumerate(turns) if m["role"] == "user")
    return r["prompt_id"], turns[: last_user + 1]


# ShareGPT chats whose first turn equals an AlpacaEval instruction (ignoring case and spacing): training on them
# would leak a benchmark. The pinned files never change, so the list is fixed; a test recomputes it.
_SHAREGPT_BENCHMARK_DUPLICATES = frozenset({
    "1qTWFZJ_0", "2DX5zWq_0", "6hVGSGD_0", "9wiewtk_0", "BRNEIhb_0", "F2RXNJI_0", "FX9X4CD_0", "H5QUkgm_0",
    "L8jnJ4q_0", "RvC8Krj_0", "XkG1O6k_0", "YId9B8p_0", "ahClVzd_0", "dZJntaU_0", "k0S032L_0", "k5HzBL1_0",
    "oNzQSNG_0", "p09oR1y_0", "yS5TtKy_0", "yePPued_0", "zCF3udT_0",
})


def _sharegpt(r: dict):
    # Leading "system" turns are share-tool banners. Records whose first turn is "gpt" are chunks cut out of a
    # longer chat; their first human turn answers context that is gone, so they are dropped.
    turns = [t for t in r["conversations"] if t["from"] != "system"]
    if not turns or turns[0]["from"] not in ("human", "user") or not turns[0]["value"].strip():
        return None
    if r["id"] in _SHAREGPT_BENCHMARK_DUPLICATES:
        return None
    return r["id"], user(turns[0]["value"])


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                   "bard": "assistant"}
# Chats with a human turn equal to a benchmark prompt: the first-turn ones above and one whose sixth turn is an
# AlpacaEval instruction. The whole chat goes, since every later turn carries the benchmark prompt as context.
_SHAREGPT_TURN_BENCHMARK_CHATS = _SHAREGPT_BENCHMARK_DUPLICATES | {"BEqvZIj_0"}


def _sharegpt_turns(r: dict) -> list[tuple[str, Messages]]:
    """One prompt per human turn: the chat up to and including that turn, earlier answers as the file has them.

    Ids are `<chat id>:<turn>`, turns counted from 1 over human turns. A chat opened by an assistant turn is a
    chunk of a longer one (dropped, as by `_sharegpt`); a turn whose context has an empty message or roles that
    do not alternate user/assistant gives no prompt (chat templates may refuse it), nor do the turns after it.
    """
    prompts = []
    for context in _sharegpt_chat(r):
        if context[-1]["role"] == "user":
            prompts.append((f"{r['id']}:{len(prompts) + 1}", context))
    return prompts


def _sharegpt_chat(r: dict) -> list[Messages]:
    """The chat after each turn, as long as it is a chat (`_sharegpt_turns`' rules); none for a dropped chat."""
    if r["id"] in _SHAREGPT_TURN_BENCHMARK_CHATS:
        return []
    turns = [t for t in r["conversations"] if t["from"] != "system"]  # share-tool banners
    chats, context = [], []
    for turn in turns:
        role = _SHAREGPT_ROLES.get(turn["from"])
        expected = "user" if len(context) % 2 == 0 else "assistant"
        if role != expected or not turn["value"].strip():
            break
        context.append({"role": role, "content": turn["value"]})
        chats.append(list(context))
    return chats


def _sharegpt_answers(r: dict) -> tuple[str, Messages] | None:
    """The chat up to its last answer, where no human turn follows that answer: the answer no `sharegpt-turns`
    prompt carries (human_answers.py reads those before a later human turn). Id `<chat id>:last`; none where the
    chat ends on a human turn."""
    chats = _sharegpt_chat(r)
    if not chats or chats[-1][-1]["role"] != "assistant":
        return None
    return f"{r['id']}:last", chats[-1]


CODEIO_TEMPLATE = """{task_description}

The input and output requirements are as follows:

{input_output_spec}

Here is a reference implementation:

```python
{code_sample}
```

Choose a feasible input for `main_solution`, then reason step by step, without running any code, to predict \
the exact output it returns for that input. Give the input and the output as JSON values."""


def _codeio(r: dict, index: int):
    # Built from the task fields for both files: the hq file's own `prompt` field is the input of a quality
    # rating (its `output` is five scores), not a task. No code is executed, unlike reasoning-gym's generator.
    text = CODEIO_TEMPLATE.format(**{k: r[k].strip() for k in ("task_description", "input_output_spec",
                                                                "code_sample")})
    return str(index), user(text)


def main_solution_stub(code: str) -> str | None:
    """The module imports and `def main_solution(...):` line of a CodeI/O code sample; None when it has none.

    Only the signature is kept: the body is what the target is asked to write.
    """
    try:
        with warnings.catch_warnings():  # the samples' own invalid escapes ('\\.') are theirs, not the user's
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(code)
    except SyntaxError:
        return None
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main_solution":
            return "\n".join(imports + [f"def main_solution({ast.unparse(node.args)}):"])
    return None


def _codeio_function(r: dict, index: int):
    # The same tasks as a function to write rather than code to read: main_solution's signature with the task
    # as its docstring, so the target answers in Python. A sample without a top-level main_solution gives none.
    stub = main_solution_stub(r["code_sample"])
    if stub is None:
        return None
    quotes = '"""'
    doc = "\n\n".join(r[k].strip() for k in ("task_description", "input_output_spec")).replace(quotes, "'''")
    body = textwrap.indent(f"{quotes}{doc}\n{quotes}", "    ")
    return str(index), user(f"Implement this Python function:\n```python\n{stub}\n{body}\n```")


def _codeio_answer(r: dict, index: int):
    # The codeio-functions prompt with the record's own code sample as the answer, in a fenced block as the
    # target writes code: human-written code for `blockdraft data --human-answers` only (ANSWERED_SETS).
    posed = _codeio_function(r, index)
    if posed is None:
        return None
    prompt_id, messages = posed
    answer = {"role": "assistant", "content": f"```python\n{r['code_sample'].strip()}\n```"}
    return prompt_id, [*messages, answer]


# set name -> record, index -> (id, messages), None (no prompt), or a list of (id, messages) (several prompts)
Converted = tuple[str, Messages] | list[tuple[str, Messages]] | None
CONVERTERS: dict[str, Callable[[dict, int], Converted]] = {
    "humaneval": lambda r, i: _humaneval(r),
    "mt-bench": lambda r, i: _mt_bench(r),
    "ifeval": lambda r, i: (str(r["key"]), user(r["prompt"])),
    "alpaca-eval": lambda r, i: (str(i), user(r["instruction"])),
    "writingbench": lambda r, i: (str(r["index"]), user(r["query"])),
    "healthbench": lambda r, i: _healthbench(r),
    "sharegpt": lambda r, i: _sharegpt(r),
    "sharegpt-turns": lambda r, i: _sharegpt_turns(r),
    "sharegpt-answers": lambda r, i: _sharegpt_answers(r),
    "codeio": _codeio,
    "codeio-hq": _codeio,
    "codeio-functions": _codeio_function,
    "codeio-answers": _codeio_answer,
}


def set_prompts(spec: PromptSet, path: str, limit: int | None) -> list[Prompt]:
    """The first `limit` usable prompts (all when None) of a registered set's verified file."""
    convert, prompts = CONVERTERS[spec.name], []
    for index, record in enumerate(read_records(spec, path)):
        if limit is not None and len(prompts) >= limit:
            break  # stops ShareGPT's record decoder early
        converted = convert(record, index)
        for prompt_id, messages in [converted] if isinstance(converted, tuple) else converted or []:
            prompts.append(Prompt(prompt_id, tuple(messages), spec.name))
    return prompts if limit is None else prompts[:limit]
