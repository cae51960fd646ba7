"""`blockdraft bench serve`: the serving statistics on hand-made timings, the load generator against real servers on
loopback ports (tiny models), errors counted rather than raised, and started servers never left behind.

No speed is asserted: only what is counted, how it is summarized, and what is written.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from blockdraft.bench import serve_servers
from blockdraft.bench.serve_load import Point, client_for, run_point
from blockdraft.bench.serve_plot import save_plot
from blockdraft.bench.serve_report import build_document, summary_line
from blockdraft.bench.serve_servers import DEFAULT, TARGET_ALONE, Endpoint, free_port, ready, started_servers
from blockdraft.bench.serve_stats import RequestTiming, over_rounds, percentile, summarize_point
from blockdraft.bench.serve_sweep import SweepSettings, sweep
from blockdraft.cli import main
from blockdraft.server import create_app

from server_client import MODEL, loopback

MESSAGES = [[{"role": "user", "content": text}] for text in ("Once upon", "Hello there", "abc")]
HARDWARE = {"device": "test CPU", "torch": "x", "transformers": "y"}
CLIENT = ["--device", "cpu", "--threads", "1"]  # the bench sets torch's threads: keep the tests' one thread


# ------------------------------------------------------------------------------------------------------------
# Statistics on hand-made timings


def test_percentile_interpolates_linearly_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5, "rank 1.5 lies halfway between the 2nd and 3rd values"
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4, "order must not matter"
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    values = [random.Random(0).random() for _ in range(37)]
    for q in (50, 90, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q))), f"p{q} departs from numpy"
    with pytest.raises(ValueError, match="q must lie in"):
        percentile([1.0], 101)


def test_per_user_rate_is_pace_after_the_first_token_and_total_rate_is_everyones_tokens_over_wall_time():
    # a: 5 tokens in 3 chunks (one speculative step carried 3), first at 1 s, last at 3 s: TPOT 2/4 = 0.5 s.
    a = RequestTiming(start=0.0, end=3.1, chunk_times=[1.0, 2.0, 3.0], completion_tokens=5)
    # b: queued longer (TTFT 1.5 s), 3 tokens, first at 2 s, last at 6 s: TPOT 4/2 = 2 s.
    b = RequestTiming(start=0.5, end=6.0, chunk_times=[2.0, 4.0, 6.0], completion_tokens=3)
    # c: one chunk holding both its tokens: no pace seen, so no TPOT; its tokens still count in the total.
    c = RequestTiming(start=1.0, end=2.5, chunk_times=[2.4], completion_tokens=2)
    refused = RequestTiming(start=0.2, end=0.3, error="429", message="HTTP 429: busy")
    summary = summarize_point([a, b, c, refused], wall_seconds=6.0, unfinished=1)
    assert summary["per_user_tok_s"] == pytest.approx(1.25), "median of 1/TPOT over a (2 tok/s) and b (0.5 tok/s)"
    assert summary["total_tok_s"] == pytest.approx(10 / 6, abs=1e-3), "all completed tokens over the wall time"
    assert summary["ttft_ms"]["p50"] == pytest.approx(1400.0), "TTFTs 1.0, 1.5 and 1.4 s: median 1.4 s"
    assert summary["itl_ms"]["p50"] == pytest.approx(1500.0), "ITLs pool chunk gaps 1, 1, 2, 2 s over requests"
    assert summary["tpot_ms"]["p50"] == pytest.approx(1250.0)
    assert summary["tokens_per_chunk"] == pytest.approx(10 / 7, abs=1e-3)
    assert (summary["requests"], summary["completed"], summary["errors"], summary["unfinished"]) == (5, 3, 1, 1)
    assert summary["error_kinds"] == {"429": 1} and summary["first_errors"] == ["HTTP 429: busy"]
    assert summary["e2e_ms"]["p99"] == pytest.approx(5500.0, rel=0.01), "an error's time enters no latency"


def test_rounds_are_summarized_by_median_and_range_and_each_ratio_is_within_its_round():
    settings = SweepSettings((Point(2, concurrency=1),), max_tokens=4, time_limit=10, repeats=3)

    def record(repeat, mode, total):
        return {"point": "c=1", "repeat": repeat, "mode": mode, "total_tok_s": total, "per_user_tok_s": total / 2,
                "ttft_ms": {"p50": 10.0 * repeat}, "mean_tau": 1.0, "completed": 2, "requests": 2, "errors": 0,
                "cut_short": False}

    # Round 2 ran on a slower machine for both modes: within a round the default is 1.10x, 1.05x, 1.20x.
    records = [record(1, TARGET_ALONE, 100.0), record(1, DEFAULT, 110.0), record(2, DEFAULT, 63.0),
               record(2, TARGET_ALONE, 60.0), record(3, TARGET_ALONE, 100.0), record(3, DEFAULT, 120.0)]
    document = build_document(records, settings, hardware=HARDWARE, context={"prompt_set": "test", "prompts": 1})
    assert [r["vs_target_alone"] for r in document["records"] if r["mode"] == DEFAULT] == [1.1, 1.05, 1.2], (
        "a round's ratio is against the target alone of the same round, not another round's")
    default = next(p for p in document["points"] if p["mode"] == DEFAULT)
    assert default["vs_target_alone"] == 1.1 and default["vs_target_alone_range"] == [1.05, 1.2]
    assert default["total_tok_s"] == 110.0 and default["total_tok_s_range"] == [63.0, 120.0]
    assert default["rounds"] == 3 and default["completed"] == 6 and default["ttft_p50_ms"] == 20.0
    line = json.loads(summary_line(document))
    assert line["points"]["c=1"][DEFAULT]["vs_target_alone"] == 1.1
    assert line["points"]["c=1"][DEFAULT]["vs_target_alone_range"] == [1.05, 1.2]
    assert over_rounds([]) == []


def test_a_point_has_one_load_shape():
    assert Point(8, concurrency=2).label == "c=2" and Point(8, rate=0.5).label == "0.5/s"
    for bad in (dict(requests=4), dict(requests=4, concurrency=1, rate=1.0), dict(requests=0, concurrency=1),
                dict(requests=4, rate=0.0)):
        with pytest.raises(ValueError):
            Point(**bad)


# ------------------------------------------------------------------------------------------------------------
# The load generator against real servers on loopback ports


@pytest.fixture(scope="module")
def servers(model):
    """The target alone and the speculative default mode, served by uvicorn on loopback ports: their URLs."""
    target, draft = model
    with loopback(create_app(target, None, model_id=MODEL)) as alone, \
            loopback(create_app(target, draft, model_id=MODEL)) as default:
        yield {TARGET_ALONE: str(alone.base_url), DEFAULT: str(default.base_url)}


def test_sweep_completes_every_request_on_both_modes_and_writes_document_and_plot(servers, tmp_path):
    settings = SweepSettings((Point(2, concurrency=1), Point(3, concurrency=2)), max_tokens=12, time_limit=60)
    endpoints = [Endpoint(label, url) for label, url in servers.items()]
    seen = []
    records = sweep(endpoints, MESSAGES, settings, on_progress=lambda done, total, text: seen.append((done, text)))
    assert [(r["point"], r["mode"]) for r in records] == [("c=1", TARGET_ALONE), ("c=1", DEFAULT),
                                                          ("c=2", DEFAULT), ("c=2", TARGET_ALONE)], (
        "every point runs every mode, the order rotated by one per point")
    for r in records:
        assert r["completed"] == r["requests"] and r["errors"] == 0 and not r["cut_short"], r
        assert r["completion_tokens"] > 0 and r["total_tok_s"] > 0 and r["ttft_ms"]["p50"] > 0
    tau = {r["mode"]: r["mean_tau"] for r in records}
    assert tau[TARGET_ALONE] == 1.0, "the target alone commits one token per step"
    assert tau[DEFAULT] >= 1, "mean tau counts the bonus token: at least 1"
    assert seen[-1][0] == 2 * (2 + 3), "the progress bar reaches every request of every mode"

    document = build_document(records, settings, hardware=HARDWARE, context={"prompt_set": "test", "prompts": 3})
    for r in document["records"]:
        own = r["total_tok_s"] / next(x["total_tok_s"] for x in records
                                      if x["point"] == r["point"] and x["mode"] == TARGET_ALONE)
        assert r["vs_target_alone"] == pytest.approx(own, abs=1e-3), "the ratio is total tok/s at the same point"
    assert document["settings"]["points"] == ["c=1", "c=2"] and document["settings"]["max_tokens"] == 12
    line = json.loads(summary_line(document, tmp_path))
    assert set(line["points"]["c=2"]) == {TARGET_ALONE, DEFAULT} and line["points"]["c=1"][DEFAULT]["errors"] == 0
    png = save_plot(document, tmp_path)
    assert png.read_bytes().startswith(b"\x89PNG"), "the Pareto plot must be a PNG"


def test_rounds_interleave_and_rotate_the_modes(servers, tmp_path):
    settings = SweepSettings((Point(2, concurrency=1),), max_tokens=6, time_limit=60, repeats=2)
    records = sweep([Endpoint(label, url) for label, url in servers.items()], MESSAGES, settings)
    assert [(r["repeat"], r["mode"]) for r in records] == [(1, TARGET_ALONE), (1, DEFAULT), (2, DEFAULT),
                                                           (2, TARGET_ALONE)], "each round runs every mode, rotated"
    document = build_document(records, settings, hardware=HARDWARE, context={"prompt_set": "test", "prompts": 3})
    assert [p["rounds"] for p in document["points"]] == [2, 2]
    assert save_plot(document, tmp_path).read_bytes().startswith(b"\x89PNG"), "medians with their range bars"


def test_the_command_loads_one_url_and_ends_with_a_json_line(servers, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nHello\n")
    out = tmp_path / "out"
    code = main(["bench", "serve", "--url", servers[DEFAULT], "--concurrency", "1,2", "--requests-per-point", "2",
                 "--prompts", str(prompts), "--max-tokens", "8", "--out", str(out), *CLIENT])
    stdout = capsys.readouterr().out
    assert code == 0
    line = json.loads(stdout.strip().splitlines()[-1])
    assert line["bench"] == "serve" and set(line["points"]) == {"c=1", "c=2"}
    label = servers[DEFAULT].removeprefix("http://")
    assert line["points"]["c=2"][label]["completed"] == 2 and line["points"]["c=2"][label]["vs_target_alone"] is None
    document = json.loads((out / "bench-serve.json").read_text())
    assert document["settings"]["prompt_set"] == str(prompts) and document["hardware"]["device"]
    assert {"ttft_ms", "itl_ms", "tpot_ms", "per_user_tok_s", "total_tok_s", "errors"} <= set(document["records"][0])
    assert (out / "bench-serve.png").is_file()
    assert "TTFT ms" in stdout, "the table is printed before the JSON line"


def test_an_open_loop_point_cut_by_the_time_limit_reports_unfinished_requests(servers):
    async def go():
        async with client_for(servers[DEFAULT], None, 5) as client:
            return await run_point(client, MODEL, MESSAGES, Point(40, rate=1000.0), max_tokens=400, time_limit=0.05)

    run = asyncio.run(go())
    assert run.cut_short and run.unfinished > 0, "40 requests of 400 tokens cannot end within 0.05 s"
    assert len(run.timings) + run.unfinished == 40


# ------------------------------------------------------------------------------------------------------------
# Errors: counted, never raised


def refusing_app() -> FastAPI:
    """A server whose chat requests alternate between 429 and a stream that fails after its first chunk."""
    app, calls = FastAPI(), []

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": MODEL}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat():
        calls.append(1)
        if len(calls) % 2:
            return JSONResponse({"error": {"message": "at capacity"}}, status_code=429, headers={"retry-after": "2"})

        async def events():
            yield 'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            yield 'data: {"error":{"message":"decoding failed"}}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_refused_and_failed_requests_count_as_errors_and_the_bench_finishes(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\n")
    with loopback(refusing_app()) as client:
        code = main(["bench", "serve", "--url", str(client.base_url), "--concurrency", "2", "--requests-per-point",
                     "4", "--prompts", str(prompts), "--max-tokens", "4", "--out", str(tmp_path), *CLIENT])
    assert code == 0, "errors are results, not a crash"
    document = json.loads((tmp_path / "bench-serve.json").read_text())
    (record,) = document["records"]
    assert (record["completed"], record["errors"]) == (0, 4)
    assert record["error_kinds"] == {"429": 2, "stream": 2}, "past the warm-up's 429, 429s and failed streams alternate"
    assert record["per_user_tok_s"] is None and record["total_tok_s"] == 0
    assert (tmp_path / "bench-serve.png").is_file(), "a sweep without a completed request still gets its plot"
    assert "at capacity" in capsys.readouterr().out, "the first error messages are shown"


def test_options_that_would_be_ignored_or_measure_nothing_are_refused(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\n")
    base = ["bench", "serve", "--out", str(tmp_path), "--prompts", str(prompts), *CLIENT]
    closed = free_port()  # nothing listens there
    for extra, message in ((["--url", "http://127.0.0.1:9", "--target", "x"], "--target set the servers"),
                           (["--url", f"http://127.0.0.1:{closed}"], "nothing answers"),
                           (["--concurrency", "0,2"], "client counts of at least 1"),
                           (["--request-rate", "fast"], "positive requests per second"),
                           (["--requests-per-point", "0"], "at least 1"),
                           (["--time-limit", "0"], "positive seconds"),
                           (["--repeats", "0"], "`--repeats` must be at least 1")):
        assert main([*base, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_a_server_is_ready_once_every_batch_size_is_priced():
    assert not ready(503, {"status": "warming", "batch_rows_ready": 0, "max_batch": 8})
    assert not ready(200, {"status": "ok", "batch_rows_ready": 2, "max_batch": 8}), (
        "a server still measuring larger batches between requests would stall the point's first requests")
    assert ready(200, {"status": "ok", "batch_rows_ready": 8, "max_batch": 8})
    assert ready(200, {}), "another OpenAI-compatible server is ready when /health says 200"


# ------------------------------------------------------------------------------------------------------------
# Started servers are stopped however the bench ends

FAKE_SERVE = """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_started_servers_are_stopped_after_the_sweep_and_after_an_error(monkeypatch, tmp_path):
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(serve_servers, "serve_command",
                        lambda port, flags: [sys.executable, "-c", FAKE_SERVE, "--port", str(port), *flags])
    monkeypatch.setattr(serve_servers.subprocess, "Popen", Recorded)
    with started_servers(serve_servers.MODES, [], tmp_path, startup_timeout=30) as endpoints:
        assert [e.label for e in endpoints] == [TARGET_ALONE, DEFAULT]
        assert all(httpx.get(e.url + "/health").status_code == 200 for e in endpoints)
    assert len(started) == 2 and all(p.poll() is not None for p in started), "a server outlived the sweep"
    with pytest.raises(KeyboardInterrupt):
        with started_servers(serve_servers.MODES, [], tmp_path, startup_timeout=30):
            raise KeyboardInterrupt  # Ctrl-C in the middle of a sweep
    assert len(started) == 4 and all(p.poll() is not None for p in started), "a server outlived a Ctrl-C"


def test_each_round_starts_the_servers_in_a_rotated_order_and_keeps_their_labels_in_order(monkeypatch, tmp_path):
    # A server started first ran 2-3 % faster than an identical one started after it: no mode may always be first.
    started = []
    monkeypatch.setattr(serve_servers, "serve_command",
                        lambda port, flags: [sys.executable, "-c", FAKE_SERVE, "--port", str(port), *flags])
    real = serve_servers.server_process

    def recorded(label, *args, **kwargs):
        started.append(label)
        return real(label, *args, **kwargs)

    monkeypatch.setattr(serve_servers, "server_process", recorded)
    for round_ in (1, 2, 3):
        with started_servers(serve_servers.MODES, [], tmp_path, startup_timeout=30, round_=round_) as endpoints:
            assert [e.label for e in endpoints] == [TARGET_ALONE, DEFAULT], "the interleaving's base order"
    assert started == [TARGET_ALONE, DEFAULT, DEFAULT, TARGET_ALONE, TARGET_ALONE, DEFAULT]
    log = (tmp_path / f"server-{DEFAULT}.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("--- round")] == [
        "--- round 1: started 2 of 2", "--- round 2: started 1 of 2", "--- round 3: started 2 of 2"], (
        "every round's server appends to the mode's log")


def test_a_sweep_given_a_server_factory_starts_fresh_servers_for_every_round(servers):
    settings = SweepSettings((Point(2, concurrency=1), Point(2, concurrency=2)), max_tokens=6, time_limit=60,
                             repeats=2)
    opened, closed = [], []

    @contextmanager
    def fresh(round_):
        opened.append(round_)
        yield [Endpoint(label, url) for label, url in servers.items()]
        closed.append(round_)

    records = sweep(fresh, MESSAGES, settings)
    assert opened == closed == [1, 2], "one start and one stop per round, the round ended before the next began"
    assert [(r["repeat"], r["point"], r["mode"]) for r in records] == [
        (1, "c=1", TARGET_ALONE), (1, "c=1", DEFAULT), (1, "c=2", DEFAULT), (1, "c=2", TARGET_ALONE),
        (2, "c=1", DEFAULT), (2, "c=1", TARGET_ALONE), (2, "c=2", TARGET_ALONE), (2, "c=2", DEFAULT)], (
        "a round runs every point; each point's modes rotate by point and by round")
    assert all(r["completed"] == r["requests"] for r in records)
