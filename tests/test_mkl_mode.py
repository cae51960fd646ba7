"""MKL's strict mode: asked for at import, checked at load, and what it keeps equal (mkl_mode.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from blockdraft.mkl_mode import ENV, MODE, strict

ROWS = Path(__file__).parent / "data" / "smollm2_decode_attention.safetensors"
needs_mkl = pytest.mark.skipif(strict() is None, reason="this torch build carries no MKL mode query")


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != ENV} | env
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=environment, capture_output=True,
                          text=True, timeout=120)


def test_import_asks_for_strict_mode_and_keeps_the_users_choice():
    assert python(f"import os, blockdraft; print(os.environ['{ENV}'])").stdout.strip() == MODE
    assert python(f"import os, blockdraft; print(os.environ['{ENV}'])", **{ENV: "AUTO"}).stdout.strip() == "AUTO"


@needs_mkl
def test_mkl_runs_strict_after_import_and_a_load_warns_where_it_does_not():
    product = "import torch; torch.randn(8, 8) @ torch.randn(8, 8)"
    check = "from blockdraft.mkl_mode import strict, warn_unless_strict; print(strict()); warn_unless_strict()"
    first = python(f"import blockdraft; {product}; {check}")
    assert first.stdout.strip() == "True" and "strict mode" not in first.stderr
    late = python(f"{product}; import blockdraft; {check}")  # MKL ran before blockdraft could ask
    assert late.stdout.strip() == "False" and f"set {ENV}={MODE}" in late.stderr


@needs_mkl
def test_identical_rows_of_a_batch_attend_to_the_same_bits_on_every_thread():
    # A decode step of SmolLM2 (3 query rows per key/value head): the second row of a batch runs on the second
    # thread, whose scratch buffer lies elsewhere; outside strict mode its head 1 rounded apart here (AMD EPYC,
    # Zen 5), and a request's text then depended on what it was batched with.
    rows = load_file(ROWS)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for batch in (2, 3, 5):
            q, k, v = (rows[name].expand(batch, -1, -1, -1).contiguous() for name in ("query", "keys", "values"))
            out = F.scaled_dot_product_attention(q, k, v)  # [batch, 3, 3, 64]
            for row in range(1, batch):
                assert torch.equal(out[row], out[0]), f"row {row} of {batch} attended apart from row 0"
    finally:
        torch.set_num_threads(threads)
