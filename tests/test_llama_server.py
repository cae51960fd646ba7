"""llama.cpp's server as bench methods (bench/llama_server.py), without the binary:
the acceptance read from the server's log, and the method skipped with a note where the binary is missing."""

from __future__ import annotations

import pytest

from blockdraft.bench.llama_server import SERVER_ENV, find_llama_server, step_stats
from blockdraft.bench.methods import LLAMA_DFLASH, LLAMA_SERVER, ServerMethod, server_methods

LOG = """slot update_slots: id  0 | task 5 | accepted  2/ 3 draft tokens
slot update_slots: id  0 | task 5 | accepted  0/ 3 draft tokens
slot update_slots: id  0 | task 5 | accepted  3/ 3 draft tokens
"""


def test_steps_come_from_the_log():
    # 12 tokens: 1 from the prefill, 3 + 1 + 4 = 8 from drafting steps, 3 from plain steps.
    stats = step_stats(LOG, new_tokens=12, draft_max=3, accepted_total=5)
    assert stats.histogram == [4, 0, 1, 1, 0], "plain steps and drafting steps must land in their tau bins"
    assert stats.plain_steps == 3 and stats.tokens == 11
    assert stats.mean_tau == pytest.approx(11 / 6)


def test_log_that_disagrees_with_the_response_gives_no_tau():
    assert step_stats(LOG, new_tokens=12, draft_max=3, accepted_total=4) is None, "a wrong tau would be printed"


class FakeServer:
    def __init__(self):
        self.closed = False

    def complete(self, prompt, max_new_tokens):
        return list(range(12)), {"draft_n_accepted": 5}, LOG

    def close(self):
        self.closed = True


def test_plain_server_method_has_no_tau():
    [decoded] = ServerMethod(LLAMA_SERVER, FakeServer(), None).decode([[1, 2, 3]], 16)
    assert decoded.tokens == list(range(12)) and decoded.stats is None


def test_method_returns_tokens_and_stats():
    server = FakeServer()
    method = ServerMethod(LLAMA_DFLASH, server, 3)
    [decoded] = method.decode([[1, 2, 3]], 16)
    assert decoded.tokens == list(range(12)) and decoded.stats.steps == 6
    method.close()
    assert server.closed, "a server process would outlive the bench"


def test_missing_binary_skips_with_a_note(monkeypatch, tmp_path):
    monkeypatch.setenv(SERVER_ENV, str(tmp_path / "no-such-llama-server"))
    assert find_llama_server() is None
    for name in (LLAMA_SERVER, LLAMA_DFLASH):
        methods, note = server_methods(name, None, tmp_path / "t.gguf", tmp_path, (3,))
        assert methods == [] and note.startswith(name) and "llama-server" in note and SERVER_ENV in note
