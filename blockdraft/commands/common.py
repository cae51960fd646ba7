"""Arguments shared by several commands."""

from __future__ import annotations


def add_model_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="HF folder or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on GPUs and on CPUs with native bf16, "
                        "else float32), bfloat16, float32 (exact), float16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--full-vocab", action="store_true",
                        help="let the draft propose any token id, ignoring the draft folder's blockdraft_vocab.json")
