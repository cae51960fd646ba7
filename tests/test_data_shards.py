"""Binary data shards (train/shards.py) and the folder reader (train/data.py): round trips, the size bound, old JSON
Lines shards, and the refusals that name the file and the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load, save

from blockdraft.errors import InputError
from blockdraft.train.batches import data_fingerprint, load_split
from blockdraft.train.data import Example, read_examples, write_shard
from blockdraft.train.shards import ShardSizer, encode_shard, tokenizer_fingerprint

from tiny_models import char_tokenizer

FINGERPRINT = "f" * 64
EXAMPLES = [Example("a", [1, 7, 8, 9], [0, 0, 1, 1]), Example("set:b:2", [1, 40, 41, 42, 2], [0, 1, 1, 1, 1]),
            Example("c", [5, 2], [0, 1])]


def write(path, examples=EXAMPLES, fingerprint=FINGERPRINT, vocab_size=96):
    write_shard(path, examples, tokenizer_sha256=fingerprint, vocab_size=vocab_size)
    return path


def fields(examples):
    return [(e.id, e.input_ids, e.loss_mask) for e in examples]


@pytest.mark.parametrize("vocab_size, dtype", [(96, "uint16"), (2**16, "uint16"), (151_936, "int32")])
def test_a_binary_shard_reads_back_the_examples_written(tmp_path, vocab_size, dtype):
    examples = EXAMPLES + [Example("big", [0, vocab_size - 1], [0, 1])]
    path = write(tmp_path / "data-00000.safetensors", examples, vocab_size=vocab_size)
    arrays = load(path.read_bytes())
    assert arrays["tokens"].dtype == np.dtype(dtype), "uint16 only when every id fits"
    assert arrays["offsets"].tolist() == [0, 4, 9, 11, 13] and arrays["prompt_lengths"].tolist() == [2, 1, 1, 1]
    read = read_examples(path)
    assert fields(read) == fields(examples) and read == examples
    assert all(type(t) is int for t in read[3].input_ids), "plain ints, as JSON Lines shards give"


def test_binary_and_json_lines_shards_fingerprint_the_same(tmp_path):
    # A resumed training run compares this hash: the format a folder is stored in must not change it.
    binary = read_examples(write(tmp_path / "data-00000.safetensors"))
    write_shard(tmp_path / "data-00000.jsonl", EXAMPLES)
    assert data_fingerprint(binary) == data_fingerprint(read_examples(tmp_path / "data-00000.jsonl"))


def test_a_mask_that_is_not_prompt_then_response_is_refused_for_binary_shards(tmp_path):
    with pytest.raises(ValueError, match="'odd'.*0...0 1...1"):
        write(tmp_path / "data-00000.safetensors", [Example("odd", [1, 2, 3], [0, 1, 0])])
    with pytest.raises(ValueError, match=r"\[0, 96\)"):
        write(tmp_path / "data-00000.safetensors", [Example("far", [1, 96], [0, 1])])


def test_the_sizer_keeps_every_shard_within_the_byte_bound():
    examples = [Example(f"set:{i}", [3] * (2 + 37 * (i % 5)), [0] + [1] * (1 + 37 * (i % 5))) for i in range(40)]
    for bound in (600, 1000, 4000):
        sizer, rest, sizes = ShardSizer(1000, bound, FINGERPRINT, 96), examples, []
        while take := sizer.take(rest):
            data = encode_shard(rest[:take], tokenizer_sha256=FINGERPRINT, vocab_size=96)
            assert take == 1 or len(data) <= bound, f"{take} examples take {len(data)} bytes, over {bound}"
            sizes.append(take)
            rest = rest[take:]
        assert sum(sizes) == 40 and max(sizes) > 1, sizes
    assert ShardSizer(3, 10**6, FINGERPRINT, 96).take(examples) == 3, "the example cap holds too"
    assert ShardSizer(3, 10**6, FINGERPRINT, 96).full(examples[:2]) == 0, "two of three: not full yet"


def test_a_folder_reads_json_lines_and_binary_shards_in_name_order(tmp_path):
    write_shard(tmp_path / "data-00000.jsonl", EXAMPLES[:1])
    write(tmp_path / "data-00001.safetensors", EXAMPLES[1:2])
    write_shard(tmp_path / "data-00002.jsonl", EXAMPLES[2:])
    assert fields(read_examples(tmp_path)) == fields(EXAMPLES)
    write(tmp_path / "data-00002.safetensors", EXAMPLES[2:])
    with pytest.raises(InputError, match="data-00002.jsonl and data-00002.safetensors"):
        read_examples(tmp_path)


def test_held_out_binary_shards_are_found(tmp_path):
    write(tmp_path / "data-00000.safetensors", EXAMPLES[:2])
    (tmp_path / "val").mkdir()
    write(tmp_path / "val" / "data-00000.safetensors", EXAMPLES[2:])
    examples, train, held = load_split(tmp_path, 0.5, seed=0)
    assert (train, held) == ([0, 1], [2]) and examples[2].id == "c", "val/ shards are the held-out set"


def test_a_prompt_in_two_folders_is_trained_once_and_never_held_out_while_trained(tmp_path):
    first, second = tmp_path / "cpu", tmp_path / "gpu"
    first.mkdir(), second.mkdir()
    write(first / "data-00000.safetensors", EXAMPLES)
    # "a" again (same prompt, another response), and an id that repeats "c" over another prompt (magpie numbers
    # its prompts per folder): the first is a repeat, the second is not.
    again = [Example("a", [1, 7, 3, 3, 3], [0, 0, 1, 1, 1]), Example("c", [6, 2], [0, 1])]
    write(second / "data-00000.safetensors", again)
    (second / "val").mkdir()
    write(second / "val" / "data-00000.safetensors", [Example("v", [1, 40, 9, 9], [0, 1, 1, 1])])
    notes = []
    examples, train, held = load_split([first, second], 0.5, seed=0, notes=notes)
    assert [e.input_ids for e in examples] == [[1, 7, 8, 9], [1, 40, 41, 42, 2], [5, 2], [6, 2]]
    assert (train, held) == ([0, 1, 2, 3], []), "the held-out prompt [1, 40] is trained on already"
    assert notes == ["2 examples repeat the prompt of an earlier one (the same prompt in two data folders, or twice "
                     "in one) and were left out; each prompt is trained on once (a sampled answer: each distinct one)"]
    assert load_split(first, 0.5, seed=0, notes=(none := []))[0] and none == [], "no repeats, no note"


def test_a_shard_of_another_schema_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path / "data-00000.safetensors")
    arrays = load(path.read_bytes())
    metadata = {"format": "blockdraft-data", "version": "0", "ids": json.dumps(["a", "set:b:2", "c"]),
                "tokenizer": FINGERPRINT}
    path.write_bytes(save(arrays, metadata=metadata))
    with pytest.raises(InputError, match=f"{path}.*version '0'.*rebuild"):
        read_examples(tmp_path)
    path.write_bytes(save({**arrays, "offsets": np.array([0, 4, 3, 11], np.int64)},
                          metadata={**metadata, "version": "1"}))
    with pytest.raises(InputError, match=f"{path}: offsets .* damaged: delete it"):
        read_examples(tmp_path)


@pytest.mark.parametrize("keep", [0, 7, 100, -4])
def test_a_truncated_shard_is_refused_naming_the_file(tmp_path, keep):
    path = write(tmp_path / "data-00000.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:keep])  # keep < 0: all but the last -keep bytes
    with pytest.raises(InputError, match=f"{path} is not a readable data shard .*blockdraft data --out"):
        read_examples(tmp_path)


def test_a_shard_of_another_tokenizer_is_refused_naming_the_file(tmp_path):
    tokenizer = char_tokenizer()
    path = write(tmp_path / "data-00000.safetensors", fingerprint=tokenizer_fingerprint(tokenizer))
    assert fields(read_examples(tmp_path, tokenizer)) == fields(EXAMPLES)
    tokenizer.add_tokens(["<tool>"])
    with pytest.raises(InputError, match=f"{path} was built with another tokenizer.*regenerate the data"):
        read_examples(tmp_path, tokenizer)
    with pytest.raises(InputError, match="another tokenizer"):
        load_split(tmp_path, 0.5, seed=0, tokenizer=tokenizer)


def test_the_tokenizer_fingerprint_follows_the_vocabulary_only():
    assert tokenizer_fingerprint(char_tokenizer()) == tokenizer_fingerprint(char_tokenizer()), "stable"
    other_template = char_tokenizer()
    other_template.chat_template = "{{ messages }}"  # the template is not what the ids mean
    assert tokenizer_fingerprint(other_template) == tokenizer_fingerprint(char_tokenizer())
