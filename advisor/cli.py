"""The kvadvise command line. Commands only parse, call and render;
``main()`` is the only place that turns errors into messages and exit codes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from advisor.errors import EXIT_BUG, EXIT_INPUT, KvadviseError

F = TypeVar("F", bound=Callable[..., Any])
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def run_options(f: F) -> F:
    """llama.cpp's own flag names for the run configuration."""
    opts = [
        click.option(
            "--ctx",
            "-c",
            "n_ctx",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Context size in tokens, total over all sequences (llama.cpp -c). 0 = the model's n_ctx_train.",
        ),
        click.option(
            "--cache-type-k",
            "-ctk",
            "type_k",
            type=click.Choice(KV_TYPES),
            default="f16",
            show_default=True,
            help="K cache type.",
        ),
        click.option(
            "--cache-type-v",
            "-ctv",
            "type_v",
            type=click.Choice(KV_TYPES),
            default="f16",
            show_default=True,
            help="V cache type (quantized V needs flash attention).",
        ),
        click.option(
            "--flash-attn",
            "-fa",
            "flash_attn",
            type=click.Choice(["on", "off", "auto"]),
            default="auto",
            show_default=True,
            help="Flash attention.",
        ),
        click.option(
            "--parallel",
            "-np",
            "n_parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Parallel sequences (slots).",
        ),
        click.option("--kv-unified", "-kvu", is_flag=True, help="One KV buffer shared by all sequences."),
        click.option(
            "--batch",
            "-b",
            "n_batch",
            type=click.IntRange(min=1),
            default=2048,
            show_default=True,
            help="Logical batch size.",
        ),
        click.option(
            "--ubatch",
            "-ub",
            "n_ubatch",
            type=click.IntRange(min=1),
            default=512,
            show_default=True,
            help="Physical batch size.",
        ),
        click.option("--swa-full", is_flag=True, help="Full-size cache for sliding-window layers."),
        click.option(
            "--device",
            type=click.Choice(["cpu", "cuda"]),
            default="cpu",
            show_default=True,
            help="Where the layers go: the CPU, or all on one CUDA GPU.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in README.md)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _estimate_and_print(spec: Any, opts: dict[str, Any]) -> None:
    from advisor.ggml import cache_type
    from advisor.memory import RunConfig, estimate
    from advisor.render import estimate_dict, estimate_text

    as_json = opts.pop("as_json")
    cfg = RunConfig(type_k=cache_type(opts.pop("type_k")), type_v=cache_type(opts.pop("type_v")), **opts)
    est = estimate(spec, cfg)
    if as_json:
        click.echo(json.dumps(estimate_dict(spec, cfg, est), indent=2))
    else:
        click.echo(estimate_text(spec, cfg, est))


def _backend(name: str) -> Any:
    from advisor.plugins import discover

    return discover().get(name)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvadvise")
@click.option("--debug", is_flag=True, envvar="KVADVISE_DEBUG", help="Show tracebacks (also KVADVISE_DEBUG=1).")
def cli(debug: bool) -> None:
    """Memory advisor for llama.cpp and Ollama: KV cache, weights and buffers, exactly as llama.cpp allocates them."""


@cli.command()
@click.argument("path")
@run_options
def gguf(path: str, **opts: Any) -> None:
    """Memory for a local GGUF file (reads the header only)."""
    _estimate_and_print(_backend("gguf").load_spec(path), opts)


@cli.command()
@click.argument("config")
@click.option(
    "--weights-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Size of the weights you will load (a config.json alone does not say).",
)
@run_options
def hf(config: str, weights_bytes: int | None, **opts: Any) -> None:
    """Memory for a Hugging Face model: a config.json file or folder, or a repo id."""
    from advisor.spec import with_weights

    spec = _backend("hf").load_spec(config)
    _estimate_and_print(with_weights(spec, weights_bytes) if weights_bytes is not None else spec, opts)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins(as_json: bool) -> None:
    """List the installed backends, and any that failed to load."""
    from advisor.plugins import discover

    backends, broken = discover().load_all()
    if as_json:
        doc = {
            "backends": [{"name": n, "summary": b.summary} for n, b in sorted(backends.items())],
            "broken": [{"name": b.name, "target": b.target, "error": b.error} for b in broken],
        }
        click.echo(json.dumps(doc, indent=2))
        return
    for name, b in sorted(backends.items()):
        click.echo(f"{name:<10} {b.summary}")
    for br in broken:
        click.echo(f"{br.name:<10} BROKEN ({br.target}): {br.error}")


def _debug() -> bool:
    return "--debug" in sys.argv[1:] or os.environ.get("KVADVISE_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error becomes one line on stderr and a documented exit code."""
    try:
        cli.main(args=argv, prog_name="kvadvise", standalone_mode=False)
    except KvadviseError as e:
        if _debug():
            raise
        click.echo(f"kvadvise: error: {e.message}", err=True)
        if e.hint:
            click.echo(f"kvadvise: hint: {e.hint}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("kvadvise: aborted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"kvadvise: error: {e.format_message()}", err=True)
        return EXIT_INPUT
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except BrokenPipeError:
        return 0
    except Exception as e:
        if _debug():
            raise
        click.echo(
            f"kvadvise: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True
        )
        return EXIT_BUG
    return 0


if __name__ == "__main__":
    sys.exit(main())
