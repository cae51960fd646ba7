"""The command line end to end on a tiny target saved as an HF folder: generate, compare, inspect, refusals."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.io.checkpoint import write_checkpoint

from tiny_models import char_tokenizer, tiny_draft, tiny_target


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_compare_reports_identical_outputs_and_speedup(model_folders, capsys):
    target, draft = model_folders
    code, out, _ = run(capsys, "generate", "hello", "--target", target, "--draft", draft, "--dtype", "float32",
                       "--max-new-tokens", "12", "--compare")
    assert code == 0, out
    assert "[target alone]" in out and "[speculative]" in out
    assert "speedup" in out and "identical" in out and "K=8" in out and "float32" in out


@pytest.mark.parametrize("dtype, code, words", [
    ("float32", 1, "DIFFERENT in float32 beyond rounding at prompt 1, new token 3:"),
    ("bfloat16", 0, "differ at prompt 1, new token 3:"),
])
def test_generate_compare_names_where_outputs_differ_and_fails_a_float32_bug(model_folders, capsys, monkeypatch, dtype,
                                                                             code, words):
    import blockdraft.commands.generate as command

    original = command._run

    def wrong_speculative(decoder, ids, max_new_tokens, **kw):  # a decode that changes the fourth new token
        tokens, rows, stats = original(decoder, ids, max_new_tokens, **kw)
        if decoder.speculative:
            tokens[0][3] = (tokens[0][3] + 1) % decoder.target.lm_head.weight.shape[0]
        return tokens, rows, stats

    monkeypatch.setattr(command, "_run", wrong_speculative)
    target, draft = model_folders
    got, out, _ = run(capsys, "generate", "xyz", "--target", target, "--draft", draft, "--dtype", dtype,
                      "--max-new-tokens", "8", "--compare")
    assert got == code and words in out and "the target's margin" in out, out


def test_generate_compare_prints_both_texts_and_names_the_differing_token(model_folders, capsys, monkeypatch):
    """Where the outputs differ, both completions are printed under their labels and the first differing token is
    named by its text as well as its id: ids alone tell a reader nothing, and one text hides the other."""
    import blockdraft.commands.generate as command

    original, seen = command._run, {}

    def wrong_speculative(decoder, ids, max_new_tokens, **kw):  # the fourth new token becomes another character
        tokens, rows, stats = original(decoder, ids, max_new_tokens, **kw)
        if decoder.speculative:
            tokens[0][3] = 3 + (tokens[0][3] - 2) % 92  # ids 3..94 are the printable characters
        seen["speculative" if decoder.speculative else "alone"] = list(tokens[0])
        return tokens, rows, stats

    monkeypatch.setattr(command, "_run", wrong_speculative)
    target, draft = model_folders
    _, out, _ = run(capsys, "generate", "xyz", "--target", target, "--draft", draft, "--dtype", "bfloat16",
                    "--max-new-tokens", "8", "--compare")
    tokenizer, alone, spec = char_tokenizer(), seen["alone"], seen["speculative"]
    assert (f"=== [target alone] prompt 1:\n{tokenizer.decode(alone, skip_special_tokens=True)}\n"
            f"=== [speculative] prompt 1:\n{tokenizer.decode(spec, skip_special_tokens=True)}\n") in out, out
    assert (f"new token 3: {tokenizer.decode([alone[3]])!r} (id {alone[3]}) alone, "
            f"{tokenizer.decode([spec[3]])!r} (id {spec[3]}) speculative") in out, out


def test_a_bounded_draft_context_decodes_exactly_and_the_bench_states_it(model_folders, capsys, tmp_path):
    target, draft = model_folders
    code, out, _ = run(capsys, "generate", "abcabcabcabc", "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "24", "--compare", "--draft-window", "3", "--draft-sinks", "1")
    assert code == 0 and "identical" in out, out
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nabcabcabc\n")
    code, out, _ = run(capsys, "bench", "--prompts", str(prompts), "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "4", "--methods", "blockdraft", "--draft-window", "8",
                       "--out", str(tmp_path / "bench"))
    assert code == 0 and "draft context: first 4 + latest 8 positions" in out, out
    settings = json.loads((tmp_path / "bench" / "bench.json").read_text())["settings"]
    assert settings["draft_window"] == {"window": 8, "sinks": 4}
    code, out, _ = run(capsys, "eval", "--prompts", str(prompts), "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "4", "--draft-window", "8", "--draft-sinks", "2")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["draft_window"] == {"window": 8, "sinks": 2}, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="names a missing GPU")
@pytest.mark.parametrize("device, words", [("gpu", "unknown device 'gpu'"), ("cuda", "sees no CUDA GPU")])
def test_a_device_this_machine_lacks_is_named(model_folders, capsys, tmp_path, device, words):
    target, draft = model_folders
    for command in (["generate", "hi"], ["eval", "--prompts", "humaneval"]):
        code, _, err = run(capsys, *command, "--target", target, "--draft", draft, "--device", device)
        assert code == 2 and words in err, err


def test_bench_and_eval_refuse_what_would_fail_late_or_mislead(model_folders, capsys, tmp_path):
    target, draft = model_folders
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nabcabcabc\n" + "x" * 600 + "\n")
    model = ["--target", target, "--draft", draft, "--dtype", "float32"]
    (tmp_path / "afile").write_text("")
    bench = ["bench", "--prompts", str(prompts), "--max-new-tokens", "4", "--methods", "blockdraft", *model]
    for extra, words in ((["--out", str(tmp_path / "afile")], "cannot hold the results"),
                         (["--batch-size", "4", "--out", str(tmp_path / "b")], "more than the 3 prompts"),
                         (["--out", str(tmp_path / "c")], "prompt prompts.txt:3 has")):  # over the context: by id
        code, _, err = run(capsys, *bench, *extra)
        assert code == 2 and words in err, err
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"caf\xe9\n")
    code, _, err = run(capsys, "bench", "--prompts", str(binary), *model)
    assert code == 2 and "latin1.txt, line 1: not UTF-8" in err, err
    refusals = [(["--batch-size", "0"], "--batch-size"), (["--prompts", ","], "names no prompt set")]
    if importlib.util.find_spec("eval_framework") is not None:  # the package that ships HealthBench
        refusals.append((["--prompts", "healthbench"], "training set"))
    for extra, words in refusals:
        code, _, err = run(capsys, "eval", "--prompts", str(prompts), *extra, *model)
        assert code == 2 and words in err, (extra, err)


def test_bench_records_its_vocabulary_and_notes_ignored_sampling_flags(model_folders, capsys, tmp_path):
    target, draft = model_folders
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n")
    code, out, err = run(capsys, "bench", "--prompts", str(prompts), "--target", target, "--draft", draft, "--dtype",
                         "float32", "--max-new-tokens", "4", "--methods", "blockdraft", "--top-k", "5",
                         "--full-vocab", "--out", str(tmp_path / "b"))
    assert code == 0 and "--top-k ignored at temperature 0" in err, err
    settings = json.loads((tmp_path / "b" / "bench.json").read_text())["settings"]
    assert settings["full_vocab"] is True and settings["proposal_vocab_size"] is None
    code, out, _ = run(capsys, "eval", "--prompts", str(prompts), "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "4", "--batch-size", "2")
    record = json.loads(out.strip().splitlines()[-1])
    assert record["prompts"] == {str(prompts): 1} and record["batch_size"] == 2 and record["date"]


def test_generate_streams_and_ends_with_the_statistics_line(model_folders, capsys):
    target, draft = model_folders
    code, out, _ = run(capsys, "generate", "hi", "--target", target, "--draft", draft, "--dtype", "float32",
                       "--max-new-tokens", "6", "--block-size", "4")
    assert code == 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("[speculative]") and "tok/s" in last and "tau" in last and "K=4" in last


def test_generate_prints_the_same_bins_for_every_row_at_the_k_asked_for(model_folders, capsys):
    """Trees and lookups (on by default) verify up to 2K tokens a step: every row's histogram and the batch's must
    still show the bins 1..K and >K of the K the user set, or rows of one batch print different lengths."""
    import re

    target, draft = model_folders
    code, out, _ = run(capsys, "generate", "abcabcabcabc", "xyzxyzxyz", "--target", target, "--draft", draft,
                       "--dtype", "float32", "--max-new-tokens", "24", "--block-size", "4")
    lines = [line for line in out.splitlines() if "histogram" in line]
    assert code == 0 and len(lines) == 3, out
    assert all(re.search(r"histogram 1:\d+ 2:\d+ 3:\d+ 4:\d+ >4:\d+\)", line) for line in lines), lines
    assert "K=4" in lines[-1], lines[-1]


def test_generate_compare_with_lookups_names_the_mode_and_matches(model_folders, capsys):
    target, draft = model_folders
    code, out, _ = run(capsys, "generate", "abcabcabcabc", "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "24", "--compare")
    assert code == 0 and "identical" in out and "adaptive tree + lookup" in out, out
    code, out, _ = run(capsys, "generate", "abcabc", "--target", target, "--draft", draft, "--dtype", "float32",
                       "--max-new-tokens", "8", "--compare", "--lookup", "off")
    assert code == 0 and "adaptive tree," in out and "lookup" not in out.splitlines()[-1]
    code, out, _ = run(capsys, "generate", "abcabcabcabc", "--target", target, "--draft", draft, "--dtype",
                       "float32", "--max-new-tokens", "24", "--compare", "--drafting", "off")
    assert code == 0 and "identical" in out and "lookup alone" in out.splitlines()[-1], out
    assert " 0 drafted" in out, "the draft never runs"
    code, _, err = run(capsys, "generate", "abc", "--target", target, "--draft", draft, "--drafting", "off",
                       "--lookup", "off")
    assert code != 0 and "drafting=False" in err and "Traceback" not in err, err


def test_every_door_decodes_with_the_same_defaults():
    """The API, the CLI (flags at auto) and the server start from one DecodeOptions: the best exact mode."""
    import inspect

    from blockdraft import api
    from blockdraft.commands.decoding import switch as _switch
    from blockdraft.decode.options import DecodeOptions, resolve

    defaults = DecodeOptions()
    assert (defaults.tree, defaults.adaptive, defaults.lookup) == (True, True, True)
    unset = {name: p.default for name, p in inspect.signature(api.generate).parameters.items()
             if name in ("tree", "adaptive", "lookup", "block_size", "sampler", "draft_argmax", "options")}
    assert resolve(**{k: v for k, v in unset.items() if k != "options"}) == defaults, "the API's defaults drifted"
    assert resolve(tree=_switch("auto"), adaptive=_switch("auto"), lookup=_switch("auto")) == defaults
    with pytest.raises(Exception, match="unknown decode option"):
        resolve(trees=True)


def test_unseeded_sampling_prints_how_to_draw_the_same_text_again(model_folders, capsys):
    import re

    target, draft = model_folders
    common = ["generate", "hello", "--target", target, "--draft", draft, "--dtype", "float32", "--max-new-tokens",
              "12", "--temperature", "0.8"]
    code, out, _ = run(capsys, *common)
    again = re.search(r"rerun with (--seed \d+ --sampler rejection)", out)
    assert code == 0 and again is not None, out
    code, repeat, _ = run(capsys, *common, *again.group(1).split())

    def text(printed: str) -> str:  # what was streamed: between the sampling line and the statistics line
        return printed.split("\n", 1)[1].rsplit("[speculative]", 1)[0]

    assert code == 0 and text(repeat) == text(out), "the printed seed must reproduce the unseeded run"
    code, out, _ = run(capsys, *common, "--seed", "3")
    assert code == 0 and "rerun" not in out and "coupled" in out, "a seeded sample is coupled by default"


def test_a_seeded_sample_compares_identical_to_the_target_alone(model_folders, capsys):
    """--seed samples coupled: the speculative run draws the target-alone sample of that seed, so --compare
    checks the texts as it does greedy ones; the rejection sampler draws another sample and compares nothing."""
    target, draft = model_folders
    common = ["generate", "hello", "--target", target, "--draft", draft, "--dtype", "float32", "--max-new-tokens",
              "16", "--temperature", "0.9", "--compare"]
    code, out, _ = run(capsys, *common, "--seed", "5")
    assert code == 0 and "coupled" in out and "outputs identical" in out, out
    code, out, _ = run(capsys, *common, "--seed", "5", "--sampler", "rejection", "--adaptive", "on")
    assert code == 0 and "not compared" in out, out


def test_inspect_prints_the_config_and_validates(model_folders, capsys):
    target, draft = model_folders
    code, out, _ = run(capsys, "inspect", draft, "--target", target)
    assert code == 0
    config = json.loads(out[: out.index("\n}\n") + 2])
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    assert "ok: the checkpoint matches" in out and "proposal vocabulary (blockdraft_vocab.json): none" in out


@pytest.mark.parametrize(
    "extra, word",
    [
        (["--max-new-tokens", "0"], "max-new-tokens"),
        (["--dtype", "float12"], "dtype"),
        (["--block-size", "99"], "block_size"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--draft-window", "0"], "--draft-window"),
        (["--block-size", "0"], "block_size"),  # not "the trained size"
        (["--draft-window", "64", "--draft-sinks", "-1"], "sink positions"),
    ],
)
def test_bad_input_exits_2_naming_the_parameter(model_folders, capsys, extra, word):
    target, draft = model_folders
    code, _, err = run(capsys, "generate", "hi", "--target", target, "--draft", draft, *extra)
    assert code == 2 and word in err, err


def test_a_draft_for_another_target_is_refused(model_folders, capsys, tmp_path):
    target, _ = model_folders
    other = tiny_target("llama", layers=8)
    draft = tiny_draft(other, layers=1, block_size=8)
    write_checkpoint(tmp_path / "d", draft.config, draft.state_dict(), dtype=draft.fc.weight.dtype)
    code, _, err = run(capsys, "generate", "hi", "--target", target, "--draft", str(tmp_path / "d"))
    assert code == 2 and "num_target_layers" in err, err


def test_vocab_writes_the_sidecar_from_data(tmp_path, capsys):
    from blockdraft.io.vocab import read_vocab
    from blockdraft.train.data import Example, write_shard

    target = tiny_target("llama")
    draft = tiny_draft(target, layers=1, block_size=8)
    write_checkpoint(tmp_path / "draft", draft.config, draft.state_dict())
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    write_shard(tmp_path / "data" / "data-00000.jsonl", [Example("a", [1, 7, 8, 9], [0, 0, 1, 1])])
    code, out, _ = run(capsys, "vocab", str(tmp_path / "draft"), "--data", str(tmp_path / "data"))
    assert code == 0 and "2 of" in out
    assert read_vocab(tmp_path / "draft", draft.config.vocab_size).tolist() == [8, 9]
    write_shard(tmp_path / "other" / "data-00000.jsonl", [Example("b", [1, 7, 10_000], [0, 1, 1])])
    code, _, err = run(capsys, "vocab", str(tmp_path / "draft"), "--data", str(tmp_path / "other"))
    assert code == 2 and "another target" in err
    (tmp_path / "prompts").mkdir()
    write_shard(tmp_path / "prompts" / "data-00000.jsonl", [Example("c", [1, 7, 8], [0, 0, 0])])
    code, _, err = run(capsys, "vocab", str(tmp_path / "draft"), "--data", str(tmp_path / "prompts"))
    assert code == 2 and "hold no response tokens" in err, err  # an empty sidecar would be refused at load


@pytest.mark.parametrize(("extra", "word"), [(["--kd-weight", "0.5"], "--loss kd"),
                                             (["--loss", "kd", "--kd-weight", "2"], "kd_weight"),
                                             (["--target-layer-ids", "1,a"], "--target-layer-ids")])
def test_train_refuses_bad_kd_settings(model_folders, capsys, tmp_path, extra, word):
    target, _ = model_folders
    code, _, err = run(capsys, "train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--target", target,
                       *extra)
    assert code == 2 and word in err, err


def test_train_takes_several_data_folders_but_not_one_twice(model_folders, capsys, tmp_path):
    target, _ = model_folders
    code, _, err = run(capsys, "train", "--data", str(tmp_path), "--data", str(tmp_path / "."), "--out",
                       str(tmp_path / "run"), "--target", target)
    assert code == 2 and "twice" in err, err


def test_the_librarys_warnings_are_one_line_notes(capsys, monkeypatch):
    """A warning of the library (a cost cache timed on a busy machine) is a note to the user: one line, not a
    source location and the line of code that raised it; another package's keeps Python's form."""
    import warnings

    import blockdraft.cli as cli
    from blockdraft.decode import measure

    class Command:
        add_arguments = staticmethod(lambda parser: None)

        @staticmethod
        def run(args):
            warnings.warn_explicit("the step costs were timed busy", UserWarning, measure.__file__, 1)
            warnings.warn_explicit("a note of another package", UserWarning, "/elsewhere/lib.py", 7)
            return 0

    monkeypatch.setattr(cli, "_module", lambda name: Command)
    with pytest.warns(UserWarning, match="a note of another package"):  # passed on to how Python shows it
        shown = warnings.showwarning
        assert cli.main(["inspect"]) == 0
        assert warnings.showwarning is shown, "the command line's form must not outlive main()"
    err = capsys.readouterr().err
    assert err == "warning: the step costs were timed busy\n", err
