"""System RAM as a budget, as VRAM is: what a plan keeps in host memory, against the RAM that is free
now (``MemAvailable``, what psutil reads) or given (``--ram SIZE``).

What llama.cpp 0c1e570 keeps in RAM for a run:

- weights the CPU reads, mapped from the model file (llama.cpp mmaps it by default: ``CPU_Mapped``
  buffers, page cache that must stay resident to run at speed): ``token_embd`` always
  (llama_model::load_tensors), the experts of ``--n-cpu-moe`` and the layers ``-ngl`` leaves on the CPU,
  a CPU plan's whole model. The rest of the file passes through the page cache while it loads and can
  be reclaimed;
- buffers (anonymous memory): the host compute buffer (``CUDA_Host``), the logits, the CPU's KV cache
  and compute buffer for what it runs, ``CPU_REPACK`` copies;
- llama-server's prompt cache (ggml-org/llama.cpp#16391): the sequence states of prompts a slot let
  go, kept to restore a shared prefix, up to ``--cache-ram`` MiB (``LLAMA_ARG_CACHE_RAM``; 8192 by
  default, common/common.h ``cache_ram_mib``; tools/server/server-task.cpp ``server_prompt_cache``: the
  oldest are dropped past the limit, a state larger than it is not stored). One per llama-server
  process: Ollama (>= 0.30) runs one per loaded model, passes no ``--cache-ram`` and starts it with its
  own environment (llm/llama_server.go ``SetupLlamaServerCommandEnv``: ``cmd.Env = os.Environ()``), so
  ``LLAMA_ARG_CACHE_RAM`` in the server's environment bounds it (ollama/ollama#18264: 8 GiB of RAM per
  runner after a day, a 100 % GPU model);
- context checkpoints: up to ``--ctx-checkpoints`` (``LLAMA_ARG_CTX_CHECKPOINTS``; 32 per slot,
  common/common.h ``n_ctx_checkpoints``) for a model whose cache cannot be rolled back: sliding-window
  layers or a recurrent state (tools/server/server-context.cpp, ``do_checkpoint``). Each holds the part
  of one sequence's state that cannot be removed (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``): the SWA
  cache's cells the window still sees, at most ``n_swa`` (src/llama-kv-cache.cpp ``state_write`` skips
  masked cells; src/llama-kv-cache-iswa.cpp writes only the SWA cache), or the recurrent state
  (src/llama-memory-hybrid.cpp writes only that). They are host vectors (``common_prompt_checkpoint``):
  ``--cache-ram 0`` does not remove them, ``--ctx-checkpoints 0`` does (ggml-org/llama.cpp#23181,
  #21690).

The prompt cache and the checkpoints are bounds a setting can lower: when they do not fit beside the
rest, the plan sets ``--ctx-checkpoints`` and then ``--cache-ram`` to what is left (the checkpoints
first: without them a SWA or hybrid model re-processes its whole prompt, ggml-org/llama.cpp#21831).
A plan whose weights and buffers alone exceed the RAM does not fit it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvadvise.model.ggml import row_bytes
from kvadvise.planner.gpus import PROCESS_BYTES

if TYPE_CHECKING:
    from kvadvise.model.spec import ModelSpec
    from kvadvise.planner.budget import Budget
    from kvadvise.planner.memory import MemoryEstimate, RunConfig

MIB = 1 << 20
GIB = 1 << 30
# common/common.h (0c1e570): cache_ram_mib = 8192, n_ctx_checkpoints = 32
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_CTX_CHECKPOINTS = 32
CACHE_RAM_STEP_MIB = 256  # a --cache-ram kvadvise sets is rounded down to this
# llama-cli runs llama-server's context since ggml-org/llama.cpp#17824, its prompt cache and checkpoints with it
# (common/common.h cache_ram_mib 8192; --ctx-checkpoints is an LLAMA_EXAMPLE_CLI flag too); the library keeps none
RUNTIMES_WITH_PROMPT_CACHE = ("llama-server", "llama-cli")


@dataclass(frozen=True, slots=True)
class HostRam:
    """What a plan keeps in system RAM, against the RAM it may use."""

    mapped_bytes: int  # weights the CPU reads through mmap (page cache that must stay resident)
    buffers_bytes: int  # anonymous: host compute, logits, the CPU's KV and compute, CPU_REPACK
    gpu_shared_bytes: int  # unified memory (Apple): what the GPU holds of the same RAM
    prompt_cache_bytes: int  # llama-server's prompt cache at most (--cache-ram); 0: none
    checkpoints_bytes: int  # context checkpoints at most, every slot
    checkpoint_bytes: int  # one checkpoint (one sequence)
    ram_bytes: int  # the RAM the plan may use: free now, or --ram
    ram_source: str
    cache_ram_mib: int | None = None  # the --cache-ram the plan needs (None: llama.cpp's default stands)
    ctx_checkpoints: int | None = None  # the --ctx-checkpoints the plan needs (None: the default stands)
    kept_bytes: int = 0  # of ram_bytes, left to the runtime's process (and a Mac's OS: a Mac of the card list)

    @property
    def essential_bytes(self) -> int:
        """What no setting lowers: the weights the CPU reads, the buffers, the GPU's share of unified memory."""
        return self.mapped_bytes + self.buffers_bytes + self.gpu_shared_bytes

    @property
    def total_bytes(self) -> int:
        return self.essential_bytes + self.prompt_cache_bytes + self.checkpoints_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.kept_bytes <= self.ram_bytes

    @property
    def container_limit_bytes(self) -> int:
        """A container's memory limit for the runtime (docker run --memory): what it holds in RAM and the
        process itself, rounded up to a whole GiB (the GPU's share of unified memory is not the process's)."""
        need = self.total_bytes - self.gpu_shared_bytes + PROCESS_BYTES
        return -(-need // GIB) * GIB


def checkpoint_bytes(spec: ModelSpec, est: MemoryEstimate) -> int:
    """One context checkpoint of one sequence, as llama.cpp 0c1e570 serialises it; 0 for a model whose
    cache rolls back (no checkpoints are made).

    - SWA layers: the cells the window still sees, at most ``n_swa`` (src/llama-kv-cache.cpp ``state_write``
      skips masked cells): per stream its cell count (u32), then for the sequence's stream per cell its
      position, its number of sequences and its sequence id (3 x 4 bytes), ``v_trans`` and the layer count,
      and per layer K's type and row size (4 + 8 bytes) and its rows, then V's the same way (transposed
      without flash attention: type, element size and width, 3 x 4 bytes). Measured on real llama-server
      with Gemma 3 270M (tests/test_offload_default.py): 7.506 MiB, as predicted to the byte;
    - the recurrent state of the sequence (its R and S rows; the serialisation's few headers not counted).
    """
    lay = est.layout
    total = 0
    if spec.has_swa and spec.n_swa:
        cells = min(spec.n_swa, lay.n_ctx_swa)
        layers = [il for il in range(spec.n_layer_all) if spec.kv_layers[il] and spec.swa_layers[il]]
        total += 4 + 4 * lay.n_stream + 12 * cells + 4 + 4  # n_stream, cell counts, cells' meta, v_trans, n_layer
        for il in layers:
            total += 12 + cells * row_bytes(lay.type_k, spec.n_embd_k_gqa(il))
            if not spec.is_mla:
                total += 12 + cells * row_bytes(lay.type_v, spec.n_embd_v_gqa(il))
    if spec.has_recurrent:
        total += est.recurrent_bytes // max(1, lay.n_seq_max)
    return total


def plan_host_ram(
    spec: ModelSpec,
    cfg: RunConfig,
    est: MemoryEstimate,
    budget: Budget,
    *,
    cpu_weights_bytes: int = 0,
    cpu_buffers_bytes: int = 0,
    gpu_bytes: int | None = None,
) -> HostRam:
    """The RAM ``est`` needs on the host of ``budget``. ``cpu_weights_bytes`` / ``cpu_buffers_bytes``: what a
    partial offload also keeps there (its weights, mapped; its KV and the CPU's compute buffer);
    ``gpu_bytes``: what its GPU holds (else ``est``'s), part of the same RAM on unified memory."""
    if est.layout.device == "cpu":
        mapped = est.weights_bytes - est.repack_bytes
        buffers = est.device_bytes - mapped
        shared = 0
    else:
        mapped = est.host.weights_bytes
        buffers = est.host_bytes - est.host.weights_bytes
        shared = (est.device_bytes if gpu_bytes is None else gpu_bytes) if budget.device == "metal" else 0
    mapped += cpu_weights_bytes
    buffers += cpu_buffers_bytes
    server = cfg.runtime in RUNTIMES_WITH_PROMPT_CACHE
    one = checkpoint_bytes(spec, est) if server else 0
    slots = est.layout.n_seq_max
    checkpoints = slots * DEFAULT_CTX_CHECKPOINTS * one
    cache = DEFAULT_CACHE_RAM_MIB * MIB if server else 0
    # the runtime's own process (code, libraries, the GPU runtime's host side: about 450 MB, llama.cpp#27725) beside
    # its buffers, whatever the RAM: MemAvailable and --ram are read before it starts; RAM that is a machine's whole
    # memory (a Mac of the card list: budget.ram_kept_bytes) leaves its OS its share too
    # (a plan on the CPU takes its --margin off the RAM already, room enough for the process beside it)
    process = max(0, PROCESS_BYTES - budget.margin_bytes) if budget.device == "cpu" else PROCESS_BYTES
    kept = budget.ram_kept_bytes + process
    source = budget.ram_source
    if budget.ram_kept_bytes:
        source += f"; {kept / GIB:.2f} GiB for the OS and the runtime"
    room = budget.ram_bytes - kept - (mapped + buffers + shared)
    if room < 0 and kept and not budget.ram_kept_bytes:  # short of RAM: say what the check kept besides the buffers
        source += f", {kept / MIB:,.0f} MiB of it left to the runtime's process"
    n_ckpt = cache_mib = None
    if room >= 0:
        if checkpoints > room:
            n_ckpt = room // (slots * one)
            checkpoints = n_ckpt * slots * one
        left = room - checkpoints
        if cache > left:
            cache_mib = left // MIB // CACHE_RAM_STEP_MIB * CACHE_RAM_STEP_MIB
            cache = cache_mib * MIB
    return HostRam(
        mapped,
        buffers,
        shared,
        cache,
        checkpoints,
        one,
        budget.ram_bytes,
        source,
        cache_mib,
        n_ckpt,
        kept,
    )
