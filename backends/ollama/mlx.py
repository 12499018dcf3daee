"""Ollama's MLX runner on Apple Silicon: which runner loads a model, and the memory the MLX runner takes.

Read from ollama/ollama at fb30760996871fa9460115c753afd2c60d4ab0f7 (2026-08-21, tag v0.33.0-rc2), the
newest stored snapshot; where a rule comes from a release note or an issue instead, the constant says so.
docs/ollama-mlx.md has the sources, the published figures the tests hold, and what no Mac here verified.

- **Which runner** (server/sched.go, ``req.model.IsMLX()``; server/images.go ``IsMLX``: the model's config
  says ``model_format == "safetensors"``): a safetensors tag (``qwen3.8:27b-mlx``, ``*-nvfp4``, ``*-mxfp8``)
  runs ``ollama runner --mlx-engine``; a GGUF tag runs llama-server. From 0.40 Ollama runs the
  architectures its MLX runner supports on MLX by default on Apple Silicon (the v0.40.0 release note as
  quoted in issue 42; not read at the source: the snapshot predates it).
- **Weights** as MLX stores them (x/quant/quant.go ``byType``; x/create/create.go
  ``GetTensorQuantization``): linear weights at the tag's type, ``k_proj``/``v_proj``/``down_proj`` of
  the non-expert layers and ``lm_head`` promoted to the 8-bit type of the family, embeddings and norms
  kept at bf16.
- **K/V** (x/mlxrunner/cache/kvcache.go ``KVCache``): bf16 arrays ``[1, n_head_kv, T, head_dim]`` per
  layer, grown 256 tokens at a time as tokens arrive (nothing is allocated at load); sliding-window layers
  a ``RotatingKVCache`` of at most the window (cache/rotating.go).
- **The context**: the runner takes ``m.MaxContextLength()`` (x/mlxrunner/runner.go ``Load``) and never
  receives num_ctx (x/mlxrunner/client.go: only a "soft" length for ``/api/ps``): ollama#16219, #18125;
  the fixes (PRs #18196, #18261, #18285) were closed, not merged, when last seen.
- **The prefix cache** (x/mlxrunner/prefix_cache.go ``maxPagedOutBytes = 8 << 30``): up to 8 GiB of
  paged-out K/V snapshots beside the live cache, whatever the context (ollama#17924, #18131).
- **Wired memory** (x/mlxrunner/runner.go ``configureWiredMemory``): the runner wires min(weights,
  ``recommendedMaxWorkingSetSize``), macOS's GPU share (``iogpu.wired_limit_mb`` = 0: 2/3 of the RAM up
  to 36 GiB, 3/4 above; kvadvise.planner.gpus.apple_gpu_share_bytes); everything it holds is Metal memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.model.ggml import BLOCK, GGMLType

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec

GIB = 1 << 30

PINNED_COMMIT = "fb30760996871fa9460115c753afd2c60d4ab0f7"  # ollama/ollama, 2026-08-21, v0.33.0-rc2
RUNNERS = ("auto", "llamacpp", "mlx")

Version = tuple[int, int, int]

# Ollama 0.19 previewed MLX for text models (ollama.com/blog/mlx, 2026-03-30; ollama#15503).
MLX_TEXT_SINCE: Version = (0, 19, 0)
# From 0.40 an MLX architecture runs on MLX by default on Apple Silicon: the v0.40.0 release note as
# issue 42 quotes it (unverified here: the stored source stops at v0.33.0-rc2).
MLX_DEFAULT_SINCE: Version = (0, 40, 0)
# The first release that enforces num_ctx in the MLX runner: none known (PRs #18196, #18261, #18285 closed
# unmerged; ollama#18125 reports 0.33.1 and 0.33.2 ignoring it). Set it when a release note says so.
NUM_CTX_ENFORCED_SINCE: Version | None = None

# x/models/*: base.Register(<HF class>) at PINNED_COMMIT, as the GGUF architecture llama.cpp converts that
# class to (kvadvise.model.hfconfig.ARCH_BY_HF_CLASS), with the first release whose tree has the model
# (`git tag --contains` of the commit that added x/models/<pkg>/<pkg>.go). Registered classes llama.cpp
# has no architecture for (Glm4MoeLiteForCausalLM, Cohere2MoeForCausalLM, LagunaForCausalLM,
# MuseGlimmerForConditionalGeneration) are left out: no GGUF of them is planned here.
MLX_ARCHITECTURES: Mapping[str, tuple[str, Version]] = {
    "llama": ("x/models/llama (LlamaForCausalLM)", (0, 16, 3)),
    "qwen3": ("x/models/qwen3 (Qwen3ForCausalLM)", (0, 16, 3)),
    "gemma3": ("x/models/gemma3 (Gemma3ForCausalLM, Gemma3ForConditionalGeneration)", (0, 16, 3)),
    "qwen35": ("x/models/qwen3_5 (Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration)", (0, 17, 6)),
    "qwen35moe": ("x/models/qwen3_5_moe (Qwen3_5MoeForConditionalGeneration)", (0, 17, 6)),
    "qwen3next": ("x/models/qwen3_5 (Qwen3NextForCausalLM)", (0, 17, 6)),
    "gemma4": ("x/models/gemma4 (Gemma4ForCausalLM, Gemma4ForConditionalGeneration)", (0, 21, 0)),
    "nemotron_h": ("x/models/nemotron_h (NemotronHForCausalLM)", (0, 32, 9)),
    "nemotron_h_moe": ("x/models/nemotron_h (NemotronHForCausalLM)", (0, 32, 9)),
}

KV_STEP_TOKENS = 256  # cache/kvcache.go NewKVCache: step 256 (rotating.go the same)
KV_BYTES_PER_VALUE = 2  # bf16: the K/V projections' output dtype; no K/V quantization in the runner
PREFIX_CACHE_BYTES = 8 << 30  # prefix_cache.go maxPagedOutBytes (cache.go before; since v0.18.3)
BF16_BYTES = 2

# x/quant/quant.go byType (group size, bits) and the 8-bit type of each family (create.go eightBit); a
# group stores its scale as fp8 (nvfp4: e4m3, mx*: e8m0) or, for affine, a bf16 scale and a bf16 bias.
QUANTS: Mapping[str, tuple[int, int, str]] = {
    "nvfp4": (16, 4, "mxfp8"),
    "mxfp4": (32, 4, "mxfp8"),
    "int4": (64, 4, "int8"),
    "mxfp8": (32, 8, "mxfp8"),
    "int8": (64, 8, "int8"),
    "bf16": (1, 16, "bf16"),
}
_PROMOTED_QUANTS = ("int4", "nvfp4", "mxfp4")  # create.go: k/v/down to 8 bits (experts only for int4)


def bits_per_weight(quant: str) -> float:
    """Stored bits per weight of an MLX quantization: the packed values and their group's scale (fp8) or
    scale and bias (affine: two bf16)."""
    group, bits, _ = QUANTS[quant]
    if quant == "bf16":
        return 16.0
    per_group = 32 if quant.startswith("int") else 8
    return bits + per_group / group


def parse_version(version: str) -> Version | None:
    from kvadvise.backends.ollama.api import parse_version as parse

    return parse(version)


@dataclass(frozen=True, slots=True)
class RunnerChoice:
    """The runner Ollama loads the model with on Apple Silicon, and why."""

    runner: str  # "llamacpp" | "mlx"
    why: str
    ollama_version: str | None  # the version it was decided for (None: unknown, the newest rule)
    chosen_by: str  # "--runner" | "version"


def choose_runner(architecture: str, ollama_version: str | None, requested: str = "auto") -> RunnerChoice:
    """Which runner loads a GGUF model of ``architecture`` on a Mac, by Ollama's version (unknown: the
    newest rule), unless ``requested`` (--runner) names one."""
    if requested not in RUNNERS:
        raise InputError(f"--runner {requested!r}: one of {', '.join(RUNNERS)}")
    supported = MLX_ARCHITECTURES.get(architecture)
    if requested == "mlx":
        if supported is None:
            raise InputError(
                f"--runner mlx: Ollama's MLX runner has no model for {architecture} (x/models at {PINNED_COMMIT[:7]})",
                hint="it fails with 'unsupported architecture' (ollama#16460); leave --runner to plan llama.cpp",
            )
        v = parse_version(ollama_version) if ollama_version else None
        first = max(MLX_TEXT_SINCE, supported[1])
        if v is not None and v != (0, 0, 0) and v < first:  # 0.0.0: a source build, planned as the newest
            raise InputError(
                f"--runner mlx: Ollama {ollama_version} has no MLX runner for {architecture} (MLX text models "
                f"from {_v(MLX_TEXT_SINCE)}; {supported[0]} since {_v(supported[1])}): first in {_v(first)}",
                hint="leave --runner to plan llama.cpp, or plan a release that has it (--ollama-version)",
            )
        return RunnerChoice("mlx", "--runner mlx", ollama_version, "--runner")
    if requested == "llamacpp":
        return RunnerChoice("llamacpp", "--runner llamacpp (a GGUF tag of the model)", ollama_version, "--runner")
    v = parse_version(ollama_version) if ollama_version else None
    if ollama_version and v is None:
        raise InputError(f"--ollama-version {ollama_version!r}: expected MAJOR.MINOR.PATCH, e.g. 0.40.0")
    named = f"Ollama {ollama_version}" if ollama_version else "Ollama (version unknown: the newest)"
    if supported is None:
        return RunnerChoice("llamacpp", f"{named}: no MLX model for {architecture}", ollama_version, "version")
    where, since = supported
    if v is not None and v != (0, 0, 0):
        if v < MLX_TEXT_SINCE or v < since:
            why = f"{named} has no MLX model for {architecture} ({where} since {_v(since)})"
            return RunnerChoice("llamacpp", why, ollama_version, "version")
        if v < MLX_DEFAULT_SINCE:
            why = (
                f"{named} picks the runner by the tag's format (server/images.go IsMLX): a GGUF tag runs "
                f"llama.cpp; its safetensors tags (-mlx, -nvfp4, -mxfp8) run MLX: --runner mlx plans those"
            )
            return RunnerChoice("llamacpp", why, ollama_version, "version")
    why = f"{named} runs {architecture} on MLX on Apple Silicon (>= {_v(MLX_DEFAULT_SINCE)}; {where})"
    return RunnerChoice("mlx", why, ollama_version, "version")


def num_ctx_enforced(ollama_version: str | None) -> bool:
    """Whether the MLX runner of this Ollama keeps prompts within num_ctx (no known release does)."""
    if NUM_CTX_ENFORCED_SINCE is None or not ollama_version:
        return False
    v = parse_version(ollama_version)
    return v is not None and v >= NUM_CTX_ENFORCED_SINCE


def _v(v: Version) -> str:
    return ".".join(map(str, v))


# --- the memory -------------------------------------------------------------------------------------------


def _elements(type_name: str, n_bytes: int) -> int:
    blck, size = BLOCK[GGMLType[type_name.upper()]]
    return n_bytes // size * blck


def weights_bytes(spec: ModelSpec, quant: str) -> int:
    """The weights as the MLX runner holds them for a model quantized to ``quant`` (create.go
    GetTensorQuantization): each linear weight of the GGUF re-stored at its MLX type, the token embedding
    at bf16, an untied output (lm_head) at the 8-bit type, and every other tensor (norms, small vectors,
    recurrent parameters) as large as the GGUF stores it (f32 there: an over-count, the safe side)."""
    if quant not in QUANTS:
        raise InputError(f"--mlx-quant {quant!r}: one of {', '.join(QUANTS)}")
    bpw, eight = bits_per_weight(quant), bits_per_weight(QUANTS[quant][2])
    linear = [w for w in spec.matmul_weights if w.block >= 0]
    if not linear:
        return _weights_from_size(spec, quant)
    down_cols = {spec.n_ff, spec.n_ff_exp * max(1, spec.n_expert), spec.n_ff_shexp} - {0}
    kv_rows = {spec.n_embd_k_gqa(il) for il in range(spec.n_layer_all)} | {
        spec.n_embd_v_gqa(il) for il in range(spec.n_layer_all)
    }
    total_bits = 0.0
    linear_bytes = 0
    for w in linear:
        n = _elements(w.type_name, w.n_bytes)
        linear_bytes += w.n_bytes
        expert = spec.n_expert > 1 and n // max(1, w.ne1) in (
            spec.n_ff_exp * spec.n_expert,
            spec.n_embd * spec.n_expert,
        )
        down = w.ne1 == spec.n_embd and n // w.ne1 in down_cols
        kv = w.ne1 in kv_rows and n // w.ne1 == spec.n_embd
        promoted = quant in _PROMOTED_QUANTS and (down or kv) and (not expert or quant == "int4")
        total_bits += n * (eight if promoted else bpw)
    embd = spec.n_vocab * spec.n_embd * BF16_BYTES
    output = int(spec.n_vocab * spec.n_embd * eight / 8) if spec.output_bytes else 0
    rest = max(0, spec.weights_bytes - linear_bytes - spec.tok_embd_bytes - spec.output_bytes)
    return int(total_bits / 8) + embd + output + rest


# bits per weight of a GGUF type as a whole file stores it (llama.cpp tools/quantize: Q4_K_M about 4.89),
# for a built-in profile, which has only the published download size and no tensor list
GGUF_BITS_PER_WEIGHT: Mapping[str, float] = {
    "q4_K": 4.89,
    "q4_0": 4.5,
    "q5_K": 5.7,
    "q6_K": 6.56,
    "q8_0": 8.5,
    "f16": 16.0,
    "bf16": 16.0,
    "mxfp4": 4.25,
}


def _weights_from_size(spec: ModelSpec, quant: str) -> int:
    """A profile: the linear weights counted from the published GGUF size (its file type's bits per weight),
    the share create.go promotes to 8 bits (k_proj, v_proj, down_proj) from the model's dimensions."""
    gguf_bpw = GGUF_BITS_PER_WEIGHT.get(spec.file_type)
    if gguf_bpw is None:
        raise InputError(
            f"{spec.name}: no tensor list and no bits per weight for {spec.file_type} to size its MLX weights",
            hint="pull the model (or give a GGUF) to plan its MLX weights",
        )
    n_linear = (spec.weights_bytes - spec.tok_embd_bytes - spec.output_bytes) * 8 / gguf_bpw
    hd_k, hd_v = spec.n_embd_head_k, spec.n_embd_head_v
    n_head, n_kv = max(spec.n_head, default=0), max(spec.n_head_kv, default=0)
    q_o = spec.n_embd * n_head * (hd_k + hd_v)
    k_v = spec.n_embd * n_kv * (hd_k + hd_v)
    if spec.n_expert > 1:
        gate_up = 2 * spec.n_embd * (spec.n_ff_exp * spec.n_expert + spec.n_ff_shexp)
        down_experts, down = spec.n_embd * spec.n_ff_exp * spec.n_expert, spec.n_embd * spec.n_ff_shexp
    else:
        gate_up, down_experts, down = 2 * spec.n_embd * spec.n_ff, 0, spec.n_embd * spec.n_ff
    layer = q_o + k_v + gate_up + down_experts + down
    promoted = k_v + down + (down_experts if quant == "int4" else 0)
    share = promoted / layer if quant in _PROMOTED_QUANTS and layer else 0.0
    bpw, eight = bits_per_weight(quant), bits_per_weight(QUANTS[quant][2])
    embd = spec.n_vocab * spec.n_embd * BF16_BYTES
    output = int(spec.n_vocab * spec.n_embd * eight / 8) if spec.output_bytes else 0
    return int(n_linear * ((1 - share) * bpw + share * eight) / 8) + embd + output


def kv_bytes_per_token(spec: ModelSpec) -> int:
    """K and V of one token over the full-attention layers (bf16)."""
    return sum(
        (spec.n_embd_k_gqa(il) + spec.n_embd_v_gqa(il)) * KV_BYTES_PER_VALUE
        for il in range(spec.n_layer_all)
        if spec.kv_layers[il] and not (spec.has_swa and spec.swa_layers[il])
    )


def kv_bytes(spec: ModelSpec, n_tokens: int) -> int:
    """The K/V arrays after ``n_tokens`` tokens: each layer's buffer grown in whole 256-token steps
    (kvcache.go appendKV), a sliding-window layer's capped at its window (rotating.go), plus the
    recurrent layers' fixed state (cache/recurrent.go Get: the conv tail in the activation dtype, bf16,
    the delta/SSM state in f32; llama.cpp's n_embd_r and n_embd_s count the same values)."""
    steps = -(-n_tokens // KV_STEP_TOKENS) * KV_STEP_TOKENS
    total = 0
    for il in range(spec.n_layer_all):
        if spec.recurrent_layers[il]:
            total += spec.n_embd_r * BF16_BYTES + spec.n_embd_s * 4
        if not spec.kv_layers[il]:
            continue
        cells = min(steps, spec.n_swa) if spec.has_swa and spec.swa_layers[il] and spec.n_swa else steps
        total += (spec.n_embd_k_gqa(il) + spec.n_embd_v_gqa(il)) * KV_BYTES_PER_VALUE * cells
    return total


@dataclass(frozen=True, slots=True)
class MlxMemory:
    """What Ollama's MLX runner holds for one model, against what macOS lets the GPU wire."""

    quant: str  # the MLX type of the tag (nvfp4, mxfp8, int4, int8, bf16)
    weights_bytes: int
    num_ctx: int  # what the user asked for (Modelfile / request / OLLAMA_CONTEXT_LENGTH)
    n_ctx_runner: int  # the prompt the runner accepts: num_ctx when enforced, else the model's maximum
    num_ctx_enforced: bool
    kv_bytes_per_token: int  # full-attention layers, bf16
    kv_bytes_at_num_ctx: int  # the K/V after num_ctx tokens (256-token steps)
    kv_bytes: int  # the K/V at n_ctx_runner: the most one conversation can make it hold
    prefix_cache_bytes: int  # paged-out snapshots, at most (8 GiB)
    wired_limit_bytes: int  # recommendedMaxWorkingSetSize: macOS's default GPU share of the RAM
    ram_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.prefix_cache_bytes

    @property
    def total_bytes_at_num_ctx(self) -> int:
        return self.weights_bytes + self.kv_bytes_at_num_ctx + self.prefix_cache_bytes

    @property
    def weights_wired(self) -> bool:
        """The weights fit the wired limit (else the runner warns "performance may be degraded")."""
        return self.weights_bytes <= self.wired_limit_bytes

    @property
    def fits(self) -> bool:
        """Everything the runner may hold (weights, K/V at the runner's context, a full prefix cache)
        within the GPU's share: past it macOS swaps (ollama#18131, #18556)."""
        return self.total_bytes <= self.wired_limit_bytes


def mlx_memory(spec: ModelSpec, *, num_ctx: int, ram_bytes: int, quant: str, enforced: bool) -> MlxMemory:
    from kvadvise.planner.gpus import apple_gpu_share_bytes

    n_runner = min(num_ctx, spec.n_ctx_train) if enforced else spec.n_ctx_train
    return MlxMemory(
        quant=quant,
        weights_bytes=weights_bytes(spec, quant),
        num_ctx=num_ctx,
        n_ctx_runner=n_runner,
        num_ctx_enforced=enforced,
        kv_bytes_per_token=kv_bytes_per_token(spec),
        kv_bytes_at_num_ctx=kv_bytes(spec, min(num_ctx, spec.n_ctx_train)),
        kv_bytes=kv_bytes(spec, n_runner),
        prefix_cache_bytes=PREFIX_CACHE_BYTES,
        wired_limit_bytes=apple_gpu_share_bytes(ram_bytes),
        ram_bytes=ram_bytes,
    )


@dataclass(frozen=True, slots=True)
class RunnerPlan:
    """The runner a Mac plan names, and the MLX runner's memory when it is MLX."""

    choice: RunnerChoice
    memory: MlxMemory | None  # None: llama.cpp loads it (the plan above is the load)

    def json_doc(self) -> dict[str, object]:
        m = self.memory
        doc: dict[str, object] = {
            "runner": self.choice.runner,
            "why": self.choice.why,
            "chosen_by": self.choice.chosen_by,
            "ollama_version": self.choice.ollama_version,
            "source": f"ollama/ollama@{PINNED_COMMIT[:12]}",
        }
        if m is not None:
            doc["mlx"] = {
                "quant": m.quant,
                "weights_bytes": m.weights_bytes,
                "num_ctx": m.num_ctx,
                "num_ctx_enforced": m.num_ctx_enforced,
                "n_ctx_runner": m.n_ctx_runner,
                "kv_bytes_per_token": m.kv_bytes_per_token,
                "kv_bytes_at_num_ctx": m.kv_bytes_at_num_ctx,
                "kv_bytes": m.kv_bytes,
                "prefix_cache_bytes": m.prefix_cache_bytes,
                "total_bytes": m.total_bytes,
                "total_bytes_at_num_ctx": m.total_bytes_at_num_ctx,
                "wired_limit_bytes": m.wired_limit_bytes,
                "ram_bytes": m.ram_bytes,
                "weights_wired": m.weights_wired,
                "fits": m.fits,
            }
        return doc

    def lines(self) -> list[str]:
        c, m = self.choice, self.memory
        name = "MLX (ollama runner --mlx-engine)" if c.runner == "mlx" else "llama-server"
        out = [f"runner: {name}: {c.why}"]
        if m is None:
            return out
        out.append("  the llama.cpp buffers of this plan are not what loads; the MLX runner holds:")
        out.append(f"  weights ({m.quant}, as MLX stores them)  {_gib(m.weights_bytes)}")
        if m.num_ctx_enforced:
            out.append(f"  K/V at num_ctx {m.num_ctx:,} (bf16, grown 256 tokens at a time)  {_gib(m.kv_bytes)}")
        else:
            out.append(
                f"  num_ctx {m.num_ctx:,} is ignored by this runner (ollama#16219, #18125): it accepts prompts up to "
                f"{m.n_ctx_runner:,} tokens (the model's maximum); K/V {_gib(m.kv_bytes_at_num_ctx)} at {m.num_ctx:,}, "
                f"{_gib(m.kv_bytes)} at {m.n_ctx_runner:,}"
            )
        out.append(f"  prefix cache (paged-out snapshots, fixed, ollama#18131)  up to {_gib(m.prefix_cache_bytes)}")
        verdict = "fits" if m.fits else "does NOT fit: macOS swaps past it"
        out.append(
            f"  total {_gib(m.total_bytes)} against the GPU's share {_gib(m.wired_limit_bytes)} of "
            f"{_gib(m.ram_bytes)} (iogpu.wired_limit_mb): {verdict}"
        )
        if not m.fits and not m.num_ctx_enforced:
            verdict = "fits" if m.total_bytes_at_num_ctx <= m.wired_limit_bytes else "does not fit either"
            out.append(f"  with prompts kept under num_ctx yourself: {_gib(m.total_bytes_at_num_ctx)}, {verdict}")
        if not m.weights_wired:
            out.append("  the weights exceed the wired limit: the runner warns 'performance may be degraded'")
        # x/mlxrunner reads no OLLAMA_KV_CACHE_TYPE, OLLAMA_FLASH_ATTENTION or LLAMA_ARG_* (envconfig: only
        # LoadTimeout, GpuOverhead, LogLevel); num_ctx still sets what /api/ps reports
        out.append("  the server settings above size llama.cpp loads only: the MLX runner reads none of them")
        return out


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
