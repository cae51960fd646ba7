"""`blockdraft bench`: summary math, the report's files and last line, and the command's checks (the runner's
interleaving, rounds and truncation: test_bench_runner.py).

No timing is asserted: only how rows are scheduled, counted and summarized.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from blockdraft.bench import BenchSettings
from blockdraft.bench.methods import METHODS, choose_methods
from blockdraft.bench.report import _acceptance_table
from blockdraft.bench.summary import first_difference, paired_ratios, spread, summarize_method
from blockdraft.cli import main
from blockdraft.errors import InputError
from blockdraft.commands import bench as command
from blockdraft.commands.bench import report
from blockdraft.prompts import Prompt, benchmark_set_names

from tiny_models import tiny_draft, tiny_target

STOP = 2  # the tiny targets' eos id


def test_spread_gives_median_range_and_quartiles():
    s = spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"], s["n"]) == (3.0, 1.0, 5.0, 2.0, 4.0, 5)
    assert spread([7.0])["q1"] == spread([7.0])["q3"] == 7.0
    assert spread([]) is None


def test_speedup_is_median_of_paired_ratios_not_ratio_of_medians():
    method = {0: 10.0, 1: 30.0, 2: 40.0}
    reference = {0: 5.0, 1: 10.0, 2: 40.0}
    assert paired_ratios(method, reference) == [2.0, 3.0, 1.0]
    rows = [{"batch": b, "tokens_per_second": r, "new_tokens": [4], "seconds": 1.0} for b, r in method.items()]
    summary = summarize_method(rows, {"hf-generate": reference})
    assert summary["speedup_vs_hf_generate"]["median"] == 2.0, "speedups pair each batch with its own reference run"
    assert summary["tokens_per_second"]["median"] == 30.0 and summary["new_tokens"] == 12


def test_first_difference_finds_divergence_and_length_change():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    """One small real run (tiny fp32 target, 3 prompts in batches of 2), shared by the report tests."""
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    out = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with redirect_stdout(stdout):
        settings = BenchSettings(block_size=4, max_new_tokens=4, batch_size=2, warmup=False)  # warm-up tested above
        prompts = [[1, 5, 9, 13, 17], [3, 4], [7, 8, 9]]
        rc = report(target, draft, prompts, settings, out, context={"prompt_set": "tiny"})
    return rc, stdout.getvalue(), out


def test_report_ends_stdout_with_one_json_line(bench_out):
    rc, stdout, out = bench_out
    assert rc == 0
    line = json.loads(stdout.rstrip("\n").splitlines()[-1])
    assert set(line["methods"]) == {"ours-baseline", "hf-generate", "hf-prompt-lookup", "blockdraft", "blockdraft-tree",
                                   "blockdraft-adaptive", "blockdraft-lookup", "blockdraft-lookup-only"}
    assert (line["K"], line["N"], line["batch_size"], line["dtype"]) == (4, 4, 2, "float32")
    assert line["methods"]["blockdraft"]["mean_tau"] >= 1.0


def test_report_writes_full_json_and_png(bench_out):
    _, _, out = bench_out
    document = json.loads((out / "bench.json").read_text())
    assert len(document["rows"]) == 2 * 8, "one row per (batch, method)"
    assert {"device", "torch", "transformers"} <= set(document["hardware"]) and document["date"]
    assert len(document["acceptance"]["blockdraft"]["tau_histogram"]) == 4 + 1, "K=4: tau 1..4 and >4"
    # fp32 tiny targets have no near-ties: every greedy method must reproduce our baseline exactly.
    assert document["mismatches"] == [], f"greedy methods disagree with ours-baseline: {document['mismatches']}"
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_method_reports_the_same_bins_at_the_k_asked_for(bench_out):
    """Trees (up to 2K nodes) and lookup blocks (up to 2K wide) must not widen a method's histogram: every method
    of a K=4 run has the bins 1..4 and >4, and every acceptance table's header says K=4."""
    _, _, out = bench_out
    acceptance = json.loads((out / "bench.json").read_text())["acceptance"]
    assert set(acceptance) == {"blockdraft", "blockdraft-tree", "blockdraft-adaptive", "blockdraft-lookup",
                               "blockdraft-lookup-only"}
    for name, acc in acceptance.items():
        assert acc["block_size"] == 4 and acc["tau_bins"] == ["1", "2", "3", "4", ">4"], (name, acc)
        assert len(acc["tau_histogram"]) == 5 and sum(acc["tau_histogram"]) == acc["steps"], (name, acc)
        table = _acceptance_table(name, acc)
        assert table.title.endswith("K=4"), table.title
        assert [c.header for c in table.columns] == ["", "1", "2", "3", "4", ">4"], name


def test_differing_prompts_are_counted_per_method_out_of_the_prompts():
    """Three methods differing on 1, 2 and 2 of 2 prompts: each says how many of the 2 prompts it changed; a sum
    over methods ("5 prompt(s) differ" with 2 prompts) counts no prompt set at all."""
    from rich.console import Console

    from blockdraft.bench.report import build_document, mismatch_lines, render
    from blockdraft.bench.runner import BenchRun

    tokens = {"ours-baseline": [[5, 6, 7], [8, 9]], "hf-generate": [[5, 6, 7], [8, 3]],
              "blockdraft": [[5, 0, 7], [8]], "blockdraft-lookup": [[1, 6, 7], [8, 9, 4]]}
    rows = [{"batch": b, "method": m, "new_tokens": [len(tokens[m][b])], "seconds": 1.0, "tokens_per_second": 3.0}
            for m in tokens for b in (0, 1)]
    run = BenchRun(list(tokens), ["set:a", "set:b"], rows, tokens)
    hardware = {"device": "cpu", "torch": "x", "transformers": "y"}
    document = build_document(run, BenchSettings(block_size=4, max_new_tokens=3), hardware=hardware, context={},
                              notes=[])
    assert mismatch_lines(document)[:3] == [
        "hf-generate: 1 of 2 prompts differs from ours-baseline (set:b from new token 1)",
        "blockdraft: 2 of 2 prompts differ from ours-baseline (set:a from new token 1, set:b from new token 1)",
        "blockdraft-lookup: 2 of 2 prompts differ from ours-baseline (set:a from new token 0, set:b from new token 2)",
    ], mismatch_lines(document)
    console = Console(record=True, width=200)
    render(document, console)
    text = console.export_text()
    assert "blockdraft: 2 of 2 prompts differ" in text and "5 prompt" not in text, text


def test_no_label_of_the_plot_collides_with_another():
    """Every method's name on the speedup panel, every tick, title and the legend: no two may overlap, none may
    leave the figure, and the legend may cover no panel (it hid the tallest tau bars)."""
    from blockdraft.bench.plot import draw
    from blockdraft.metrics import tau_bins

    histogram = [30, 22, 20, 18, 15, 12, 10, 27, 19]
    acc = {"block_size": 8, "mean_tau": 4.9, "steps": sum(histogram), "tau_bins": tau_bins(8),
           "tau_histogram": histogram, "per_position_acceptance": [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6]}
    document = {"settings": {"prompt_set": "mt-bench", "prompts": 80, "block_size": 8, "max_new_tokens": 256,
                             "batch_size": 1, "dtype": "bfloat16"},
                "hardware": {"device": "NVIDIA H100 80GB HBM3"}, "date": "2025-06-01T12:00:00+00:00",
                "summary": {name: {"speedup_vs_hf_generate": {"median": 1 + i / 3, "min": 0.9 + i / 3,
                                                             "max": 1.1 + i / 3}} for i, name in enumerate(METHODS)},
                "acceptance": {name: acc for name in METHODS[3:]}}
    figure = draw(document)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()

    def shown(axis):  # the tick labels drawn: matplotlib keeps some past the view limits, never drawn
        low, high = sorted(axis.get_view_interval())
        return [t for at, t in zip(axis.get_majorticklocs(), axis.get_majorticklabels()) if low <= at <= high]

    texts = [t for axes in figure.axes for t in (*shown(axes.xaxis), *shown(axes.yaxis), axes.title,
                                                  axes.xaxis.label, axes.yaxis.label) if t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    assert [t for t, _ in boxes].count("blockdraft-lookup") == 1, "every method is named on the speedup panel"
    page = figure.bbox
    for i, (a, box) in enumerate(boxes):
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, f"{a!r} is cut"
        for b, other in boxes[i + 1:]:
            assert not box.overlaps(other), f"labels {a!r} and {b!r} collide"
    legend = figure.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(axes.get_window_extent(renderer)) for axes in figure.axes), "legend hides a panel"


def test_methods_subset_keeps_the_references_and_base_order(tmp_path):
    assert choose_methods(None) == METHODS
    assert choose_methods("blockdraft-lookup, hf-prompt-lookup") == (
        "ours-baseline", "hf-generate", "hf-prompt-lookup", "blockdraft-lookup"), "references kept, base order"
    target = tiny_target("llama")
    stdout = io.StringIO()
    with redirect_stdout(stdout):
        settings = BenchSettings(block_size=4, max_new_tokens=4, warmup=False, methods=choose_methods("blockdraft"))
        assert report(target, tiny_draft(target, block_size=4), [[1, 5, 9], [3, 4]], settings, tmp_path) == 0
    line = json.loads(stdout.getvalue().rstrip("\n").splitlines()[-1])
    assert list(line["methods"]) == ["ours-baseline", "hf-generate", "blockdraft"], "only the methods asked for run"
    assert len(json.loads((tmp_path / "bench.json").read_text())["rows"]) == 2 * 3


def test_a_sampled_bench_samples_every_method_and_compares_no_texts(tmp_path):
    # Every method samples (ours from its own seeds per call, HF from the global generator seeded per call); the
    # texts are separate draws, so nothing is compared, and the settings say how they were drawn.
    from blockdraft.sampling import SamplingParams

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    sampling = SamplingParams(temperature=1.0, top_k=3, seed=5)
    settings = BenchSettings(block_size=4, max_new_tokens=6, warmup=False, sampling=sampling,
                             methods=choose_methods("blockdraft,blockdraft-lookup"))
    stdout = io.StringIO()
    with redirect_stdout(stdout):
        assert report(target, draft, [[1, 5, 9], [3, 4], [7, 8, 9]], settings, tmp_path) == 0
    document = json.loads((tmp_path / "bench.json").read_text())
    assert document["settings"]["decoding"] == "sampled (rejection): temperature 1, top_k 3, top_p 1, min_p 0, seed 5"
    assert document["mismatches"] == [] and all(
        m["mismatches_vs_ours_baseline"] is None for m in document["summary"].values())
    assert "sampled (rejection): temperature 1" in stdout.getvalue()
    again = tmp_path / "again"
    with redirect_stdout(io.StringIO()):
        report(target, draft, [[1, 5, 9], [3, 4], [7, 8, 9]], settings, again)
    rows = [json.loads((folder / "bench.json").read_text())["rows"] for folder in (tmp_path, again)]
    assert [r["new_tokens"] for r in rows[0]] == [r["new_tokens"] for r in rows[1]]
    greedy = BenchSettings(block_size=4, max_new_tokens=6, warmup=False, methods=choose_methods("blockdraft"))
    with redirect_stdout(io.StringIO()):
        report(target, draft, [[1, 5, 9], [3, 4], [7, 8, 9]], greedy, tmp_path / "greedy")
    base = json.loads((tmp_path / "greedy" / "bench.json").read_text())
    assert base["settings"]["decoding"] == "greedy"


def test_a_coupled_bench_compares_our_samples_with_ours_baseline(tmp_path):
    """Ours sampling coupled draw ours-baseline's sample from the same seeds: their texts are compared (float32:
    no mismatch), HF's are not, and a speculative method that picked other tokens would be reported."""
    from blockdraft.sampling import SamplingParams

    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    settings = BenchSettings(block_size=4, max_new_tokens=10, warmup=False, sampling=sampling, coupled=True,
                             methods=choose_methods("blockdraft,blockdraft-tree,blockdraft-lookup"))
    with redirect_stdout(io.StringIO()):
        assert report(target, draft, [[1, 5, 9], [3, 4], [7, 8, 9]], settings, tmp_path) == 0
    document = json.loads((tmp_path / "bench.json").read_text())
    assert document["settings"]["decoding"].startswith("sampled (coupled)")
    counts = {name: m["mismatches_vs_ours_baseline"] for name, m in document["summary"].items()}
    assert counts == {"ours-baseline": 0, "hf-generate": None, "blockdraft": 0, "blockdraft-tree": 0,
                      "blockdraft-lookup": 0}, counts
    assert document["mismatches"] == []


def test_unknown_method_is_refused_with_the_known_ones(capsys):
    with pytest.raises(InputError, match="blockdraft-lookup"):
        choose_methods("blockdraft-lokup")
    with pytest.raises(InputError, match="no method named"):
        choose_methods(" , ")
    assert main(["bench", "--prompts", "no-such-set", "--methods", "hf-generat"]) == 2
    err = capsys.readouterr().err
    assert "'hf-generat'" in err and all(name in err for name in METHODS), "the method is checked first"


def test_unknown_prompt_set_lists_known_sets(capsys):
    assert main(["bench", "--prompts", "no-such-set"]) == 2
    err = capsys.readouterr().err
    assert "no-such-set" in err and all(name in err for name in benchmark_set_names())


def test_bad_prompt_file_line_is_named(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": \n')
    assert main(["bench", "--prompts", str(path)]) == 2
    assert "line 2" in capsys.readouterr().err



def test_training_set_is_refused_for_benchmarking(monkeypatch, capsys):
    # Stands in for a healthbench extract: the loaded prompts carry the set they came from.
    monkeypatch.setattr(command, "load_prompts", lambda *a: [Prompt("1", ({"role": "user", "content": "hi"},),
                                                                   "healthbench")])
    assert main(["bench", "--prompts", "extract.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "training set" in err and "mt-bench" in err


def test_llama_cpp_dflash_is_checked_against_llama_cpp_alone():
    """llama.cpp's DFlash must give llama.cpp's own plain text (not ours: another engine rounds otherwise); the
    check names each differing prompt, its index and both tokens, and the JSON line counts the equal ones."""
    from rich.console import Console

    from blockdraft.bench.report import build_document, engine_lines, render, summary_line
    from blockdraft.bench.runner import BenchRun

    tokens = {"ours-baseline": [[5, 6, 7], [8, 9]], "hf-generate": [[5, 6, 7], [8, 9]],
              "llama-cpp": [[5, 6, 1], [8, 9]], "llama-cpp-dflash-n2": [[5, 6, 1], [8, 9]],
              "llama-cpp-dflash-n8": [[5, 6, 1], [8, 4]]}
    rows = [{"batch": b, "method": m, "new_tokens": [len(tokens[m][b])], "seconds": 1.0, "tokens_per_second": 3.0}
            for m in tokens for b in (0, 1)]
    run = BenchRun(list(tokens), ["set:a", "set:b"], rows, tokens)
    hardware = {"device": "cpu", "torch": "x", "transformers": "y", "weights": "q4 (int4 layers)"}
    document = build_document(run, BenchSettings(block_size=4, max_new_tokens=3), hardware=hardware, context={},
                              notes=[])
    assert engine_lines(document) == [
        "llama-cpp-dflash-n2: 2 of 2 prompts equal llama-cpp's text",
        "llama-cpp-dflash-n8: 1 of 2 prompts equal llama-cpp's text; set:b from new token 1 (llama-cpp 9, "
        "llama-cpp-dflash-n8 4)",
    ]
    line = json.loads(summary_line(document))
    assert line["methods"]["llama-cpp-dflash-n8"]["equal_llama_cpp_alone"] == 1
    assert "equal_llama_cpp_alone" not in line["methods"]["llama-cpp"]
    console = Console(record=True, width=200)
    render(document, console)
    assert "weights q4 (int4 layers)" in console.export_text(), "the header must say which weights ran"


def test_llama_cpp_dflash_prefers_its_own_server_as_reference():
    """Where the plain server ran, it is the reference: llama-cpp-python rounds some near-ties otherwise."""
    from blockdraft.bench.report import _engine_checks
    from blockdraft.bench.runner import BenchRun

    tokens = {"ours-baseline": [[5, 6]], "llama-cpp": [[5, 1]], "llama-cpp-server": [[5, 6]],
              "llama-cpp-dflash": [[5, 6]]}
    [check] = _engine_checks(BenchRun(list(tokens), ["set:a"], [], tokens))
    assert check["reference"] == "llama-cpp-server" and check["first_difference"] is None
