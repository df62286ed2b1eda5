#!/usr/bin/env bash
# One prepared GPU check that fits a lease: under 8 minutes on a fresh H200 (torch 2.11 cu130, Triton,
# transformers, onnxruntime; no Transformer Engine, no network), cold compiles included.
#
#   correctness first (pytest -m gpu), then a short GPU bench (no micro-benchmarks), then tune and
#   inference only while time is left; each step under its own `timeout`, capped by what is left of
#   BUDGET; every step's output appended under $OUT as it runs, so a killed check still returns what
#   it did. At most 8 files come back from $OUT (2 folders deep): log.txt, steps.tsv, doctor.json,
#   gpu_tests.tsv (one line per test as it ends: a killed pytest still says what passed), gpu_tests.xml,
#   results.tar.gz (re-packed after each step: each step's own log under logs/, the bench's results.json,
#   which it rewrites at every look, tune's and inference's folders).
#
# torchao and liger-kernel travel as wheels (no index there): before the call, here,
#   mkdir -p .whl && cp ../shared/wheels-py312/*.whl .whl/      (.whl/ is git-ignored; carry ".whl")
# They are installed with --target into /tmp/site (liger's packaging and numpy are on the image).
#
# GPU_CHECK_FAKE=FILE (tests only): run no command; each step "takes" the seconds FILE gives it
# ("name seconds" per line; a step that takes its limit or more is killed, rc 124), on a fake clock.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
LOG="$OUT/log.txt" STEPS="$OUT/steps.tsv" RES="${GPU_CHECK_RES:-/tmp/overdrive_gpu_check}"
BUDGET=${BUDGET:-450}  # seconds for the whole script: 30 s under 8 minutes for the call's own start-up
RESERVE=15             # kept back from every step's limit: the final packing and the summary
FAKE="${GPU_CHECK_FAKE:-}" FAKE_NOW=0
now() { if [ -n "$FAKE" ]; then echo "$FAKE_NOW"; else date +%s; fi; }
start=$(now)
status=0
: > "$LOG"
printf 'step\tlimit_s\tseconds\trc\tstatus\n' > "$STEPS"
rm -rf "$RES" && mkdir -p "$RES/logs"

pack() {  # what the finished steps wrote, in one file that comes back even if a later step is killed
  [ -n "$FAKE" ] && return 0
  tar -czf "$OUT/results.tar.gz.part" -C "$RES" . 2>/dev/null && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}

# step NAME LIMIT MIN_LEFT REQUIRED -- command...
#   LIMIT: the step's own limit (s), capped by what is left of BUDGET minus RESERVE; MIN_LEFT: skip the
#   step unless this many seconds are left; REQUIRED=1: a failure fails the check.
step() {
  local name=$1 limit=$2 min_left=$3 required=$4; shift 5
  local left=$(( BUDGET - ($(now) - start) - RESERVE ))
  if [ "$left" -lt "$min_left" ]; then
    printf '%s\t%s\t0\t-\tskipped (%s s left, needs %s)\n' "$name" 0 "$left" "$min_left" >> "$STEPS"
    echo "== $name: skipped, $left s left (needs $min_left)" | tee -a "$LOG"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s, at $(( $(now) - start )) s)" | tee -a "$LOG"
  local t0 rc
  t0=$(now)
  if [ -n "$FAKE" ]; then
    local took
    took=$(awk -v n="$name" '$1 == n {print $2}' "$FAKE")
    took=${took:-1}
    if [ "$took" -ge "$limit" ]; then took=$limit; rc=124; else rc=0; fi
    FAKE_NOW=$(( FAKE_NOW + took ))
    echo "would run: $*" >> "$LOG"
  else
    # its own log in the packed results as it runs, and the shared log.txt
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$RES/logs/$name.log" >> "$LOG"
    rc=${PIPESTATUS[0]}
  fi
  local secs=$(( $(now) - t0 )) st=ok
  [ "$rc" -eq 0 ] || st=$([ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "timed out" || echo "failed")
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$limit" "$secs" "$rc" "$st" >> "$STEPS"
  echo "-- $name: $st (rc $rc) in $secs s" | tee -a "$LOG"
  [ "$rc" -ne 0 ] && [ "$required" = 1 ] && status=1
  pack
  return 0
}

WHEELS="echo 'no .whl/: torchao and liger-kernel paths are skipped'"
if ls .whl/*.whl >/dev/null 2>&1; then
  WHEELS="'$PY' -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl"
  [ -z "$FAKE" ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

# The plan. Worst case (every step killed at its limit): 30 + 60 + 160 + 180 = 430 s (+5 s per kill),
# then tune, inference, host_us and zero_sliced are skipped; tests/unit/test_gpu_check_plan.py checks this with fake timings.
# The bench gets the most: its estimate on an H200 is ~20 s of set-up (5 workers spawned at once), the
# cold compiles of a GPT-350m and a GPT-125m (forward+backward) in the two compiled workers at once
# (~1-2 min; benchmarks/compile_time.py measures a model's cold compile), 3 rounds of 5 workers x 5
# steps (~30 s) and the parity top-up (~15 s): ~170 s. A bench cut at its limit still leaves
# results.json as of its last look.
step setup 30 25 1 -- bash -c "$WHEELS && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv"
step doctor 60 45 1 -- bash -c "'$PY' -m overdrive doctor --json > '$OUT/doctor.json'"
step gpu_tests 160 120 1 -- env OVERDRIVE_TEST_LOG="$OUT/gpu_tests.tsv" "$PY" -m pytest -v -m gpu tests/gpu -p no:cacheprovider --durations=15 \
  -o junit_family=xunit2 --junitxml="$OUT/gpu_tests.xml"
# Short bench: bf16 eager and compiled, FP8 under compile (torchao from the wheel on SM 9.0), 3 timed
# rounds, no micro-benchmarks; the workers warm up (compile) at once.
step bench 180 100 1 -- "$PY" -m overdrive bench --suite gpu --configs amp-bf16,amp-bf16+compile,fp8+compile \
  --rounds 3 --no-micro --out "$RES/bench"
step tune 90 100 0 -- "$PY" -m overdrive tune --model examples/tune_gpt.py:make_model --batch examples/tune_gpt.py:batch \
  --loss-fn examples/tune_gpt.py:loss --budget-s 60 --out "$RES/tune"
step inference 60 70 0 -- "$PY" -m overdrive bench --workload inference --suite inference-quick --out "$RES/inference"
# the host's time per eager op on this GPU's host: the published B200 step behind plan/host.py's HOST_US_PER_OP,
# at tiny widths (the GPU's work negligible), timed here: ~15 s
step host_us 25 20 0 -- "$PY" scripts/host_us_published.py --device cuda --repeats 10 --out "$RES/host_us/host-us.json"
# nanotron's sliced ZeRO-1 loops with their kernel launches (plan/host.py's ZERO_SLICED_* are a CPU host's): ~12 s
step zero_sliced 20 15 0 -- "$PY" scripts/measure_zero_sliced_host.py --device cuda --repeats 5 \
  --out "$RES/zero_sliced/zero-sliced-host.json"

total=$(( $(now) - start ))
printf 'total\t%s\t%s\t%s\t%s\n' "$BUDGET" "$total" "$status" "$([ "$status" = 0 ] && echo ok || echo failed)" >> "$STEPS"
echo "gpu_check finished in $total s (budget $BUDGET s) with status $status" | tee -a "$LOG"
column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
exit $status
