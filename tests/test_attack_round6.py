"""Round 6 of the red team (a reviewer in its own worktree): the files several models are written to, compare's
card flags, the Python API's RunConfig, and the verifiers fed what a server or a binary should never say. Each test
reproduces one defect of the code at cb53101, where it fails; its docstring gives the command and what was wrong."""

from __future__ import annotations

import hashlib
import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_internal_error as _no_internal_error
from attack_helpers import no_server, run  # noqa: F401  (no_server: an autouse fixture)
from attack_helpers import one_line_input_error as _one_line_input_error
from ollama_fake import FakeOllama, build_store, ps_entry, running_fake
from tinymodels import write_tiny_gguf

GiB = 1 << 30


def _store(root: Path, models: list[tuple[str, str, str, dict[str, int]]]) -> Path:
    """An Ollama store of header-only qwen3 GGUFs: (namespace, model, tag, dims) each, each its own blob (the
    blob's name is a made-up digest: the store checks a digest's form, never the bytes)."""
    for ns, model, tag, dims in models:
        gguf = write_tiny_gguf(
            root.parent / f"{ns}-{model}-{tag}.gguf",
            "qwen3",
            dims=dims,
            sparse=True,
            n_ctx_train=131072,
            name=f"{ns}-{model}-{tag}",
        )
        build_store(
            root, gguf, hashlib.sha256(f"{ns}/{model}:{tag}".encode()).hexdigest(), namespace=ns, model=model, tag=tag
        )
    return root


BIG = dict(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=12288)  # an 8B's shape, f16: 15 GiB
SMALL = dict(n_layer=28, n_embd=2048, n_head=16, n_head_kv=8, head=128, n_ff=6144)  # a 1.7B's shape


# --- 1. two helpers given one Modelfile name -------------------------------------------------------------------


def test_two_models_never_share_one_created_name_or_modelfile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvadvise ollama big alice/helper bob/helper --gpu rtx-4090 --write-modelfiles mf` (two users' models of one
    name, both given their own 4k context): the plan prints `ollama create helper-4k -f helper-4k.Modelfile` twice
    and "then ask for helper-4k, helper-4k by these names" (backends/ollama/config.py created_name drops the
    namespace), and the write fails with "mf/helper-4k.Modelfile already exists" (exit 2) for a file that did not
    exist: both Modelfiles have one path, and kvadvise.files.check_targets keys its same-file check by option, so
    two files of --write-modelfiles are never compared. With --force it is worse: "wrote mf/helper-4k.Modelfile"
    twice, exit 0, and only bob's is there (FROM bob/helper:latest): alice's Modelfile is lost, and following the
    steps, `ollama create helper-4k` replaces one model with the other. Expected: a name (and a file) per model."""
    store = _store(
        tmp_path / "models",
        [("library", "big", "latest", BIG), ("alice", "helper", "latest", SMALL), ("bob", "helper", "latest", SMALL)],
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    folder = tmp_path / "mf"
    args = ["ollama", "big", "alice/helper", "bob/helper", "--gpu", "rtx-4090", "--write-modelfiles", str(folder)]
    rc, out, err = run(capsys, *args)
    assert "evicts" in out and "(its own: alice-helper-4k)" in out, out  # the setting: both helpers get their own 4k
    created = [ln.split()[2] for ln in out.splitlines() if ln.strip().startswith("ollama create ")]
    assert len(created) == len(set(created)), f"one name for two models: {created}"
    assert rc in (0, 3), err
    written = sorted(folder.glob("*.Modelfile"))
    froms = sorted(ln for f in written for ln in f.read_text().splitlines() if ln.startswith("FROM "))
    assert froms == ["FROM alice/helper:latest", "FROM bob/helper:latest"], (froms, err)


# --- 2. and 3. two models whose names become one section -------------------------------------------------------


@pytest.fixture
def colon_and_dash_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """qwen3:8b and qwen3-8b:latest, two different models (two blobs)."""
    small = dict(n_layer=4, n_embd=1024, n_head=8, n_head_kv=4, head=128, n_ff=2048)
    store = _store(tmp_path / "models", [("library", "qwen3", "8b", small), ("library", "qwen3-8b", "latest", small)])
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def test_the_llama_swap_config_of_two_models_named_alike_is_written_or_refused(
    colon_and_dash_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama qwen3:8b qwen3-8b --gpu rtx-4090 --write-llama-swap swap.yaml` (two models of the store,
    `ollama cp`/`ollama create` names): exit 1, "kvadvise: internal error: ValueError: llama-swap: every group member
    must be one model of the config, in one group only". kvadvise.runtime.router.section_name turns both into
    "qwen3-8b" and backends/ollama/together_files.llama_swap_text hands config_text two models of one name, which
    it refuses with a bare ValueError. docs/exit-codes.md: exit 1 is a bug. Expected: a config with a name for each
    model (llama-swap model IDs are free text), or a one-line input error (exit 2)."""
    target = tmp_path / "swap.yaml"
    args = ["ollama", "qwen3:8b", "qwen3-8b", "--gpu", "rtx-4090", "--write-llama-swap", str(target)]
    rc, _, err = run(capsys, *args)
    _no_internal_error(rc, err)
    if rc == 2:
        _one_line_input_error(rc, err)
        return
    import yaml

    doc = yaml.safe_load(target.read_text())
    assert len(doc["models"]) == 2, doc["models"].keys()


def test_the_router_preset_never_holds_one_section_twice(
    colon_and_dash_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama qwen3:8b qwen3-8b --gpu rtx-4090 --write-preset models.ini`: exit 0, "wrote models.ini", and
    the preset holds `[qwen3-8b]` twice, each with its own `model = .../blobs/sha256-...` (router.section_name makes
    one name of `qwen3:8b` and `qwen3-8b:latest`). llama-server's preset loader reads an INI file: the second
    section's keys land on the first, so the router serves one of the two models and the other cannot be asked
    for, although the output says "--models-max 2: all 2 models fit in memory together". Expected: a section per
    model (or a one-line refusal, exit 2)."""
    target = tmp_path / "models.ini"
    rc, _, err = run(capsys, "ollama", "qwen3:8b", "qwen3-8b", "--gpu", "rtx-4090", "--write-preset", str(target))
    _no_internal_error(rc, err)
    if rc == 2:
        _one_line_input_error(rc, err)
        assert not target.exists()
        return
    sections = [ln for ln in target.read_text().splitlines() if ln.startswith("[")]
    assert len(sections) == len(set(sections)) == 2, sections


# --- 4. and 5. compare's card flags ------------------------------------------------------------------------------


def test_compare_plans_every_card_a_repeated_gpu_names(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise compare qwen3:8b --gpu rtx-4090 --gpu rtx-3060`: one row, rtx-3060 (exit 0): the first card is
    dropped without a word (advisor/cli/compare.py declares --gpu a single TEXT option, so click keeps the last).
    The plan commands take a repeated --gpu as a list (docs/commands.md: "`--gpu 4090 --gpu 3090` (repeated: a
    list)"), and compare's help says "Cards of `kvadvise gpus`, comma-separated". Expected: both cards compared, as
    `--gpu rtx-4090,rtx-3060` does, or the repetition refused (exit 2); never a card silently left out."""
    rc, out, err = run(capsys, "compare", "qwen3:8b", "--gpu", "rtx-4090", "--gpu", "rtx-3060", "--json")
    if rc == 2:
        _one_line_input_error(rc, err)
        return
    assert rc == 0, err
    cards = [c["card"] for c in json.loads(out)["cards"]]
    assert cards == ["rtx-4090", "rtx-3060"], cards


def test_compare_refuses_a_decimal_vram_as_every_other_command_does(
    gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise compare qwen3:8b --vram 24GB`: exit 0, a card labelled "22.3517 GiB" (and its decode columns "-"),
    where `kvadvise gguf/llamacpp/ollama ... --vram 24GB` is refused: "GB is decimal (22.35 GiB); memory is sold in
    binary units (a 24 GB card has 24 GiB)" (docs/commands.md, --vram: "`24GB` is refused with a hint"). compare's
    --vram is parsed with flags.SIZE instead of flags.VRAM_SIZE, and its error message even invites "24GB (GiB/MiB/KiB
    binary, GB/MB/KB decimal)". Expected: the same refusal and hint as the other commands (exit 2)."""
    rc, _, err = run(capsys, "gguf", str(gemma_path), "--vram", "24GB")
    _one_line_input_error(rc, err)
    assert "24GiB" in err
    rc, _, err = run(capsys, "compare", "qwen3:8b", "--vram", "24GB")
    _one_line_input_error(rc, err)
    assert "24GiB" in err


# --- 6. verify ollama: a model of 10^30 bytes --------------------------------------------------------------------


@pytest.mark.parametrize(("size", "size_vram"), [(10**30, 10**30), (-1, 10 * GiB), (10 * GiB, -5)])
def test_a_servers_model_size_out_of_range_is_an_unexpected_payload(
    size: int, size_vram: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify ollama qwen3:8b --num-ctx 4096` against a server whose /api/ps says `"size": 1e30,
    "size_vram": 1e30`: exit 0, "fits: 100% GPU", "1000000000000000000000.0 GB ... reported - predicted =
    +999,999,999,999,999,983,222,784 MB"; with `"size": -1`: "Unknown, -0.0 GB", exit 3 as a model that "does not fit
    as asked". backends/ollama/api.py running_models range-checks context_length (round 5) but takes any size and
    size_vram (Ollama's are a uint64 byte count of a model that loaded). Expected: exit 4, "answered /api/ps with an
    unexpected payload", as for a context_length of -1."""
    entry = ps_entry("qwen3:8b", size=size, size_vram=size_vram, context_length=4096, family="qwen3")
    with running_fake(FakeOllama(running=[entry])) as fake:
        rc, out, err = run(capsys, "verify", "ollama", "qwen3:8b", "--host", fake.url, "--num-ctx", "4096")
    assert rc == 4, (rc, out)
    assert "unexpected payload" in err and "internal error" not in err, err


# --- 7. the Python API's RunConfig --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"spec_draft_n_max": None},  # TypeError: '<=' not supported between 'int' and 'NoneType'
        {"n_outputs_max": "512"},  # TypeError
        {"llama_build": "b8000"},  # TypeError
        {"tensor_split": None},  # TypeError: 'NoneType' object is not iterable
        {"tensor_split": 3},  # TypeError: 'int' object is not iterable
        {"mmproj": "mmproj.gguf"},  # AttributeError in estimate(): 'str' object has no attribute 'tensors'
    ],
    ids=lambda f: ",".join(f"{k}={v!r}" for k, v in f.items()),
)
def test_a_run_config_of_the_wrong_types_is_a_domain_error(gemma_path: Path, fields: dict[str, Any]) -> None:
    """`kvadvise.estimate(spec, kvadvise.RunConfig(spec_draft_n_max=None))` (likewise n_outputs_max="512",
    llama_build="b8000", tensor_split=None or 3, or mmproj="mmproj.gguf", a path where a ProjectorSpec goes) raises
    TypeError or AttributeError from inside (planner/memory.py RunConfig.__post_init__ compares without checking the
    type; estimate() reads mmproj.tensors). docs/python-api.md: "a wrong one raises kvadvise.errors.InputError (or
    ConfigError ...) never an AttributeError from inside"; RunConfig(n_ctx="x") already raises ConfigError.
    Expected: a KvadviseError (exit 2) naming the field."""
    import kvadvise
    from kvadvise.errors import KvadviseError

    spec = kvadvise.load_model(str(gemma_path))
    try:
        kvadvise.estimate(spec, kvadvise.RunConfig(**fields))
    except KvadviseError as e:
        assert e.exit_code == 2 and next(iter(fields)) in e.message, e.message
    except Exception as e:  # the defect: any other exception
        pytest.fail(f"{type(e).__name__}: {e}")
    else:
        pytest.fail(f"RunConfig({fields}) was planned")


# --- 8. verify --attach: a /props that says nothing is no agreement ----------------------------------------------


@pytest.fixture
def props_server() -> Iterator[tuple[list[dict[str, Any]], str]]:
    """A loopback server answering GET /props with the payload the test puts in the list."""
    payload: list[dict[str, Any]] = [{}]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(payload[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield payload, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_attach_never_agrees_on_a_context_the_server_did_not_give(
    props_server: tuple[list[dict[str, Any]], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 --attach 127.0.0.1:PORT` against a server whose /props holds
    `model_path` and nothing else (no default_generation_settings.n_ctx, no total_slots; or an n_ctx of "4096" or
    -1): exit 0, "llama-server at ... runs the plan's context and slots". advisor/runtime/serverport.py _props
    leaves n_ctx/n_slots None when they are missing or malformed, and attach_checks skips what is None, so nothing
    was compared and agreement is printed. docs/commands.md: --attach "asks the running server's /props ... for
    its model, context per slot and slots and compares them with the plan (exit 3 when they differ)". Expected:
    never that it runs the plan's context when it did not say its context (exit 3 or 4, or a note that it could
    not be compared, without the agreement line and exit 0)."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    payload, where = props_server
    for props in (
        {"model_path": str(model)},
        {"model_path": str(model), "default_generation_settings": {"n_ctx": "4096"}, "total_slots": 1},
        {"model_path": str(model), "default_generation_settings": {"n_ctx": -1}, "total_slots": 1},
    ):
        payload[0] = props
        rc, out, err = run(capsys, "verify", "llamacpp", str(model), "--ctx", "4096", "--attach", where)
        _no_internal_error(rc, err)
        assert not (rc == 0 and "runs the plan's context" in out + err), (props, out, err)


# --- 9. verify --log: no "offloaded" line is no "0 layers on the CPU" -------------------------------------------


def test_a_log_without_the_offload_line_does_not_say_zero_layers_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify llamacpp q3.gguf --ctx 4096 --log server.log` with a log that holds the buffer lines of a
    CUDA run (`load_model: loading model`, the model, KV and compute buffers) but not `load_tensors: offloaded N/M
    layers to GPU` (a log cut by grep, journalctl's rate limit, a tail): the verdict is "does not fit: 0 layers on
    the CPU", exit 3. advisor/runtime/verification.py compare: gpu_layers and total_layers None, so all_on_gpu is
    False and cpu_layers = 0 - 0. The line contradicts itself: nothing says a layer is on the CPU, and nothing says
    the plan did not fit. Expected: a verdict that says the layers are not in the log, never "0 layers on the CPU"
    beside "does not fit"."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    log = tmp_path / "server.log"
    log.write_text(
        "load_model: loading model '/models/q3.gguf'\n"
        "load_tensors:        CUDA0 model buffer size =     1.57 MiB\n"
        "llama_kv_cache:      CUDA0 KV buffer size =     4.00 MiB\n"
        "llama_context:      CUDA0 compute buffer size =     6.50 MiB\n"
        "llama_context:  CUDA_Host compute buffer size =     0.02 MiB\n"
    )
    rc, out, err = run(capsys, "verify", "llamacpp", str(model), "--ctx", "4096", "--log", str(log))
    _no_internal_error(rc, err)
    assert "0 layers on the CPU" not in out, out


# --- 10. verify quality: figures that are no numbers ----------------------------------------------------------


@pytest.mark.parametrize("kld", [".", "1.2.3", "1e999"])
def test_llama_perplexity_figures_that_are_no_finite_number_are_a_failed_run(
    kld: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise verify quality q3.gguf -ctk q8_0 -ctv q8_0 --llama-perplexity ./llama-perplexity --json` where the
    binary's KL-divergence run prints `Mean    KLD:   .` (or `1.2.3`): exit 1, "internal error: ValueError: could
    not convert string to float: '.'" (backends/llamacpp/perplexity.py parse: the pattern `-?[\\d.]+` matches what
    float() refuses). With `1e999` the run is "measured": --json prints `"mean_kld": Infinity`, which is not JSON
    (`jq` refuses it), and the figure is saved to kv-quality.json for later plans. docs/commands.md: exit 3 "when a
    run fails"; docs/json.md: --json is one JSON object. Expected: exit 3 (the run printed no usable figure), never
    exit 1 nor a non-finite number in the JSON."""
    model = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")
    fake = tmp_path / "llama-perplexity"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --kl-divergence) KL=1;; esac; done\n'
        'echo "perplexity: computing over 3 chunks, n_ctx=1024, batch_size=1024" >&2\n'
        'if [ -z "$KL" ]; then echo "Final estimate: PPL = 10.0 +/- 0.1" >&2; exit 0; fi\n'
        f'echo "Mean    KLD:   {kld} ±   0.000012" >&2\n'
        'echo "99.0%   KLD:   0.010000" >&2\n'
        'echo "Same top p: 99.500 ± 0.100 %" >&2\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    args = ["verify", "quality", str(model), "-ctk", "q8_0", "-ctv", "q8_0", "--llama-perplexity", str(fake)]
    rc, out, err = run(capsys, *args, "--json")
    _no_internal_error(rc, err)
    if out.strip():
        json.loads(out, parse_constant=lambda c: pytest.fail(f"not JSON: {c} in --json"))
    assert rc == 3, (rc, out, err)


# --- 11. /api/show: a tensor of 2^124 elements ----------------------------------------------------------------


def test_a_shown_tensor_past_any_models_size_is_an_unexpected_payload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvadvise ollama mymodel --host URL --gpu rtx-4090` against a server whose /api/show lists a tensor of shape
    [2^62, 2^62]: exit 3, a plan of 85,070,591,730,234,615,865,843,651,857,942,842,880 bytes of weights that "does not
    fit" at 256 tokens. backends/ollama/api.py _tensor takes any positive dimensions (a GGUF file bounds them by its
    size; a server's list is bounded by nothing), as it took a context_length of 10^30 before round 5 (now "answered
    /api/show ... is 1,000,...,000, more than llama.cpp's -c takes", exit 2). Expected: the payload refused (exit 4,
    "unexpected payload", or exit 2 naming the tensor), never a plan of 10^37 bytes."""
    from ollama_fake import show_payload

    from kvadvise.model.gguf import read_file

    show = show_payload(read_file(write_tiny_gguf(tmp_path / "q3.gguf", "qwen3")))
    show["tensors"][0]["shape"] = [2**62, 2**62]
    with running_fake(FakeOllama(shows={"mymodel:latest": show})) as fake:
        rc, _, err = run(capsys, "ollama", "mymodel", "--host", fake.url, "--gpu", "rtx-4090", "--json")
    assert rc in (2, 4), (rc, err)
    assert "internal error" not in err, err
