"""warm_threads.py: one throwaway cos over torch's threads per thread count, before the target's and the draft's
RoPE tables (the first cos a process splits over threads rounded apart in about 1 process in 2 on an Ice Lake)."""

from __future__ import annotations

import pytest
import torch

from blockdraft import warm_threads
from blockdraft.model.layers import rope_cos_sin, rope_inv_freq

from tiny_models import tiny_target


@pytest.fixture
def throwaways(monkeypatch) -> list[int]:
    """The thread counts warmed from here on, in a process that has warmed none."""
    calls: list[int] = []
    monkeypatch.setattr(warm_threads, "_WARMED", set())
    monkeypatch.setattr(warm_threads, "_throwaway", calls.append)
    return calls


def test_each_thread_count_is_warmed_once(throwaways, monkeypatch):
    for threads in (2, 2, 3, 2, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        warm_threads.warm_threads()
    assert throwaways == [2, 3], "a thread count warmed again costs a call; a new count unwarmed can round apart"


def test_the_targets_forward_warms_before_its_rope_tables(throwaways):
    target = tiny_target("llama")
    with torch.inference_mode():
        target.forward(torch.tensor([[5, 6, 7]]), torch.arange(3)[None], target.new_cache(1, 16),
                       logit_rows=torch.tensor([[2]]))
    assert throwaways == [torch.get_num_threads()], "the target's first RoPE table ran on unwarmed threads"


def test_the_drafts_rope_tables_are_warmed(throwaways):
    rope_cos_sin(rope_inv_freq(16, 10000.0), torch.arange(4)[None], torch.float32)
    assert throwaways == [torch.get_num_threads()], "the draft's first RoPE table ran on unwarmed threads"


def test_the_throwaway_gives_every_thread_a_block(monkeypatch):
    # torch splits an elementwise cos in tasks of BLOCK elements: fewer elements than threads * BLOCK leave some
    # thread without a task, unwarmed
    sizes, linspace = [], torch.linspace
    monkeypatch.setattr(torch, "linspace", lambda start, end, steps: sizes.append(steps) or linspace(start, end, steps))
    warm_threads._throwaway(3)
    assert sizes == [3 * warm_threads.BLOCK]
