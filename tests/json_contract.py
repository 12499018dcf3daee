"""The JSON contract of ``--json``: which commands are checked, the shape of a document, its snapshot.

tests/test_json_contract.py runs every command of :data:`CASES` in-process, validates its document against
its JSON Schema (docs/schema/, kept by hand) and compares the document's *shape* (every key path with the
JSON type found there) with the snapshot committed in tests/data/json/<case>.json. A key added, removed or
retyped is then a reviewed change: after an intended one, regenerate every snapshot with one command::

    python tests/json_contract.py --write

and review the diff of tests/data/json/ (and update docs/schema/ by hand). Without ``--write`` it runs the
check alone, as the test suite does.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SCHEMAS = ROOT / "docs" / "schema"
SNAPSHOTS = TESTS / "data" / "json"
# set by --write: the test writes each snapshot instead of comparing (not KVADVISE_*: conftest clears those)
WRITE_VAR = "JSON_CONTRACT_WRITE"
REGENERATE = "python tests/json_contract.py --write"

GGUF = "GGUF"  # in a case's argv: the real Gemma 3 270M GGUF (tests/conftest.py gemma_path)
DIR = "DIR"  # a folder holding that GGUF


@dataclass(frozen=True)
class Case:
    """One command whose ``--json`` document is checked."""

    name: str  # its snapshot: tests/data/json/<name>.json
    argv: tuple[str, ...]  # GGUF and DIR stand for the paths of the test's setting
    schema: str  # the file of docs/schema/ it follows
    exit_codes: tuple[int, ...] = (0,)
    store: bool = False  # OLLAMA_MODELS is a store holding the Gemma GGUF (else an empty folder)

    @property
    def command(self) -> str:
        return "kvadvise " + " ".join(self.argv)


CASES: tuple[Case, ...] = (
    # one model, planned: the plan document (and its runtime's part: "ollama", "llama_server")
    Case("ollama", ("ollama", "qwen3-coder", "--gpu", "rtx-4090", "--json"), "plan.schema.json"),
    Case("ollama_partial", ("ollama", "qwen3-coder", "--gpu", "rtx-4060", "--json"), "plan.schema.json"),
    Case(
        # Ollama 0.13.0's own layout replayed (llm/server.go createLayout): ollama.decision is an object
        "ollama_layout",
        ("ollama", "qwen2.5-coder:7b", "--gpu", "rtx-4060", "--ollama-version", "0.13.0", "--ctx", "32768", "--json"),
        "plan.schema.json",
    ),
    Case(
        # the Go engine's layout replayed (ollamaServer.Load over the runner's memory): a decision with its
        # approximation (the graph stand-in)
        "ollama_engine_layout",
        ("ollama", "gpt-oss:20b", "--gpu", "rtx-4060", "--ollama-version", "0.13.0", "--ctx", "8192", "--json"),
        "plan.schema.json",
    ),
    Case(
        # the training context (262,144) does not fit 100% on the GPU: the plan that runs keeps experts on the CPU
        "ollama_ctx0",
        ("ollama", "qwen3-coder", "--gpu", "rtx-4090", "--ctx", "0", "--json"),
        "plan.schema.json",
        (0,),
    ),
    Case("gguf_vram", ("gguf", GGUF, "--vram", "640MiB", "--json"), "plan.schema.json", (3,)),
    Case("gguf_vram_fits", ("gguf", GGUF, "--vram", "640MiB", "--margin", "0", "--json"), "plan.schema.json"),
    Case("gguf_no_hardware", ("gguf", GGUF, "--ctx", "4096", "--no-hardware", "--json"), "plan.schema.json"),
    Case("llamacpp_vram", ("llamacpp", GGUF, "--vram", "640MiB", "--json"), "plan.schema.json", (3,)),
    Case(
        "llamacpp_vram_fits",
        ("llamacpp", GGUF, "--vram", "640MiB", "--margin", "0", "--json"),
        "plan.schema.json",
    ),
    Case(
        "llamacpp_draft",
        ("llamacpp", GGUF, "--vram", "2GiB", "-md", GGUF, "--ctx", "8192", "--json"),
        "plan.schema.json",
    ),
    Case(
        "hf",
        ("hf", "tests/data/hf/qwen3-coder-30b.json", "--quant", "Q4_K_M", "--gpu", "rtx-4090", "--json"),
        "plan.schema.json",
    ),
    # several models on one Ollama server
    Case(
        "ollama_together",
        ("ollama", "qwen3-coder", "qwen3:4b", "nomic-embed-text", "--gpu", "rtx-4090", "--json"),
        "together.schema.json",
        (0, 3),
    ),
    # models x cards
    Case("compare", ("compare", "qwen3-coder", "--gpu", "rtx-4090,rtx-4060", "--json"), "compare.schema.json"),
    # listings: a folder of GGUF files, an Ollama store
    Case("gguf_dir", ("gguf", DIR, "--gpu", "rtx-4090", "--json"), "listing.schema.json"),
    Case(
        "ollama_installed", ("ollama", "--installed", "--gpu", "rtx-4090", "--json"), "listing.schema.json", store=True
    ),
    # a plan beside a run of llama.cpp (the run is a stand-in in the fast test; the llama-marked one is real)
    Case(
        "verify_llamacpp",
        ("verify", "llamacpp", GGUF, "--ctx", "4096", "--no-hardware", "--json"),
        "verification.schema.json",
    ),
)

# Objects whose keys are data (model names, environment variables), not part of the contract: their values
# are recorded under PATH{} whatever the keys.
MAPS = frozenset(
    {
        "ollama.env",  # {OLLAMA_*: value}
        "llama_server.env",  # {LLAMA_ARG_*: value}
        "env",  # kvadvise ollama A B: {OLLAMA_*: value}
        "recommended_contexts",  # {model: num_ctx}
        "modelfile_names",  # {model: name}
    }
)


def json_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):  # before int: a bool is an int in Python
        return "bool"
    for t, name in ((int, "int"), (float, "float"), (str, "str"), (list, "list"), (dict, "object")):
        if isinstance(v, t):
            return name
    raise TypeError(f"not a JSON value: {v!r}")


def shape(doc: Mapping[str, Any]) -> dict[str, str]:
    """Every key path of ``doc`` with the JSON types found there: ``memory.devices[].total_bytes: int``
    (the elements of a list under ``[]``, the values of a :data:`MAPS` object under ``{}``; a path that is
    null in one place and an int in another is ``int|null``)."""
    seen: dict[str, set[str]] = {}

    def walk(v: object, path: str) -> None:
        seen.setdefault(path, set()).add(json_type(v))
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}{{}}" if path in MAPS else f"{path}.{k}")
        elif isinstance(v, list):
            for x in v:
                walk(x, f"{path}[]")

    for k, v in doc.items():
        walk(v, k)
    return {p: "|".join(sorted(seen[p])) for p in sorted(seen)}


def snapshot_path(case: Case) -> Path:
    return SNAPSHOTS / f"{case.name}.json"


def snapshot(case: Case, doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"command": case.command, "schema": case.schema, "shape": shape(doc)}


def write_snapshot(case: Case, doc: Mapping[str, Any]) -> None:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    snapshot_path(case).write_text(json.dumps(snapshot(case, doc), indent=2) + "\n", encoding="utf-8")


def shape_difference(case: Case, doc: Mapping[str, Any]) -> str | None:
    """None when ``doc`` has the snapshot's shape; else what was added and removed, and what to do."""
    path = snapshot_path(case)
    if not path.is_file():
        return f"no snapshot {path.relative_to(ROOT)} for `{case.command}`: run `{REGENERATE}`"
    want = json.loads(path.read_text(encoding="utf-8"))
    got = snapshot(case, doc)
    if want == got:
        return None
    lines = [f"the --json document of `{case.command}` differs from {path.relative_to(ROOT)}:"]
    for key in ("command", "schema"):
        if want.get(key) != got[key]:
            lines.append(f"  {key}: {want.get(key)!r} -> {got[key]!r}")
    old = {f"{p}: {t}" for p, t in want.get("shape", {}).items()}
    new = {f"{p}: {t}" for p, t in got["shape"].items()}
    lines += [f"  added    {x}" for x in sorted(new - old)]
    lines += [f"  removed  {x}" for x in sorted(old - new)]
    lines.append(
        f"if the change is intended, rerun `{REGENERATE}`, review the diff of tests/data/json/ and "
        f"update docs/schema/{case.schema} to match"
    )
    return "\n".join(lines)


def schemas() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(SCHEMAS.glob("*.schema.json"))}


@functools.cache
def validator(name: str) -> Any:
    """A Draft 2020-12 validator of docs/schema/<name>, with the other schemas its $ref names (by file name,
    as they lie side by side)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    docs = schemas()
    registry: Registry[Any] = Registry().with_resources((n, Resource.from_contents(s)) for n, s in docs.items())
    return Draft202012Validator(docs[name], registry=registry)


def schema_errors(name: str, doc: object) -> list[str]:
    """Where ``doc`` breaks docs/schema/<name>, one line each (empty: it follows it)."""
    from jsonschema.exceptions import best_match

    out = []
    for e in validator(name).iter_errors(doc):
        best = best_match([e])  # the error inside an anyOf/oneOf that explains it
        where = "/" + "/".join(str(x) for x in best.absolute_path)
        out.append(f"{where}: {best.message}")
    return sorted(out)


def described(schema: object, where: str = "") -> Iterable[str]:
    """The properties and $defs of a schema that have no description."""
    if isinstance(schema, dict):
        for key in ("properties", "$defs"):
            for name, sub in (schema.get(key) or {}).items():
                if isinstance(sub, dict) and "description" not in sub:
                    yield f"{where}/{key}/{name}"
        for k, v in schema.items():
            if k != "if":  # a condition's properties describe nothing
                yield from described(v, f"{where}/{k}")
    elif isinstance(schema, list):
        for n, v in enumerate(schema):
            yield from described(v, f"{where}/{n}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--write", action="store_true", help="regenerate tests/data/json/ from the documents the commands print now"
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_json_contract.py")]
    if args.write:
        env[WRITE_VAR] = "1"
        cmd += ["-m", "not llama"]  # the snapshots come from the fast runs
        names = {f"{c.name}.json" for c in CASES}
        for stale in SNAPSHOTS.glob("*.json"):
            if stale.name not in names:
                stale.unlink()
                print(f"removed {stale.relative_to(ROOT)} (no such case)")
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
