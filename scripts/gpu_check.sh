#!/usr/bin/env bash
# One prepared GPU check: the GPU tests (pytest -m gpu) and the GPU benchmark suite, results
# under $OUT (default ./out/gpu_check). Budget: under 8 minutes on one H100/H200.
#
# On the project's device machine (Python 3.12, torch 2.11 cu130, no torchao/liger) the optional
# engines travel as wheels in .whl/ (see ../shared/wheels-py312); they are installed when present.
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
"$PY" -c "import rich, psutil, matplotlib" 2>/dev/null || echo "warning: rich/psutil/matplotlib missing" >&2
start=$(date +%s)
status=0

echo "== doctor"
timeout 300 "$PY" -m overdrive doctor --json > "$OUT/doctor.json" || status=1
timeout 300 "$PY" -m overdrive doctor | tee "$OUT/doctor.txt"

echo "== GPU tests"
timeout 240 "$PY" -m pytest -q -m gpu tests/gpu --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if "$PY" -m overdrive bench --help >/dev/null 2>&1; then
  echo "== GPU benchmark suite"
  timeout 330 "$PY" -m overdrive bench --suite gpu --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "gpu_check finished in $(( $(date +%s) - start )) s with status $status"
exit $status
