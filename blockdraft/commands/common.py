"""Arguments shared by several commands."""

from __future__ import annotations


def add_model_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (fast on CPU), float32 (exact), float16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
