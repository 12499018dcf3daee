"""The command line: JSON keys, numbers, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvadvise.backends.gguf_cache import load, read
from kvadvise.cli import main
from kvadvise.model.gguf import read_file
from kvadvise.planner.repack import cpu_isa

MIB = 1 << 20


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_keys_and_numbers_for_gemma(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(
        capsys,
        "gguf",
        str(gemma_path),
        "--ctx",
        "10000",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "--json",
        "--no-hardware",
    )
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) >= {"model", "config", "memory", "budget", "fits", "reasons"}
    assert doc["budget"] is None and doc["fits"] is None and doc["reasons"] == []
    m = doc["model"]
    assert (m["architecture"], m["n_layer"], m["n_vocab"], m["n_ctx_train"]) == ("gemma3", 18, 262144, 32768)
    assert (m["n_head"], m["n_head_kv"], m["n_embd_head_k"], m["n_swa"], m["n_layer_swa"]) == (4, 1, 256, 512, 15)
    c = doc["config"]
    assert c == {
        "n_ctx": 10240,  # 10000 padded to a multiple of 256, as llama.cpp prints it
        "n_ctx_requested": 10000,
        "n_ctx_seq": 10240,
        "n_ctx_swa": 1024,  # pad(512 + 512, 256)
        "n_parallel": 1,
        "kv_unified": False,
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_outputs_max": 1,
        "runtime": "llama-server",
        "type_k": "q8_0",
        "type_v": "q8_0",
        "flash_attn": True,
        "swa_full": False,
        "device": "cpu",
        "cpu_repack": cpu_isa(),  # this machine's CPU: a CPU plan adds its CPU_REPACK copies
    }
    mem = doc["memory"]
    # q8_0 row of 256 values = 8 blocks x 34 B = 272 B; 3 full layers x 10240 cells + 15 SWA layers x 1024 cells
    k = 272 * (3 * 10240 + 15 * 1024)
    assert mem["k_bytes"] == mem["v_bytes"] == k
    assert mem["kv_bytes"] == 2 * k
    assert mem["kv_bytes_per_token"] == 3 * 2 * 272  # only the full-attention layers grow with the context
    # the file's tensor data, and the copies of its q4_K matrices (12.66 MiB) where the CPU repacks them
    assert mem["weights_bytes"] - mem["repack_bytes"] == 246_587_904
    if cpu_isa() in ("avx2", "avx512"):
        assert mem["repack_bytes"] == 13_271_040
    assert mem["output_bytes"] == 262144 * 4
    assert mem["recurrent_bytes"] == mem["overhead_bytes"] == 0
    parts = ("weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "output_bytes", "overhead_bytes")
    assert mem["total_bytes"] == sum(mem[p] for p in parts)
    assert [(c["kind"], c["cells"], c["n_layer"]) for c in mem["caches"]] == [("kv", 10240, 3), ("swa", 1024, 15)]


def test_human_output(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--ctx", "4000", "-fa", "on", "--no-hardware", "--verbose")
    assert rc == 0
    assert "n_ctx 4,096 (asked 4,000; llama.cpp pads to 256)" in out
    assert "K cache       13.50 MiB   3 full layers × 4,096 + 15 SWA layers × 1,024 cells" in out
    assert "KV per token of context: 3,072 B" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gguf", "/nonexistent/model.gguf"], "no such file"),
        (["gguf", "{gemma}", "--ctx", "abc"], "Invalid value for '--ctx'"),
        (["gguf", "{gemma}", "-ctk", "q3_K"], "Invalid value for '--cache-type-k'"),
        (["gguf", "{gemma}", "-ctv", "q8_0", "-fa", "off"], "quantized V cache requires flash attention"),
        (["gguf", "{gemma}", "--parallel", "0"], "Invalid value for '--parallel'"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, *[a.replace("{gemma}", str(gemma_path)) for a in args])
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and message in lines[0] and lines[0].startswith("kvadvise: error:")
    assert "Traceback" not in err


def test_truncated_download_says_so(gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.gguf"
    with open(gemma_path, "rb") as src:
        cut.write_bytes(src.read(100_000_000))  # header intact, tensor data cut short
    rc, _, err = run(capsys, "gguf", str(cut))
    assert rc == 2
    assert "truncated" in err and "download" in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    env = {**os.environ, "KVADVISE_DEBUG": "1"}
    p = subprocess.run([sys.executable, "-m", "kvadvise", "gguf", str(bad)], capture_output=True, text=True, env=env)
    assert p.returncode != 0 and "Traceback" in p.stderr and "not a GGUF file" in p.stderr
    p = subprocess.run([sys.executable, "-m", "kvadvise", "gguf", str(bad)], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_header_cache_is_used_and_invalidated(tmp_path: Path) -> None:
    import shutil
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "m.gguf", "llama")
    assert load(path) is None
    first = read(path)
    assert first == read_file(path)
    assert load(path) == first  # stored, and read back identical (floats, bools, arrays)
    other = write_tiny_gguf(tmp_path / "other.gguf", "qwen3")
    shutil.copyfile(other, path)  # same path, new content: size/mtime change
    assert read(path) == read_file(path) != first


def test_plugins_lists_builtin_backends(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "plugins", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert {b["name"] for b in doc["backends"]} >= {"gguf", "hf"}
    assert doc["broken"] == []


def test_entry_point_scan_agrees_with_importlib_metadata() -> None:
    from importlib.metadata import entry_points

    from kvadvise.plugins import GROUP, _entry_points

    assert sorted(_entry_points(GROUP)) == sorted((ep.name, ep.value) for ep in entry_points(group=GROUP))


def test_given_ctx_against_a_budget_fits_or_exits_3(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--ctx", "32768", "--vram", "8GiB", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] is True
    assert doc["budget"]["budget_bytes"] == 8 * 1024 * MIB - 1024 * MIB  # minus llama.cpp's 1024 MiB fit margin
    assert doc["config"]["device"] == "cuda" and doc["memory"]["overhead_bytes"] > 0
    assert doc["memory"]["device_bytes"] + doc["memory"]["host_bytes"] == doc["memory"]["total_bytes"]
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--ctx", "32768", "--vram", "1500MiB", "--json")
    assert rc == 3 and json.loads(out)["fits"] is False


def test_recommends_when_ctx_is_not_given(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "gguf", str(gemma_path), "--gpu", "rtx 3060", "--use", "code", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] is True
    assert doc["target_ctx"] == 32768 and doc["config"]["n_ctx"] == 32768
    assert (doc["config"]["type_k"], doc["config"]["type_v"]) == ("f16", "f16")  # f16 reaches the target: preferred
    assert [o["type_k"] + "/" + o["type_v"] for o in doc["options"]] == [
        "f16/f16",
        "q8_0/q8_0",
        "q8_0/q4_0",
        "q4_0/q4_0",
    ]
    assert doc["reasons"] and doc["budget"]["source"].startswith("profile:")


def test_llamacpp_prints_the_server_command(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "llamacpp", str(gemma_path), "--vram", "3GiB", "--target-ctx", "16384", "--chart")
    assert rc == 0
    assert f"llama-server -m {gemma_path} -c 16384 -np 1 -fa on -ctk f16 -ctv f16 -ngl 999" in out
    assert "budget" in out and "f = f16" in out  # the chart


def test_min_ctx_unreachable_exits_3(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "1200MiB", "--min-ctx", "32768")
    assert rc == 3 and "min-ctx" in err and "hint" in err


def test_llamacpp_json_has_the_command_and_refuses_to_write_what_does_not_fit(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["llamacpp", str(gemma_path), "--ctx", "4096", "-fa", "on", "--no-hardware", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    ls = doc["llama_server"]
    assert ls["command"] == f"llama-server -m {gemma_path} -c 4096 -np 1 -fa on -ctk f16 -ctv f16 -ngl 0"
    assert ls["env"]["LLAMA_ARG_CTX_SIZE"] == "4096" and ls["offload_command"] is None
    env = tmp_path / "llama.env"
    rc = main(["llamacpp", str(gemma_path), "--vram", "1GiB", "--write-env", str(env)])
    assert rc == 3 and not env.exists()
    assert "not written" in capsys.readouterr().err


def test_chart_that_cannot_be_drawn_says_why(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gguf", str(gemma_path), "--ctx", "4096", "--no-hardware", "--chart"]) == 0
    assert "no chart: it needs a budget" in capsys.readouterr().err


def test_hf_weights_bytes_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Path(__file__).parent / "data" / "hf" / "qwen3-coder-30b.json"
    rc = main(["hf", str(cfg), "--weights-bytes", "19000000000", "--ctx", "32768", "--no-hardware", "--json"])
    assert rc == 0
    assert "weights: 19,000,000,000 B from --weights-bytes" in json.loads(capsys.readouterr().out)["model"]["notes"]


def test_hf_weights_bytes_past_int64_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--weights-bytes 99999999999999999999 planned 1e20 bytes of weights; a size past int64 (8 EiB) is refused,
    as --vram's is (kvadvise.units.MAX_SIZE_BYTES)."""
    cfg = Path(__file__).parent / "data" / "hf" / "qwen3-coder-30b.json"
    assert main(["hf", str(cfg), "--weights-bytes", "99999999999999999999", "--no-hardware"]) == 2
    assert "--weights-bytes" in capsys.readouterr().err
    assert main(["hf", str(cfg), "--weights-bytes", str(2**63 - 1), "--no-hardware", "--ctx", "4096"]) == 0


@pytest.mark.parametrize(("typed", "told"), [("-ngl", "-ngl"), ("-ngl5", "-ngl5"), ("-xyz", "-xyz")])
def test_an_unknown_short_option_is_named_as_typed(
    typed: str, told: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise llamacpp m.gguf -ngl 99` (llama.cpp's flag) said "No such option '-n'": click reads -ngl as -n -g -l
    and names the first letter, which the user never typed. The option is named as typed (exit 2, one line); the
    layers are kvadvise's to plan (-ngl is in the command it prints)."""
    rc = main(["llamacpp", str(gemma_path), typed, "99"])
    err = capsys.readouterr().err
    assert rc == 2 and f"No such option '{told}'" in err and "'-n'" not in err, err
    assert len(err.strip().splitlines()) <= 2


def test_a_unified_cache_keeps_the_context_given(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-c 2048 -np 40 -kvu: one cache of 2,048 cells the 40 slots share (llama_context: n_ctx_seq = n_ctx when
    kv_unified). With a card, --ctx alone was planned per slot (256 x 40 = -c 10240, a cache five times the one
    llama.cpp makes), the headline said "51 tokens x 40 slots" and the settings line dropped -kvu."""
    for hw in (["--no-hardware"], ["--gpu", "4090"]):
        assert main(["gguf", str(gemma_path), "--ctx", "2048", "-np", "40", "-kvu", *hw, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["config"]["n_ctx"], doc["config"]["kv_unified"]) == (2048, True), hw
        full = [c for c in doc["memory"]["caches"] if c["kind"] == "kv"]
        assert [c["cells"] for c in full] == [2048], hw
        assert main(["gguf", str(gemma_path), "--ctx", "2048", "-np", "40", "-kvu", *hw]) == 0
        out = capsys.readouterr().out
        assert "2,048 tokens shared by 40 slots" in out and " -kvu" in out, out


def test_a_partial_plans_headline_counts_the_slots(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The headline of a plan that runs with part on the CPU named one slot's tokens alone: -c 32768 -np 4 said
    "8,192 tokens, K/V f16, part on the CPU" over a command of -c 32768 -np 4, and with -kvu (one cache of
    32,768 cells the four share) the same 8,192. It now says what the plan without the CPU says."""
    common = ["gguf", str(gemma_path), "--ctx", "32768", "-np", "4", "-ctk", "f16", "-ctv", "f16"]
    # the GPU alone does not hold it: part on the CPU (1,700 MiB: the CPU layers' attention runs on the GPU for prompt
    # batches with copies of their K and V, memory.cpu_layers_attention_bytes; at 1,600 MiB only with -np 4 alone)
    hw = ["--vram", "1700MiB", "--ram", "16GiB", "--allow-cpu"]
    for more, said in (([], "8,192 tokens x 4 slots"), (["-kvu"], "32,768 tokens shared by 4 slots")):
        assert main([*common, *more, *hw]) == 0
        head, _, rest = capsys.readouterr().out.partition("\n")
        assert head.endswith(f": {said}, K/V f16, part on the CPU"), head
        assert "-c 32768 -np 4 " in rest, rest


def test_a_budget_the_margin_takes_whole_says_so(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--vram 1GiB with llama.cpp's 1,024 MiB margin leaves 0 bytes for the model: the reason said "the GPU has
    0.00 GiB" and no more; it says where the memory went, and which option moves it."""
    assert main(["gguf", str(gemma_path), "--vram", "1GiB", "--gpu-only", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["budget"]["budget_bytes"] == 0 and doc["budget"]["margin_bytes"] == 1 << 30
    said = [r for r in doc["reasons"] if r.startswith("does not fit")]
    assert said and said[0].endswith(
        "the GPU has 0.00 GiB (1.00 GiB free, all of it the 1,024 MiB margin kept free; --margin sets the margin)"
    ), said
    assert main(["gguf", str(gemma_path), "--vram", "1GiB", "--gpu-only", "--margin", "0", "--json"]) == 0
    capsys.readouterr()
