"""The MTP (NextN) draft context: ``llama-server --spec-type draft-mtp``, speculative decoding with the
multi-token-prediction blocks a GGUF carries after its trunk (``{arch}.nextn_predict_layers``).

What llama.cpp does with them (b11312 = 0c1e570):
- the model loads its NextN blocks only when MTP is asked for (common/common.cpp
  common_model_params_to_llama: ``mparams.load_mtp``), on the device of their layer index like any block
  (``--fit`` counts them: common/fit.cpp ``hp_ngl += llama_model_n_layer_nextn``);
- llama-server makes a second context on the same model (common/speculative.cpp
  common_speculative_init_result: "creating MTP draft context against the target model",
  ``cparams.ctx_type = LLAMA_CONTEXT_TYPE_MTP``, ``n_ctx = llama_n_ctx(ctx_tgt)``, the draft's cache types
  -ctkd/-ctvd, ``n_outputs_max = n_parallel`` from common_base_params_to_speculative); its KV cache holds
  the NextN layers only (src/llama-model.cpp create_memory: ``filter = il >= hparams.n_layer()``), no
  recurrent state (``n_rs_seq = 0``), and its compute graph runs those layers;
- the target context reserves logits for every drafted token (tools/server/server-context.cpp
  server_output_limits -> common_speculative_get_output_limits: ``n_parallel * (1 + n_max)`` rows);
- ``--fit`` reserves the MTP context beside the target (common_init_result: ``extra`` with
  ``shares_model = true``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvadvise.errors import ConfigError
from kvadvise.model.spec import ModelSpec

# The speculative types of --spec-type that kvadvise plans (common/speculative.cpp, b11312)
SPEC_TYPES = ("none", "draft-mtp")
# common/common.h common_params_speculative_draft::n_max (b11312); Ollama passes its draft_num_predict (4)
DEFAULT_N_MAX = 3


@dataclass(frozen=True, slots=True)
class DecodeGain:
    """A published measurement of decode with an MTP head against decode without it (an estimate for any
    other model, text and card: the gain follows the draft's acceptance rate)."""

    model: str
    speedup_low: float  # decode tok/s with MTP / without, x
    speedup_high: float
    acceptance_low: float  # drafted tokens accepted, 0..1
    acceptance_high: float
    source: str  # URL
    date: str


PUBLISHED_GAINS = (
    # Step-3.5-Flash IQ4_XS/Q4_K_S, f16 KV, --draft 1..3, 32k-64k: 35.38 -> 45.61 tok/s at best, 0.92x at worst
    DecodeGain("Step-3.5-Flash", 0.92, 1.29, 0.69, 0.89, "https://github.com/ggml-org/llama.cpp/pull/20981", "2026-03"),
    # Qwen3.6-35B-A3B UD-Q4_K_M, draft-mtp/4: acceptance per task 0.479 (creative) .. 0.806 (math)
    DecodeGain("Qwen3.6-35B-A3B", 0.0, 0.0, 0.48, 0.81, "https://github.com/ggml-org/llama.cpp/pull/22673", "2026-05"),
)


def gain_text() -> str:
    """The published figures, one line: what a plan says of MTP's decode gain."""
    parts = []
    for g in PUBLISHED_GAINS:
        speed = f"{g.speedup_low:.2f}-{g.speedup_high:.2f}x decode, " if g.speedup_high else ""
        parts.append(
            f"{g.model}: {speed}{g.acceptance_low:.0%}-{g.acceptance_high:.0%} of drafts accepted ({g.source})"
        )
    return "estimate from published runs: " + "; ".join(parts)


def check(spec: ModelSpec, llama_build: int | None = None) -> None:
    """llama_init_from_model (src/llama-context.cpp, b11312) returns no context for MTP on a model without
    NextN blocks ("context type MTP requested but model doesn't contain MTP layers"); a build before the speculative
    types (kvadvise.planner.builds.SPEC_DRAFT_ARGS) has no draft-mtp at all."""
    from kvadvise.planner import builds

    if builds.older_than(llama_build, builds.SPEC_DRAFT_ARGS):
        raise ConfigError(
            f"--spec-type draft-mtp: llama.cpp b{llama_build} has no MTP drafting (from b{builds.SPEC_DRAFT_ARGS}, "
            "ggml-org/llama.cpp#22964 and #22673); it refuses --spec-type",
            hint="drop --spec-type draft-mtp, or plan a newer build (--llama-build)",
        )
    if spec.n_layer_nextn == 0:
        raise ConfigError(
            f"{spec.name} has no MTP/NextN layers ({spec.architecture}.nextn_predict_layers is 0 or absent): "
            "llama-server cannot create a draft-mtp context for it",
            hint="drop --spec-type draft-mtp, or use a GGUF converted with its MTP layers",
        )


def with_nextn_weights(spec: ModelSpec) -> ModelSpec:
    """The model with its NextN blocks loaded (load_mtp): their weights in the blocks they belong to, the
    mapped span grown by them."""
    n = spec.n_layer_nextn
    if not n or not spec.nextn_layer_bytes:
        return spec
    trunk = spec.n_layer
    layer_bytes = spec.layer_bytes
    if layer_bytes:
        layer_bytes = (*layer_bytes[:trunk], *spec.nextn_layer_bytes)
    pads = spec.layer_cuda_pad_bytes
    if pads:
        pads = (*pads[:trunk], *spec.nextn_layer_cuda_pad_bytes)
    return replace(
        spec,
        weights_bytes=spec.weights_bytes + spec.nextn_span_bytes,
        layer_bytes=layer_bytes,
        layer_cuda_pad_bytes=pads,
        cuda_pad_bytes=spec.cuda_pad_bytes + sum(spec.nextn_layer_cuda_pad_bytes),
    )


def context_spec(spec: ModelSpec) -> ModelSpec:
    """The MTP context as a model of its own: the same layers, KV cells for the NextN layers only, no
    recurrent state, and no weights (it runs on the target's: they are counted there)."""
    n = spec.n_layer_all
    trunk = spec.n_layer
    return replace(
        spec,
        kv_layers=tuple(il >= trunk and spec.n_head_kv[il] > 0 for il in range(n)),
        recurrent_layers=(False,) * n,
        n_embd_r=0,
        n_embd_s=0,
        ssm=None,
        weights_bytes=0,
        tok_embd_bytes=0,
        output_bytes=0,
        input_extra_bytes=0,
        layer_bytes=(0,) * n,
        cuda_pad_bytes=0,
        layer_cuda_pad_bytes=(),
        matmul_weights=(),
        layer_largest_tensor_bytes=(),
        fixed_span=(0, 0),
    )
