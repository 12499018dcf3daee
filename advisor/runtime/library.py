"""The library as a runtime: llama-cli, llama-bench, and the bindings (llama-cpp-python, node-llama-cpp,
LM Studio), and llama-servers built before mid-2026. They reserve logits for the whole batch
(llama_context_params.n_outputs_max = 0: src/llama-context.cpp, the library's default)."""

from __future__ import annotations

from kvadvise.runtime.seam import LlamaCppRuntime


class LlamaLibrary(LlamaCppRuntime):
    name = "llama-cli"
    program = "llama-cli"
