"""benchmarks/gpu_truth.sh (issue 17): the GPU run is prepared here and dry-run on the CPU, so it cannot rot.

The CUDA half (build with nvcc, NVML) needs the GPU machine; ``--cpu`` runs the same driver, the same
kvadvise command line and the same output files with a small matrix on the tests' CPU llama-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_truth  # noqa: E402
from cuda_truth import check_run  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def carry(real_llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gpu_truth.sh --prepare` as the device run gets it (without the wheels: this Python has kvadvise)."""
    carry = tmp_path_factory.mktemp("carry")
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "prepare", "--no-wheels", "--carry", str(carry)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stdout + p.stderr  # 1: a travel-size warning
    return carry


@pytest.fixture(scope="module")
def cpu_run(
    real_llama_server: Path, carry: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict], str]:
    tmp = tmp_path_factory.mktemp("gpu_truth")
    out = tmp / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    cmd = [
        "bash",
        str(ROOT / "benchmarks" / "gpu_truth.sh"),
        "--cpu",
        "--out",
        str(out),
        "--work",
        str(tmp / "work"),
        "--carry",
        str(carry),
        "--llama-server",
        str(real_llama_server),
        "--deadline",
        "600",
        "--run-timeout",
        "300",  # a loaded 2-core CI machine: the Gemma 3 270M run alone took 23 s on a busy one
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=700)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "gpu_truth.jsonl").read_text().splitlines()]
    return out, rows, p.stdout


def test_cpu_run_writes_the_files_the_device_tool_brings_back(cpu_run: tuple[Path, list[dict], str]) -> None:
    out, _, _ = cpu_run
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == ["gpu_truth.jsonl", "gpu_truth.txt", "gpu_truth_logs.tar.gz"]
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 * MIB for f in files)


def test_cpu_run_provenance(cpu_run: tuple[Path, list[dict], str]) -> None:
    _, rows, _ = cpu_run
    prov = rows[0]
    assert prov["kind"] == "provenance" and prov["mode"] == "cpu"
    for key in (
        "started_at",
        "host",
        "cpus",
        "platform",
        "python",
        "gpu",
        "nvidia_smi",
        "nvcc",
        "llama_cpp_source",
        "kvadvise_git",
        "deadline_s",
        "argv",
    ):
        assert key in prov, key
    server = next(r for r in rows if r["kind"] == "server")
    assert "version:" in server["version"]
    install = next(r for r in rows if r["kind"] == "install")
    assert install["cli"] and install["version"].startswith("kvadvise")
    models = {r["name"]: r for r in rows if r["kind"] == "model"}
    assert set(models) == {"gemma-270m", "qwen3", "gemma3-swa"}
    assert models["gemma3-swa"]["arch"] == "gemma3" and models["qwen3"]["bytes"] > 0
    # the real Gemma 3 270M travels as its header: rebuilt at its real size, zeros for weights
    assert models["gemma-270m"]["bytes"] == 253_113_024 and models["gemma-270m"]["weights"] == "zeros"


def test_cpu_run_measured_equals_predicted_kv(cpu_run: tuple[Path, list[dict], str]) -> None:
    _, rows, _ = cpu_run
    runs = [r for r in rows if r["kind"] == "run"]
    assert [r["id"].split("-", 1)[1] for r in runs] == [
        "gemma-270m-kf16-vf16-faon-np1-ub512-c1100",
        "qwen3-kf16-vf16-faon-np1-ub512-c1000",
        "qwen3-kq8_0-vq8_0-faon-np2-ub256-c2100",
        "gemma3-swa-kq8_0-vf16-faoff-np1-ub512-c1000",
    ]
    for r in runs:
        assert r["ok"], r.get("error")
        assert r["rc"] == 0
        v = r["verify"]
        # llama.cpp prints sizes as %.2f MiB: measured bytes are exact to 0.005 MiB per printed buffer
        n_kv = sum(b["kind"] == "KV" for b in r["buffers"])
        for key in ("k_bytes", "v_bytes", "kv_bytes", "recurrent_bytes"):
            assert abs(v["measured"][key] - v["memory"][key]) <= n_kv * 0.005 * MIB, (r["id"], key)
        assert v["measured"]["kv_bytes"] > 0
        assert r["prompt_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
        # every buffer line of the raw log, and the server's own command line (through the wrapper)
        kinds = {(b["buft"], b["kind"]) for b in r["buffers"]}
        assert {("CPU", "KV"), ("CPU", "compute")} <= kinds, kinds
        assert r["cache_summaries"] and r["server_command"]
        c = r["config"]
        assert f"-c {c['ctx']} -np {c['np']}" in r["server_command"] and "--fit off" in r["server_command"]
        assert r["nvml"] == {"nvml": None} or "device_used_peak_bytes" in r["nvml"]  # no GPU here, or sampled
    summary = rows[-1]
    assert summary["kind"] == "summary" and summary["runs"] == 4 and summary["failed"] == 0


def test_cpu_run_rows_hold_the_cuda_bars(cpu_run: tuple[Path, list[dict], str]) -> None:
    """The check the CUDA rows will get (tests/cuda_truth.py), on the CPU rows: it holds, and a row that
    misses by more than the bar is named."""
    import copy

    _, rows, _ = cpu_run
    runs = [r for r in rows if r["kind"] == "run"]
    assert [p for r in runs for p in check_run(r)] == []
    off = copy.deepcopy(runs[1])
    compute = next(b for b in off["buffers"] if b["kind"] == "compute")
    compute["mib"] += 17 + 0.03 * compute["mib"]
    off["verify"]["measured"]["v_bytes"] += 1 << 20
    problems = check_run(off)
    assert len(problems) == 2, problems
    assert "compute predicted" in problems[1] and "v_bytes predicted" in problems[0]


def test_cpu_run_archives_every_log(cpu_run: tuple[Path, list[dict], str]) -> None:
    out, rows, _ = cpu_run
    with tarfile.open(out / "gpu_truth_logs.tar.gz") as tar:
        names = set(tar.getnames())
        for r in (r for r in rows if r["kind"] == "run"):
            assert r["log"] in names
            text = tar.extractfile(r["log"]).read().decode()
            assert "KV buffer size" in text
    table = (out / "gpu_truth.txt").read_text().splitlines()
    assert len(table) == 1 + 4 and all("| yes |" in line for line in table[1:])


def test_gpu_matrix() -> None:
    names = [m[0] for m in gpu_truth.GPU_MODELS]
    m = gpu_truth.matrix(names, cpu=False)
    assert [c["model"] for c in m[: len(names)]] == names  # every model runs first
    assert len({tuple(sorted(c.items())) for c in m}) == len(m)
    for c in m:
        assert c["ctx"] % 256, c  # not a multiple of 256: the padding shows
        assert c["ctx"] / c["np"] > 768, c  # room for the ~1000-token benchmark in every slot
        assert c["fa"] == "on" or c["ctv"] == "f16", c  # a quantized V needs flash attention
        if "mla" in c["model"]:
            assert c["ctk"] == c["ctv"], c
    seen = {(k, c[k]) for c in m for k in ("ctk", "fa", "np", "ub")}
    assert {
        ("ctk", "f16"),
        ("ctk", "q8_0"),
        ("ctk", "q4_0"),
        ("fa", "on"),
        ("fa", "off"),
        ("np", 1),
        ("np", 4),
        ("ub", 512),
        ("ub", 2048),
    } <= seen
    recipes = {r for _, r, _ in gpu_truth.GPU_MODELS}
    assert {"header", "big", "big-moe", "qwen3", "qwen3moe", "gemma3", "qwen35", "deepseek2-mla"} == recipes
    assert {c["model"] for c in m if c.get("ncmoe")} == {"moe-2g", "qwen3moe"}  # experts on the CPU


def test_big_model_is_over_1_gb() -> None:
    b = gpu_truth.BIG
    per_layer = 2 * b["n_embd"] * b["n_head"] * b["head"] + 2 * b["n_embd"] * b["n_head_kv"] * b["head"]
    per_layer += 3 * b["n_embd"] * b["n_ff"]
    total = 2 * (b["n_layer"] * per_layer + 2 * 32000 * b["n_embd"])  # f16, untied output
    assert total > 1e9


def test_prune_keeps_what_the_cuda_build_needs() -> None:
    keep = gpu_truth.keep
    for rel in (
        "CMakeLists.txt",
        "cmake/build-info.cmake",
        "ggml/src/ggml-cuda/fattn.cu",
        "ggml/src/ggml-cuda/template-instances/fattn-vec-instance-f16-f16.cu",
        "ggml/src/ggml-cpu/ops.cpp",
        "src/models/llama.cpp",
        "common/arg.cpp",
        "tools/server/server.cpp",
        "tools/ui/CMakeLists.txt",
        "tools/ui/ui.h.in",  # read by scripts/ui-assets.cmake even with LLAMA_BUILD_UI=OFF (the lost device run)
        "tools/ui/ui.cpp.in",
        "tools/ui/sources.cmake",
        "tools/fit-params/main.cpp",
        "tools/rpc/rpc-server.cpp",
        "tools/mtmd/clip.cpp",
        "scripts/ui-assets.cmake",
        "vendor/cpp-httplib/httplib.cpp",
        "LICENSE",
    ):
        assert keep(rel), rel
    for rel in (
        "docs/build.md",
        "models/ggml-vocab-llama-bpe.gguf",
        "tests/test-backend-ops.cpp",
        "examples/simple/simple.cpp",
        "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "ggml/src/ggml-metal/x.m",
        "tools/ui/src/app.ts",
        "tools/ui/static/favicon.svg",
        "tools/server/tests/unit/test_basic.py",
        "tools/mtmd/test-3.mp4",
        "convert_hf_to_gguf.py",
    ):
        assert not keep(rel), rel


def test_parse_log_reads_every_buffer_line() -> None:
    text = "\n".join([
        "load_tensors:   CPU_Mapped model buffer size =   125.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  1172.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.12 MiB",
        "llama_kv_cache:        CUDA0 KV buffer size =   250.00 MiB",
        "llama_kv_cache: size =  250.00 MiB (  4096 cells,   8 layers,  1/1 seqs), K (f16):  125.00 MiB, V (f16):  125.00 MiB",
        "sched_reserve:      CUDA0 compute buffer size =   300.75 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    40.02 MiB",
        "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:05.0) - 142000 MiB free",
    ])  # fmt: skip
    got = gpu_truth.parse_log(text)
    assert len(got["buffers"]) == 6
    assert got["buffer_mib_by_type"]["CUDA0 compute"] == 300.75
    assert got["buffer_mib_by_type"]["CUDA_Host compute"] == 40.02
    assert got["devices"] == [{"device": "CUDA0", "name": "NVIDIA H200", "free_mib": 142000}]
    assert "4096 cells" in got["cache_summaries"][0]


def test_the_suites_llama_server_is_built_from_the_archive_that_travels(real_llama_server: Path, carry: Path) -> None:
    """One llama.cpp source (issue 24): `prepare` carries the very archive the suite built its
    llama-server, rpc-server and llama-fit-params from, byte for byte; so a CI run proves it builds."""
    if os.environ.get("KVADVISE_TEST_LLAMA_SERVER"):
        pytest.skip("KVADVISE_TEST_LLAMA_SERVER: a llama-server built elsewhere")
    from llama_server_build import built_from

    manifest = json.loads((carry / "manifest.json").read_text())
    built = built_from()
    assert (
        manifest["archive_sha256"]
        == built["archive_sha256"]
        == gpu_truth.source.sha256_file(carry / "llama.cpp.tar.gz")
    )
    assert manifest["llama_cpp_commit"] == built["llama_cpp_commit"] and manifest["llama_cpp_commit"]
    with tarfile.open(carry / "llama.cpp.tar.gz") as tar:
        names = set(tar.getnames())
    for rel in ("tools/ui/ui.h.in", "tools/ui/ui.cpp.in", "tools/ui/CMakeLists.txt", "scripts/ui-assets.cmake"):
        assert "llama.cpp/" + rel in names, rel
    assert not any(n.startswith("llama.cpp/tools/ui/src/") for n in names)
    # the binaries name their build as a release binary does (b11312 = 0c1e570): 'version: 0.5.0-dev (build
    # 11312, commit 0c1e570)', which plans can key on
    version = subprocess.run([str(real_llama_server), "--version"], capture_output=True, text=True).stderr
    assert f"(build {built['llama_cpp_build']}, commit {str(built['llama_cpp_commit'])[:7]})" in version, version
    for tool in ("rpc-server", "llama-fit-params"):
        assert real_llama_server.with_name(tool).is_file(), tool
