"""Which Ollama runs a GGUF model how, by version: the runner, the llama.cpp it carries, who decides the layers.

Read from the tags of ollama/ollama (the git mirror; each row names the tag and file it follows):

- **>= 0.30** (llm/llama_server.go; server.go NewLlamaServer "All GGML models are served via the upstream
  llama-server subprocess", commit 9db4bdbad "runner: Remove CGO engines, use llama-server exclusively for
  GGML models"): one llama-server per model, built from the llama.cpp tag in LLAMA_CPP_VERSION (Dockerfile
  "llama-server stages"), which places the layers itself (--fit). kvadvise models this.
- **0.11.0 to 0.24.x**: a runner inside Ollama's own binary, on the llama.cpp commit Makefile.sync's
  FETCH_HEAD vendors: the cgo **llamarunner** (runner/llamarunner: the llama.cpp library, a context of
  n_batch = num_batch × slots from 0.13.3, llama/llama.go NewContextParams), or the Go **ollamarunner** for
  the architectures fs/ggml/ggml.go OllamaEngineRequired lists (all of them with OLLAMA_NEW_ENGINE=1; a model
  the Go engine cannot read falls back to the llamarunner, llm/server.go NewLlamaServer). The layers on the
  GPU are Ollama's decision: llm/memory.go EstimateGPULayers up to 0.12.10 (the llamarunner's; the
  ollamarunner's from 0.11.11 is the trial layout, from 0.11.5 with OLLAMA_NEW_ESTIMATES=1, which kvadvise takes as
  unset), then llm/server.go createLayout/greedyFit over Ollama's
  own estimate (fs/ggml GraphSize for the llamarunner; the runner's trial allocations for the ollamarunner, replayed
  from 0.11.11 by kvadvise.backends.ollama.engine_layout with a stand-in for the runner's graph).
  kvadvise plans what the llama.cpp library allocates for the llamarunner at the vendored commit's rules
  (kvadvise.planner.builds: whole-batch logits, RunConfig.runtime "library"); it does not model the Go
  engine's allocation; Ollama's layer decision is replayed beside the plan for llm/memory.go and the
  llamarunner's createLayout (kvadvise.backends.ollama.decision: estimate_legacy, layout).
- **before 0.11**: not modelled.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.errors import InputError
from kvadvise.planner import builds

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec

Version = tuple[int, int, int]

MODELLED_FROM: Version = (0, 11, 0)
LLAMA_SERVER_FROM: Version = (0, 30, 0)  # v0.30.0: llm/llama_server.go, LLAMA_CPP_VERSION
NEWEST_KNOWN: Version = (0, 32, 15)  # the newest release tag of the mirror read (v0.33.0 is rc only)
MIRROR = "ollama/ollama tags (git mirror)"


@dataclass(frozen=True, slots=True)
class LlamaCppPin:
    """The llama.cpp an Ollama release carries, from its first release ``since``."""

    since: Version
    commit: str  # Makefile.sync FETCH_HEAD (0.11-0.24) or the LLAMA_CPP_VERSION tag (>= 0.30)
    build: int | None  # bNNNN where a source names it; None: not known here
    # a build on the same side of every kvadvise.planner.builds rule as the vendored source (set_rows, the
    # SWA cache's 256 padding, the V-less MLA cache, the f16 FA mask, the backends' graph_optimize), checked in
    # llama/llama.cpp/src and ml/backend/ggml/ggml/src of the tag by tests/test_ollama_versions.py: what the
    # plan's rules follow when the build is not known
    rules_build: int
    pinned_on: str  # the date of the Ollama commit that pinned it
    source: str

    @property
    def label(self) -> str:
        return f"b{self.build}" if self.build is not None else self.commit[:9]


def _pin(since: Version, commit: str, build: int | None, pinned_on: str, source: str, rules: int = 0) -> LlamaCppPin:
    return LlamaCppPin(since, commit, build, rules or build or 0, pinned_on, source)


_BEFORE_SET_ROWS = builds.SET_ROWS - 1
_BEFORE_SWA_PAD = builds.SWA_PAD_256 - 1
_BEFORE_GRAPH_OPTIMIZE = builds.GRAPH_OPTIMIZE - 1
_BEFORE_EMBD_SELECT = builds.EMBD_SELECT - 1  # and so before MLA_V_LESS

# Makefile.sync FETCH_HEAD at each tag (0.11-0.24), LLAMA_CPP_VERSION (>= 0.30); the build where the pinning
# commit's title names it. A commit whose build is unknown is bounded by its neighbours and its source read.
PINS: tuple[LlamaCppPin, ...] = (
    _pin((0, 11, 0), "de4c07f93783a1a96456a44dc16b9db538ee1618", None, "2025-05-12",
         "Makefile.sync (ollama 0cefd46f2 'llama: update to commit de4c07f93'); no ggml_set_rows in its "
         "llama-kv-cache, the old SWA cache", _BEFORE_SET_ROWS),
    _pin((0, 11, 5), "e54d41befcc1575f4c898c5ff4ef43970cead75f", None, "2025-08-14",
         "Makefile.sync (ollama 1a19df1f3 'update vendored llama.cpp and ggml'); before b6646; ggml_set_rows "
         "on by default (LLAMA_SET_ROWS), SWA cache min(size_base, GGML_PAD(n_swa + n_ubatch, n_pad)), no "
         "graph_optimize in its ggml-backend.cpp", _BEFORE_GRAPH_OPTIMIZE),
    _pin((0, 12, 4), "364a7a6d4a786e98947c8a90430ea581213c0ba9", 6646, "2025-10-02",
         "Makefile.sync (ollama c68f367ef 'Update GGML to b6646')"),
    _pin((0, 12, 6), "7049736b2dd9011bf819e298b844ebbc4b5afdc9", None, "2025-10-13",
         "Makefile.sync (ollama 4987f13d3 'Llama cpp bump (df1b612)'); between b6646 and b6840", _BEFORE_SWA_PAD),
    _pin((0, 12, 11), "3cfa9c3f125763305b4226bc032f1954f08990dc", 6840, "2025-11-06",
         "Makefile.sync (ollama 544b6739d 'ggml update to b6840')"),
    _pin((0, 13, 2), "7f8ef50cce40e3e7e4526a3696cb45658190e69a", 7108, "2025-12-03",
         "Makefile.sync (ollama 0cf7794b1 'ggml update to b7108')"),
    _pin((0, 13, 3), "17f7f4baad8b3a716ee139da7bb56ae984e8c0fa", None, "2025-12-10",
         "Makefile.sync (ollama b95693056 'llama.cpp bump (17f7f4)'); between b7108 and b7813, no "
         "ggml_build_forward_select in its llama-graph.cpp", _BEFORE_EMBD_SELECT),
    _pin((0, 13, 5), "ec98e20021f7611db3bbcf6bb6629fed6e1ce4f0", None, "2025-12-17",
         "Makefile.sync (ollama 49a9c9ba6 'GGML update to ec98e2002', a llama.cpp commit of 2025-12-16); "
         "between b7108 and b7813, no ggml_build_forward_select in its llama-graph.cpp", _BEFORE_EMBD_SELECT),
    *(
        _pin(since, f"b{b}", b, day, "LLAMA_CPP_VERSION (Dockerfile: llama-server built from that tag)")
        for since, b, day in (
            ((0, 30, 0), 9452, "2026-06-01"),
            ((0, 30, 1), 9479, "2026-06-02"),
            ((0, 30, 4), 9493, "2026-06-03"),
            ((0, 30, 5), 9509, "2026-06-04"),
            ((0, 30, 9), 9626, "2026-06-16"),
            ((0, 30, 10), 9672, "2026-06-17"),
            ((0, 30, 11), 9781, "2026-06-26"),
            ((0, 31, 0), 9840, "2026-06-29"),
            ((0, 31, 2), 9888, "2026-07-07"),
            ((0, 32, 2), 10069, "2026-07-21"),
            ((0, 32, 3), 10091, "2026-07-22"),
            ((0, 32, 6), 10242, "2026-08-04"),
            ((0, 32, 8), 10353, "2026-08-10"),
            ((0, 32, 10), 10380, "2026-08-12"),
            ((0, 32, 14), 10434, "2026-08-15"),
            ((0, 32, 15), 10488, "2026-08-19"),
        )
    ),
)  # fmt: skip

# fs/ggml/ggml.go (KV) OllamaEngineRequired at each tag where the list changed: these run on the Go engine
_ENGINE_BASE = ("gemma3", "gemma3n", "mistral3", "llama4", "mllama", "qwen25vl", "gptoss")
_ENGINE_0127 = (*_ENGINE_BASE, "gpt-oss", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe")
_ENGINE_0135 = (*_ENGINE_0127, "deepseekocr", "deepseek2", "nomic-bert", "olmo3", "bert")
_ENGINE_0155 = (*_ENGINE_0135, "glm4moelite", "lfm2", "qwen3next", "glmocr")
_ENGINE_0200 = (*_ENGINE_0155, "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe", "lfm2moe", "gemma4")
ENGINE_REQUIRED: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 11, 0), frozenset(_ENGINE_BASE)),
    ((0, 11, 5), frozenset((*_ENGINE_BASE, "gpt-oss"))),
    ((0, 12, 0), frozenset((*_ENGINE_BASE, "gpt-oss", "qwen3"))),
    ((0, 12, 2), frozenset((*_ENGINE_BASE, "gpt-oss", "qwen3", "qwen3moe"))),
    ((0, 12, 5), frozenset((*_ENGINE_BASE, "gpt-oss", "qwen3moe"))),
    ((0, 12, 6), frozenset((*_ENGINE_BASE, "gpt-oss", "qwen3", "qwen3moe"))),
    ((0, 12, 7), frozenset(_ENGINE_0127)),
    ((0, 13, 0), frozenset((*_ENGINE_0127, "deepseekocr", "deepseek2"))),
    ((0, 13, 1), frozenset((*_ENGINE_0127, "deepseekocr", "deepseek2", "nomic-bert"))),
    ((0, 13, 4), frozenset((*_ENGINE_0127, "deepseekocr", "deepseek2", "nomic-bert", "olmo3"))),
    ((0, 13, 5), frozenset(_ENGINE_0135)),
    ((0, 14, 3), frozenset((*_ENGINE_0135, "glm4moelite", "lfm2"))),
    ((0, 15, 5), frozenset(_ENGINE_0155)),
    ((0, 17, 1), frozenset((*_ENGINE_0155, "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe", "lfm2moe"))),
    ((0, 20, 0), frozenset(_ENGINE_0200)),
    ((0, 22, 0), frozenset((*_ENGINE_0200, "laguna", "nemotron_h_omni"))),
)

# fs/ggml/ggml.go (GGML) FlashAttention: the architectures that get flash attention without
# OLLAMA_FLASH_ATTENTION (llm/server.go reads it from 0.11.8: "model wants flash attention")
_FA_0126 = ("gptoss", "gpt-oss", "qwen3", "qwen3moe", "gemma3")
_FA_0134 = (*_FA_0126, "qwen3vl", "qwen3vlmoe", "mistral3", "olmo3")
_FA_0155 = (*_FA_0134, "bert", "glm4moelite", "lfm2", "glmocr", "qwen3next")
_FA_0171 = (*_FA_0155, "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe")
MODEL_FLASH_ATTENTION: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 11, 0), frozenset()),
    ((0, 11, 8), frozenset(("gptoss", "gpt-oss"))),
    ((0, 12, 4), frozenset(("gptoss", "gpt-oss", "qwen3", "qwen3moe"))),
    ((0, 12, 6), frozenset(_FA_0126)),
    ((0, 12, 8), frozenset((*_FA_0126, "qwen3vl", "qwen3vlmoe"))),
    ((0, 13, 2), frozenset((*_FA_0126, "qwen3vl", "qwen3vlmoe", "mistral3"))),
    ((0, 13, 4), frozenset(_FA_0134)),
    ((0, 13, 5), frozenset((*_FA_0134, "bert"))),
    ((0, 14, 3), frozenset((*_FA_0134, "bert", "glm4moelite", "lfm2"))),
    ((0, 15, 5), frozenset(_FA_0155)),
    ((0, 17, 1), frozenset(_FA_0171)),
    ((0, 20, 4), frozenset((*_FA_0171, "gemma4"))),
    ((0, 22, 0), frozenset((*_FA_0171, "gemma4", "nemotron_h_omni"))),
)

# fs/ggml/ggml.go (GGML) SupportsFlashAttention, besides "no pooling_type" and head_k == head_v != 0:
# architectures refused (from the tag) and always allowed (from v0.17.1: qwen35, qwen35moe, qwen3next)
FA_REFUSED: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 11, 0), frozenset()),
    ((0, 11, 2), frozenset({"gptoss"})),
    ((0, 11, 5), frozenset()),
    ((0, 11, 11), frozenset({"gemma2"})),
    ((0, 19, 0), frozenset({"gemma2", "grok"})),
)
FA_ALWAYS_FROM: Version = (0, 17, 1)
# llm/server.go NewLlamaServer to v0.12.3: "fa := envconfig.FlashAttention(); if f.FlashAttention() { fa = true }", so
# OLLAMA_FLASH_ATTENTION=0 cannot turn off a model that wants it; v0.12.4 (fdb109469 "Allow overriding flash
# attention setting"): envconfig.FlashAttention(f.FlashAttention()), the variable when set, else the model's wish
FA_OVERRIDE_FROM: Version = (0, 12, 4)
FA_ALWAYS = frozenset({"qwen35", "qwen35moe", "qwen3next"})

LAYOUT_FROM: Version = (0, 12, 11)  # llm/memory.go deleted (f560bd077fcf); llamaServer.Load calls createLayout
# ollamaServer.Load (createLayout over the runner's reported memory) by default: v0.11.5..v0.11.10 made it only with
# OLLAMA_NEW_ESTIMATES=1 (llm/server.go NewLlamaServer: "newEstimates := textProcessor != nil &&
# envconfig.NewMemoryEstimates()", else a llamaServer: llm/memory.go for the Go engine's models too); v0.11.11 returns
# an ollamaServer whenever the Go engine runs the model
TRIAL_LAYOUT_FROM: Version = (0, 11, 11)
UBATCH_FROM: Version = (0, 13, 3)  # llama/llama.go NewContextParams: n_batch = batchSize × numSeqMax, n_ubatch
FA_AUTO_FROM: Version = (0, 13, 4)  # llamarunner: ml.FlashAttentionAuto unless OLLAMA_FLASH_ATTENTION is set
NUM_BATCH_DEFAULT = 512  # api/types.go DefaultOptions NumBatch (0.11.0 to 0.24.0)
# server/routes.go Serve: the default num_ctx by the GPUs' total VRAM from v0.15.5; before, envconfig's
# OLLAMA_CONTEXT_LENGTH default 4096 (envconfig/config.go at v0.15.4)
DEFAULT_NUM_CTX_BY_VRAM_FROM: Version = (0, 15, 5)
OLD_DEFAULT_NUM_CTX = 4096
LIBRARY_N_UBATCH = 512  # llama_context_default_params().n_ubatch, what the llamarunner left it before 0.13.3
# api/types.go DefaultOptions: RepeatPenalty 1.1 up to 0.32.9, 1.0 from 0.32.10 (ollama 6a261db7d, "stop applying
# repeat_penalty 1.1 to models that don't set one"); a model's params layer overrides it
REPEAT_PENALTY_OFF_FROM: Version = (0, 32, 10)


def _number(value: object, default: float) -> float:
    """A params-layer number (JSON: int or float); anything else: the default Ollama would use."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def _since(table: tuple[tuple[Version, frozenset[str]], ...], v: Version) -> frozenset[str]:
    out: frozenset[str] = frozenset()
    for since, names in table:
        if v >= since:
            out = names
    return out


def pin(v: Version) -> LlamaCppPin | None:
    """The llama.cpp of release ``v``; None before 0.11 (not modelled)."""
    found = None
    for p in PINS:
        if v >= p.since:
            found = p
    return found if v >= MODELLED_FROM else None


def parse(version: str) -> Version:
    """An Ollama version as --ollama-version or /api/version gives it (``0.20.2``, ``v0.20.2``,
    ``0.30.0-rc1``)."""
    from kvadvise.backends.ollama.api import parse_version

    v = parse_version(version)
    if v is None:
        raise InputError(f"--ollama-version {version!r}: expected MAJOR.MINOR.PATCH, e.g. 0.20.2")
    return v


class Placement(enum.Enum):
    """Who decides the layers on the GPU for a release and a model (the value: the code, as said to the user)."""

    FIT = "llama.cpp --fit (llm/llama_server.go)"  # from 0.30: llama-server's own --fit
    MEMORY_GO = "llm/memory.go EstimateGPULayers"  # up to 0.12.10 (estimate_legacy)
    ENGINE_LAYOUT = "llm/server.go createLayout over the Go runner's trial allocations"  # ollamarunner (engine_layout)
    CREATE_LAYOUT = "llm/server.go createLayout over fs/ggml GraphSize (Ollama's estimate)"  # llamarunner (layout)
    NOT_MODELLED = "not modelled"


@dataclass(frozen=True, slots=True)
class OllamaRelease:
    """How one Ollama release runs one model, and what kvadvise claims about it."""

    version: str | None  # as given or read; None: not known (planned as the newest release)
    found_by: str  # "--ollama-version" | "/api/version" | "unknown"
    architecture: str
    runner: str  # "llama-server" | "llamarunner" | "ollamarunner" | "not modelled"
    pin: LlamaCppPin | None  # the llama.cpp it carries (None: not known)
    placement: Placement  # who decides the layers on the GPU
    claims_allocation: bool  # kvadvise's figures are what this runner allocates
    claims_layers: bool  # kvadvise's layer placement is this Ollama's
    # a pre-release's plan: the rules of the release before it (an rc is tagged after that one, and its own pin is not
    # claimed: v0.13.3-rc0 vendors 0.13.2's 7f8ef50cc, rc1 the release's 17f7f4baa); None: as ``pin``
    rules_pin: LlamaCppPin | None = None

    @property
    def v(self) -> Version | None:
        return parse(self.version) if self.version else None

    @property
    def layers_by(self) -> str:
        """Who decides the layers on the GPU, as said to the user."""
        return self.placement.value

    @property
    def program(self) -> str:
        """RunConfig.runtime: llama-server for Ollama >= 0.30, the library's rules (whole-batch logits) for
        the runners inside Ollama's binary."""
        return "llama-server" if self.runner == "llama-server" else "library"

    @property
    def in_process(self) -> bool:
        return self.runner != "llama-server"

    def sampling_penalties(self, params: dict[str, object]) -> bool:
        """Whether this release's sampler applies a penalty to a model with these parameters (its params layer): a
        repeat_penalty other than 1 (the default's until 0.32.10), a presence or frequency penalty other than 0. The
        llamarunner and llama-server sample with llama.cpp's chain (runner/llamarunner PenaltyRepeat, llm/llama_server.go
        repeat_penalty); the Go engine's sampler (sample/) applies none (ollama #14537, token history, was reverted)."""
        if self.runner not in ("llamarunner", "llama-server") or _number(params.get("repeat_last_n"), 64) == 0:
            return False  # a window of 0 tokens: llama_sampler_penalties_apply returns at once
        v = self.v
        default_repeat = 1.0 if v is None or v >= REPEAT_PENALTY_OFF_FROM else 1.1
        repeat = _number(params.get("repeat_penalty"), default_repeat)
        others = (_number(params.get(k), 0.0) for k in ("presence_penalty", "frequency_penalty"))
        return repeat != 1.0 or any(x != 0.0 for x in others)

    def n_batch(self, num_batch: int, num_ctx: int, n_parallel: int) -> tuple[int, int]:
        """(-b, -ub) of the llamarunner's context: num_batch capped at num_ctx (llm/server.go NewLlamaServer),
        times the slots from 0.13.3 with n_ubatch num_batch; before, n_batch num_batch and the library's
        n_ubatch 512 (llama/llama.go NewContextParams at each tag)."""
        nb = max(1, min(num_batch, num_ctx)) if num_ctx else num_batch
        v = self.v
        if v is not None and v >= UBATCH_FROM:
            return nb * n_parallel, nb
        return nb, min(nb, LIBRARY_N_UBATCH)

    def flash_attn(self, spec: ModelSpec, asked: str | None) -> str:
        """The -fa the runner gets: ``asked`` is OLLAMA_FLASH_ATTENTION (on/off) when set, None when not.
        llm/server.go NewLlamaServer: the model's own default (GGML.FlashAttention, from 0.11.8; before 0.12.4 on
        whatever the variable says), then refused unless GGML.SupportsFlashAttention; the llamarunner from 0.13.4
        leaves an unset one to llama.cpp (auto)."""
        v = self.v or NEWEST_KNOWN
        if self.runner == "llamarunner" and v >= FA_AUTO_FROM and asked is None:
            return "auto"
        wanted = spec.architecture in _since(MODEL_FLASH_ATTENTION, v)
        want = wanted if asked is None else asked == "on" or (wanted and v < FA_OVERRIDE_FROM)
        return "on" if want and supports_flash_attention(spec, v) else "off"

    def refuses_flash_attention(self, spec: ModelSpec) -> bool:
        """A model this release's in-process runner runs without flash attention once OLLAMA_FLASH_ATTENTION is set,
        whatever it says (llm/server.go NewLlamaServer, GGML.SupportsFlashAttention: gemma2 from 0.11.11); kvadvise's
        advice always sets that variable."""
        return self.in_process and not supports_flash_attention(spec, self.v or NEWEST_KNOWN)

    def claims(self, *, layers_replayed: bool = False) -> str:
        """What kvadvise says about this release, plainly; ``layers_replayed``: Ollama's own layer decision was
        replayed for the plan (kvadvise.backends.ollama.decision)."""
        named = f"Ollama {self.version}" if self.version else "Ollama (version unknown)"
        if self.runner == "not modelled":
            return (
                f"{named} is older than {_v(MODELLED_FROM)}: kvadvise does not model it (runner, llama.cpp, "
                "layers); the figures are llama.cpp's library for an unknown build, not what it loads"
            )
        p = self.pin
        at = f"llama.cpp {p.label} (pinned {p.pinned_on})" if p else "llama.cpp (build not known)"
        if self.runner == "llama-server":
            if self.v is None or self.v > NEWEST_KNOWN:
                return (
                    f"{named}: llama-server, placed by llama.cpp's --fit; planned as Ollama {_v(NEWEST_KNOWN)} "
                    f"and later (b{builds.REFERENCE}'s rules; kvadvise read Ollama up to {_v(NEWEST_KNOWN)})"
                )
            return f"{named}: llama-server of {at}, placed by llama.cpp's --fit (modelled)"
        if self.runner == "ollamarunner":
            placement = (
                "its layer decision is replayed (Ollama's split)" if layers_replayed else "nor its layer placement"
            )
            return (
                f"{named} runs {self.architecture} on its Go engine (ollamarunner, fs/ggml OllamaEngineRequired): "
                f"kvadvise does not model that engine's memory, {placement}; the figures are what "
                f"llama.cpp's library ({at}) would allocate for the same load"
            )
        return (
            f"{named} runs {self.architecture} in its built-in llamarunner on {at}: kvadvise plans what that "
            "library allocates (the logits of the whole batch); which layers go to the GPU is Ollama's decision "
            f"({self.layers_by}), "
            + (
                "replayed: Ollama's split"
                if layers_replayed
                else "not modelled: the plan puts the layers it can on the GPU"
            )
        )

    def json_doc(self) -> dict[str, object]:
        p = self.pin
        return {
            "version": self.version,
            "found_by": self.found_by,
            "runner": self.runner,
            "program": self.program,
            "llama_cpp": None
            if p is None
            else {"commit": p.commit, "build": p.build, "rules_build": p.rules_build, "pinned_on": p.pinned_on},
            "layers_by": self.layers_by,
            "claims_allocation": self.claims_allocation,
            "claims_layers": self.claims_layers,
            "claims": self.claims(),
            "source": f"{MIRROR}: v{_v(self.v)}" if self.v else None,
        }


def supports_flash_attention(spec: ModelSpec, v: Version) -> bool:
    """fs/ggml/ggml.go GGML.SupportsFlashAttention at release ``v``: no pooling_type (an embedding model;
    kvadvise sees it as a model with no K/V layer), not a refused architecture, head_k == head_v != 0."""
    if spec.pooling or (not any(spec.kv_layers) and not spec.has_recurrent):  # pooling_type: v0.12.5:fs/ggml/ggml.go
        return False
    if v >= FA_ALWAYS_FROM and spec.architecture in FA_ALWAYS:
        return True
    if spec.architecture in _since(FA_REFUSED, v):
        return False
    return spec.n_embd_head_k != 0 and spec.n_embd_head_k == spec.n_embd_head_v


# Ollama's library blobs of gpt-oss are its own conversion (convert/convert_gptoss.go): architecture "gptoss",
# which the Go engine runs from 0.11.0 (OllamaEngineRequired); llama.cpp's conversions say "gpt-oss"
LIBRARY_ARCHITECTURES = {"gpt-oss": "gptoss"}


def blob_architecture(architecture: str, source: str) -> str:
    """The architecture a model's GGUF names: a built-in profile of Ollama's library (``source`` "profile:...")
    stands for the library's blob, in Ollama's own naming."""
    return LIBRARY_ARCHITECTURES.get(architecture, architecture) if source.startswith("profile:") else architecture


def release(version: str | None, architecture: str, *, found_by: str = "--ollama-version") -> OllamaRelease:
    """How Ollama ``version`` (None or a development build 0.0.0: the newest) runs a model of ``architecture``."""
    version = version.strip() if version else None  # as printed: " 0.12.3" is 0.12.3
    v = parse(version) if version else None
    if v is None or v == (0, 0, 0) or v >= LLAMA_SERVER_FROM:
        # a pre-release (0.30.0-rc0) comes before its release and pins other code (v0.30.0-rc0's LLAMA_CPP_VERSION
        # is b9048, the release's b9452): its llama.cpp is not known here
        known = v is not None and v != (0, 0, 0) and v <= NEWEST_KNOWN and not _prerelease(version)
        return OllamaRelease(
            version if v != (0, 0, 0) else None,
            found_by if version else "unknown",
            architecture,
            "llama-server",
            pin(v) if known and v is not None else None,
            Placement.FIT,
            True,
            True,
        )
    if v < MODELLED_FROM:
        return OllamaRelease(
            version, found_by, architecture, "not modelled", None, Placement.NOT_MODELLED, False, False
        )
    engine = architecture in _since(ENGINE_REQUIRED, v)
    if v < LAYOUT_FROM and not (engine and v >= TRIAL_LAYOUT_FROM):
        placement = Placement.MEMORY_GO
    elif engine:
        placement = Placement.ENGINE_LAYOUT
    else:
        placement = Placement.CREATE_LAYOUT
    # a pre-release (0.13.3-rc0) pins code between the release before it and its own: not claimed, planned by the
    # earlier one's rules (the older build: the larger figures where a rule changed)
    pre = _prerelease(version)
    return OllamaRelease(
        version,
        found_by,
        architecture,
        "ollamarunner" if engine else "llamarunner",
        None if pre else pin(v),
        placement,
        not engine,
        False,
        rules_pin=_pin_before(v) if pre else None,
    )


def _prerelease(version: str | None) -> bool:
    """0.30.0-rc0, v0.13.3-rc1: a tag before its release."""
    return version is not None and re.search(r"^v?[0-9]+\.[0-9]+\.[0-9]+-", version) is not None


def _pin_before(v: Version) -> LlamaCppPin | None:
    """The llama.cpp of the last release before ``v`` (the pin of a version below it)."""
    found = None
    for p in PINS:
        if p.since < v:
            found = p
    return found


def _v(v: Version | None) -> str:
    return ".".join(map(str, v)) if v else "?"
