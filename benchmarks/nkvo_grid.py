"""Measurement: what ``-nkvo`` (``--no-kv-offload``) does to the compute buffers, by llama.cpp's own allocation pass.

For each real-size shape of tests/oracle.py (sparse GGUFs of tests/tinymodels.py, a 32,000-token vocabulary so that
the layers, not the logits, make the peak) at 4,096 and 32,768 cells, FA on (f16 and q8_0 cache) and off (f16),
llama-fit-params (the tests' build) reserves the graphs on one loopback rpc-server, with and without ``-nkvo``; each
row (one JSON line) holds the device's ("RPC0") and the host's ("CPU") compute buffer in MiB both ways. The result
is committed as tests/data/measured/nkvo_b11312.jsonl and read in docs/how-numbers-are-computed.md: kvadvise does
not model -nkvo (no asserts here).

    python benchmarks/nkvo_grid.py [--out FILE] [RECIPE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server_build import fit_params, rpc_server  # noqa: E402
from oracle import REAL_SIZES, dry_run  # noqa: E402
from rpc_devices import devices  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.model.ggml import GGMLType  # noqa: E402
from kvadvise.planner.memory import RunConfig  # noqa: E402

RECIPES = ("llama", "qwen3", "qwen2", "gemma3", "gpt-oss", "qwen3moe", "phi3", "qwen35", "lfm2", "granitehybrid")
RECIPES += ("gemma2", "mixtral")
CACHES = (("on", GGMLType.F16), ("off", GGMLType.F16), ("on", GGMLType.Q8_0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="*", default=list(RECIPES))
    ap.add_argument("--out", type=Path, default=Path("nkvo_grid.jsonl"))
    args = ap.parse_args()
    binary = fit_params()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp, devices(rpc_server(), 1) as endpoints, args.out.open("w") as out:
        for recipe in args.recipes:
            path = Path(tmp) / f"{recipe}.gguf"
            write_tiny_gguf(path, recipe, n_vocab=32000, n_ctx_train=262144, dims=REAL_SIZES[recipe], sparse=True)
            for n_ctx in (4096, 32768):
                for fa, cache in CACHES:
                    cfg = RunConfig(n_ctx=n_ctx, flash_attn=fa, type_k=cache, type_v=cache, runtime="llama-server")
                    row: dict[str, object] = {"recipe": recipe, "ctx": n_ctx, "fa": fa, "kv": cache.type_name}
                    for key, extra in (("base", []), ("nkvo", ["-nkvo"])):
                        row[key] = dry_run(binary, path, cfg, rpc=endpoints[0], extra=extra, env=env)
                    out.write(json.dumps(row) + "\n")
                    print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
