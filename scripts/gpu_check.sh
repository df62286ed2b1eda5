#!/usr/bin/env bash
# One prepared GPU check: the GPU tests (pytest -m gpu) and the GPU benchmark suite, results
# under $OUT (default ./out/gpu_check). Budget: under 8 minutes on one H100/H200.
#
# On the project's device machine (Python 3.12, torch 2.11 cu130; rich, psutil, matplotlib and
# pytest present; no torchao, no liger) the optional engines travel as wheels: copy them first,
#   mkdir -p .whl && cp ../shared/wheels-py312/*.whl .whl/   (then carry .whl)
# and they are installed into /tmp/site here. At most 8 files come back from $OUT, so the bench
# folder travels as one tarball (plus its results.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
start=$(date +%s)
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia_smi.csv" 2>&1

echo "== doctor ($(( $(date +%s) - start )) s)"
timeout 240 "$PY" -m overdrive doctor --json > "$OUT/doctor.json" || status=1
"$PY" -m overdrive report --help >/dev/null 2>&1 || status=1

echo "== GPU tests ($(( $(date +%s) - start )) s)"
timeout 180 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== GPU benchmark suite ($(( $(date +%s) - start )) s)"
BENCH=/tmp/overdrive_gpu_bench
rm -rf "$BENCH"
timeout 330 "$PY" -m overdrive bench --suite gpu --out "$BENCH" 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ -f "$BENCH/results.json" ]; then
  cp "$BENCH/results.json" "$OUT/bench_results.json"
  tar -czf "$OUT/bench.tar.gz" -C "$BENCH" .
fi
echo "gpu_check finished in $(( $(date +%s) - start )) s with status $status"
exit $status
