"""Round 23b (attacker): Ollama's llamarunner (swa_full, the embeddings row, num_batch), Apple's M4 decode class, and
``kvadvise hf`` on GLM-4.7-Flash and LFM2 / LFM2-MoE configs, through the commands and the Python API.

No Ollama server answers (attack_helpers.no_server: a closed port, an empty store); the registry is off; built-in
profiles stand for the library models. Sources: Ollama's history (``git show vX.Y.Z:path`` of ollama/ollama), the
llama.cpp b11312 vendored by llama_cpp_python 0.3.36, transformers' config classes, published GGUF sizes.

Tests marked "Regression guard (passes)" pass now; the others are findings (they fail now and pass once kvadvise
follows the source they cite).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from attack_helpers import no_internal_error, no_server, one_line_input_error, parameter_count, run  # noqa: F401
from json_contract import schema_errors

GB, GIB, MIB = 10**9, 1024**3, 1024**2
ROOT = Path(__file__).resolve().parent.parent

_ENV = ("OLLAMA_CONTEXT_LENGTH", "OLLAMA_NUM_PARALLEL", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION",
        "OLLAMA_GPU_OVERHEAD", "OLLAMA_NEW_ENGINE", "OLLAMA_NEW_ESTIMATES", "OLLAMA_SCHED_SPREAD")  # fmt: skip


def _ollama(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    """``kvadvise ollama ARGS --json`` with none of this shell's OLLAMA_* settings and the registry off."""
    monkeypatch.setenv("KVADVISE_OLLAMA_REGISTRY", "off")
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    rc, out, err = run(capsys, "ollama", *args, "--json")
    assert rc in (0, 3), (rc, err)
    doc: dict[str, Any] = json.loads(out)
    return doc


def _caches(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in plan["memory"]["caches"]}


# gemma2:9b (built-in profile, google/gemma-2-9b-it): 42 layers, 21 global + 21 sliding (window 4096), 8 KV heads of
# 256, n_embd 3584, vocab 256,000. One cell of one layer's K (f16) = 8 x 256 x 2 B = 4096 B.
G2_KV_ROW = 8 * 256 * 2
G2_VOCAB, G2_EMBD = 256_000, 3584


# --- 1. Ollama's llamarunner: swa_full, the embeddings row, num_batch ----------------------------------------------


@pytest.mark.parametrize("version", ["0.11.0", "0.12.3", "0.18.2", "0.24.0"])
@pytest.mark.parametrize("np_", ["1", "2"])
def test_gemma2_llamarunner_swa_cache_is_full_size(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str, np_: str
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version V --vram 24GiB --ctx 4096 -np N``.
    gemma2 is never in fs/ggml/ggml.go KV.OllamaEngineRequired (v0.12.3, v0.18.2, v0.24.0), so llm/server.go
    NewLlamaServer starts the llamarunner, whose llama/llama.go NewContextParams starts from
    llama_context_default_params() and never sets swa_full (vendored src/llama-context.cpp: ``/*.swa_full =*/
    true``): the sliding-window layers' cache is as large as the global layers' (n_ctx = num_ctx x slots). 0.11.0
    vendors a llama.cpp (de4c07f93) from before the iSWA cache: every layer full-size there as well."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", version, "--vram", "24GiB", "--ctx", "4096",
                   "-np", np_)  # fmt: skip
    assert plan["ollama"]["release"]["runner"] == "llamarunner"
    c = _caches(plan)
    n_ctx = 4096 * int(np_)
    assert c["swa"]["k_bytes"] == c["kv"]["k_bytes"] == 21 * n_ctx * G2_KV_ROW, c
    assert plan["config"]["swa_full"] is True


def test_gemma2_llama_server_swa_cache_is_window_sized(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version 0.30.0 --vram 24GiB --ctx 8192``.
    From 0.30 Ollama runs llama-server (no --swa-full in llm/llama_server.go), whose common_params.swa_full is false:
    llama_kv_cache_iswa sizes the SWA cache min(n_ctx, GGML_PAD(n_swa + n_ubatch, 256)) = 4096 + 512 = 4608 cells
    (b11312 src/llama-kv-cache-iswa.cpp), not the full 8192; n_ubatch is Ollama's automatic num_batch at 8,192 tokens,
    1,024 (server/sched.go automaticGenerationBatch), so 4096 + 1024 = 5120 cells."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.30.0", "--vram", "24GiB", "--ctx", "8192")
    assert plan["ollama"]["release"]["runner"] == "llama-server"
    assert plan["config"]["n_ubatch"] == 1024
    c = _caches(plan)
    assert c["swa"]["k_bytes"] == 21 * 5120 * G2_KV_ROW, c
    assert c["kv"]["k_bytes"] == 21 * 8192 * G2_KV_ROW, c
    assert plan["config"]["swa_full"] is False


@pytest.mark.parametrize("model", ["gemma3:12b", "gpt-oss:20b"])
@pytest.mark.parametrize("version", ["0.12.3", "0.18.2", "0.24.0"])
def test_go_engine_models_do_not_get_swa_full(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, model: str, version: str
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma3:12b|gpt-oss:20b --ollama-version V --ctx 16384``.
    gemma3 and gptoss are in OllamaEngineRequired at every 0.11-0.24 tag, so the Go ollamarunner runs them: its own
    kvcache.SWACache (window + batch cells), not llama.cpp's context; swa_full (the llamarunner's) must not apply."""
    plan = _ollama(capsys, monkeypatch, model, "--ollama-version", version, "--vram", "24GiB", "--ctx", "16384")
    assert plan["ollama"]["release"]["runner"] == "ollamarunner"
    assert plan["config"]["swa_full"] is False
    c = _caches(plan)
    assert c["swa"]["cells"] < c["kv"]["cells"] == 16384, c


@pytest.mark.parametrize(("version", "embd"), [("0.18.2", G2_EMBD), ("0.30.0", 0)])
def test_output_buffer_embeddings_row_only_in_llamarunner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str, embd: int
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version V -np 2 --ctx 4096``: llama_context::
    output_reserve holds n_vocab (+ n_embd when cparams.embeddings) f32 per sequence. Ollama's llamarunner sets
    params.embeddings = true (v0.18.2 llama/llama.go NewContextParams; the vendored output_reserve: has_embd =
    cparams.embeddings); llama-server (0.30+) does not set embeddings for a chat model."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", version, "--vram", "24GiB", "--ctx", "4096",
                   "-np", "2")  # fmt: skip
    assert plan["memory"]["output_bytes"] == (G2_VOCAB + embd) * 4 * 2


def test_llamarunner_num_batch_is_ubatch_and_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version 0.18.2 --batch 256 -np 2``: the
    llamarunner's context gets n_ubatch = num_batch and n_batch = num_batch x slots (v0.18.2 llama/llama.go
    NewContextParams); the advice sets num_batch 256 (what Ollama takes), not the context's n_batch 512."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.18.2", "--vram", "24GiB", "--ctx", "4096",
                   "-np", "2", "--batch", "256")  # fmt: skip
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (512, 256)
    assert plan["ollama"]["settings"]["num_batch"] == 256


def test_llamarunner_gemma2_quantized_cache_stays_f16(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version 0.18.2 -ctk q8_0 -ctv q8_0``:
    v0.18.2 fs/ggml/ggml.go SupportsFlashAttention returns false for gemma2, so llm/server.go drops a quantized
    OLLAMA_KV_CACHE_TYPE ("OLLAMA_FLASH_ATTENTION must be enabled ..."): an f16 cache, full-size SWA included."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.18.2", "--vram", "24GiB", "--ctx", "4096",
                   "-ctk", "q8_0", "-ctv", "q8_0")  # fmt: skip
    assert (plan["config"]["type_k"], plan["config"]["type_v"]) == ("f16", "f16")
    c = _caches(plan)
    assert c["swa"]["k_bytes"] == c["kv"]["k_bytes"] == 21 * 4096 * G2_KV_ROW


def test_gemma2_llamarunner_advised_flash_attention_env_keeps_the_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINDING. ``kvadvise ollama gemma2:9b --ollama-version 0.18.2 --vram 24GiB --ctx 4096 --json``.

    kvadvise plans flash attention on (the llamarunner's auto from 0.13.4) and its advice sets
    ``OLLAMA_FLASH_ATTENTION=1`` (ollama.env; the text output prints it under "server:" and in the systemd lines).
    But with that variable set Ollama 0.18.2 turns flash attention OFF for gemma2: v0.18.2 llm/server.go
    NewLlamaServer: faUserSet (the variable is set), ``fa := envconfig.FlashAttention(...)`` is true, then ``if fa &&
    !f.SupportsFlashAttention() { fa = false }`` (fs/ggml/ggml.go SupportsFlashAttention: ``if slices.Contains(
    []string{"gemma2"}, arch) { return false }``), and for the llamarunner (tok == nil) ``flashAttention =
    ml.FlashAttentionDisabled``. kvadvise's own ``-fa on`` plan (the same variable) agrees: flash_attention false,
    compute 579.9 MB instead of 563.1 MB. So following the advice runs a different configuration from the one
    planned. Rule: for a model SupportsFlashAttention refuses, leave OLLAMA_FLASH_ATTENTION unset (llama.cpp's auto)
    or plan what the advised setting gives; the advised env, replayed, must give the plan's flash attention."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.18.2", "--vram", "24GiB", "--ctx", "4096")
    advised = plan["ollama"]["env"].get("OLLAMA_FLASH_ATTENTION")
    fa = plan["ollama"]["settings"]["flash_attention"]
    if advised is None:  # left to llama.cpp's auto: nothing to replay
        return
    replay = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.18.2", "--vram", "24GiB", "--ctx",
                     "4096", "-fa", "on" if advised == "1" else "off")  # fmt: skip
    assert replay["ollama"]["settings"]["flash_attention"] == fa, (advised, fa, replay["ollama"]["settings"])


@pytest.mark.parametrize(
    ("model", "version"),
    [("gemma2:9b", "0.18.2"), ("gemma2:9b", "0.11.0"), ("gemma3:12b", "0.18.2"), ("gpt-oss:20b", "0.24.0"),
     ("gemma2:9b", "0.30.0")],
)  # fmt: skip
def test_iswa_plans_follow_the_plan_schema(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, model: str, version: str
) -> None:
    """Regression guard (passes). ``kvadvise ollama MODEL --ollama-version V -np 2 --batch 256 --json`` validates
    against docs/schema/plan.schema.json (swa_full, the output bytes, num_batch in the document)."""
    plan = _ollama(capsys, monkeypatch, model, "--ollama-version", version, "--vram", "24GiB", "--ctx", "8192",
                   "-np", "2", "--batch", "256")  # fmt: skip
    assert schema_errors("plan.schema.json", plan) == []


# --- 2. Speed: Apple's M4 class ------------------------------------------------------------------------------------


def _profiles() -> list[dict[str, Any]]:
    doc = json.loads((ROOT / "profiles" / "gpus.json").read_text())
    return [p for p in doc["gpus"] if isinstance(p, dict)]


def test_m4_class_only_on_m4_profiles() -> None:
    """Regression guard (passes). profiles/gpus.json: every Apple M4 card (id m4-*) has speed_class m4; no M1, M2 or
    M3 card has it (M1 Max/Ultra: m1; M2/M3: Metal's default fit)."""
    apple = [p for p in _profiles() if str(p.get("id", "")).startswith(("m1-", "m2-", "m3-", "m4-"))]
    assert apple
    for p in apple:
        is_m4 = str(p["id"]).startswith("m4-")
        assert (p.get("speed_class") == "m4") == is_m4, p["id"]


def test_m4_decode_same_in_every_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression guard (passes). The M4 class reaches every command that prints a decode figure:
    ``kvadvise ollama llama3.2:1b --gpu m4-max-64gb --ctx 4096``, ``kvadvise compare llama3.2:1b --gpu m4-max-64gb
    --target-ctx 4096`` and ``kvadvise gpus llama3.2:1b --target-ctx 4096 --json`` give the same 4k figure, and it
    is above the M3 Max 64 GB's by more than the bandwidth ratio (546 / 400): the shorter fixed time per layer."""
    plan = _ollama(capsys, monkeypatch, "llama3.2:1b", "--gpu", "m4-max-64gb", "--ctx", "4096")
    m3 = _ollama(capsys, monkeypatch, "llama3.2:1b", "--gpu", "m3-max-64gb", "--ctx", "4096")
    t_plan = plan["decode_estimate"]["tokens_per_s"]
    rc, out, err = run(capsys, "compare", "llama3.2:1b", "--gpu", "m4-max-64gb", "--target-ctx", "4096", "--json")
    assert rc == 0, err
    entry = json.loads(out)["entries"][0]
    assert entry["decode_4k_tokens_per_s"] == pytest.approx(t_plan, rel=1e-6)
    rc, out, err = run(capsys, "gpus", "llama3.2:1b", "--target-ctx", "4096", "--json")
    assert rc == 0, err
    card = next(c for c in json.loads(out)["cards"] if c["card"] == "m4-max-64gb")
    assert card["decode_4k_tokens_per_s"] == pytest.approx(t_plan, rel=1e-6)
    assert t_plan / m3["decode_estimate"]["tokens_per_s"] > 546 / 400
    assert "M4" in plan["decode_estimate"]["note"], plan["decode_estimate"]["note"]


def test_metal_default_class_note_names_metal_classes() -> None:
    """Regression guard (passes). API: speed.class_label(Device("metal", ...)) for a Metal card of unknown
    architecture names Metal's classes (M1, M4), not ROCm's GCN cards; a ROCm one still names GCN."""
    from kvadvise.planner.speed import Device, class_label

    metal = class_label(Device(backend="metal", bandwidth_bytes_per_s=400 * GB))
    assert "M4" in metal and "M1" in metal and "GCN" not in metal, metal
    assert "GCN" in class_label(Device(backend="rocm", bandwidth_bytes_per_s=1024 * GB))
    assert "M4 class" in class_label(Device(backend="metal", bandwidth_bytes_per_s=546 * GB, speed_class="m4"))


# --- 3. kvadvise hf: GLM-4.7-Flash, LFM2, LFM2-MoE ---------------------------------------------------------------

from test_attack_round22a import GLM47_FLASH  # noqa: E402  (the published config, field by field)

# LFM2-1.2B's config.json as published (LiquidAI/LFM2-1.2B; the field names of Liquid's own config, e.g. the copy in
# a public model_repo README: "tie_embedding": true, block_* keys; layer_types with attention at 2,5,8,10,12,14 as
# transformers' tests use for the 1.2B: full_attn_idxs [2, 5, 8, 10, 12, 14]).
_LT = ["conv"] * 16
for _i in (2, 5, 8, 10, 12, 14):
    _LT[_i] = "full_attention"
LFM2_12B: dict[str, Any] = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_auto_adjust_ff_dim": True,
    "block_dim": 2048, "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
    "block_norm_eps": 1e-05, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "hidden_size": 2048,
    "intermediate_size": 12288, "layer_types": _LT, "max_position_embeddings": 128000, "norm_eps": 1e-05,
    "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "vocab_size": 65536, "tie_embedding": True,
}  # fmt: skip
# LFM2-1.2B's parameters counted from its shapes (tied embeddings, ff 2/3 x 12288 = 8192): embeddings 65536 x 2048,
# 16 FFNs 3 x 2048 x 8192, 10 conv blocks (in_proj 2048 x 6144, out_proj 2048 x 2048, conv 3 x 2048), 6 attention
# blocks (q, o 2048 x 2048; k, v 2048 x 512) = 1,170 M less the norms: Liquid AI's "1.17B" and the F16 GGUF's size.
LFM2_12B_MATRICES = 65536 * 2048 + 16 * 3 * 2048 * 8192 + 10 * (2048 * 6144 + 2048 * 2048 + 3 * 2048) \
    + 6 * (2 * 2048 * 2048 + 2 * 2048 * 512)  # fmt: skip


def _hf(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg: dict[str, Any], *args: str) -> tuple[int, str, str]:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    hw = () if "--gpu" in args else ("--no-hardware",)
    return run(capsys, "hf", str(p), *hw, *args)


def _hf_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg: dict[str, Any], *args: str) -> dict[str, Any]:
    rc, out, err = _hf(capsys, tmp_path, cfg, *args, "--json")
    assert rc == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_lfm2_tie_embedding_key_means_tied(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """FINDING. ``kvadvise hf LFM2-1.2B/config.json --quant Q8_0 --ctx 32768 --no-hardware``.

    LFM2's published config says ``"tie_embedding": true`` (Liquid's key; no tie_word_embeddings). transformers
    reads it (src/transformers/models/lfm2/configuration_lfm2.py Lfm2Config.__init__: ``tie_word_embeddings =
    kwargs.get("tie_embedding", tie_word_embeddings)``, default True), the checkpoint has no lm_head, and llama.cpp's
    converter writes no output.weight (lfm2.cpp falls back to token_embd). kvadvise ignores the key
    (breakdown.params: ``hp.get("tie_word_embeddings", arch in _TIED_BY_DEFAULT)``, lfm2 not in it) and counts a
    second 65,536 x 2,048 output matrix: 1,304,489,984 parameters where the model has about 1,170 M (Liquid AI:
    1.17 B), Q8_0 1.39 GB where the published LFM2 1.2B Q8_0 files are 1.17-1.25 GB. Rule: read tie_embedding as
    tie_word_embeddings (and default tied for lfm2/lfm2moe, as the transformers classes do)."""
    plan = _hf_plan(capsys, tmp_path, LFM2_12B, "--quant", "Q8_0", "--ctx", "32768")
    n = parameter_count(plan)
    assert n == pytest.approx(LFM2_12B_MATRICES, rel=0.01), (n, LFM2_12B_MATRICES)


def test_lfm2_without_tie_key_defaults_tied(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """FINDING. ``kvadvise hf config.json --quant Q8_0`` on an LFM2 config with neither tie key (transformers'
    Lfm2Config and Lfm2MoeConfig default tie_word_embeddings=True, so such a checkpoint has no lm_head and its GGUF no
    output.weight). kvadvise counts an untied output (lfm2 is not in breakdown._TIED_BY_DEFAULT): 134 M parameters
    too many. Same count expected as with tie_word_embeddings true."""
    cfg = {k: v for k, v in LFM2_12B.items() if k != "tie_embedding"}
    tied = dict(cfg, tie_word_embeddings=True)
    n_default = parameter_count(_hf_plan(capsys, tmp_path, cfg, "--quant", "Q8_0"))
    n_tied = parameter_count(_hf_plan(capsys, tmp_path, tied, "--quant", "Q8_0"))
    assert n_default == n_tied, (n_default, n_tied)


def test_lfm2_kv_and_conv_state(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression guard (passes). LFM2-1.2B at 32,768 tokens, f16: K and V only on the 6 attention blocks (lfm2.py
    zeroes head_count_kv on conv blocks): 6 x 8 x 64 x 2 x 2 B = 12,288 B a token; the 10 short-conv blocks keep a
    recurrent state of n_embd x (L_cache - 1) f32 each (b11312 llama_hparams::n_embd_r for shortconv):
    10 x 2048 x 2 x 4 B = 163,840 B."""
    plan = _hf_plan(capsys, tmp_path, dict(LFM2_12B, tie_word_embeddings=True), "--quant", "Q4_K_M", "--ctx", "32768")
    assert plan["memory"]["kv_bytes_per_token"] == 6 * 8 * 64 * 2 * 2
    assert plan["memory"]["recurrent_bytes"] == 10 * 2048 * 2 * 4


def test_lfm2_adjusted_ff_dim(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression guard (passes). API: hfconfig.gguf_metadata writes lfm2.feed_forward_length as b11312
    conversion/lfm2.py LFM2Model._add_feed_forward_length: int(2 x 12288 / 3) = 8192, x 1.0, rounded up to 256."""
    from kvadvise.model.hfconfig import gguf_metadata

    md = gguf_metadata(LFM2_12B, source="lfm2.json")
    assert md["lfm2.feed_forward_length"] == 8192
    md2 = gguf_metadata(dict(LFM2_12B, block_ff_dim=6656, intermediate_size=6656), source="lfm2.json")  # LFM2-350M
    assert md2["lfm2.feed_forward_length"] == 4608


@pytest.mark.parametrize(("quant", "published_gb"), [("Q8_0", 31.84), ("Q4_K_M", 18.47), ("BF16", 59.91)])
def test_glm47_flash_weights_near_published_gguf(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, quant: str, published_gb: float
) -> None:
    """Regression guard (passes). ``kvadvise hf GLM-4.7-Flash/config.json --quant Q --no-hardware``: within 5 % of
    bartowski's GGUFs (mygguf.com/models/bartowski_zai-org_GLM-4.7-Flash-GGUF: bf16 59.91 GB, Q8_0 31.84 GB, Q4_K_M
    18.47 GB; llama.cpp b7779). kvadvise is 1.4-2.2 % above: it counts the MTP block that b11312's converter keeps
    (conversion/glm.py Glm4MoeLiteModel: block_count = 47 + num_nextn_predict_layers) and b7779 had not written
    (59.91 GB / 2 = 29.95 B parameters = kvadvise's 30.59 B less one MoE block)."""
    plan = _hf_plan(capsys, tmp_path, GLM47_FLASH, "--quant", quant, "--ctx", "8192")
    w = plan["memory"]["weights_bytes"] / GB
    assert w == pytest.approx(published_gb, rel=0.05), w


def test_glm47_flash_kv_per_token(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression guard (passes). MLA at b11312: K only, kv_lora_rank + qk_rope = 576 values per layer, the 47 main
    layers (create_memory filters the NextN block): 47 x 576 x 2 B = 54,144 B a token at f16; at q8_0 (34 B a
    32-value block) 47 x 576 / 32 x 34 = 28,764 B (no V cache to add: V is a view of K)."""
    plan = _hf_plan(capsys, tmp_path, GLM47_FLASH, "--quant", "Q4_K_M", "--ctx", "32768")
    assert plan["memory"]["kv_bytes_per_token"] == 47 * 576 * 2
    q8 = _hf_plan(
        capsys,
        tmp_path,
        GLM47_FLASH,
        "--quant",
        "Q4_K_M",
        "--ctx",
        "32768",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
    )
    assert q8["memory"]["kv_bytes_per_token"] == 47 * 576 // 32 * 34


# --- 4. Bad input: one line, exit 2, no traceback -------------------------------------------------------------------


@pytest.mark.parametrize("mult", [1e308, math.inf, math.nan, 1e12], ids=["1e308", "Infinity", "NaN", "1e12"])
def test_lfm2_non_finite_ffn_multiplier_is_input_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mult: float
) -> None:
    """FINDING. ``kvadvise hf config.json --quant Q4_K_M --no-hardware`` on an LFM2 config whose
    block_ffn_dim_multiplier is 1e308, Infinity or NaN (Python's json reads the last two; 1e308 x 8192 overflows).
    kvadvise: exit 1, "kvadvise: internal error: OverflowError: cannot convert float infinity to integer" (NaN:
    ValueError) -- hfconfig._lfm2 does int(mult * ff) unchecked. docs/exit-codes.md: bad input is exit 2 with one
    "kvadvise: error:" line; exit 1 is a kvadvise bug. Rule: a non-finite or absurd block_ffn_dim_multiplier (or
    the ff it gives) is refused like any other bad number in the config. 1e12: exit 0 with "weights 459300519813.21
    GiB" (a feed_forward_length of 8.2e15, where a config's intermediate_size above 1,048,576 is refused as "larger
    than any real model")."""
    cfg = dict(LFM2_12B, block_ffn_dim_multiplier=mult)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))  # json.dumps writes Infinity / NaN as Python's json reads them
    rc, _out, err = run(capsys, "hf", str(p), "--quant", "Q4_K_M", "--no-hardware")
    one_line_input_error(rc, err)


@pytest.mark.parametrize(
    ("which", "key", "value"),
    [("lfm2moe", "num_dense_layers", -1), ("lfm2moe", "num_dense_layers", "2"), ("lfm2moe", "num_dense_layers", 2.5),
     ("lfm2moe", "num_dense_layers", None), ("lfm2", "block_multiple_of", -256), ("lfm2", "block_multiple_of", "256"),
     ("lfm2", "block_ff_dim", None), ("glm", "num_nextn_predict_layers", -3), ("glm", "num_nextn_predict_layers", 1.5),
     ("glm", "num_nextn_predict_layers", "1"), ("glm", "num_nextn_predict_layers", 10**7),
     ("glm", "kv_lora_rank", None)],
)  # fmt: skip
def test_bad_new_config_fields_are_input_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, which: str, key: str, value: object
) -> None:
    """Regression guard (passes). The fields this round reads (num_dense_layers, block_multiple_of, block_ff_dim,
    GLM-4.7-Flash's num_nextn_predict_layers, kv_lora_rank): negative, a string, a fraction, absurd or missing ->
    exit 2, one ``kvadvise: error:`` line (None: the key removed, or null for kv_lora_rank)."""
    if which == "glm":
        cfg = copy.deepcopy(GLM47_FLASH)
    elif which == "lfm2":
        cfg = copy.deepcopy(LFM2_12B)
    else:
        cfg = copy.deepcopy(LFM2_MOE)
    if value is None and key != "kv_lora_rank":
        cfg.pop(key, None)
        if key == "block_ff_dim":
            cfg.pop("intermediate_size", None)
    else:
        cfg[key] = value
    rc, _out, err = _hf(capsys, tmp_path, cfg, "--quant", "Q4_K_M")
    one_line_input_error(rc, err)


_LT_MOE = ["conv"] * 24
for _i in (2, 6, 10, 14, 18, 21):
    _LT_MOE[_i] = "full_attention"
# LFM2-8B-A1B: transformers' Lfm2MoeConfig defaults (the LFM2-8B-A1B shape) with 24 layers, 6 of them attention
LFM2_MOE: dict[str, Any] = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
    "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
    "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "num_dense_layers": 2,
    "num_experts_per_tok": 4, "num_experts": 32, "use_expert_bias": True, "norm_topk_prob": True,
    "layer_types": _LT_MOE, "max_position_embeddings": 128000, "norm_eps": 1e-05, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_lfm2_moe_parameter_count(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression guard (passes). ``kvadvise hf LFM2-8B-A1B/config.json --quant Q4_K_M``: the parts counted as b11312
    lfm2.cpp loads them (2 leading dense blocks of 7168, 22 MoE blocks of 32 x 1792 experts, 18 conv + 6 attention
    mixers, tied embeddings): 8.34 B, as llama-bench prints "lfm2moe 8B.A1B" with 8.34 B (ggml-org/llama.cpp#19848)
    and Liquid AI's 8.3 B total."""
    n = parameter_count(_hf_plan(capsys, tmp_path, LFM2_MOE, "--quant", "Q4_K_M"))
    assert n == pytest.approx(8.34e9, rel=0.01), n


# --- 1b. cohere2 (Command R7B's architecture) from an Ollama store: the llamarunner's full-size SWA cache ------------


@pytest.fixture(scope="module")
def cohere2_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ollama store with a tiny cohere2 GGUF (tests/tinymodels.py: 4 layers, layers 0-2 sliding over 64 tokens,
    layer 3 global; K = V = 64, n_head_kv from the recipe) as ``r23b-cohere2``."""
    import hashlib

    from ollama_fake import build_store
    from tinymodels import write_tiny_gguf

    base = tmp_path_factory.mktemp("r23b")
    gguf = write_tiny_gguf(base / "c2.gguf", "cohere2", n_vocab=32000, n_ctx_train=131072, name="r23b-cohere2")
    root = base / "models"
    build_store(root, gguf, hashlib.sha256(b"r23b/cohere2").hexdigest(), model="r23b-cohere2")
    return root


@pytest.mark.parametrize(("version", "full"), [("0.12.3", True), ("0.18.2", True), ("0.24.0", True), ("0.30.0", False)])
def test_cohere2_store_model_swa_full_only_in_llamarunner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cohere2_store: Path,
    version: str, full: bool,
) -> None:  # fmt: skip
    """Regression guard (passes). ``kvadvise ollama r23b-cohere2 --ollama-version V --vram 8GiB --ctx 4096``:
    cohere2 is in no OllamaEngineRequired list (v0.12.3, v0.18.2, v0.24.0), so the llamarunner runs it with
    llama_context_default_params' swa_full = true: the three SWA layers' cache holds all 4,096 cells, as the global
    layer's. From 0.30 llama-server (swa_full false): GGML_PAD(64 + 512, 256) = 768 cells."""
    from attack_helpers import use_store

    use_store(monkeypatch, cohere2_store, tmp_path)
    plan = _ollama(capsys, monkeypatch, "r23b-cohere2", "--ollama-version", version, "--vram", "8GiB", "--ctx", "4096")
    assert plan["ollama"]["release"]["runner"] == ("llamarunner" if full else "llama-server")
    c = _caches(plan)
    assert c["swa"]["n_layer"] == 3 and c["kv"]["n_layer"] == 1, c
    assert c["swa"]["cells"] == (4096 if full else 768), c
    per_layer_swa = c["swa"]["k_bytes"] // 3
    assert per_layer_swa * c["kv"]["cells"] == c["kv"]["k_bytes"] * c["swa"]["cells"], c  # same row size


@pytest.mark.parametrize("num_batch", [None, "256"])
def test_llamarunner_decision_graph_at_ollama_num_batch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, num_batch: str | None
) -> None:
    """Regression guard (passes). ``kvadvise ollama gemma2:9b --ollama-version 0.18.2 --ctx 4096 -np 2 [--batch
    256]``: the replayed decision's "compute graph" is v0.18.2 fs/ggml/ggml.go GraphSize's gemma2 fullOffload at
    Ollama's BatchSize (num_batch, llm/server.go createLayout), not the context's n_batch (num_batch x slots):
    max(4 x batch x (embedding + vocab), 4 x batch x (2 + context + context x heads + 2 x embedding + 2 x headsK x
    heads)) with context 8,192 (num_ctx x numParallel), heads 16, embedding 3,584, vocab 256,000, head 256:
    4 x 512 x 259,584 B = 507.0 MiB; 4 x 256 x 259,584 B = 253.5 MiB."""
    extra = ("--batch", num_batch) if num_batch else ()
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", "0.18.2", "--vram", "24GiB", "--ctx", "4096",
                   "-np", "2", *extra)  # fmt: skip
    batch = int(num_batch or 512)
    context, heads, embd, vocab, hk = 8192, 16, G2_EMBD, G2_VOCAB, 256
    full = max(4 * batch * (embd + vocab), 4 * batch * (2 + context + context * heads + 2 * embd + 2 * hk * heads))
    import re

    logged = re.search(r'msg="compute graph" device=CUDA0 size="([^"]+)"', plan["ollama"]["decision"]["log_line"])
    assert logged is not None, plan["ollama"]["decision"]["log_line"]
    assert logged.group(1) == f"{full / MIB:.1f} MiB", (logged.group(1), full / MIB)


def test_mac_given_by_vram_and_bandwidth_gets_the_metal_default_note(capsys: pytest.CaptureFixture[str]) -> None:
    """FINDING (docs vs behaviour). docs/how-numbers-are-computed.md (the M4 class paragraph, this round): "A Mac
    given by `--vram`/`--bandwidth` keeps Metal's default and the note says so", and speed._DEFAULT_CLASS_NOTE
    ["metal"] was written for it ("an M1 Max/Ultra decodes about 30 % slower, an M4 or later up to 30 % faster").
    But there is no way to give a Mac by --vram/--bandwidth: ``kvadvise ollama llama3.2:1b --vram 48GiB --bandwidth
    546 --device metal --ctx 4096`` is refused with exit 2 ("--device metal: a --vram budget is a discrete GPU's
    (Metal runs on Apple Silicon)", entry.check_machine), without --device the budget is planned as CUDA (its note
    says cuda), and no probe detects a Mac (hardware.probe: NVML, AMD sysfs). So the documented note is never
    printed. Rule: either accept ``--device metal`` with a --vram budget (a Mac of unknown chip, Metal's default
    class and that note) or drop the sentence and the note."""
    doc = " ".join((ROOT / "docs" / "how-numbers-are-computed.md").read_text().split())
    if "A Mac given by `--vram`/`--bandwidth`" not in doc:
        return  # the promise was dropped: nothing to hold the command to
    rc, out, err = run(capsys, "ollama", "llama3.2:1b", "--vram", "48GiB", "--bandwidth", "546", "--device", "metal",
                       "--ctx", "4096", "--json")  # fmt: skip
    assert rc == 0, err
    note = json.loads(out)["decode_estimate"]["note"]
    assert "default class assumed" in note and "M4" in note, note


def test_lfm2_moe_tie_embedding_key_means_tied(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """FINDING. As test_lfm2_tie_embedding_key_means_tied for LFM2-MoE: transformers' Lfm2MoeConfig.__init__ also
    reads ``tie_word_embeddings = kwargs.get("tie_embedding", tie_word_embeddings)`` (default True). An LFM2-8B-A1B
    config written with Liquid's key ("tie_embedding": true) should count as the tied one (8.34 B); kvadvise adds a
    65,536 x 2,048 output matrix (134 M parameters, 71 MB at Q4_K_M)."""
    cfg = {k: v for k, v in LFM2_MOE.items() if k != "tie_word_embeddings"}
    cfg["tie_embedding"] = True
    n_key = parameter_count(_hf_plan(capsys, tmp_path, cfg, "--quant", "Q4_K_M"))
    n_tied = parameter_count(_hf_plan(capsys, tmp_path, LFM2_MOE, "--quant", "Q4_K_M"))
    assert n_key == n_tied, (n_key, n_tied)


@pytest.mark.parametrize("version", ["0.13.3", "0.13.4"])
def test_llamarunner_embedding_model_context_batch_is_num_ctx(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """FINDING. ``kvadvise ollama bge-m3:567m --ollama-version 0.13.3|0.13.4 --vram 24GiB --ctx 8192 --json``.

    bge-m3 is a bert GGUF with bert.pooling_type; bert joins OllamaEngineRequired only at 0.13.5, so 0.13.3 and
    0.13.4 run it in the llamarunner. v0.13.3 llm/server.go (llamaServer).Load, before initModel sends the load
    request: ``if isEmbedding && s.loadRequest.BatchSize < s.options.NumCtx { s.loadRequest.BatchSize =
    s.options.NumCtx }`` ("embedding model detected, setting batch size to context length"), and
    runner/llamarunner/runner.go takes ``s.batchSize = req.BatchSize`` into ``llama.NewContextParams(kvSize,
    s.batchSize, ...)``: n_ubatch = 8,192 and n_batch = 8,192 x 1 slot. kvadvise plans the context at n_batch 512,
    n_ubatch 512 (compute 518 MB), the non-embedding num_batch, so the runner's compute buffer (a whole 8k-token
    ubatch through bert's non-causal attention) is under-planned. (backends/ollama/layout.py applies the rule to the
    decision's GraphSize, EMBEDDING_BATCH_FROM, but in_process_request does not.) Rule: in_process_request, from
    0.13.3, for a model with pooling: num_batch = max(num_batch, num_ctx)."""
    plan = _ollama(capsys, monkeypatch, "bge-m3:567m", "--ollama-version", version, "--vram", "24GiB", "--ctx", "8192")
    assert plan["ollama"]["release"]["runner"] == "llamarunner"
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (8192, 8192), plan["config"]


@pytest.mark.parametrize(("version", "n_batch"), [("0.12.3", 2048), ("0.18.2", 2048), ("0.30.0", 2048)])
def test_ollama_batch_2048_is_taken(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str, n_batch: int
) -> None:
    """FINDING. ``kvadvise ollama gemma2:9b --ollama-version V --vram 24GiB --ctx 4096 --batch 2048 --json``.

    For Ollama ``--batch`` is num_batch (docs/commands.md: "`num_batch` (`--batch`, ...) is planned as Ollama passes
    it"; docs/ollama-versions.md: "`num_batch` (512 unless `--batch`)"). --batch 1024 is planned so (n_ubatch 1024,
    settings.num_batch 1024), but --batch 2048 is dropped: the plan keeps num_batch 512 (n_batch 512, n_ubatch 512 on
    the llamarunner; -ub 512 on 0.30) and the advice sets no num_batch, because PlanRequest.given() counts a field
    as asked only when it differs from llama-server's default -b 2048 (advisor/request.py), and in_process_request /
    the advice read ``"n_batch" in given``. What Ollama does with PARAMETER num_batch 2048: v0.18.2 llm/server.go
    ``opts.NumBatch = min(opts.NumBatch, opts.NumCtx)`` = 2048 -> llama/llama.go NewContextParams(n_batch = 2048 x
    slots, n_ubatch 2048) (0.12.3: n_batch 2048, the library's n_ubatch 512); v0.30.0 llm/llama_server.go
    appendBatchArgs ``-b 2048 -ub 2048``. Rule: tell an explicit --batch from the default (e.g. None as the
    field's default), for Ollama at least."""
    plan = _ollama(capsys, monkeypatch, "gemma2:9b", "--ollama-version", version, "--vram", "24GiB", "--ctx", "4096",
                   "--batch", "2048")  # fmt: skip
    ub = 512 if version == "0.12.3" else 2048
    assert (plan["config"]["n_batch"], plan["config"]["n_ubatch"]) == (n_batch, ub), plan["config"]
    assert plan["ollama"]["settings"]["num_batch"] == 2048, plan["ollama"]["settings"]


@pytest.mark.xfail(
    strict=True,
    reason="held: a config's MTP blocks stay in the weights kvadvise hf plans (the output layer's share), as for "
    "Qwen3.5/3.6 configs, whose held-out decode rows were fitted with those bytes read per token: dropping them moved "
    "four Qwen3.5/3.6-35B-A3B rows to 1.33-1.40 and needs a refit of the hybrid-MoE speed (a GGUF's header plans "
    "them right: not loaded)",
)
def test_glm47_flash_mtp_block_not_loaded_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """FINDING. ``kvadvise hf GLM-4.7-Flash/config.json --quant Q8_0 --ctx 8192 --gpu h100-80gb --json``.

    kvadvise appends the MTP block to block_count as b11312's converter does (right for the file), but then plans
    its weights on the GPU and reads them for every decoded token: device weights 32.22 GB where the same config
    with num_nextn_predict_layers 0 gives 31.53 GB (0.69 GB more at Q8_0, one MoE block of 64 experts), and 165 t/s
    where that gives 172 (4 % slower). llama.cpp b11312 does not load the block unless a draft-mtp speculative run
    asks (src/models/deepseek2.cpp load_arch_tensors: ``if (!ml.load_mtp) { mtp_flags |= TENSOR_SKIP; }``;
    llama_model_default_params load_mtp = false, common.cpp sets it only for COMMON_SPECULATIVE_TYPE_DRAFT_MTP;
    llama-model-loader.cpp: "model has unused tensor ... -- ignoring", size_data -= nbytes), and kvadvise's own GGUF
    path leaves it out ("MTP/NextN block weights ... are not loaded by llama.cpp by default",
    model/architecture.py). Rule: the hf path's NextN blocks count for the file, not for memory or decode."""
    gpu = ("--gpu", "h100-80gb", "--quant", "Q8_0", "--ctx", "8192")
    with_mtp = _hf_plan(capsys, tmp_path, GLM47_FLASH, *gpu)
    without = _hf_plan(capsys, tmp_path, dict(GLM47_FLASH, num_nextn_predict_layers=0), *gpu)
    dev = [sum(d["weights_bytes"] for d in p["memory"]["devices"]) for p in (with_mtp, without)]
    assert dev[0] == pytest.approx(dev[1], rel=0.002), dev
    tps = [p["decode_estimate"]["tokens_per_s"] for p in (with_mtp, without)]
    assert tps[0] == pytest.approx(tps[1], rel=0.005), tps
