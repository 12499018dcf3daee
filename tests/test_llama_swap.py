"""Several models on llama.cpp with a memory budget (issue 42.3): ``kvadvise ollama A B C --write-llama-swap
FILE --write-preset FILE``. The llama-swap config is checked against llama-swap's own schema and the checks
of its loader (mostlygeek/llama-swap 0bdb3720199f, 2026-08-22, committed in tests/data/llama-swap with its
source); every group and every --models-max combination is checked to fit by planning it on its own, and
the combinations the router's count would allow but that do not fit are checked not to."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ollama_fake import closed_port_url
from rpc_devices import stop

from kvadvise.backends.ollama.together_budget import combinations_of, everything
from kvadvise.cli import main
from kvadvise.errors import InputError
from kvadvise.runtime.llamaswap import SwapGroup, SwapModel, config_text

DATA = Path(__file__).parent / "data" / "llama-swap"
RESERVED_MACROS = ("PID", "PORT", "MODEL_ID")  # internal/config/load.go: macro names that are not the user's


def load_like_llama_swap(text: str, *, members_defined: bool = True) -> dict[str, Any]:
    """What llama-swap's LoadConfigFromReader (internal/config/load.go @0bdb3720) refuses, for the parts a
    written config uses: the schema (config-schema.json), ttl and globalTTL bounds, legacy groups and the
    routing block not both, no duplicate member, no model in two groups, members that are models, a cmd that
    SanitizeCommand (commands.go) splits into a command, no macro in it but the reserved ones; and what its
    example documents but the loader does not check (``members_defined``): "every member must be a model ID
    defined in the models section" (its own example's groups name models it does not define)."""
    doc = yaml.safe_load(text)
    jsonschema.Draft7Validator(json.loads((DATA / "config-schema.json").read_text())).validate(doc)
    if doc.get("globalTTL", 0) < 0:
        raise ValueError("globalTTL must be >= 0")
    models: dict[str, Any] = doc.get("models") or {}
    for name, m in models.items():
        ttl = m.get("ttl", -1)
        if ttl < 0 and ttl != -1:
            raise ValueError(f"model {name}: invalid TTL value {ttl}")
        lines = [x for x in str(m["cmd"]).split("\n") if not x.strip().startswith("#")]
        args = shlex.split(
            "\n".join(x.strip().removesuffix("\\") + " " if x.strip().endswith("\\") else x for x in lines)
        )
        if not args:
            raise ValueError(f"model {name}: empty command")
        macros = set(doc.get("macros") or {}) | set(m.get("macros") or {}) | set(RESERVED_MACROS)
        for macro in re.findall(r"\$\{([^}]*)\}", str(m["cmd"])):
            if macro not in macros and not macro.startswith("env."):
                raise ValueError(f"model {name}: unknown macro ${{{macro}}}")
    rtr = (doc.get("routing") or {}).get("router") or {}
    if (doc.get("groups") or doc.get("matrix")) and rtr:
        raise ValueError("config uses both the legacy top-level 'matrix'/'groups' keys and 'routing.router'")
    groups = doc.get("groups") or (rtr.get("settings") or {}).get("groups") or {}
    used: dict[str, str] = {}
    for gid, g in groups.items():
        seen: set[str] = set()
        for member in g["members"]:
            if member in seen:
                raise ValueError(f"duplicate model member {member} found in group: {gid}")
            seen.add(member)
            if member in used:
                raise ValueError(f"model member {member} is used in multiple groups: {used[member]} and {gid}")
            used[member] = gid
            if members_defined and member not in models:
                raise ValueError(f"group {gid}: {member} is not a model of the config")
    return doc


def test_the_oracle_accepts_llama_swaps_own_example_and_refuses_wrong_configs() -> None:
    doc = load_like_llama_swap((DATA / "config.example.yaml").read_text(), members_defined=False)
    assert "gpt-oss-120b" in doc["models"] and doc["routing"]["router"]["settings"]["groups"]["group2"]["swap"] is False
    good = config_text(
        [
            SwapModel("a", ("llama-server", "-m", "/m/a.gguf"), 300),
            SwapModel("b", ("llama-server", "-m", "/m/b.gguf"), 0),
        ],
        [SwapGroup("g", ("a", "b"))],
    )
    load_like_llama_swap(good)
    wrong = {
        "member not a model": good.replace('- "b"', '- "c"'),
        "swap not a bool": good.replace("swap: false", "swap: no-thanks"),
        "ttl below -1": good.replace("ttl: 300", "ttl: -5"),
        "an unknown macro": good.replace("/m/a.gguf", "${MODELS}/a.gguf"),
        "both group styles": good + "routing:\n  router:\n    use: group\n",
        "a model in two groups": good + '  "h":\n    members:\n      - "a"\n',
    }
    for why, text in wrong.items():
        with pytest.raises((ValueError, jsonschema.ValidationError)):
            load_like_llama_swap(text)
            pytest.fail(why)


def test_cmd_is_split_by_llama_swap_into_the_planned_arguments() -> None:
    """SanitizeCommand's POSIX split gives back each argument, a path with a space or a quote included; a
    path llama-swap would read as a macro is refused; a model in two groups is a bug, not a file."""
    args = ("llama-server", "-m", "/my models/it's.gguf", "-c", "8192", "-np", "2", "-kvu")
    text = config_text([SwapModel("m:1", args, 60, ("a comment",))], [])
    doc = load_like_llama_swap(text)
    cmd = "\n".join(x for x in doc["models"]["m:1"]["cmd"].split("\n") if not x.strip().startswith("#"))
    assert shlex.split(cmd) == ["llama-server", "--port", "${PORT}", *args[1:]]
    assert doc["models"]["m:1"]["ttl"] == 60 and "groups" not in doc
    with pytest.raises(InputError, match="macro"):
        config_text([SwapModel("m", ("llama-server", "-m", "/x/${HOME}.gguf"), 60)], [])
    with pytest.raises(ValueError, match="one group only"):
        config_text([SwapModel("m", ("llama-server",), 60)], [SwapGroup("a", ("m",)), SwapGroup("b", ("m",))])


def test_combinations_a_router_count_cannot_express() -> None:
    """A+B fits, B+C fits, A+C does not: --models-max 2 would allow A+C, so it is 1, and A+C is named;
    groups keep A+B together and C alone; a model that does not fit alone is in no group and allows nothing."""
    ok = {("A",), ("B",), ("C",), ("A", "B"), ("B", "C")}
    c = combinations_of(["A", "B", "C"], lambda combo: combo in ok)
    assert c.models_max == 1 and c.over == (("A", "C"),)
    assert c.groups == (("A", "B"), ("C",)) and c.largest == (("A", "B"), ("B", "C")) == c.kept_out()
    assert c.fits(["B", "A"]) and not c.fits(["A", "C"]) and not c.fits(["A", "B", "C"])
    every = combinations_of(["A", "B", "C"], lambda combo: True)
    assert every.models_max == 3 and every.over == () and every.groups == (("A", "B", "C"),)
    assert every == everything(["A", "B", "C"])  # what a plan that keeps them all loaded takes without replaying
    tried: list[tuple[str, ...]] = []
    combinations_of(["A", "B", "C"], lambda combo: tried.append(combo) or combo in ok)
    assert ("A", "B", "C") not in tried  # A+C, one of its parts, does not fit: never replayed
    short = combinations_of(["A", "B"], lambda combo: combo == ("A",))
    assert short.models_max == 0 and short.alone_short == ("B",) and short.groups == (("A",),)


@pytest.fixture
def ollama_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_MAX_LOADED_MODELS", "OLLAMA_KEEP_ALIVE", "OLLAMA_NUM_PARALLEL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OLLAMA_KV_CACHE_TYPE", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-store"))
    monkeypatch.setenv("OLLAMA_HOST", closed_port_url())


MODELS = ("qwen3-coder:30b", "gemma3:12b", "gemma3:4b")  # built-in profiles
ON = ("--gpu", "rtx-4090", "--ctx", "32768")


def fits_together(capsys: pytest.CaptureFixture[str], *names: str) -> bool:
    """The co-residency plan of ``names`` alone (kvadvise ollama A B), at the same card and context."""
    rc = main(["ollama", *names, *ON] if len(names) > 1 else ["ollama", names[0], *ON])
    capsys.readouterr()
    assert rc in (0, 3)
    return rc == 0


def test_write_llama_swap_and_router_preset_keep_every_allowed_combination_in_memory(
    ollama_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a 4090 at 32k, qwen3-coder:30b does not stay beside either Gemma, the two Gemmas stay together:
    --models-max 1 (the router would otherwise load a pair that does not fit), and llama-swap's groups hold
    the two Gemmas together and qwen3-coder alone. Each group and each model alone fit when planned on their
    own; each pair that --models-max 2 would have allowed and the answer names does not."""
    swap, preset = tmp_path / "llama-swap.yaml", tmp_path / "models.ini"
    rc = main(["ollama", *MODELS, *ON, "--write-llama-swap", str(swap), "--write-preset", str(preset)])
    out, err = capsys.readouterr()
    assert rc == 3 and "do not all stay loaded together" in out  # the question's answer is still no
    assert f"llama-server --models-preset {preset} --models-max 1" in err
    assert "gemma3:12b + gemma3:4b would fit together, but not under a count of 1" in err
    doc = load_like_llama_swap(swap.read_text())
    groups = [g["members"] for g in doc["groups"].values()]
    assert groups == [["qwen3-coder-30b"], ["gemma3-12b", "gemma3-4b"]]
    assert all(g["swap"] is False and g["exclusive"] is True for g in doc["groups"].values())
    by_section = {"qwen3-coder-30b": "qwen3-coder:30b", "gemma3-12b": "gemma3:12b", "gemma3-4b": "gemma3:4b"}
    for g in groups:
        assert fits_together(capsys, *(by_section[x] for x in g))
    named = re.search(r"not 2: .* and (.*) would not fit together", err)
    assert named is not None
    pairs = [tuple(p.split(" + ")) for p in named.group(1).split("; ")]
    assert pairs == [("qwen3-coder:30b", "gemma3:12b"), ("qwen3-coder:30b", "gemma3:4b")]
    for a, b in itertools.combinations(MODELS, 2):
        assert fits_together(capsys, a, b) == ((a, b) not in pairs)
    cmd = doc["models"]["gemma3-4b"]["cmd"]
    assert "-c 32768" in cmd and "-np 1" in cmd and "--port ${PORT}" in cmd and doc["models"]["gemma3-4b"]["ttl"] == 0
    text = preset.read_text()
    assert "; not 2: the router counts models, not bytes" in text  # said in the preset too
    assert text.count("load-on-startup = true") == 1  # one model at start: --models-max 1
    rc = main(["ollama", *MODELS, *ON, "--write-llama-swap", str(swap)])
    _, err = capsys.readouterr()
    assert rc == 2 and "exists" in err  # never over a file without --force
    rc = main(["ollama", *MODELS, *ON, "--write-llama-swap", str(tmp_path / "other.yaml"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    schema = json.loads((Path(__file__).parent.parent / "docs" / "schema" / "together.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["router"]["models_max"] == 1 and doc["router"]["not_together"] == [list(p) for p in pairs]


def test_models_that_all_fit_are_one_group_and_models_max_is_their_count(
    ollama_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    swap = tmp_path / "s.yaml"
    rc = main(
        ["ollama", "gemma3:12b", "gemma3:4b", "--gpu", "rtx-4090", "--ctx", "8192", "--write-llama-swap", str(swap)]
    )
    _, err = capsys.readouterr()
    assert rc == 0, err
    doc = load_like_llama_swap(swap.read_text())
    assert [g["members"] for g in doc["groups"].values()] == [["gemma3-12b", "gemma3-4b"]]
    assert "--models-max 2" in err and "not 3" not in err


def test_on_two_gpus_each_model_is_pinned_and_checked_on_its_gpu(
    ollama_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 3090s at 32k: qwen3-coder:30b and gemma3:12b each pinned to a GPU (-dev CUDA0, CUDA1) stay
    together; gemma3:27b, spread over both, fits beside neither: --models-max 1, and the groups are the
    pair and gemma3:27b alone, each of which is planned on its own and fits."""
    swap = tmp_path / "s.yaml"
    on = ("--gpu", "rtx-3090x2", "--ctx", "32768")
    rc = main(["ollama", "qwen3-coder:30b", "gemma3:12b", "gemma3:27b", *on, "--write-llama-swap", str(swap)])
    _, err = capsys.readouterr()
    assert rc == 3 and "--models-max 1: each of these models fits alone" in err
    assert "qwen3-coder:30b + gemma3:27b; gemma3:12b + gemma3:27b would not fit together" in err
    doc = load_like_llama_swap(swap.read_text())
    assert [g["members"] for g in doc["groups"].values()] == [["qwen3-coder-30b", "gemma3-12b"], ["gemma3-27b"]]
    assert (
        "-dev CUDA0" in doc["models"]["qwen3-coder-30b"]["cmd"] and "-dev CUDA1" in doc["models"]["gemma3-12b"]["cmd"]
    )
    for names in (("qwen3-coder:30b", "gemma3:12b"), ("gemma3:27b",)):
        assert main(["ollama", *names, *on]) == 0, names
        capsys.readouterr()
    assert main(["ollama", "gemma3:12b", "gemma3:27b", *on]) == 3
    capsys.readouterr()


def test_the_real_router_reads_the_preset_and_holds_models_max(
    real_llama_server: Path, gemma_path: Path, tmp_path: Path
) -> None:
    """The real llama-server router (b11312, on the CPU) reads the preset as kvadvise writes it (its header
    of combinations that would not fit, load-on-startup only for what --models-max allows) and, started
    with router_command's --models-max 1, unloads one model before it loads the other."""
    import socket
    import subprocess
    import time
    import urllib.request

    from kvadvise.backends.ollama.together_budget import combinations_of
    from kvadvise.backends.ollama.together_files import budget_lines
    from kvadvise.planner.memory import RunConfig
    from kvadvise.runtime.router import RoutedModel, preset_text, router_command

    c = combinations_of(["gemma-a", "gemma-b"], lambda combo: len(combo) == 1)  # each alone, not both
    assert c.models_max == 1
    cfg = RunConfig(n_ctx=2048, flash_attn="on", device="cpu")
    first = set(c.groups[0][: c.models_max])
    models = [RoutedModel(n, str(gemma_path), cfg, load_on_startup=n in first) for n in c.refs]
    preset = tmp_path / "models.ini"
    preset.write_text(preset_text(models, header="\n".join(budget_lines(c))))
    assert "; not 2: the router counts models, not bytes, and gemma-a + gemma-b would not fit together" in (
        preset.read_text()
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [*shlex.split(router_command(str(preset), c.models_max, str(real_llama_server))), "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def states() -> dict[str, str]:
        with urllib.request.urlopen(f"{base}/models", timeout=10) as r:
            return {m["id"]: m["status"]["value"] for m in json.load(r)["data"]}

    try:
        deadline = time.monotonic() + 120
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                seen = states()
            except OSError:
                seen = {}
            if seen.get("gemma-a") == "loaded":
                break
            time.sleep(0.5)
        assert seen == {"gemma-a": "loaded", "gemma-b": "unloaded"}  # load-on-startup as written
        body = json.dumps({"model": "gemma-b", "prompt": "Hi", "max_tokens": 1}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.load(r)["model"] == "gemma-b"
        assert states() == {"gemma-a": "unloaded", "gemma-b": "loaded"}  # --models-max 1: never both
    finally:
        stop(proc)
