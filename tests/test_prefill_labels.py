"""benchmarks/prefill_labels.py's count of the slots a human text labels on the target's greedy path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("prefill_labels", Path(__file__).parents[1] / "benchmarks" /
                                              "prefill_labels.py")
prefill_labels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prefill_labels)


def test_a_text_on_the_greedy_path_labels_every_slot_to_its_edge():
    tokens = [5, 6, 7, 8, 9]
    greedy = [6, 7, 8, 9, 1]  # g_t = the text's next token everywhere
    # slot k of anchor p needs p+k-1 <= 4: 5, 4, 3 anchors for slots 1, 2, 3
    assert prefill_labels.labelled_slots(tokens, greedy, 4) == [5, 4, 3]


def test_a_departure_from_the_path_stops_the_later_slots_there():
    tokens = [5, 6, 0, 8, 9]  # the text leaves the greedy path at t=2 (greedy would write 7)
    greedy = [6, 7, 8, 9, 1]
    # anchor 0: slot 1 (g_0), slot 2 (x_1 = g_0 -> g_1), slot 3 needs x_2 = g_1: no. anchor 1: slot 1 only.
    # anchor 2: slots 1, 2 (x_3 = g_2), 3 (x_4 = g_3). anchor 3: slots 1, 2 (g_4). anchor 4: slot 1.
    assert prefill_labels.labelled_slots(tokens, greedy, 4) == [5, 3, 1]
