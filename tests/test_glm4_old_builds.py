"""GLM-4-0414 (llama.cpp's glm4) on a build of May 2025: a published CUDA log of GLM-Z1-32B-0414 at b5274
(tests/data/published/034-*.json, with its URL), planned from its config.json (kvadvise.model.hfconfig,
Glm4ForCausalLM) and from a GGUF header of the same shape (the glm4 tensors of llama-model.cpp load_tensors:
attn_q/k/v, attn_output, post_attention_norm, ffn_norm, one ffn_up of 2 x n_ff, ffn_down, post_ffw_norm,
written sparse); the feed-forward rule of builds before ggml_swiglu (kvadvise.planner.builds.FUSED_GLU); and the
rule of builds before ggml-org/llama.cpp#15850 (kvadvise.planner.builds.GRAPH_OPTIMIZE): no backend reordered the
graph before ggml-alloc saw it, so kvadvise.planner.galloc over the graph as that build made it
(kvadvise.planner.llama_graph, legacy) is the device's compute buffer on CUDA too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import published_logs
import pytest
import tinymodels

from kvadvise.model.architecture import from_gguf
from kvadvise.model.gguf import read_file
from kvadvise.model.hfconfig import from_config
from kvadvise.model.spec import ModelSpec
from kvadvise.planner import builds
from kvadvise.planner.compute import analytic_device_compute
from kvadvise.planner.llama_graph import LlamaShape, build
from kvadvise.planner.memory import MIB, estimate, resolve

LOG = published_logs.load(
    Path(__file__).resolve().parent / "data" / "published" / "034-cuda-glmz1-32b-b5274-sweepbench-c32768-fa.json"
)


def _glm4(path: Path, hf: dict[str, int], n_vocab: int) -> ModelSpec:
    """A sparse glm4 GGUF of the config's dimensions, as convert_hf_to_gguf.py's Glm4Model writes it."""
    n_layer, n_embd, n_ff = hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"]
    n_head, n_head_kv, head = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    t = tinymodels._TinyWriter(path, "glm4", "glm4", n_vocab, hf["max_position_embeddings"], 0, sparse=True)
    tinymodels._hparams(
        t, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, head_k=head, head_v=head,
        n_rot=head // 2,
    )  # fmt: skip
    tinymodels._embeddings(t, n_embd, tied=False)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.norm(f"{p}.attn_norm.weight", n_embd)
        t.mat(f"{p}.attn_q.weight", n_embd, head * n_head)
        t.mat(f"{p}.attn_k.weight", n_embd, head * n_head_kv)
        t.mat(f"{p}.attn_v.weight", n_embd, head * n_head_kv)
        t.mat(f"{p}.attn_output.weight", head * n_head, n_embd)
        t.norm(f"{p}.post_attention_norm.weight", n_embd)
        t.norm(f"{p}.ffn_norm.weight", n_embd)
        t.mat(f"{p}.ffn_up.weight", n_embd, 2 * n_ff)
        t.mat(f"{p}.ffn_down.weight", n_ff, n_embd)
        t.norm(f"{p}.post_ffw_norm.weight", n_embd)
    t.finish()
    return from_gguf(read_file(path))


def test_the_log_says_what_the_plan_is_for() -> None:
    assert LOG.run.llama_build == 5274 and LOG.run.flash_attn == "on" and LOG.run.runtime == "library"
    assert LOG.source_url and "CUDA0 compute buffer size =   353.00 MiB" in LOG.raw
    assert "padding = 256" in LOG.raw  # a build before #17046 pads the cache to 256 with flash attention


def test_the_config_converts_to_the_gguf_the_log_loaded(tmp_path: Path) -> None:
    """glm.py Glm4Model writes TextModel's keys and the token list: the config's spec is the header's."""
    hf = from_config(LOG.hf_config, source=LOG.id)
    gguf = _glm4(tmp_path / "glm-z1-32b.gguf", LOG.hf_config, LOG.hf_config["vocab_size"])
    fields = ("architecture", "n_layer", "n_embd", "n_head", "n_head_kv", "n_embd_head_k", "n_embd_head_v", "n_ff",
              "n_vocab", "n_ctx_train")  # fmt: skip
    assert [getattr(hf, f) for f in fields] == [getattr(gguf, f) for f in fields]
    assert (hf.architecture, hf.n_ff, hf.n_vocab, hf.n_head_kv[0]) == ("glm4", 23040, 151552, 2)


def test_glm_z1_32b_at_b5274(tmp_path: Path) -> None:
    """KV, the host's compute buffer (the f32 KQ mask of 32768 x 512 and one [n_embd, n_ubatch] row) and the
    device's (the logits 57 MiB up, above the hole the last layer's feed-forward leaves) as printed, from the
    GGUF header and from the config."""
    header = _glm4(tmp_path / "glm-z1-32b.gguf", LOG.hf_config, LOG.hf_config["vocab_size"])
    for spec in (header, from_config(LOG.hf_config, source=LOG.id)):
        est = estimate(spec, LOG.run)
        assert round(est.devices[0].kv_bytes / MIB, 2) == LOG.kv_mib["CUDA0"]
        assert est.host.compute_bytes / MIB == pytest.approx(LOG.compute_mib["CUDA_Host"], abs=0.01)
        assert est.devices[0].compute_bytes / MIB == pytest.approx(LOG.compute_mib["CUDA0"], abs=0.01)
    # the analytic plan (the logits above two [n_embd, n_ubatch] rows) was 9.3 % under
    lay = resolve(header, LOG.run)
    assert analytic_device_compute(header, lay) / MIB == pytest.approx(320.0, abs=0.01)


def test_the_graph_is_the_one_b5274_built() -> None:
    """The log's "graph nodes = 2264": llm_build_glm4's nodes at e1e8e09, 37 a layer (attn_norm 2, Q and K 3
    each, V 2, the cache stores 5, the attention 5, wo 1, post-attention norm 2, the residual 1, ffn_norm 2, up 1,
    the halves' views, copies, silu and mul 6, down 1, post-ffw norm 2, the residual 1), the embeddings, the
    mask's f16 cast, the last layer's two get_rows, the output norm and matmul: the reserve graph less the
    sched's 4 input copies and their 4 dependency views."""
    hf = LOG.hf_config
    shape = LlamaShape(
        n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=hf["num_attention_heads"],
        n_head_kv=hf["num_key_value_heads"], n_embd_head=hf["head_dim"], n_ff=hf["intermediate_size"],
        n_vocab=hf["vocab_size"], n_kv=32768, n_ubatch=512, n_outputs=512, flash_attn=True, glm4=True, legacy=True,
        swiglu=False, set_rows=False,
    )  # fmt: skip
    assert "graph nodes  = 2264" in LOG.raw
    assert len(build(shape).nodes) - 2 * 4 == 2264


def test_from_the_rule_on_the_analytic_plan() -> None:
    """A build from kvadvise.planner.builds.GRAPH_OPTIMIZE on is planned analytically on CUDA (its graph may
    reach ggml-alloc reordered; llama_graph is not checked there); one before, exactly."""
    spec = from_config(LOG.hf_config, source=LOG.id)
    old, new = (
        estimate(spec, replace(LOG.run, llama_build=b)).devices[0].compute_bytes
        for b in (builds.GRAPH_OPTIMIZE - 1, builds.GRAPH_OPTIMIZE)
    )
    lay = resolve(spec, replace(LOG.run, llama_build=builds.GRAPH_OPTIMIZE))
    assert new == analytic_device_compute(spec, lay) != old


def test_the_fused_up_projection_before_ggml_swiglu(tmp_path: Path) -> None:
    """Before #14158 build_ffn(LLM_FFN_SWIGLU) copied both halves of the fused up projection (ggml_cont) and then
    ran silu and mul in place: one [n_ff, n_ubatch] f32 tensor more than ggml_swiglu's. GLM-4-32B's layers with a
    1,024-token vocabulary (the layers the peak), 8192 cells, flash attention: the allocation pass of e1e8e09
    (Ollama 0.6.8's llama.cpp, run here on a no-op device) gives 220.00 MiB on the device (the 0c1e570 rule
    planned 179 MiB; the analytic plan of the old rule 224); kvadvise.planner.galloc over the legacy graph, as
    much."""
    spec = _glm4(tmp_path / "glm4-32b-v1024.gguf", LOG.hf_config, 1024)
    run = replace(LOG.run, n_ctx=8192)
    old, new = (
        estimate(spec, replace(run, llama_build=b)).devices[0].compute_bytes
        for b in (builds.FUSED_GLU - 1, builds.FUSED_GLU)
    )
    assert old - new == 4 * 512 * spec.n_ff
    assert old / MIB == pytest.approx(220.00, abs=0.01)
