"""A quick first start: the server answers /health at once ("warming", 503) while step costs are measured in
the background, serves requests as soon as the first batch-size bucket is measured, and every request decodes with
exactly the costs of a server that was warm from the start.

The measurement is faked (`GatedCosts`): each bucket waits for the test to release it and gets prices of its own,
so a decode priced from a bucket that was not yet measured (a borrowed neighbour) would be seen.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest
from fastapi.testclient import TestClient

from blockdraft.decode import decoder as decoder_module
from blockdraft.decode.costs import CostModel, batch_bucket, linear_costs
from blockdraft.server import app as app_module
from blockdraft.server import create_app

from server_client import MODEL, TEXT, text_body, wait_for

WIDTHS = (1, 2, 3, 4, 8, 12, 16)


class GatedCosts:
    """A stand-in for `measured_costs`: one shared CostModel, grown a bucket at a time once the test opens that
    bucket's gate; bucket b prices a plain step at b seconds, so buckets never agree."""

    def __init__(self) -> None:
        self.model = CostModel()
        self.gates = {b: threading.Event() for b in (1, 2, 4, 8)}

    def __call__(self, target, drafter, tree, rows, fresh=False) -> CostModel:
        for bucket in (1, 2, 4, 8):
            if bucket <= batch_bucket(rows) and bucket not in self.model.buckets():
                assert self.gates[bucket].wait(timeout=60), f"bucket {bucket} was never released"
                self.model.update(linear_costs(plain=bucket, draft=bucket / 3, per_position=0.02 * bucket,
                                               buckets=(bucket,)))
        return self.model

    def answers(self, rows: int) -> list[float]:
        """Every price a decode of up to `rows` rows may ask for."""
        return [self.model.seconds(r, w, drafted) for r in range(1, rows + 1) for w in WIDTHS
                for drafted in (False, True)]


@pytest.fixture
def gated(monkeypatch):
    costs = GatedCosts()
    monkeypatch.setattr(decoder_module, "measured_costs", costs)
    monkeypatch.setattr(app_module, "READY_WAIT_SECONDS", 0.05)  # do not wait for the (gated) first bucket
    return costs


def test_health_warms_then_serves_with_the_costs_of_a_warm_server(model, gated, monkeypatch):
    decodes, real = [], decoder_module.stream

    def recording(target, drafter, prompts, **kwargs):  # the rows of each decode and the prices it could see
        decodes.append((len(prompts), gated.answers(len(prompts))))
        yield from real(target, drafter, prompts, **kwargs)

    monkeypatch.setattr(decoder_module, "stream", recording)
    bodies = [text_body(f"Warm {i} " + "xy" * i, max_tokens=10) for i in range(3)]
    app = create_app(*model, model_id=MODEL, max_batch=4)
    with TestClient(app) as client, ThreadPoolExecutor(3) as pool:
        health = client.get("/health")
        assert health.status_code == 503, "no bucket is measured yet: a load balancer must not send requests"
        assert health.json()["status"] == "warming" and health.json()["batch_rows_ready"] == 0
        early = [pool.submit(client.post, TEXT, json=body) for body in bodies]
        wait_for(lambda: app.state.worker.queue_depth == 3)
        gated.gates[1].set()
        # Whichever request reached the queue first is served while bucket 2 is still being "measured".
        served, _ = wait(early, timeout=60, return_when=FIRST_COMPLETED)
        assert len(served) == 1 and served.pop().result().status_code == 200
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["batch_rows_ready"] == 1
        assert sum(f.done() for f in early) == 1, "a batch must not outgrow the buckets measured"
        gated.gates[2].set()
        gated.gates[4].set()
        warming = [f.result(timeout=60).json()["choices"][0]["text"] for f in early]
        wait_for(lambda: app.state.worker.warmup.done)
        assert client.get("/health").json()["batch_rows_ready"] == 4
        assert [rows for rows, _ in decodes] == [1, 2], "one row, then two once bucket 2 was measured"
        warm_batch = [f.result(timeout=60).json()["choices"][0]["text"]
                      for f in [pool.submit(client.post, TEXT, json=body) for body in bodies]]
        alone = [client.post(TEXT, json=body).json()["choices"][0]["text"] for body in bodies]
    assert warming == alone == warm_batch, "a request made while warming got another text than once warm"
    for rows, seen in decodes:
        assert seen == gated.answers(rows), f"a {rows}-row decode saw prices the warm server does not give"


def test_a_failed_measurement_is_reported_and_refuses_requests(model, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected timing failure")

    monkeypatch.setattr(decoder_module, "measured_costs", broken)
    with TestClient(create_app(*model, model_id=MODEL)) as client:
        wait_for(lambda: not client.app.state.worker.alive)
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "worker stopped"
        assert "injected timing failure" in health.json()["error"] and "restart" in health.json()["error"]
        refused = client.post(TEXT, json=text_body())
        assert refused.status_code == 503 and "injected timing failure" in refused.json()["error"]["message"]


@pytest.mark.parametrize("again", [False, True], ids=["cached", "measure-costs"])
def test_measure_costs_measures_the_servers_buckets_again(model, monkeypatch, again):
    # `serve --measure-costs` after a first start on a busy machine: every bucket is measured afresh, not read.
    asked = []

    def recording(target, drafter, tree, rows, fresh=False):
        asked.append((rows, fresh))
        return linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)

    monkeypatch.setattr(decoder_module, "measured_costs", recording)
    app = create_app(*model, model_id=MODEL, max_batch=4, measure_costs=again)
    with TestClient(app) as client:
        wait_for(lambda: app.state.worker.warmup.done)
        assert client.post(TEXT, json=text_body("Fresh", max_tokens=4)).status_code == 200
    assert asked and all(fresh == again for _, fresh in asked), f"asked {asked}"
