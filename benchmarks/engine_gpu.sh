#!/usr/bin/env bash
# GPU side of the H200 engine run (benchmarks/engine_gpu.py does the work; this only sets the scene).
#
#   engine_gpu.sh receive DIR      check this call's pieces (DIR/*) against manifest.json and keep them
#                                  in $EGPU_WORK/in (default /tmp/egpu); idempotent
#   engine_gpu.sh run [ARGS...]    join + unpack + install what has arrived (once), apply the overlays to
#                                  two copies of vLLM, then run the A/B phases; results under $OUT
#   engine_gpu.sh dry-run [...]    the same without a GPU or an engine (local check)
#
# ARGS include --tp N (default 1): every engine at --tensor-parallel-size N on the checkpoint kinds staged
# by engine_gpu_prepare.py --tp N; N visible GPUs are needed (one line and exit 1 before any install).
# TP=2 (the nvidia-h200-x2 kind) has not run yet: issue 31.
#
# The manifest and both scripts travel in every call (<stage>/common); prepared by
# benchmarks/engine_gpu_prepare.py.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${EGPU_WORK:-/tmp/egpu}
export PYTHONUNBUFFERED=1
# the H200 image's multicast settings stay as they are (device KINDS.md); nothing here touches NCCL
py=${EGPU_PYTHON:-python3}
cmd=${1:?usage: engine_gpu.sh receive DIR | run [ARGS] | dry-run [ARGS]}
shift
case "$cmd" in
  receive) exec "$py" "$here/engine_gpu.py" receive --manifest "$here/manifest.json" --work "$work" "$@" ;;
  run) exec "$py" "$here/engine_gpu.py" run --manifest "$here/manifest.json" --work "$work" --out "${OUT:?OUT is not set}" "$@" ;;
  dry-run) exec "$py" "$here/engine_gpu.py" run --dry-run --manifest "$here/manifest.json" --work "$work" --out "${OUT:-$work/out}" "$@" ;;
  *) echo "engine_gpu.sh: unknown command '$cmd' (receive, run, dry-run)" >&2; exit 1 ;;
esac
