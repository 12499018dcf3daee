"""Plugin surfaces: a third-party backend through an entry point, a broken one,
and the Python API answering exactly what --json prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from live_state import without_live_ram

import kvadvise
from kvadvise.cli import main

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
"""A third-party runtime: specs from a tiny text format 'layers,kv_heads,head_dim,ctx'."""
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import with_weights


class TinyRuntime:
    name = "tinyrt"
    summary = "a test runtime plugin"

    def load_spec(self, ref):
        layers, kv, head, ctx = (int(x) for x in ref.split(","))
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
               "hidden_size": 8 * head, "num_attention_heads": 8, "num_key_value_heads": kv, "head_dim": head,
               "vocab_size": 32000, "max_position_embeddings": ctx, "intermediate_size": 1024}
        return with_weights(from_config(cfg, source="tinyrt:" + ref), 1_000_000_000)

    def running_models(self, host):
        return ()


class CommandRuntime(TinyRuntime):
    """As the README's plugin example: its own `kvadvise cmdrt NAME` and `kvadvise verify cmdrt NAME`."""

    name = "cmdrt"

    def register_commands(self, cli, verify):
        import click

        from kvadvise.entry import plan_for
        from kvadvise.ui import output
        from kvadvise.ui.flags import run_options, take
        from kvadvise.ui.show import exit_if_no_fit, show_plan

        @cli.command("cmdrt")
        @click.argument("name")
        @click.option("--shout", is_flag=True, help="An option of the plugin's own.")
        @run_options
        def cmdrt(name, shout, **kwargs):
            """Plan a model of the command runtime."""
            f = take(kwargs)
            plan = plan_for(self.load_spec(name), f.request)
            show_plan(plan, f.view, requested_ctx=f.request.n_ctx)
            if shout:
                output.note("PLANNED")
            exit_if_no_fit(plan)

        @verify.command("cmdrt")
        @click.argument("name")
        def verify_cmdrt(name):
            """Check a running model of the command runtime."""
            output.result(f"verified {name}")
'''


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """An installed distribution as pip leaves it: a package and its dist-info with entry_points.txt."""
    (tmp_path / "kvadvise_tinyrt").mkdir()
    (tmp_path / "kvadvise_tinyrt" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "kvadvise_tinyrt-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvadvise-tinyrt\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[kvadvise.backends]\ntinyrt = kvadvise_tinyrt:TinyRuntime\nbroken = kvadvise_tinyrt:DoesNotExist\n"
        "cmdrt = kvadvise_tinyrt:CommandRuntime\n"
    )
    return tmp_path


def cli(plugin_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    return subprocess.run([sys.executable, "-m", "kvadvise", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_plugin_is_listed_and_broken_one_reported(plugin_path: Path) -> None:
    p = cli(plugin_path, "plugins", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    names = {b["name"]: b for b in doc["backends"]}
    assert {"gguf", "hf", "llamacpp", "tinyrt"} <= set(names)
    assert names["tinyrt"]["capabilities"] == ["resolve", "live-state"]
    assert [b["name"] for b in doc["broken"]] == ["broken"]
    assert "DoesNotExist" in doc["broken"][0]["error"]


def test_plugin_works_through_the_cli(plugin_path: Path) -> None:
    p = cli(plugin_path, "tinyrt", "32,8,128,8192", "--ctx", "8192", "--no-hardware", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["memory"]["kv_bytes_per_token"] == 32 * 8 * 128 * 2 * 2
    assert doc["memory"]["kv_bytes"] == 32 * 8 * 128 * 2 * 2 * 8192


def test_a_plugin_brings_its_own_commands(plugin_path: Path) -> None:
    """register_commands, as the built-in backends use it: a command with an option of its own, and a verify one."""
    p = cli(plugin_path, "cmdrt", "32,8,128,8192", "--ctx", "8192", "--no-hardware", "--json", "--shout")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["memory"]["kv_bytes"] == 32 * 8 * 128 * 2 * 2 * 8192
    assert "PLANNED" in p.stderr
    p = cli(plugin_path, "verify", "cmdrt", "m1")
    assert (p.returncode, p.stdout) == (0, "verified m1\n"), p.stderr
    p = cli(plugin_path, "--help")
    assert "cmdrt" in p.stdout and "Plan a model of the command runtime." in p.stdout
    p = cli(plugin_path, "plugins", "--json")
    caps = {b["name"]: b["capabilities"] for b in json.loads(p.stdout)["backends"]}
    assert caps["cmdrt"] == ["resolve", "commands", "live-state"]


def test_broken_plugin_never_breaks_builtin_commands(plugin_path: Path, gemma_path: Path) -> None:
    p = cli(plugin_path, "gguf", str(gemma_path), "--ctx", "4096", "--no-hardware", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["config"]["n_ctx"] == 4096
    p = cli(plugin_path, "broken", "x", "--ctx", "1", "--no-hardware")
    assert p.returncode == 2 and "backend 'broken'" in p.stderr and "Traceback" not in p.stderr


def test_api_and_json_agree_on_an_estimate(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = kvadvise.load_model(str(gemma_path))
    cfg = kvadvise.RunConfig(n_ctx=10000, type_k=kvadvise.GGMLType.Q8_0, type_v=kvadvise.GGMLType.Q8_0, flash_attn="on")
    api_doc = kvadvise.to_json(kvadvise.plan(spec, cfg))
    assert (
        main(
            [
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
                "--no-hardware",
                "--json",
            ]
        )
        == 0
    )
    cli_doc = json.loads(capsys.readouterr().out)
    cli_doc["config"]["n_ctx_requested"] = api_doc["config"]["n_ctx_requested"]
    assert api_doc == cli_doc
    assert kvadvise.estimate(spec, cfg).kv_bytes == cli_doc["memory"]["kv_bytes"]


def test_api_and_json_agree_on_a_recommendation(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = kvadvise.load_model(str(gemma_path))
    hw = kvadvise.gpu_profile("rtx 3060")
    api_doc = kvadvise.to_json(kvadvise.plan(spec, hardware=hw, policy=kvadvise.Policy(target_ctx=16384)))
    assert main(["gguf", str(gemma_path), "--gpu", "rtx 3060", "--target-ctx", "16384", "--json"]) == 0
    cli_doc = json.loads(capsys.readouterr().out)
    # the card is a profile, but free RAM is read live, moments apart
    assert without_live_ram(api_doc) == without_live_ram(cli_doc)
    rec = kvadvise.recommend(spec, hw, kvadvise.Policy(target_ctx=16384))
    assert rec.config.n_ctx == cli_doc["config"]["n_ctx"] == 16384


def test_core_never_imports_backends() -> None:
    """The built-in backends are plugins like any other: the core (advisor/, installed as
    kvadvise) reaches kvadvise.backends only through entry points."""
    import ast

    offenders = []
    for path in sorted((ROOT / "advisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in ("advisor", "backends", "profiles") or n.startswith("kvadvise.backends")
            ]
    assert offenders == []


def test_builtin_backends_declare_their_capabilities(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    caps = {b["name"]: b["capabilities"] for b in json.loads(capsys.readouterr().out)["backends"]}
    assert caps["ollama"] == ["resolve", "commands", "verify", "live-state", "write-config", "runtime"]
    assert caps["llamacpp"] == ["resolve", "commands", "verify", "runtime"]
    assert caps["gguf"] == ["resolve", "commands"]
