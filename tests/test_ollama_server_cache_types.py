"""OLLAMA_KV_CACHE_TYPE by release: from 0.30 Ollama passes it, lower-cased and unchecked, to llama-server as
--cache-type-k/-v (llm/llama_server.go), so any type llama-server takes (common/arg.cpp kv_cache_types) is planned;
a runner before 0.30 takes f16, q8_0 and q4_0 only (v0.20.0:llm/server.go warns "unsupported OLLAMA_KV_CACHE_TYPE"
and runs f16), refused there with that reason (exit 2)."""

from __future__ import annotations

import json

import pytest
from attack_helpers import no_server, one_line_input_error, run  # noqa: F401  (an autouse fixture)

from kvadvise.backends.ollama.config import server_kv_cache_type


@pytest.mark.parametrize(("kv", "bytes_per_elem"), [("bf16", 2.0), ("q5_1", 24 / 32), ("iq4_nl", 18 / 32)])
def test_a_llama_server_type_is_planned_for_ollama_0_30_and_later(
    kv: str, bytes_per_elem: float, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("ollama", "qwen3:8b", "--gpu", "rtx4090", "--ctx", "8192", "--json")
    rc, out, err = run(capsys, *args, "-ctk", kv)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["config"]["type_k"] == doc["config"]["type_v"] == kv
    assert doc["ollama"]["env"]["OLLAMA_KV_CACHE_TYPE"] == kv
    rc, out, err = run(capsys, *args, "-ctk", "f16")
    f16 = json.loads(out)["memory"]["kv_bytes"]
    # the cache is the type's size: qwen3:8b's K/V at 8k, 36 layers x 8 heads x 128 x 2 x 8192 cells
    assert doc["memory"]["kv_bytes"] == round(f16 * bytes_per_elem / 2), (doc["memory"]["kv_bytes"], f16)


def test_a_runner_before_0_30_refuses_what_it_ignores(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = run(capsys, "ollama", "qwen3:8b", "--gpu", "rtx4090", "-ctk", "q5_1", "--ollama-version", "0.20.0")
    one_line_input_error(rc, err)
    assert "Ollama 0.20.0 does not take OLLAMA_KV_CACHE_TYPE=q5_1" in err and "unsupported" in err


def test_verify_reads_the_servers_type_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "Q5_1")  # envconfig's value, lower-cased as llm/server.go does
    assert server_kv_cache_type(None, None) == ("q5_1", "from $OLLAMA_KV_CACHE_TYPE")
