"""llama.cpp's programs without a server of their own, as runtimes: ``library`` (llama-completion, llama-bench,
the library and its bindings: llama-cpp-python, node-llama-cpp, LM Studio) reserves logits for the whole batch
(llama_context_params.n_outputs_max = 0: src/llama-context.cpp, the library's default); ``llama-cli`` runs
llama-server's context since ggml-org/llama.cpp#17824 (tools/cli links llama-server-impl) and is planned by its
rules (kvadvise.planner.memory.RunConfig.runtime)."""

from __future__ import annotations

from kvadvise.runtime.seam import LlamaCppRuntime


class LlamaLibrary(LlamaCppRuntime):
    name = "library"
    program = "library"
    takes_overrides = False  # llama-cpp-python, LM Studio and node-llama-cpp take no -ot


class LlamaCli(LlamaCppRuntime):
    name = "llama-cli"
    program = "llama-cli"
