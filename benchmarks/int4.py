"""The embedded target with int4 weights from its GGUF (--weights q4) against bf16, in one process.

    python benchmarks/int4.py rows --threads 1      # int4 kernel vs packed bf16 product per shape and row count
    python benchmarks/int4.py decode --threads 2    # greedy decode of the target alone, bf16 vs q4, interleaved

`rows` times one product per SmolLM2-135M fused shape at 1 to 256 rows (median and min of 9 repeats, us): what
the int4 kernel costs against a packed bf16 product (model/q4.py runs int4 at every row count). `decode` loads both targets, prints the bytes of their weight tensors
and the process RSS after each load, then decodes one prompt for --tokens greedy tokens --repeats times per
target, alternating, and reports median tokens/s, whether q4 repeats itself and where it first leaves bf16.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from blockdraft.hardware import describe_line
from blockdraft.model import q4
from blockdraft.model.packed import PackedConcat, PackedLinear

PROMPT = "Write a Python function that checks whether a string is a palindrome."
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down


def timed(fn, calls: int = 100, repeats: int = 9) -> tuple[float, float]:
    """(median, min) microseconds per call over `repeats` runs of `calls` calls, after a warm-up."""
    for _ in range(10):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs), min(runs)


def rows() -> dict:
    table = {}
    generator = torch.Generator().manual_seed(0)
    for n, d in SHAPES:
        raw = torch.randint(0, 256, (n, d // q4.BLOCK * q4.BLOCK_BYTES), dtype=torch.uint8, generator=generator)
        raw.view(n, -1, q4.BLOCK_BYTES)[..., :4] = torch.tensor([0.01, 0.0], dtype=torch.float16).view(torch.uint8)
        codes, scales_zeros = q4.int4_form([q4.Q4Blocks(raw)])
        weight = q4.pack_int4(codes, scales_zeros)
        packed = PackedLinear(q4.dequantize_int4(codes, scales_zeros).to(torch.bfloat16))
        for m in (1, 2, 4, 9, 17, 64, 256):
            x = torch.randn(m, d).to(torch.bfloat16)
            int4, bf16 = timed(lambda: q4.int4_product(x, weight)), timed(lambda: packed.product(x))
            table[f"{n}x{d}@{m}"] = {"int4_us": int4, "bf16_packed_us": bf16}
            print(f"{n}x{d} rows {m:2d}: int4 {int4[0]:7.1f} (min {int4[1]:7.1f})  "
                  f"bf16 packed {bf16[0]:7.1f} (min {bf16[1]:7.1f})", flush=True)
    return table


def weight_bytes(target) -> dict:
    """Bytes held by the model's parameters, the packed bf16 copies (layers and head) and the int4 weights."""
    params = sum(p.numel() * p.element_size() for p in target.model.parameters())
    kernels = [f for linears in target.linears for f in linears.values()] + [target.head]
    packed = sum(f.packed.numel() * 2 for f in kernels if isinstance(f, PackedConcat))  # bf16 elements
    int4 = sum(f.weight.nbytes for f in kernels if isinstance(f, q4.Q4Linear))
    return {"parameters": params, "packed_bf16_copies": packed, "int4": int4, "total": params + packed + int4}


def decode(tokens: int, repeats: int) -> dict:
    import psutil

    from blockdraft.api import encode
    from blockdraft.decode.decoder import Decoder
    from blockdraft.io.targets import load_target

    process = psutil.Process()
    targets, memory = {}, {}
    for weights in ("bf16", "q4"):
        before = process.memory_info().rss
        start = time.perf_counter()
        targets[weights] = load_target(weights=weights)
        memory[weights] = weight_bytes(targets[weights]) | {"rss_added": process.memory_info().rss - before,
                                                            "load_s": time.perf_counter() - start}
        print(weights, {k: f"{v / 2**20:.1f} MiB" if k != "load_s" else f"{v:.1f} s" for k, v in memory[weights].items()})
    prompt = encode(targets["bf16"], PROMPT)
    speeds, outputs = {"bf16": [], "q4": []}, {"bf16": [], "q4": []}
    for weights, target in targets.items():  # warm-up
        Decoder(target, None).generate([prompt], max_new_tokens=16, stop_token_ids=[])
    for repeat in range(repeats):
        for weights in ("bf16", "q4") if repeat % 2 == 0 else ("q4", "bf16"):
            start = time.perf_counter()
            result = Decoder(targets[weights], None).generate([prompt], max_new_tokens=tokens, stop_token_ids=[])
            speeds[weights].append(tokens / (time.perf_counter() - start))
            outputs[weights].append(result[0].tokens)
            print(f"repeat {repeat} {weights}: {speeds[weights][-1]:.1f} tok/s", flush=True)
    bf16, quantized = outputs["bf16"][0], outputs["q4"][0]
    first_difference = next((i for i, (a, b) in enumerate(zip(bf16, quantized)) if a != b), None)
    report = {"tokens_per_s": {k: statistics.median(v) for k, v in speeds.items()}, "runs": speeds,
              "q4_deterministic": all(o == quantized for o in outputs["q4"]),
              "bf16_deterministic": all(o == bf16 for o in outputs["bf16"]),
              "first_token_q4_differs_from_bf16": first_difference, "memory_bytes": memory}
    report["speedup_q4_over_bf16"] = report["tokens_per_s"]["q4"] / report["tokens_per_s"]["bf16"]
    print(f"bf16 {report['tokens_per_s']['bf16']:.1f} tok/s, q4 {report['tokens_per_s']['q4']:.1f} tok/s "
          f"(x{report['speedup_q4_over_bf16']:.2f}); q4 repeats itself: {report['q4_deterministic']}; "
          f"first token where q4 differs from bf16: {first_difference}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["rows", "decode"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, bf16 activations")
    result = rows() if args.mode == "rows" else decode(args.tokens, args.repeats)
    print(json.dumps({"mode": args.mode, "threads": args.threads, "prompt": PROMPT, "tokens": args.tokens,
                      "result": result}))


if __name__ == "__main__":
    main()
