"""Round 8 of the red team (a reviewer in its own worktree): the Ollama side. What the plan claims against what
Ollama (server/sched.go, envconfig, llm/llama_server.go, server/create.go of the mirror, fb3076099687) really
does, this shell's OLLAMA_* variables in odd forms, the Modelfile Ollama builds from the one kvadvise writes, and
the printed steps. Each test reproduces one defect of the code at 8edc565, where it fails; its docstring gives the
command, what happened and what should happen."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import run
from ollama_fake import build_store, closed_port_url
from tinymodels import write_tiny_gguf

from kvadvise.backends.ollama.name import parse_name
from kvadvise.errors import InputError

BIG = dict(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head=128, n_ff=12288)  # an 8B's shape, f16: 15 GiB
SMALL = dict(n_layer=28, n_embd=2048, n_head=16, n_head_kv=8, head=128, n_ff=6144)  # a 1.7B's shape
# a repository name of the length Hugging Face GGUF repos reach (70 bytes: a valid Ollama model part, <= 80)
LONG_REPO = "Qwen3-Coder-30B-A3B-Instruct-1M-Unsloth-abliterated-uncensored-i1-GGUF"
assert len(LONG_REPO) == 70

# (host, namespace, model, tag, dims, params)
MODELS: list[tuple[str, str, str, str, dict[str, int], dict[str, Any] | None]] = [
    ("registry.ollama.ai", "library", "big", "latest", BIG, None),
    ("registry.ollama.ai", "library", "small", "latest", SMALL, None),
    ("registry.ollama.ai", "alice", "helper", "latest", SMALL, None),
    ("registry.ollama.ai", "library", "lowgpu", "latest", SMALL, {"num_gpu": 10, "temperature": 0.7}),
    ("registry.ollama.ai", "library", "bigbatch", "latest", SMALL, {"num_batch": 8192}),
    ("hf.co", "mradermacher", LONG_REPO, "i1-Q4_K_M", SMALL, None),
]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, (rc, err)
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ollama store of header-only qwen3 GGUFs (131,072-token training context), one blob each."""
    base = tmp_path_factory.mktemp("r8store")
    root = base / "models"
    for host, ns, model, tag, dims, params in MODELS:
        gguf = write_tiny_gguf(
            base / f"{ns}-{model}-{tag}.gguf", "qwen3", dims=dims, sparse=True, n_ctx_train=131072, name=model
        )
        digest = hashlib.sha256(f"{host}/{ns}/{model}:{tag}".encode()).hexdigest()
        build_store(root, gguf, digest, host=host, namespace=ns, model=model, tag=tag, params=params)
    return root


@pytest.fixture(autouse=True)
def _store(monkeypatch: pytest.MonkeyPatch, store_root: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())  # no server: the store alone
    monkeypatch.setenv("OLLAMA_MODELS", str(store_root))
    monkeypatch.chdir(tmp_path)


def _steps(out: str, prefix: str) -> list[list[str]]:
    """The printed apply steps that start with ``prefix``, split as sh splits them (comments dropped)."""
    return [shlex.split(ln, comments=True) for ln in out.splitlines() if ln.strip().startswith(prefix)]


# --- 1. a parameter "left out" of the Modelfile is still the created model's ------------------------------------


def test_a_left_out_num_gpu_is_still_the_created_models(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`kvadvise ollama lowgpu --gpu rtx-4090 --write-modelfile Modelfile` (a model whose params layer holds
    num_gpu 10, as `ollama create` leaves it after a `PARAMETER num_gpu 10`): the plan puts all 29 layers on the
    GPU ("fits 100% on the GPU") and the Modelfile says "# kvadvise: left out the model's parameter 'num_gpu' (the
    plan offloads every layer; the model's num_gpu would override it)", with FROM lowgpu:latest and no num_gpu
    line. But leaving it out does not remove it: `ollama create lowgpu-64k -f Modelfile` copies the base model's
    layers (server/create.go parseFromModel) and setParameters merges the base's params layer into the new one
    for every key the Modelfile does not set ("for k, v := range existing { if _, exists := p[k]; exists
    { continue }; p[k] = v }"). So lowgpu-64k keeps num_gpu 10, llm/llama_server.go passes `-ngl 10`, and 19 of
    29 layers run on the CPU, against the plan. Expected: the Modelfile overrides it (`PARAMETER num_gpu -1`, no
    -ngl: llama-server places the layers, or a count >= the layers)."""
    rc, out, err = run(capsys, "ollama", "lowgpu", "--gpu", "rtx-4090", "--write-modelfile", "Modelfile")
    assert rc == 0 and "fits 100% on the GPU" in out, (rc, err)
    text = (tmp_path / "Modelfile").read_text()
    values = [ln.split()[2] for ln in text.splitlines() if ln.startswith("PARAMETER num_gpu ")]
    assert values and all(v == "-1" or int(v) >= 29 for v in values), text


# --- 2. the default context Ollama runs on several GPUs ---------------------------------------------------------


def test_the_default_context_warning_counts_the_vram_of_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama small --gpu rtx-4090x2 --ctx 8k`: the model fits one card, so the plan is for one GPU
    (rightly: sched.go selectLlamaServerPlacement) and it warns "without these settings Ollama runs 32,768 tokens
    here (its default for this VRAM)". But Ollama's default num_ctx is a tier by the total VRAM of all GPUs
    (server/routes.go Serve: "for _, gpu := range gpus { totalVRAM += gpu.TotalMemory - ... }"; 262,144 from
    47 GiB), capped at the training context (131,072): two 4090s run 131,072 tokens, as `OLLAMA_SCHED_SPREAD=1`
    on the same command says. backends/ollama/advice.py takes default_num_ctx(plan.budget.total_bytes), the one
    GPU's. Expected: 131,072 (the tier of both cards)."""
    rc, out, err = run(capsys, "ollama", "small", "--gpu", "rtx-4090x2", "--ctx", "8k")
    assert rc == 0, err
    assert "Ollama runs it on one GPU" in out, out
    assert "Ollama runs 32,768 tokens here" not in out and "Ollama runs 131,072 tokens here" in out, out


# --- 3. OLLAMA_SCHED_SPREAD as Ollama reads a word -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", "on", "enabled"])
def test_sched_spread_set_to_a_word_spreads_as_ollama_reads_it(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_SCHED_SPREAD=yes kvadvise ollama small --gpu rtx-4090x2 --ctx 8k --json`: planned on one GPU, with
    the note "Ollama runs it on one GPU ...; OLLAMA_SCHED_SPREAD=1 on the server would spread it". Ollama reads
    the variable with envconfig.Bool = BoolWithDefault(k)(false): a value that is set but that strconv.ParseBool
    refuses is true ("b, err := strconv.ParseBool(s); if err != nil { return true }", envconfig/config.go), so
    "yes", "on", "enabled" spread the model over both GPUs (sched.go: "if !envconfig.SchedSpread() && ..."),
    as `OLLAMA_SCHED_SPREAD=1` does. kvadvise's envconfig.boolean returns the default for what ParseBool refuses
    (backends/ollama/envconfig.py). Expected: the plan of `=1`: both GPUs."""
    monkeypatch.setenv("OLLAMA_SCHED_SPREAD", value)
    doc = run_json(capsys, "ollama", "small", "--gpu", "rtx-4090x2", "--ctx", "8k")
    assert len(doc["memory"]["devices"]) == 2, (doc["memory"]["devices"], doc["notes"])


# --- 4. a quantized cache with flash attention off, as llama-server runs it ----------------------------------------


def test_installed_never_says_fits_for_a_cache_llama_server_refuses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_FLASH_ATTENTION=0 OLLAMA_KV_CACHE_TYPE=q8_0 kvadvise ollama --installed --gpu rtx-4090 --json`
    (the newest Ollama): the header says "flash attention off, cache q8_0 now" and every model "7.5 GiB at 32k
    f16: fits" (run_cache_type "f16", fits true). From 0.30 Ollama does not fall back to f16: llm/server.go passes
    OLLAMA_KV_CACHE_TYPE on (strings.ToLower, no check), llm/llama_server.go adds `--cache-type-k q8_0
    --cache-type-v q8_0` and, the variable being set to 0, `--flash-attn off` (LlamaServerFlashAttention), and
    llama.cpp refuses a quantized V cache without flash attention (llama_init_from_model), so no model loads.
    kvadvise knows it (`kvadvise ollama small big` with the same variables: "quantized V cache requires flash
    attention", exit 2), but advisor/planner/inventory.py fit_of falls back to f16 ("Ollama < 0.30 fell back").
    Expected: no row says it fits at a cache the server does not run (an error per row, or a refusal)."""
    monkeypatch.setenv("OLLAMA_FLASH_ATTENTION", "0")
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q8_0")
    rc, out, err = run(capsys, "ollama", "--installed", "--gpu", "rtx-4090", "--json")
    if rc == 2:  # refused, one line: also right
        assert err.startswith("kvadvise: error:") and "Traceback" not in err, err
        return
    doc = json.loads(out)
    wrong = [m["name"] for m in doc["models"] if m["fits"] and m["run_cache_type"] != "q8_0"]
    assert not wrong, (wrong, doc["settings"])


# --- 5. flags that this shell's OLLAMA_* variables beat -------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "flags", "key", "wanted"),
    [
        ("OLLAMA_NUM_PARALLEL", "4", ("-np", "1"), "num_parallel", 1),
        ("OLLAMA_FLASH_ATTENTION", "0", ("-fa", "on"), "flash_attention", True),
    ],
)
@pytest.mark.parametrize("listing", [False, True], ids=["several-models", "installed"])
def test_an_explicit_flag_overrides_this_shells_ollama_variable(
    variable: str,
    value: str,
    flags: tuple[str, str],
    key: str,
    wanted: object,
    listing: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`OLLAMA_NUM_PARALLEL=4 kvadvise ollama small alice/helper --gpu rtx-4090 --ctx 8k -np 1`: planned with 4
    slots ("OLLAMA_NUM_PARALLEL 4" in -v, settings.num_parallel 4), and the server settings it prints and
    --write-env writes say OLLAMA_NUM_PARALLEL=4, the opposite of what was asked. Likewise
    `OLLAMA_FLASH_ATTENTION=0 ... -fa on` plans flash attention off and writes OLLAMA_FLASH_ATTENTION=0, and
    `kvadvise ollama --installed -np 1` / `-fa on` lists "4 slots" / "flash attention off". docs/commands.md:
    "-np and -ctk are OLLAMA_NUM_PARALLEL and OLLAMA_KV_CACHE_TYPE; else this shell's OLLAMA_* variables", and for
    --installed "(-np N and -ctk T override them)". backends/ollama/together.py settings() takes -np only when it
    is not 1 ("o.n_parallel if o.n_parallel != 1 or not parallel") and -fa only when "off"; installed.py passes
    "r.n_parallel if r.n_parallel != 1 else None" and never reads -fa. Expected: the flag given wins."""
    monkeypatch.setenv(variable, value)
    if listing:
        doc = run_json(capsys, "ollama", "--installed", "--gpu", "rtx-4090", *flags)
        listed = {"num_parallel": "n_parallel", "flash_attention": "flash_attn"}[key]
        assert doc["settings"][listed] == wanted, doc["settings"]
    else:
        doc = run_json(capsys, "ollama", "small", "alice/helper", "--gpu", "rtx-4090", "--ctx", "8k", *flags)
        assert doc["settings"][key] == wanted, doc["settings"]


# --- 6. a one-slot plan and the slots the server already has ------------------------------------------------------


def test_a_one_slot_plan_pins_one_slot_on_the_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`OLLAMA_NUM_PARALLEL=4 kvadvise ollama big --gpu rtx-4090 --write-env big.env`: "65,536 tokens, K/V f16:
    fits 100% on the GPU" with 69 MiB spare, sized for one slot, and the env file holds OLLAMA_FLASH_ATTENTION=1
    and OLLAMA_KV_CACHE_TYPE=f16 only; its header says "The cache type and flash attention are stated even where
    they are Ollama's defaults: the plan was sized for them, and a value set earlier would otherwise win". The
    slots are not stated, so a value set earlier wins: the printed step `set -a && . ./big.env && set +a &&
    ollama serve` in this shell (or `OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=f16 ollama serve`, or a drop-in
    beside an override.conf that sets it) keeps OLLAMA_NUM_PARALLEL=4, and Ollama runs `-c 262144 -np 4`
    (llm/llama_server.go: -c num_ctx x numParallel), four times the planned 9 GiB of K/V, so --fit moves layers to
    the CPU. The variable in this very shell is not even mentioned. backends/ollama/config.py env_lines writes
    OLLAMA_NUM_PARALLEL "for more than one slot" only. Expected: the plan's one slot stated
    (OLLAMA_NUM_PARALLEL=1), as the cache type is."""
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "4")
    rc, out, err = run(capsys, "ollama", "big", "--gpu", "rtx-4090", "--ctx", "64k", "--write-env", "big.env")
    assert rc == 0 and "fits 100% on the GPU" in out and "x 4 slots" not in out, (rc, out, err)
    env = (tmp_path / "big.env").read_text().splitlines()
    assert "OLLAMA_NUM_PARALLEL=1" in env, env


# --- 7. the steps for a file named with ~ ---------------------------------------------------------------------------


def test_the_printed_steps_name_the_files_written_for_a_tilde_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`kvadvise ollama big --gpu rtx-4090 --write-modelfile=~/big.Modelfile --write-env=~/ollama.env` (bash does
    not expand a ~ after `--opt=`): kvadvise expands it and writes $HOME/big.Modelfile and $HOME/ollama.env
    (kvadvise.files: Path(path).expanduser()), and the systemd line says EnvironmentFile=$HOME/ollama.env, but the
    steps print `set -a && . '~/ollama.env' && set +a && ollama serve` and `ollama create big-64k -f
    '~/big.Modelfile'`: quoted, the ~ is a directory named ~ in the current one. sh says "~/ollama.env: not
    found", and `ollama create` silently builds from "FROM ." when the -f file does not exist (cmd/cmd.go
    CreateHandler: "No Modelfile specified or found - use default"). `kvadvise ollama A B --write-env=~/x.env`
    prints the expanded path. backends/ollama/config.py apply_hint_env / apply_hint_modelfile quote the path as
    given. Expected: the steps name the files that were written."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    args = ["ollama", "big", "--gpu", "rtx-4090", "--write-modelfile=~/big.Modelfile", "--write-env=~/ollama.env"]
    rc, out, err = run(capsys, *args)
    assert rc == 0, err
    assert (home / "big.Modelfile").is_file() and (home / "ollama.env").is_file()
    create = _steps(out, "ollama create ")
    source = [w for w in _steps(out, "set -a && . ")[0] if w.endswith("ollama.env")]
    assert create and Path(create[0][create[0].index("-f") + 1]).is_file(), create
    assert source and Path(source[0]).is_file(), source


# --- 8. and 9. num_batch: Ollama's -b and -ub -------------------------------------------------------------------


def test_batch_is_ollamas_num_batch_for_both_b_and_ub(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama small --gpu rtx-4090 --ctx 32k --batch 4096 --json`: config n_batch 4096, n_ubatch 512,
    the compute buffer of -ub 512, and the Modelfile gets `PARAMETER num_batch 4096`. Ollama >= 0.30 passes
    num_batch as both (llm/llama_server.go appendBatchArgs: "-b", NumBatch, "-ub", NumBatch), and kvadvise says
    so itself (backends/ollama/runtime.py: "--batch is Ollama's num_batch (-b and -ub equal)"; docs/commands.md:
    "-ub apart from num_batch, which is --batch"). The compute buffer grows with -ub: for an 8B-shaped model with
    a 152k vocabulary at 64k (q8_0 cache), kvadvise's own `kvadvise llamacpp ... -b 4096 -ub 4096` plans 1,920 MiB
    where the Ollama plan says 240 MiB. Expected: n_ubatch 4096 (the runtime's shape sets n_ubatch with n_batch)."""
    doc = run_json(capsys, "ollama", "small", "--gpu", "rtx-4090", "--ctx", "32k", "--batch", "4096")
    assert (doc["config"]["n_batch"], doc["config"]["n_ubatch"]) == (4096, 4096), doc["config"]


def test_the_plan_runs_the_num_batch_ollamas_scheduler_picks(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama small --gpu rtx-4090 --ctx 16k --json`: config n_batch 2048, n_ubatch 512 (llama-server's
    own defaults). Ollama never runs those: a model without its own num_batch gets automaticGenerationBatch
    (server/sched.go applyAutomaticGenerationBatch: 1024 past 4,096 tokens, 2048 past 32,768 where the prediction
    leaves the headroom, else 512) and llm/llama_server.go passes it as `-b N -ub N`. Here 1,024 (the
    prediction is well under 75 % of the 4090's free memory), which `kvadvise ollama small alice/helper --ctx 16k -v`
    prints itself ("loads on GPU 0 (num_batch 1024)", backends/ollama/together.py footprint: -b = -ub). The
    one-model plan's compute buffer is that of -ub 512 (for an 8B-shaped model with a 152k vocabulary at 64k,
    q8_0: 240 MiB planned, 960 MiB at -ub 2048). Expected: the plan at Ollama's num_batch (1024 here).
    Fixed: RunConfig.auto_batch, the steps scheduler.batch_steps replays for the plan's GPUs."""
    doc = run_json(capsys, "ollama", "small", "--gpu", "rtx-4090", "--ctx", "16k")
    assert (doc["config"]["n_batch"], doc["config"]["n_ubatch"]) == (1024, 1024), doc["config"]


def test_a_models_own_num_batch_is_planned_or_overridden(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`kvadvise ollama bigbatch --gpu rtx-4090 --ctx 32k --write-modelfile Modelfile` (a model whose params layer
    holds num_batch 8192): planned at n_batch 2048, n_ubatch 512, the same figures as a model without it, and the
    Modelfile drops the parameter without a word (modelfile.py _OWN: "the model's own values for these are
    replaced", but num_batch is replaced only when the plan sets one). Ollama runs the model's 8192: it is not
    Ollama's default, so no automatic batch (sched.go numBatchAuto), and llm/llama_server.go passes `-b 8192 -ub
    8192`; `ollama create` of the Modelfile keeps it too (server/create.go setParameters merges the base's params
    for every key the Modelfile does not set). The plan's compute buffer is that of -ub 512. Expected: the plan
    at the model's num_batch, or a Modelfile that sets the num_batch the plan is for."""
    doc = run_json(capsys, "ollama", "bigbatch", "--gpu", "rtx-4090", "--ctx", "32k")
    rc, _, err = run(
        capsys, "ollama", "bigbatch", "--gpu", "rtx-4090", "--ctx", "32k", "--write-modelfile", "Modelfile"
    )
    assert rc == 0, err
    lines = (tmp_path / "Modelfile").read_text().splitlines()
    pinned = [int(ln.split()[2]) for ln in lines if ln.startswith("PARAMETER num_batch ")]
    planned = doc["config"]["n_ubatch"]
    assert planned == 8192 or pinned == [planned], (doc["config"], lines)


# --- 10. and 11. OLLAMA_KEEP_ALIVE ----------------------------------------------------------------------------------


def test_models_do_not_stay_loaded_together_with_keep_alive_zero(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_KEEP_ALIVE=0 kvadvise ollama small alice/helper --gpu rtx-4090 --ctx 4k`: "All stay loaded together
    at the server's settings." (and "keep-alive 0s" in -v; JSON fit_together true). With a keep-alive of 0 each
    runner is unloaded as soon as its request is done (envconfig.KeepAlive: "Zero is treated as no keep alive";
    sched.go processCompleted: "runner with zero duration has gone idle, expiring to unload"), so at these
    settings no two models are ever loaded together between requests, the very sequence the scheduler replay
    assumes ("leaves every runner idle between requests", backends/ollama/scheduler.py). The keep-alive only
    orders evictions there (_victim). Expected: not "stay loaded together at the server's settings" (the plan's
    OLLAMA_KEEP_ALIVE=-1 is what keeps them)."""
    monkeypatch.setenv("OLLAMA_KEEP_ALIVE", "0")
    rc, out, err = run(capsys, "ollama", "small", "alice/helper", "--gpu", "rtx-4090", "--ctx", "4k")
    assert rc in (0, 3), err
    assert "All stay loaded together at the server's settings" not in out, out


@pytest.mark.parametrize("value", ["--5m", "-+5m", "2562048h", "99999999999999999999"])
def test_keep_alive_values_go_refuses_are_five_minutes(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OLLAMA_KEEP_ALIVE=--5m kvadvise ollama small alice/helper --gpu rtx-4090 --ctx 4k -v`: "keep-alive forever"
    (JSON settings.keep_alive_s null); "2562048h" is "keep-alive 2.56205e+06h", "99999999999999999999" 1e20 s.
    envconfig.KeepAlive tries time.ParseDuration, then strconv.ParseInt, and keeps 5 minutes when both fail:
    ParseDuration takes one sign ("--5m": "time: invalid duration") and refuses what overflows an int64 of
    nanoseconds (2562048h > 2562047h47m), ParseInt refuses "--5m" and what overflows int64. kvadvise's
    keep_alive_seconds (backends/ollama/together.py) strips every sign (s.lstrip("+-")) and bounds nothing below
    30 digits. The keep-alive decides which model Ollama evicts first (findRunnerToUnload, ByDurationAndName),
    and "forever" is what the plan recommends (OLLAMA_KEEP_ALIVE=-1). Expected: 300 s, as Ollama reads them."""
    monkeypatch.setenv("OLLAMA_KEEP_ALIVE", value)
    doc = run_json(capsys, "ollama", "small", "alice/helper", "--gpu", "rtx-4090", "--ctx", "4k")
    assert doc["settings"]["keep_alive_s"] == 300.0, doc["settings"]


# --- 12. the name `ollama create` is given ---------------------------------------------------------------------------


def test_the_created_name_is_one_ollama_create_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama hf.co/mradermacher/Qwen3-Coder-30B-A3B-Instruct-1M-Unsloth-abliterated-uncensored-i1-GGUF:
    i1-Q4_K_M --gpu rtx-4090 --ctx 8k` (a model part of 70 bytes, valid: name.go isValidLen allows 80): the steps
    say `ollama create Qwen3-Coder-...-i1-GGUF-i1-Q4_K_M-8k -f Modelfile` and `ollama run` / `kvadvise verify
    ollama` that name, 83 bytes of model part. Ollama refuses it (types/model/name.go isValidLen: a model part is
    1 to 80 bytes; server/create.go: "invalid model name", 400), so the printed steps fail at once.
    backends/ollama/config.py created_name appends "-<tag>-<ctx>" without a bound. Expected: a name Ollama
    takes (checked here with kvadvise's own port of name.go, parse_name)."""
    name = f"hf.co/mradermacher/{LONG_REPO}:i1-Q4_K_M"
    parse_name(name)  # the model's own name is valid
    rc, out, err = run(capsys, "ollama", name, "--gpu", "rtx-4090", "--ctx", "8k")
    assert rc == 0, err
    created = [words[2] for words in _steps(out, "ollama create ")]
    assert created, out
    for c in created:
        try:
            parse_name(c)
        except InputError as e:
            pytest.fail(f"`ollama create {c}` is refused by Ollama: {e.message}")


# --- 13. a release candidate -------------------------------------------------------------------------------------------


def test_a_release_candidate_is_not_claimed_to_carry_its_releases_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvadvise ollama small --gpu rtx-4090 --ctx 8k --ollama-version 0.30.0-rc0 --json`: ollama.release says
    "Ollama 0.30.0-rc0: llama-server of llama.cpp b9452 (pinned 2026-06-01), placed by llama.cpp's --fit
    (modelled)", llama_cpp.build 9452, and the plan follows b9452's rules. v0.30.0-rc0's LLAMA_CPP_VERSION is
    b9048 (`git show v0.30.0-rc0:LLAMA_CPP_VERSION` in the mirror; rc10 b9075, rc20 b9198; only rc32 and v0.30.0
    carry b9452): a pre-release comes before its release and runs other code. backends/ollama/api.py
    parse_version drops the suffix ("an rc or a build counts as its release (its code is the release's)").
    Expected: not claimed as b9452 (the rc's own pin, or the build marked not known)."""
    doc = run_json(capsys, "ollama", "small", "--gpu", "rtx-4090", "--ctx", "8k", "--ollama-version", "0.30.0-rc0")
    release = doc["ollama"]["release"]
    cpp = release["llama_cpp"]
    assert cpp is None or cpp["build"] in (None, 9048), release
