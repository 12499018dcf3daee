"""What a quantized K/V cache was measured to cost on one model, and the threshold past which the
recommendation does not choose it by default.

The figures are llama.cpp's own (tools/perplexity/perplexity.cpp kl_divergence, b11312): the logits of
the model with an f16 cache are the reference, the same text is run again with the cache type, and per
scored token (the second half of each chunk of ``n_ctx`` tokens) the KL divergence of the two
distributions and whether both put the same token on top. ``kvadvise verify quality`` measures them
(docs/quality.md); the plan reads the stored figures and passes them here: nothing is read from disk.

The threshold: no worse than Q6_K *weights* on LLaMA 3 8B, the scoreboard of llama.cpp's
tools/perplexity/README.md (revision f364eb6f, RTX 4090): mean KLD 0.005452, same top token 96.031 %.
A cache that costs more than that is a larger loss than the weight quantization most people take as
near-lossless; q8_0 weights there cost 0.001355 and 97.674 %, the order of llama.cpp PR #7412's q8_0 cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadvise.model.ggml import GGMLType

# tools/perplexity/README.md "LLaMA 2 vs. LLaMA 3 Quantization comparison", L3 8b q6_K (f364eb6f)
MAX_MEAN_KLD = 0.005452
MIN_SAME_TOP_PCT = 96.031
THRESHOLD_SOURCE = (
    "Q6_K weights on LLaMA 3 8B: mean KLD 0.005452, same top 96.03 % (llama.cpp tools/perplexity/README.md)"
)


@dataclass(frozen=True, slots=True)
class CacheQuality:
    """One cache type against an f16 cache on one model: llama-perplexity --kl-divergence's figures."""

    type_k: GGMLType
    type_v: GGMLType
    n_ctx: int  # tokens per chunk: positions n_ctx/2 .. n_ctx-1 of each chunk are scored (the depth)
    n_chunks: int
    mean_kld: float  # "Mean    KLD"
    p99_kld: float  # "99.0%   KLD"
    same_top_pct: float  # "Same top p", in %
    seconds: float  # the cache type's own run
    llama_build: int | None  # the build of llama-perplexity (its --version)

    @property
    def n_scored(self) -> int:
        """Tokens scored: n_ctx - 1 - n_ctx/2 per chunk (perplexity.cpp kl_divergence)."""
        return self.n_chunks * (self.n_ctx - 1 - self.n_ctx // 2)

    def too_lossy(self) -> bool:
        """Worse than the threshold in mean KLD or in same top token."""
        return self.mean_kld > MAX_MEAN_KLD or self.same_top_pct < MIN_SAME_TOP_PCT

    def text(self) -> str:
        """``mean KLD 0.0012, 99th percentile 0.011, same top token 98.4 % (2 chunks of 256 tokens, b11312)``."""
        build = f", b{self.llama_build}" if self.llama_build else ""
        return (
            f"mean KLD {self.mean_kld:.4g}, 99th percentile {self.p99_kld:.4g}, same top token "
            f"{self.same_top_pct:.2f} % ({self.n_chunks} chunks of {self.n_ctx} tokens{build})"
        )


@dataclass(frozen=True, slots=True)
class MeasuredQuality:
    """The measurements stored for one model (``kvadvise verify quality``), by cache type."""

    model: str  # the file's sha256 (an Ollama blob's digest)
    results: tuple[CacheQuality, ...]

    def of(self, kv: tuple[GGMLType, GGMLType]) -> CacheQuality | None:
        """The figure for the cache type ``kv``: the deepest measured (the loss grows with depth)."""
        rows = [q for q in self.results if (q.type_k, q.type_v) == kv]
        return max(rows, key=lambda q: (q.n_ctx, q.n_scored), default=None)

    def rejects(self, kv: tuple[GGMLType, GGMLType]) -> bool:
        """Measured worse than the threshold: not chosen by default."""
        q = self.of(kv)
        return q is not None and q.too_lossy()
