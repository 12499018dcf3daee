"""Users per card: how many concurrent sessions of a given context fit, and how fast each decodes.

N sessions of C tokens each are llama-server's ``-np N -c N×C`` (tools/server: one slot a session). Two
ways to hold their K/V (llama.cpp b11312, src/llama-context.cpp and src/llama-kv-cache.cpp):

- **per slot** (the default with ``-np``): N streams of ``n_ctx_seq = pad(N×C / N, 256)`` cells each, so
  every session is sure of its C tokens; a sliding-window (SWA) layer keeps ``min(C, n_swa + n_ubatch)``
  cells in each stream;
- **unified** (``-kvu``): one pool of N×C cells that every slot draws from (a slot may take more than C
  while others are short), and a SWA layer keeps ``min(N×C, n_swa×N + n_ubatch)`` cells for all of them:
  ``(N - 1) × n_ubatch`` fewer than per slot, so a SWA model (Gemma 3) fits more sessions unified.

Whether N fit is the plan's own test (kvadvise.planner.planning.make_plan: every device within its budget
for the config, with the plan's cache types, batch and GPUs, and on several GPUs the layers moved as
llama.cpp's --fit moves them), applied to the config with N slots; memory only grows with N, so the most
that fit is found by doubling, then halving the gap.

Decode of N sessions at once (an estimate, kvadvise.planner.speed's bandwidth model): one step reads the
weights once for all N sessions and each session's K/V up to its depth, so each session decodes at
``1 / t_step`` and the card at ``N / t_step`` tokens/s; batched matrix products past the card's compute
(large N) are not modelled, so the figure for many sessions is an upper bound. N sessions that do not fit the
GPUs get no figure: that layout never runs (the plan runs a partial offload, at its own speed).

llmfit (AlexsJones/llmfit 1.1.17, ``concurrency``) counts ``sessions = (pool - weights) / KV per session``:
that is the per-slot count without the compute buffer, the output buffer and SWA's smaller cache
(docs/several-models.md compares the two on real figures).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvadvise.planner.memory import estimate

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.memory import RunConfig

MAX_USERS = 4096  # -np's bound (kvadvise.request.INT_RANGES n_parallel)


@dataclass(frozen=True, slots=True)
class Sessions:
    """N sessions of ``n_ctx_user`` tokens, with one way of holding their K/V."""

    kv_unified: bool
    n_users: int
    n_ctx_user: int
    fits: bool  # the N asked fit
    max_users: int  # the most sessions of n_ctx_user that fit this way (0: not one)
    device_bytes: int  # the N sessions' memory on the GPUs (all devices)
    kv_bytes: int
    # each session, all N decoding at once at depth n_ctx_user (estimate); None where the N do not fit the GPUs
    decode_user_tps: float | None
    decode_total_tps: float | None  # the card's tokens/s over the N sessions

    @property
    def flags(self) -> str:
        return f"-np {self.n_users} -c {self.n_users * self.n_ctx_user}" + (" -kvu" if self.kv_unified else "")


@dataclass(frozen=True, slots=True)
class UsersAnswer:
    """The answer to "N users at C tokens each: do they fit, how many would, how fast"."""

    n_users: int
    n_ctx_user: int
    per_slot: Sessions
    unified: Sessions | None  # None where the runtime does not pass -kvu (Ollama)
    budget_source: str
    cache_type: str = "f16"  # the plan's K/V cache type(s), "f16" or "q8_0/f16" (K/V): both ways are at it
    unified_given: bool = False  # -kvu was asked for: the plan runs it, whatever holds more
    n_ctx_train: int = 0  # the model's training context: no slot holds more (0: not known)

    @property
    def past_training(self) -> bool:
        """Each session asked for more than a slot holds: llama-server caps each slot at the training context
        (tools/server/server-context.cpp n_ctx_slot), Ollama its num_ctx."""
        return 0 < self.n_ctx_train < self.n_ctx_user

    @property
    def chosen(self) -> Sessions:
        """-kvu where it holds more sessions (or the N asked only fit with it), else one slot each (every
        session sure of its context)."""
        u, s = self.unified, self.per_slot
        if u is not None and (self.unified_given or u.max_users > s.max_users or (u.fits and not s.fits)):
            return u
        return s

    @property
    def fits(self) -> bool:
        return self.chosen.fits and not self.past_training

    @property
    def max_users(self) -> int:
        return self.chosen.max_users


def users_config(base: RunConfig, n_users: int, n_ctx_user: int, *, kv_unified: bool) -> RunConfig:
    """``base`` (the plan's cache types, batch, GPUs) with ``n_users`` slots of ``n_ctx_user`` tokens."""
    return replace(base, n_ctx=n_users * n_ctx_user, n_parallel=n_users, kv_unified=kv_unified)


def sessions_fit(spec: ModelSpec, cfg: RunConfig, budget: Budget) -> bool:
    """The plan's test (make_plan with --ctx): every device within its budget; on several GPUs, the layers
    moved between them as llama.cpp's --fit moves them where the split given leaves one short."""
    if budget.fits(estimate(spec, cfg)):
        return True
    if budget.n_gpu > 1:
        from kvadvise.planner.fitsplit import refit

        moved = refit(spec, cfg, budget)
        return moved is not None and budget.fits(moved.estimate)
    return False


def max_users(spec: ModelSpec, base: RunConfig, budget: Budget, n_ctx_user: int, *, kv_unified: bool) -> int:
    """The most sessions of ``n_ctx_user`` tokens that fit (0: not one): doubling, then bisection."""

    def ok(n: int) -> bool:
        return sessions_fit(spec, users_config(base, n, n_ctx_user, kv_unified=kv_unified), budget)

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_USERS and ok(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_USERS:
        return MAX_USERS if ok(MAX_USERS) else _bisect(ok, lo, MAX_USERS)
    return _bisect(ok, lo, hi)


def _bisect(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with ok(n), given ok(lo) and not ok(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def concurrent_decode(spec: ModelSpec, cfg: RunConfig, budget: Budget, n_users: int) -> tuple[float, float] | None:
    """(each session's, the card's) decode tokens/s with ``n_users`` decoding at once, each at the depth of
    its context: the weights read once per step, every session's K/V (kvadvise.planner.speed's model), and the
    CPU sampling each session's token in turn (llama-server's slots, one after the other: speed.sampling_seconds)."""
    from kvadvise.planner.speed import (
        CPU_BANDWIDTH_BYTES_PER_S,
        kv_read_bytes,
        plan_devices,
        ram_bandwidth,
        sampling_seconds,
        seconds_per_token,
        weight_reads,
    )

    devs = plan_devices(spec, budget, cfg.tensor_split)
    if devs is None or not spec.weights_bytes or n_users < 1:
        return None
    cpu_bw = ram_bandwidth(budget)[0] if not devs else CPU_BANDWIDTH_BYTES_PER_S
    depth = cfg.n_ctx // max(1, cfg.n_parallel)
    kv = n_users * kv_read_bytes(spec, depth, cfg.type_k, cfg.type_v)
    t = seconds_per_token(weight_reads(spec), kv, devs, cpu_bandwidth_bytes_per_s=cpu_bw, llama_build=cfg.llama_build)
    t += n_users * sampling_seconds(spec, penalties=cfg.sampling_penalties)
    return 1 / t, n_users / t


def sessions(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_users: int,
    n_ctx_user: int,
    *,
    kv_unified: bool,
    decode: bool = True,
) -> Sessions:
    cfg = users_config(base, n_users, n_ctx_user, kv_unified=kv_unified)
    est = estimate(spec, cfg)
    fits = sessions_fit(spec, cfg, budget)
    # the concurrent model reads every weight from the GPUs: N sessions that do not fit them never run that way
    # (the plan falls back to a partial offload, whose speed is its own), so they get no decode figure
    speed = concurrent_decode(spec, cfg, budget, n_users) if decode and fits else None
    return Sessions(
        kv_unified=kv_unified,
        n_users=n_users,
        n_ctx_user=n_ctx_user,
        fits=fits,
        max_users=max_users(spec, base, budget, n_ctx_user, kv_unified=kv_unified),
        device_bytes=est.device_bytes,
        kv_bytes=est.kv_bytes,
        decode_user_tps=speed[0] if speed else None,
        decode_total_tps=speed[1] if speed else None,
    )


def users_per_card(
    spec: ModelSpec,
    base: RunConfig,
    budget: Budget,
    n_users: int,
    n_ctx_user: int,
    *,
    unified_allowed: bool = True,
    unified_given: bool = False,
    decode: bool = True,
) -> UsersAnswer:
    """``n_users`` sessions of ``n_ctx_user`` tokens on ``budget``'s GPUs, one slot each and (where the
    runtime passes -kvu) in one unified pool; ``unified_given``: -kvu asked for, the way the plan runs;
    ``decode``: estimate their decode (not for weights partly in RAM, which the concurrent model does not read;
    never for N sessions that do not fit the GPUs)."""
    per_slot = sessions(spec, base, budget, n_users, n_ctx_user, kv_unified=False, decode=decode)
    unified = (
        sessions(spec, base, budget, n_users, n_ctx_user, kv_unified=True, decode=decode) if unified_allowed else None
    )
    kv = base.type_k.type_name if base.type_k == base.type_v else f"{base.type_k.type_name}/{base.type_v.type_name}"
    return UsersAnswer(
        n_users,
        n_ctx_user,
        per_slot,
        unified,
        budget.source,
        kv,
        unified_given and unified is not None,
        spec.n_ctx_train,
    )


def answer_lines(a: UsersAnswer, *, where: str = "this card") -> list[str]:
    """The direct answer first, then each way with its flags, memory and decode."""
    from kvadvise.planner.speed import ctx_label, tps_label

    c = a.chosen
    head = (
        f"{a.n_users} users at {ctx_label(a.n_ctx_user)} each (K/V {a.cache_type}) on {where}: "
        f"{'yes' if a.fits else 'no'}; "
        + (f"no slot holds more than the {a.n_ctx_train:,} tokens it was trained on; " if a.past_training else "")
        + f"at most {a.max_users}"
        + (" (with -kvu)" if c.kv_unified else "")
    )
    out = [head]
    ways = [a.per_slot] if a.unified is None else [a.per_slot, a.unified]
    for s in ways:
        name = "unified cache (-kvu, one pool)" if s.kv_unified else "one slot each"
        speed = (
            f"; ≈ {tps_label(s.decode_user_tps)} t/s each, {tps_label(s.decode_total_tps)} t/s in all (estimate)"
            if s.decode_user_tps is not None and s.decode_total_tps is not None
            else ""
        )
        gib = 1 << 30
        out.append(
            f"  {name}: at most {s.max_users}; {a.n_users} take {s.device_bytes / gib:.2f} GiB "
            f"(K/V {s.kv_bytes / gib:.2f} GiB){speed}"
        )
    if a.unified is None:
        out.append("  (no unified cache: the runtime does not pass -kvu)")
    return out
