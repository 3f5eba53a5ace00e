#!/usr/bin/env bash
# Every GPU check in one invocation (< 8 min on one H200): the CUDA tests of the torch adapter
# (the registered hand-off's included), then the feed measurement (feed efficiency, and the
# training process's per-thread CPU per batch with and without the registered hand-off).
# Installs nothing: needs torch with CUDA, pyarrow, numpy, xxhash, pytest, hypothesis and psutil
# already there. Run from the repository root:
#     bash experiments/bench/gpu_all.sh [RESULTS_DIR] [gpu_feed.py options...]
# RESULTS_DIR (default: $OUT) gets: machine.txt, pytest_torch.txt, gpu_feed.md (the tables),
# gpu_feed.json, gpu_feed.log.
set -uo pipefail
if [[ $# -ge 1 && "$1" != -* ]]; then
  out=$1
  shift
else
  out=${OUT:?usage: gpu_all.sh RESULTS_DIR [gpu_feed.py options...] (or set OUT)}
fi
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  echo "cores: $(nproc)"
  "$py" -c "import sys, torch, pyarrow, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)"
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
timeout 180 "$py" -m pytest -q -p no:cacheprovider tests/test_torch.py tests/test_torch_packed.py tests/test_pinned_handoff.py 2>&1 | tee "$out/pytest_torch.txt" | tail -5
timeout 420 "$py" experiments/bench/gpu_feed.py --budget "${GPU_FEED_BUDGET:-300}" --json "$out/gpu_feed.json" "$@" \
  2>"$out/gpu_feed.log" | tee "$out/gpu_feed.md"
rc=$?
tail -3 "$out/gpu_feed.log"
exit $rc
