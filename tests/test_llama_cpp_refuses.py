"""Issue 28, class 4: plans llama.cpp refuses (or runs differently) are refused, or planned as llama.cpp
runs them, before anything is printed or written (llama.cpp 0c1e570, as vendored by llama-cpp-python
0.3.36).

- one ``--rpc`` endpoint given twice is one device (ggml-rpc.cpp ``ggml_backend_rpc_add_server`` keeps
  a map by endpoint, ggml-backend-reg.cpp registers a backend once): planned once, named once;
- a comma-joined or IPv6 ``--rpc`` endpoint (common/arg.cpp splits ``--rpc`` at commas; ggml-rpc
  ``parse_endpoint`` cuts the host at the first ``:`` and connects over IPv4) and a ``-ts`` share that
  ``std::stof`` cannot read (``1e-45``) or 16 shares are refused with exit 2;
- a ``--mmproj`` made for another model (tools/mtmd/mtmd.cpp: "mismatch between text model (n_embd = %d)
  and mmproj (n_embd = %d)") is refused before planning;
- Apple's and NVIDIA's cards in one process are refused (exit 2, with a hint).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from rpc_devices import devices, run_server
from tinymmproj import write_tiny_mmproj

from kvadvise.cli import main
from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.model.projector import projector_from_gguf

GIB = 1 << 30


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_one_rpc_endpoint_given_twice_is_one_device(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Planned as two devices with two budgets before; llama-server makes one device of it."""
    ep = "127.0.0.1:50052"
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--rpc", f"{ep}=8GiB", "--rpc", f"{ep}=8GiB", "--json")
    doc = json.loads(out)
    assert rc == 0, err
    assert [g["name"] for g in doc["hardware"]["gpus"]] == [f"RPC0[{ep}]"] and len(doc["memory"]["devices"]) == 1
    assert doc["budget"]["budget_bytes"] == 7 * GIB and doc["budget"]["device_budgets_bytes"] == []
    assert re.findall(r"--rpc (\S+)", doc["llama_server"]["command"]) == [ep]
    assert any("given more than once" in n for n in doc["hardware"]["notes"])
    rc, _, err = run(capsys, "llamacpp", str(gemma_path), "--rpc", f"{ep}=8GiB", "--rpc", f"{ep}=4GiB")
    assert rc == 2 and "given twice with different sizes" in err


def test_llama_server_makes_one_device_of_an_endpoint_given_twice(gemma_path: Path, real_llama_server: Path) -> None:
    """The premise, on real llama.cpp: --rpc A,A lists one RPC device and offloads every layer to it."""
    rpc_server = real_llama_server.with_name("rpc-server")
    if not rpc_server.exists():
        pytest.skip(f"no rpc-server beside {real_llama_server}")
    with devices(rpc_server, 1) as (ep,):
        log = run_server(real_llama_server, gemma_path, ["-c", "4096", "-np", "1", "-ngl", "999"], [ep, ep])
    assert len(re.findall(r"- RPC\d+\s*:", log)) == 1 and "offloaded 19/19 layers to GPU" in log
    assert len(set(re.findall(r"(RPC\d+\[[^\]]+\]) model buffer size", log))) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10.0.0.1:50052,10.0.0.2:50052=8GiB", "each HOST:PORT needs its own =SIZE"),
        ("10.0.0.1,10.0.0.2:50052=8GiB", "each HOST:PORT needs its own =SIZE"),
        ("10.0.0.1:50052=8GiB,", "each HOST:PORT needs its own =SIZE"),
        ("[::1]:50052=8GiB", "IPv6"),
        ("fe80::1:50052=8GiB", "IPv6"),
        ("host:0=8GiB", "the port is not 1-65535"),
        ("host:65536=8GiB", "the port is not 1-65535"),  # htons would connect to port 0
        (" :50052=8GiB", "not HOST:PORT=SIZE"),
    ],
)
def test_rpc_endpoints_llama_server_refuses_are_refused(
    value: str, message: str, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--rpc", value)
    assert rc == 2 and out == "" and message in err and len(err.strip().splitlines()) <= 3


def test_rpc_takes_a_list_as_llama_server_does(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--rpc a:1=8GiB,b:2=4GiB` (llama-server's comma list, each with its size) plans what two --rpc do."""
    # the RAM is given: this machine's free RAM, read twice moments apart, would differ between the two answers
    ram = ("--ram", "64GiB", "--json")
    listed = run(capsys, "llamacpp", str(gemma_path), "--rpc", "10.0.0.1:50052=8GiB,10.0.0.2:50052=4GiB", *ram)
    repeated = run(
        capsys, "llamacpp", str(gemma_path), "--rpc", "10.0.0.1:50052=8GiB", "--rpc", "10.0.0.2:50052=4GiB", *ram
    )
    assert listed[0] == 0 and listed[1] == repeated[1]
    names = [d["name"] for d in json.loads(listed[1])["memory"]["devices"]]
    assert [n.split("[")[1] for n in names[:2]] == ["10.0.0.1:50052]", "10.0.0.2:50052]"]  # by host:port


@pytest.mark.parametrize(
    ("split", "ok"),
    [
        ("1e-45,1", False),  # std::stof: below float32's smallest normal number, out_of_range
        ("1e-40,1", False),
        ("1.2e-38,1", True),
        ("0,1", True),
        ("3/1", True),  # llama.cpp splits at [,/]+
        (",".join(["1"] * 16), False),  # "got 16 input configs, but system only has 16 devices"
        # std::sregex_token_iterator gives no empty last part: llama-fit-params b11312 takes -ts 3,1, as 3,1 (exit
        # 0); an empty first part goes to std::stof ("error while handling argument -ts: stof", exit 1)
        ("3,1,", True),
        ("3,,1", True),
        (",3,1", False),
    ],
)
def test_tensor_split_as_llama_cpp_reads_it(
    split: str, ok: bool, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = len(re.split(r"[,/]+", split.rstrip(",/")))
    gpus = ",".join(["rtx-4090"] * n)
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--gpu", gpus, "-ts", split, "--ctx", "4096")
    if ok:
        assert rc == 0, err
        ts = re.search(r" -ts (\S+)", out)
        assert ts is not None and all(float(x) == 0 or float(x) >= 1.17549435e-38 for x in ts[1].split(","))
    else:
        assert rc == 2 and out == "" and ("std::stof" in err or "at most 15" in err or "15 shares" in err)


def test_a_projector_for_another_model_is_refused_before_planning(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemma 3 270M's embeddings are 640 wide; a projector made for a 64-wide model is refused (exit 2) and
    nothing is printed, where before it was planned and put in the command."""
    wrong = write_tiny_mmproj(tmp_path / "wrong.gguf", n_embd_text=64)
    right = write_tiny_mmproj(tmp_path / "right.gguf", n_embd_text=640)
    assert projector_from_gguf(read_file(wrong)).n_embd_text == 64
    assert from_gguf(read_file(gemma_path)).n_embd == 640
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), "--mmproj", str(wrong), "--ctx", "4096", "--no-hardware")
    assert rc == 2 and out == "" and "width 64" in err and "takes 640" in err and "mmproj" in err
    rc, out, _ = run(capsys, "llamacpp", str(gemma_path), "--mmproj", str(right), "--ctx", "4096", "--no-hardware")
    assert rc == 0 and f"--mmproj {right}" in out


def test_llama_server_exits_on_a_projector_for_another_model(
    gemma_path: Path, tmp_path: Path, real_llama_server: Path
) -> None:
    """The premise, on real llama.cpp: llama-server refuses the pair kvadvise now refuses."""
    wrong = write_tiny_mmproj(tmp_path / "wrong.gguf", n_embd_text=64)
    cmd = [str(real_llama_server), "-m", str(gemma_path), "--mmproj", str(wrong), "-c", "4096", "--port", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert p.returncode != 0 and "mismatch between text model (n_embd = 640) and mmproj (n_embd = 64)" in (
        p.stdout + p.stderr
    )


@pytest.mark.parametrize(
    "gpu",
    [
        ["--gpu", "m4-max-64gb,rtx-4090"],
        ["--gpu", "m4-max-64gb", "--gpu", "rtx-4090"],
        ["--gpu", "rtx-3090x2,m2-ultra-192gb"],
    ],
)
def test_apple_and_nvidia_cards_in_one_process_are_refused(
    gpu: list[str], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, "llamacpp", str(gemma_path), *gpu, "--ctx", "4096")
    assert rc == 2 and out == "" and "cannot run one llama.cpp process together" in err and "compare" in err
    # compare takes them as separate cards, side by side
    rc, out, err = run(capsys, "compare", str(gemma_path), "--gpu", "m4-max-64gb,rtx-4090", "--json")
    assert rc == 0, err
    assert [e["card"] for e in json.loads(out)["entries"]] == ["m4-max-64gb", "rtx-4090"]
