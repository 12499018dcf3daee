"""Review round 20a: the partial-offload changes of b967d7f (the per-device fill written as -ts, each device's compute
recomputed from the blocks dealt to it, whole MoE layers, -fa on for a hybrid) against real allocations.

Same harness as tests/test_attack_round19d.py (imported: ``_case`` / ``_check``): a sparse tiny GGUF, loopback
rpc-servers as devices, ``kvadvise llamacpp MODEL --rpc EP=BUDGET ... --margin 0 --ctx N FLAGS --ram 16GiB
--llama-build b11312 --json``, its run_command run with llama-server b11312 (--fit off), and llama-server's own
``--fit on -fitt FREE-BUDGET`` for comparison; each device's real total is every buffer llama-server prints for it.
Vendored source: /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp (b11312).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_attack_round19d import _DENSE, _case, _check

pytestmark = pytest.mark.llama
_LLAMA = {**_DENSE, "head": 128}
_GEMMA2 = {**_DENSE, "head": 128, "n_swa": 512}


@pytest.mark.parametrize(
    ("recipe", "dims", "budgets", "flags"),
    [
        pytest.param("llama", _LLAMA, [300, 100, 100], ["-ctk", "f16", "-ctv", "f16", "-ub", "2048"], id="llama-3dev"),
        pytest.param("llama", _LLAMA, [300, 70], ["-ctk", "f16", "-ctv", "f16"], id="llama-300-70"),
        pytest.param("gemma2", _GEMMA2, [300, 80], ["-ctk", "f16", "-ctv", "f16", "-ub", "2048"], id="gemma2-300-80"),
    ],
)
def test_last_device_given_the_last_block_keeps_the_full_offloads_output_only_compute(
    recipe: str, dims: dict, budgets: list[int], flags: list[str], tmp_path: Path, real_llama_server: Path
) -> None:
    """UNDER (OOM side): the last device really allocates more than its budget.

    | case (--ctx 16384) | kvadvise's command | last device predicted | printed (model + KV + compute) | budget |
    | llama [300,100,100] -ub 2048 | -ngl 4 -ts 2,0,2 -ub 2048 | 60.68 | 156.68 (44.64 + 16 + 96.04) | 100 |
    | llama [300,70] | -ngl 7 -ts 5,2 | 60.68 | 84.65 (44.64 + 16 + 24.01) | 70 |
    | gemma2 [300,80] -ub 2048 | -ngl 4 -ts 2,2 -ub 2048 | 60.69 | 156.68 (44.64 + 16 + 96.04) | 80 |

    UNDER by 96.0 MiB (61 %), 24.0 MiB (28 %) and 96.0 MiB (61 %); the devices are 56.7, 14.7 and 76.7 MiB over
    their budgets. --fit (same cache flags) leaves the last device only the output layer (15.66 MiB) in all three.
    llama.cpp (src/llama-model.cpp load_tensors) deals block 7 and the output layer to the last device, whose graph
    is the last block's attention over the whole ubatch (ggml_backend_sched's reserve: the 16384 x 2048 f16 KQ mask
    alone is 64 MiB at -ub 2048).

    Rule (advisor/planner/offload.py, partial_offload.tail_cut): kvadvise's own unpipelined_last_block_compute
    gives the right figure for that device (96.06 MiB at -ub 2048, instrumented), but the branch applies it as
    ``cut[d] = min(0, alone - full_compute[d])``: a cut only. At full offload the budgets' proportional split
    (layer_devices) gave the last device the output layer alone (0.04 MiB of compute), so a device that the
    partial split (--fit's fill, Offload.tensor_split, or the plan's own) gives the last block keeps 0.04 MiB of
    compute. The 'alone' figure should replace the full offload's in both directions (as the new ``own`` branch
    does for other devices), and filled()'s holds() then would not hand block 7 to that device.
    """
    c = _case(tmp_path, recipe, dims, budgets, 16384, flags, real_llama_server)
    _check(c)
