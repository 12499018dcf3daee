#!/usr/bin/env bash
# GPU truth (issue 17): the thin wrapper around benchmarks/gpu_truth.py.
#
#   benchmarks/gpu_truth.sh --prepare          # here: build .gpu_truth/ (pruned llama.cpp source, wheels)
#   benchmarks/gpu_truth.sh [--out DIR] ...    # on the GPU machine: build llama-server (CUDA), run the matrix
#   benchmarks/gpu_truth.sh --cpu [...]        # the same on the CPU, small matrix, no build (the test suite)
#
# Every other flag goes to `gpu_truth.py run` (see `benchmarks/gpu_truth.py run --help`).
# $PYTHON picks the interpreter (default: the repo's .venv/bin/python if there is one, else python3;
# on the GPU machine .venv does not travel, so python3 there).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x "$here/../.venv/bin/python" ]]; then py="$here/../.venv/bin/python"; else py=python3; fi
fi
export PYTHONUNBUFFERED=1
if [[ "${1:-}" == "--prepare" ]]; then
    shift
    exec "$py" "$here/gpu_truth.py" prepare "$@"
fi
exec "$py" "$here/gpu_truth.py" run "$@"
