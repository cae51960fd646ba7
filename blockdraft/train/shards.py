"""Binary data shards: many examples' token ids in one safetensors file (docs/data.md §5).

A shard `data-NNNNN.safetensors` holds three arrays and a string metadata dict:

    tokens          [T]      uint16 when the target's vocabulary fits in 65,536 ids, else int32: every
                             example's prompt and response ids, one example after the other
    offsets         [N + 1]  int64: example i is tokens[offsets[i]:offsets[i + 1]]
    prompt_lengths  [N]      int32: the loss mask is 0 on the first prompt_lengths[i] tokens, 1 after
    greedy          [T]      optional, the dtype of `tokens`: for human-written answers labelled by one target
                             prefill, the target's argmax after each token (docs/data.md §6); every example
                             of such a shard has it
    metadata        format ("blockdraft-data"), version, ids (a JSON list of N strings), tokenizer (the sha256
                    of the target tokenizer's vocabulary: `tokenizer_fingerprint`)

Reading keeps each shard's token array and builds an example's lists only when asked (`StoredExample`), so
60,000 examples cost their tokens' bytes, not Python lists of them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from ..errors import InputError

FORMAT, VERSION = "blockdraft-data", "1"
ARRAYS = ("tokens", "offsets", "prompt_lengths")
GREEDY = "greedy"
MAX_SHARD_BYTES = 15 * 2**20  # small shards copy, resume and travel one at a time (docs/data.md §4)


class StoredExample:
    """One example of a binary shard, read through the same `id`, `input_ids`, `loss_mask` as `data.Example`.

    `input_ids`, `loss_mask` and `greedy` are new lists built from the shard's arrays on every access.
    """

    __slots__ = ("id", "_tokens", "_start", "_end", "_prompt_length", "_greedy")

    def __init__(self, example_id: str, tokens: np.ndarray, start: int, end: int, prompt_length: int,
                 greedy: np.ndarray | None = None) -> None:
        self.id = example_id
        self._tokens, self._start, self._end, self._prompt_length = tokens, start, end, prompt_length
        self._greedy = greedy

    @property
    def input_ids(self) -> list[int]:
        return self._tokens[self._start : self._end].tolist()

    @property
    def loss_mask(self) -> list[int]:
        length = self._end - self._start
        return [0] * self._prompt_length + [1] * (length - self._prompt_length)

    @property
    def greedy(self) -> list[int] | None:
        return None if self._greedy is None else self._greedy[self._start : self._end].tolist()

    def __eq__(self, other) -> bool:
        if not all(hasattr(other, name) for name in ("id", "input_ids", "loss_mask")):
            return NotImplemented
        return ((self.id, self.input_ids, self.loss_mask, self.greedy)
                == (other.id, other.input_ids, other.loss_mask, getattr(other, "greedy", None)))

    __hash__ = None  # equal to a mutable Example, so not hashable either

    def __repr__(self) -> str:
        return f"StoredExample(id={self.id!r}, tokens={self._end - self._start}, prompt={self._prompt_length})"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id, added tokens included): the ids' meaning."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id of a `vocab_size` vocabulary fits, else int32 (safetensors has no uint32 in numpy)."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def prompt_length(example) -> int:
    """Where an example's loss mask turns from 0 to 1; a mask of any other shape is refused."""
    mask = example.loss_mask
    start = mask.index(1) if 1 in mask else len(mask)
    if any(m != 0 for m in mask[:start]) or any(m != 1 for m in mask[start:]):
        raise ValueError(f"example {example.id!r}: a binary shard stores masks 0...0 1...1 (prompt, response), "
                         "got another shape; write it with `write_shard` as JSON Lines instead")
    return start


def encode_shard(examples: list, *, tokenizer_sha256: str, vocab_size: int) -> bytes:
    """The safetensors bytes of a binary shard holding `examples` (ids checked against `vocab_size`)."""
    lengths = [len(example.input_ids) for example in examples]
    tokens = np.concatenate([np.asarray(example.input_ids, dtype=np.int64) for example in examples]
                            or [np.zeros(0, np.int64)])
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {tokens.min()}..{tokens.max()}")
    arrays = {
        "tokens": tokens.astype(token_dtype(vocab_size)),
        "offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
        "prompt_lengths": np.asarray([prompt_length(example) for example in examples], dtype=np.int32),
    }
    labelled = [getattr(example, GREEDY, None) is not None for example in examples]
    if any(labelled):
        if not all(labelled) or any(len(e.greedy) != n for e, n in zip(examples, lengths)):
            raise ValueError("a shard's examples all carry `greedy` labels of their own length, or none does")
        greedy = np.concatenate([np.asarray(example.greedy, dtype=np.int64) for example in examples])
        if greedy.min() < 0 or greedy.max() >= vocab_size:
            raise ValueError(f"greedy labels must lie in [0, {vocab_size}), got {greedy.min()}..{greedy.max()}")
        arrays[GREEDY] = greedy.astype(token_dtype(vocab_size))
    return save(arrays, metadata=_metadata([example.id for example in examples], tokenizer_sha256))


def _metadata(ids: list[str], tokenizer_sha256: str) -> dict[str, str]:
    return {"format": FORMAT, "version": VERSION, "ids": json.dumps(ids), "tokenizer": tokenizer_sha256}


class ShardSizer:
    """How many of the examples waiting to be written go into the next shard: at most `max_examples`, and
    at most `max_bytes` on disk (a single example larger than that still makes a shard of its own).

    The size is an upper bound computed without serialising: the empty shard's bytes, plus per example its
    tokens, one offset and one prompt length, and its id in the metadata (JSON-escaped once more, so at
    most twice its JSON length).
    """

    def __init__(self, max_examples: int, max_bytes: int, tokenizer_sha256: str, vocab_size: int) -> None:
        self.max_examples, self.max_bytes = max_examples, max_bytes
        self.tokenizer_sha256, self.vocab_size = tokenizer_sha256, vocab_size
        self.itemsize = token_dtype(vocab_size).itemsize
        empty = {"tokens": np.zeros(0, token_dtype(vocab_size)), "offsets": np.zeros(1, np.int64),
                 "prompt_lengths": np.zeros(0, np.int32)}
        self.base = len(save(empty, metadata=_metadata([], tokenizer_sha256))) + 64  # digits and alignment

    def example_bytes(self, example) -> int:
        arrays = 1 if getattr(example, GREEDY, None) is None else 2  # tokens, and greedy labels where there are
        return arrays * len(example.input_ids) * self.itemsize + 8 + 4 + 2 * len(json.dumps(example.id)) + 2

    def take(self, examples: list) -> int:
        """The number of leading `examples` the next shard holds (0 for no examples)."""
        size, count = self.base, 0
        for example in examples[: self.max_examples]:
            size += self.example_bytes(example)
            if count and size > self.max_bytes:
                break
            count += 1
        return count

    def full(self, examples: list) -> int:
        """`take(examples)` when that makes a full shard (more examples wait behind it), else 0."""
        count = self.take(examples)
        return count if count == self.max_examples or count < len(examples) else 0


def read_binary_shard(path: Path, tokenizer_sha256: str | None = None) -> list[StoredExample]:
    """The examples of one binary shard; a damaged shard, another format or (given the target's
    `tokenizer_sha256`) another tokenizer raise InputError naming the file."""
    rebuild = f"delete it and run `blockdraft data --out {path.parent}` again (it rewrites missing shards)"
    try:
        data = path.read_bytes()
        arrays = load(data)
        # load() has checked the header; its "__metadata__" is the string dict written with the arrays.
        metadata = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise InputError(f"{path} is not a readable data shard ({error}); {rebuild}") from error
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise InputError(f"{path} is a data shard of format {metadata.get('format')!r} version "
                         f"{metadata.get('version')!r}; this blockdraft reads {FORMAT!r} version {VERSION}; "
                         f"rebuild the data with this blockdraft (`blockdraft data`)")
    if tokenizer_sha256 is not None and metadata.get("tokenizer") != tokenizer_sha256:
        raise InputError(f"{path} was built with another tokenizer (vocabulary sha256 "
                         f"{str(metadata.get('tokenizer'))[:16]}, the target's is {tokenizer_sha256[:16]}): its ids "
                         "mean other tokens; regenerate the data with this target (`blockdraft data --target ...`)")
    ids, tokens, offsets, prompt_lengths = _checked(path, arrays, metadata)
    bounds, greedy = offsets.tolist(), arrays.get(GREEDY)
    return [StoredExample(example_id, tokens, bounds[i], bounds[i + 1], prompt, greedy)
            for i, (example_id, prompt) in enumerate(zip(ids, prompt_lengths.tolist()))]


def _checked(path: Path, arrays: dict, metadata: dict) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The shard's ids and arrays after checking they describe whole examples (a bad shard fails here, not in a
    training step hours later)."""
    def bad(what: str) -> InputError:
        return InputError(f"{path}: {what}; the shard is damaged: delete it and run `blockdraft data --out "
                          f"{path.parent}` again")

    if sorted(arrays) not in (sorted(ARRAYS), sorted((*ARRAYS, GREEDY))):
        raise bad(f"expected the arrays {list(ARRAYS)} (and optionally {GREEDY!r}), got {sorted(arrays)}")
    greedy = arrays.get(GREEDY)
    if greedy is not None and (greedy.dtype != arrays["tokens"].dtype or greedy.shape != arrays["tokens"].shape
                               or (greedy.dtype == np.int32 and (greedy < 0).any())):
        raise bad(f"`{GREEDY}` has dtype {greedy.dtype} and shape {greedy.shape}; expected those of `tokens`")
    tokens, offsets, prompt_lengths = (arrays[name] for name in ARRAYS)
    try:
        ids = json.loads(metadata.get("ids", ""))
    except json.JSONDecodeError:
        ids = None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise bad("metadata `ids` is not a JSON list of strings")
    n = len(ids)
    if tokens.dtype not in (np.uint16, np.int32) or offsets.dtype != np.int64 or prompt_lengths.dtype != np.int32:
        raise bad(f"dtypes {tokens.dtype}, {offsets.dtype}, {prompt_lengths.dtype}; expected uint16 or int32, "
                  "int64, int32")
    if tokens.ndim != 1 or offsets.shape != (n + 1,) or prompt_lengths.shape != (n,):
        raise bad(f"shapes tokens {tokens.shape}, offsets {offsets.shape}, prompt_lengths {prompt_lengths.shape} "
                  f"do not fit {n} ids")
    lengths = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != tokens.size or (lengths < 1).any():
        raise bad("offsets do not cut the tokens into non-empty examples")
    if (prompt_lengths < 0).any() or (prompt_lengths > lengths).any() or (tokens.dtype == np.int32 and
                                                                          (tokens < 0).any()):
        raise bad("a prompt length outside its example, or a negative token id")
    return ids, tokens, offsets, prompt_lengths
