"""The GPU window (lab/gpu_train.sh, docs/training.md "One GPU window"): its refusals, its stages' rules, and
a dry run on CPU, end to end, on the embedded target (slow). The trainer's time budget and the drafts it writes
while training are tested in test_trainer.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from blockdraft.model.target import Target

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # the library tests' tiny models (tiny_models.py)
sys.path.insert(0, str(REPO / "lab"))

from tiny_models import char_tokenizer, needs_smollm2, tiny_target  # noqa: E402

import gpu_check  # noqa: E402
import gpu_prep  # noqa: E402
import gpu_stages  # noqa: E402
import gpu_train  # noqa: E402
from gpu_check import Refused, check_greedy, make_reference  # noqa: E402


def chat_target() -> Target:
    target = tiny_target("llama")
    return Target(target.model, char_tokenizer())


def run_window(monkeypatch, *options: str) -> int:
    monkeypatch.chdir(REPO)  # main() moves to the repository root; the test's directory comes back after
    return gpu_train.main(["run", *options])


# ---------------------------------------------------------------------------------------------------------
# Refusals: no data is generated and nothing is trained


def test_a_gguf_whose_sha256_differs_is_refused_before_anything_loads(tmp_path, monkeypatch):
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, text in enumerate((b"first half ", b"second half"), 1):
        (parts / f"part_{i:03d}").write_bytes(text)
    (tmp_path / "sha256").write_text("0" * 64 + "\n")
    out = tmp_path / "out"
    rc = run_window(monkeypatch, "--out", str(out), "--work", str(tmp_path / "work"), "--parts-dir", str(parts),
                    "--sha256-file", str(tmp_path / "sha256"), "--no-install", "--device", "cpu")
    assert rc == 3, "a refusal exits 3"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "refused" and "a part is missing, doubled or damaged" in summary["reason"]
    assert "expects 000" in (out / "REFUSED.txt").read_text()
    assert (tmp_path / "work" / "target.gguf").read_bytes() == b"first half second half", "parts joined in order"
    assert not (tmp_path / "work" / "data").exists() and not (out / "draft").exists()


def test_an_output_folder_that_holds_files_is_refused(tmp_path, monkeypatch):
    # A draft left there by another run would come back as if this run had written it.
    (tmp_path / "out" / "draft").mkdir(parents=True)
    (tmp_path / "out" / "draft" / "config.json").write_text("{}")
    assert run_window(monkeypatch, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")) == 2


def test_the_greedy_check_passes_its_own_reference_and_refuses_a_doctored_one():
    target = chat_target()
    reference = make_reference(target, "0" * 64, prompts=("abc", "xyz"), max_new_tokens=12)
    assert len(reference["prompts"][1]["tokens"]) == 12, "the tiny target does not stop early on this prompt"
    assert check_greedy(target, reference) == [], "the target agrees with its own tokens"
    doctored = json.loads(json.dumps(reference))
    tokens = doctored["prompts"][1]["tokens"]
    tokens[5] = 3 if tokens[5] != 3 else 4
    with pytest.raises(Refused, match="prompt 2 .* new token 5: .* beyond float32 rounding"):
        check_greedy(target, doctored)


def test_the_greedy_check_refuses_another_tokenization():
    target = chat_target()
    reference = make_reference(target, "0" * 64, prompts=("abc",), max_new_tokens=4)
    reference["prompts"][0]["prompt_ids"][-2] += 1
    with pytest.raises(Refused, match="tokenizes differently .* another tokenizer or chat template"):
        check_greedy(target, reference)


def test_a_near_tie_is_noted_not_refused(monkeypatch):
    import blockdraft.decode.ties as ties

    target = chat_target()
    reference = make_reference(target, "0" * 64, prompts=("xyz",), max_new_tokens=8)
    reference["prompts"][0]["tokens"][2] = 3 if reference["prompts"][0]["tokens"][2] != 3 else 4
    monkeypatch.setattr(ties, "is_rounding", lambda split, dtype: True)  # as if the margin were within rounding
    notes = check_greedy(target, reference)
    assert len(notes) == 1 and "near-tie at prompt 1" in notes[0] and "new token 2" in notes[0]


def test_the_greedy_check_needs_float32():
    target = chat_target()
    reference = make_reference(target, "0" * 64, prompts=("abc",), max_new_tokens=2)
    with pytest.raises(Refused, match="float32"):
        check_greedy(Target(target.model.bfloat16(), target.tokenizer), reference)


def test_draft_files_of_a_geometry_count_what_comes_back(tmp_path):
    target = chat_target()
    target.tokenizer.mask_token = "<mask>"
    files = gpu_check.draft_files(target, 2, 8, (1, 3), tmp_path / "probe")
    assert files == ["blockdraft_vocab.json", "config.json", "model.safetensors"]
    assert not (tmp_path / "probe").exists(), "the probe leaves nothing behind"
    with pytest.raises(Exception, match="target_layer_ids"):
        gpu_check.draft_files(target, 2, 8, (1, 9), tmp_path / "probe")


# ---------------------------------------------------------------------------------------------------------
# Stages


def test_data_slices_stop_before_the_next_would_pass_the_budget(tmp_path, monkeypatch):
    import blockdraft.cli
    import blockdraft.train.data

    clock, calls, skips, written, available, failing = [0.0], [], [], [0], 40, None

    def fake_data(argv):  # each slice takes 10 s and regenerates its prompts (all of them, once the rest run out)
        calls.append(int(argv[argv.index("--count") + 1]))
        skips.append(argv[argv.index("--skip-held") + 1] if "--skip-held" in argv else None)
        clock[0] += 10
        if calls[-1] == failing:
            raise RuntimeError("CUDA out of memory")
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / "data-00000.safetensors").touch()
        written[0] = min(calls[-1], available)
        return 0

    monkeypatch.setattr(blockdraft.cli, "main", fake_data)
    monkeypatch.setattr(blockdraft.train.data, "read_examples", lambda folder: [None] * written[0])
    monkeypatch.setattr(gpu_stages, "monotonic", lambda: clock[0])
    (tmp_path / "prompts" / "train").mkdir(parents=True)
    (tmp_path / "prompts" / "train" / "set.jsonl").write_text("")
    args = gpu_train.argparse.Namespace(work=tmp_path, prompts_dir=tmp_path / "prompts", data_slice=8,
                                        data_batch_size=8, data_max_new_tokens=16, device="cpu", threads=None,
                                        no_magpie=False, data_extra="", data_in=[tmp_path / "a", tmp_path / "b"],
                                        data_answers=1, data_temperature=0.8)
    data = gpu_stages.generate_data(args, gpu_stages.Log(tmp_path / "log"), budget=35)
    assert calls == [8, 16, 24], "after 30 s a fourth 10-s slice would end past 35 s"
    assert skips == [f"{tmp_path / 'a'},{tmp_path / 'b'}"] * 3, "the carried folders' prompts are not regenerated"
    assert data["examples"] == 24
    calls.clear()
    data = gpu_stages.generate_data(args, gpu_stages.Log(tmp_path / "log"), budget=1000)
    assert calls == [8, 16, 24, 32, 40, 48] and data["examples"] == 40, "stops once a slice adds nothing"
    calls.clear()
    failing = 24
    data = gpu_stages.generate_data(args, gpu_stages.Log(tmp_path / "log"), budget=1000)
    assert calls == [8, 16, 24] and data["examples"] == 16, "a failed slice ends the stage; earlier shards stay"
    assert "--count 24 failed: RuntimeError: CUDA out of memory" in data["error"]
    # Sampled answers are new text for the carried folders' prompts too: nothing is passed over.
    seen = []
    monkeypatch.setattr(blockdraft.cli, "main", lambda argv: (seen.append(argv), fake_data(argv))[1])
    failing, args.data_answers = None, 2
    gpu_stages.generate_data(args, gpu_stages.Log(tmp_path / "log"), budget=15)
    assert "--skip-held" not in seen[0] and seen[0][seen[0].index("--answers"):][:4] == [
        "--answers", "2", "--temperature", "0.8"]


def test_a_stage_past_its_timeout_is_stopped_and_its_last_json_line_kept(tmp_path):
    log = gpu_stages.Log(tmp_path / "run.log")
    script = "import json, time; print(json.dumps({'step': 1}), flush=True); time.sleep(60)"
    ran = log.run([sys.executable, "-c", script], timeout=2)
    assert ran.timed_out and ran.rc != 0 and ran.seconds < 20
    assert ran.record == {"step": 1}
    assert '{"step": 1}' in (tmp_path / "run.log").read_text(), "the stage's output is in the log"


@pytest.mark.parametrize("left", ["partial", "old"])
def test_a_swap_cut_by_a_kill_leaves_one_whole_draft(tmp_path, left):
    folder = tmp_path / "draft"
    for name in ("draft.partial", "draft.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text(name)
    (tmp_path / "draft.partial" / "config.json").write_text("{}") if left == "partial" else None
    (tmp_path / "draft.old" / "config.json").write_text("{}")
    gpu_stages.recover_draft(folder)
    assert (folder / "weights").read_text() == f"draft.{left}", "the complete .partial wins over the .old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"], "leftovers would come back with the draft"


def test_the_plan_names_every_call_with_its_carry_and_a_timeout_that_fits(monkeypatch, capsys):
    monkeypatch.setattr(gpu_prep, "gpu_folders", lambda: [REPO / f".gpu_{i}" for i in (1, 2, 3)])
    monkeypatch.chdir(REPO)
    assert gpu_train.main(["plan", "--train-seconds", "100"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("call ")]
    assert len(lines) == 3
    assert 'command="bash lab/gpu_train.sh part 1", carry=[".gpu_1"], timeout_s=60' in lines[0]
    assert "part 3 && bash lab/gpu_train.sh run --out \\\"$OUT\\\" --train-seconds 100" in lines[2]
    assert '".gpu_3", ".whl"' in lines[2] and "timeout_s=485" in lines[2], "60 + 90 + 100 + 45 + 50 + 110, + 30"


def test_the_plan_keeps_an_option_value_with_spaces_one_argument(monkeypatch, capsys):
    """The printed command is pasted into the device call: --train-extra's value must stay quoted."""
    monkeypatch.setattr(gpu_prep, "gpu_folders", lambda: [REPO / f".gpu_{i}" for i in (1, 2)])
    monkeypatch.chdir(REPO)
    assert gpu_train.main(["plan", "--train-seconds", "100", "--train-extra", "--lr 3e-4 --anchors 96"]) == 0
    last = [line for line in capsys.readouterr().out.splitlines() if line.startswith("call ")][-1]
    assert "--train-extra '--lr 3e-4 --anchors 96'" in last


# ---------------------------------------------------------------------------------------------------------
# Dry run on CPU, on the embedded target: the device's calls, with budgets of seconds


def split_embedded_gguf(folder: Path, parts: int = 3) -> Path:
    """The embedded GGUF in `parts` files, as `gpu_train.sh split` cuts it, and the sha256 file it writes."""
    from blockdraft.io.targets import embedded_gguf_path, sha256_file

    data = embedded_gguf_path().read_bytes()
    folder.mkdir(parents=True)
    size = -(-len(data) // parts)
    for i in range(parts):
        (folder / f"part_{i + 1:03d}").write_bytes(data[i * size: (i + 1) * size])
    (folder / "sha256").write_text(sha256_file(embedded_gguf_path()) + "\n")
    return folder


def prompt_extracts(folder: Path) -> Path:
    result = subprocess.run(["bash", "lab/gpu_train.sh", "prep", "--prompts-dir", str(folder), "--per-set", "8"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and "not installed" in result.stderr:
        pytest.skip("the prompt-set packages are not installed (README)")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def dry_run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    parts = split_embedded_gguf(tmp_path / "parts")
    prompts = prompt_extracts(tmp_path / "prompts")
    command = ["bash", "lab/gpu_train.sh", "run", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
               "--parts-dir", str(parts), "--sha256-file", str(parts / "sha256"), "--prompts-dir", str(prompts),
               "--no-install", "--device", "cpu", "--threads", "1",
               "--data-seconds", "4", "--data-batch-size", "4", "--data-slice", "4", "--data-max-new-tokens", "24",
               "--layers", "1", "--target-layer-ids", "14", "--batch-size", "2", "--micro-batch-size", "2",
               "--epochs", "100", "--train-seconds", "6", "--draft-every", "2", "--train-grace", "120",
               "--train-extra", "--anchors 16 --max-seq-len 256 --val-fraction 0.25",
               "--eval-limit", "1", "--eval-max-new-tokens", "16", "--eval-batch-size", "1", "--eval-seconds", "120",
               "--bench-runs", "1:1,2:2", "--bench-max-new-tokens", "16", "--bench-seconds", "240", *options]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
@needs_smollm2
def test_dry_run_on_cpu_returns_a_draft_that_loads_with_eval_and_bench(tmp_path):
    from blockdraft.api import load_draft
    from blockdraft.io.targets import load_target

    # A second geometry beside the first; a margin it always meets returns its draft instead.
    done = dry_run(tmp_path, "--second-layers", "1", "--second-target-layer-ids", "1,14", "--second-margin", "100")
    assert done.returncode == 0, done.stdout[-4000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    second = summary["second"]
    assert second["rc"] == 0 and second["steps"] > 0 and second["geometry"] == "1 layers, K 16, taps [1, 14]"
    evals = summary["eval"]
    assert evals["returned"] == "second" and evals["second"]["mean_tau"] >= 1 and evals["first"]["mean_tau"] >= 1
    returned = summary["data"]["returned"]
    assert returned["shards"] == returned["of_shards"] > 0 and (out / "data.tar").is_file()
    assert summary["status"] == "done" and summary["draft"] == {**summary["draft"], "returned": True, "final": True}
    assert summary["check"]["greedy"] == "agrees" and summary["data"]["examples"] > 0
    train = summary["train"]
    assert train["rc"] == 0 and 0 < train["steps"] < 100 * 2, "the time budget, not the epochs, ends training"
    assert evals["first"]["rc"] == 0 and all(r["mean_tau"] >= 1 for r in evals["first"]["results"].values())
    assert [b["batch_size"] for b in summary["bench"]] == [1, 2] and all(b["rc"] == 0 for b in summary["bench"])
    methods = summary["bench"][1]["result"]["methods"]
    assert set(methods) == {"ours-baseline", "hf-generate", "blockdraft-lookup"}
    assert all(m["mismatches"] == 0 for m in methods.values()), "every method gives the target's own tokens"
    files = summary["returned_files"]
    assert summary["fits_return_limit"] and len(files) <= 8
    assert {"run.log", "summary.json"} <= {f["path"] for f in files}
    assert "check: greedy tokens of 4 prompts agree" in (out / "run.log").read_text()
    draft = load_draft(out / "draft", load_target(dtype="float32"))
    assert draft.config.num_hidden_layers == 1 and draft.config.target_layer_ids == (1, 14)


@pytest.mark.slow
@needs_smollm2
def test_dry_run_with_a_doctored_reference_refuses_to_train(tmp_path):
    reference = json.loads((REPO / "lab" / "gpu_reference.json").read_text())
    tokens = reference["prompts"][0]["tokens"]
    tokens[10] = tokens[10] + 1
    (tmp_path / "reference.json").write_text(json.dumps(reference))
    done = dry_run(tmp_path, "--reference", str(tmp_path / "reference.json"))
    assert done.returncode == 3, done.stdout[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "refused" and "new token 10" in summary["reason"]
    assert "beyond float32 rounding" in (tmp_path / "out" / "REFUSED.txt").read_text()
    assert not (tmp_path / "work" / "data").exists() and not (tmp_path / "out" / "draft").exists()


def test_split_cuts_the_gguf_into_parts_that_join_back_with_its_sha256(tmp_path, monkeypatch):
    import hashlib
    from types import SimpleNamespace

    import blockdraft.io.targets as targets

    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(bytes(range(256)) * 1000 + b"tail")  # 256,004 bytes: parts of unequal size
    monkeypatch.setattr(targets, "embedded_gguf_path", lambda: gguf)
    monkeypatch.setattr(gpu_prep, "REPO", tmp_path)
    monkeypatch.setattr(gpu_prep, "_travelling_bytes", lambda: 0)
    fetched = []
    monkeypatch.setattr(gpu_prep.subprocess, "run", lambda command, check: fetched.append(command))
    (tmp_path / ".gpu_9").mkdir()  # a stale part of an earlier split must go
    assert gpu_prep.split_target(SimpleNamespace(parts=3)) == 0
    folders = gpu_prep.gpu_folders()
    assert [f.name for f in folders] == [".gpu_1", ".gpu_2", ".gpu_3"]
    joined = b"".join((folder / f"part_{i:03d}").read_bytes() for i, folder in enumerate(folders, 1))
    assert joined == gguf.read_bytes()
    assert (folders[-1] / "sha256").read_text().strip() == hashlib.sha256(joined).hexdigest()
    assert any("gguf==0.19.0" in part for part in fetched[0]), "the gguf wheel is fetched for the device"
    assert "/.gpu_1/" in (tmp_path / ".git" / "info" / "exclude").read_text(), "parts stay out of git"


def test_split_takes_the_parts_asked_for_while_they_fit_beside_the_tracked_files(tmp_path, monkeypatch):
    # 48 MiB of tracked files leave too little of a call's 64 for the data room, but parts of a plan without a
    # data stage still fit; parts that would not fit are refused before any old part is removed.
    from types import SimpleNamespace

    import blockdraft.io.targets as targets

    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"x" * 1000)
    monkeypatch.setattr(targets, "embedded_gguf_path", lambda: gguf)
    monkeypatch.setattr(gpu_prep, "REPO", tmp_path)
    monkeypatch.setattr(gpu_prep, "CALL_LIMIT", 600)
    monkeypatch.setattr(gpu_prep, "DATA_ROOM", 200)
    monkeypatch.setattr(gpu_prep, "_travelling_bytes", lambda: 450)  # room 600 - 450 - 200 < 0
    monkeypatch.setattr(gpu_prep.subprocess, "run", lambda command, check: None)
    (tmp_path / ".gpu_1").mkdir()
    assert gpu_prep.split_target(SimpleNamespace(parts=None)) == 2, "no room for parts of its own choosing"
    assert gpu_prep.split_target(SimpleNamespace(parts=6)) == 2, "parts of 167 bytes beside 450 pass 600"
    assert (tmp_path / ".gpu_1").is_dir(), "a refused split leaves the old parts"
    assert gpu_prep.split_target(SimpleNamespace(parts=7)) == 0, "parts of 143 bytes beside 450 fit in 600"
    assert len(gpu_prep.gpu_folders()) == 7


@pytest.mark.slow
@needs_smollm2
def test_dry_run_of_the_next_window_continues_the_shipped_draft_on_the_carried_data(tmp_path):
    # docs/training.md §8.2, at budgets of seconds: no data stage, the repository's data folder, one draft.
    from blockdraft.api import load_draft
    from blockdraft.io.targets import load_target

    done = dry_run(tmp_path, "--data-seconds", "0", "--data-in", "datasets/smollm2-135m-instruct/gpu-a",
                   "--layers", "2", "--block-size", "8", "--target-layer-ids", "1,27", "--second-layers", "0",
                   "--train-extra", "--init-from blockdraft/drafts/smollm2-135m-instruct --standardize-features "
                   "--loss kd --kd-weight 0.5 --proposal-vocab --anchors 96 --lr 3e-4 --val-fraction 0.002 "
                   "--max-seq-len 256")
    assert done.returncode == 0, done.stdout[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "done" and "second" not in summary and summary["train"]["steps"] > 0
    assert summary["data"] == {"carried": ["datasets/smollm2-135m-instruct/gpu-a"]}, "no data stage ran"
    draft = load_draft(tmp_path / "out" / "draft", load_target(dtype="float32"))
    assert (draft.config.num_hidden_layers, draft.config.block_size, draft.config.target_layer_ids) == (2, 8, (1, 27))
