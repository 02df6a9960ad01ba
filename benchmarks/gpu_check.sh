#!/usr/bin/env bash
# gpu_check.sh OUTDIR: the engine on a real GPU, in one go, in about 10 minutes.
#
#   1. the test suite's CuPy runs: every engine test with device 'cuda' = CuPy
#      (the [cupy] ids; conftest.py adds them when a GPU is present), plus
#      tests/test_gpu.py (CUDA gradients == CPU gradients for the MLP and a
#      tiny GPT, with and without checkpointing; engine memory vs CuPy's pool);
#   2. the reference workloads W1 and W2 on the GPU (benchmarks/gpu_workloads.py):
#      peak memory by strategy (engine categories and CuPy's pool), step-time
#      ratios to no checkpointing, absolute times with the GPU named;
#   3. `tinygrad-ckpt fit` against the GPU (benchmarks/gpu_fit_check.py): a
#      GPT-2-small-sized Trainer step per strategy of fit's table, the walk's
#      predicted peak against memory.py's (equal, or it fails), its device
#      bound against CuPy's pool peak, and cudaMemGetInfo before and after;
#   4. the comparison table of the README on the GPU (tinygrad-ckpt bench
#      --compare --quick --device cuda): this engine on CuPy, PyTorch on CUDA
#      if its build has CUDA, and the floor, the step's matrix products alone,
#      measured on cuBLAS (CuPy); then bench --profile --quick --device cuda,
#      each op's time against its floor.
#
# Writes into OUTDIR: gpu_check.log (everything printed), env.txt (machine,
# driver, versions), pytest.xml (JUnit), workloads.json, fit_check.json,
# compare/ (compare.md, compare.json), profile/ (profile.md, profile.json),
# results.json (a summary: test counts, exit codes, where the figures are).
#
# How to run, from the repository root, on a machine with an NVIDIA GPU:
#     bash benchmarks/gpu_check.sh /tmp/gpu_results
# It needs python3 with numpy, pytest, hypothesis and CuPy (cupy-cuda12x or
# cupy-cuda13x, matching the driver; `pip install -e '.[gpu,test]'` gives them).
# It installs nothing from the network. If a folder of pre-downloaded wheels
# is given in WHEELS (default: .whl/ in the repository, if present), they are
# installed from it alone (pip --no-index) into a temporary folder first.
# The package itself is used from this checkout (PYTHONPATH), not installed.
#
# Without a GPU it says so, runs the two scripts' dry paths on the CPU
# stand-in (to show they work), and exits with status 3: no figures.
# Exit status: 0 all passed, 1 tests failed, 2 workloads, the fit check or
# the comparison failed, 3 no GPU.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/gpu_check.sh OUTDIR" >&2
    exit 64
fi
OUT=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
cd "$ROOT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
PY=${PYTHON:-python3}
start=$(date +%s)
echo "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT, results in $OUT"

WHEELS=${WHEELS:-$ROOT/.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "== installing wheels from $WHEELS (no network)"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/gpu_check_site:$PYTHONPATH
fi

{
    echo "python: $($PY --version 2>&1)"
    $PY -c 'import numpy; print("numpy:", numpy.__version__)' 2>&1
    $PY -c 'import cupy; print("cupy:", cupy.__version__)' 2>&1 | tail -1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
    echo "cpus: $(nproc)"
} >"$OUT/env.txt"
cat "$OUT/env.txt"

summary() {  # summary TESTS_STATUS WORKLOADS_STATUS FIT_STATUS GPU(yes/no)
    $PY - "$OUT" "$1" "$2" "$3" "$4" "$(($(date +%s) - start))" <<'EOF'
import json, os, sys, xml.etree.ElementTree as ET
out, tests_rc, work_rc, fit_rc, gpu, seconds = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                                sys.argv[5] == "yes", int(sys.argv[6]))
counts = None
if os.path.exists(os.path.join(out, "pytest.xml")):
    root = ET.parse(os.path.join(out, "pytest.xml")).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
result = {"gpu": gpu, "tests_exit_code": tests_rc, "tests": counts, "workloads_exit_code": work_rc,
          "workloads": next((p for p in ("workloads.json", "dry_run/workloads.json") if os.path.exists(os.path.join(out, p))), None),
          "fit_check_exit_code": fit_rc,
          "fit_check": next((p for p in ("fit_check.json", "dry_run/fit_check.json") if os.path.exists(os.path.join(out, p))), None),
          "seconds": seconds, "figures_measured": gpu and work_rc == 0}
from tinygrad_ckpt.serialization import atomic_write  # the package's one atomic writer (0644 under umask 022)
with atomic_write(os.path.join(out, "results.json"), "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps(result))
EOF
}

echo "== looking for a GPU"
if ! reason=$($PY -c 'from tinygrad_ckpt import backend; backend.module_for("cuda")' 2>&1); then
    echo "NO GPU: device='cuda' is not usable here, so no GPU figures will be measured."
    echo "$reason" | tail -1
    echo "== dry run of the workload script on the CPU stand-in (checks the script, not a GPU)"
    timeout 120 $PY benchmarks/gpu_workloads.py --device strict --quick --repeats 2 --out "$OUT/dry_run"
    work_rc=$?
    timeout 60 $PY benchmarks/gpu_fit_check.py --device strict --quick --out "$OUT/dry_run"
    summary -1 $work_rc $? no
    exit 3
fi

echo "== 1. test suite on CuPy (engine tests [cupy], test_gpu, test_backends)"
timeout 170 $PY -m pytest -q -p no:warnings -rs tests/ -k "cupy or test_backends" --junitxml="$OUT/pytest.xml"
tests_rc=$?
echo "pytest exit status: $tests_rc"

echo "== 2. workloads W1 and W2 on the GPU"
timeout 100 $PY benchmarks/gpu_workloads.py --device cuda --out "$OUT"
work_rc=$?
echo "workloads exit status: $work_rc"

echo "== 3. fit's predictions against a GPT-2-small-sized step on the GPU"
timeout 120 $PY benchmarks/gpu_fit_check.py --device cuda --out "$OUT"
fit_rc=$?
echo "fit check exit status: $fit_rc"

echo "== 4. the comparison and the profile on the GPU, the floor on cuBLAS"
timeout 120 $PY -m tinygrad_ckpt bench --compare --quick --device cuda --repeats 5 --output-dir "$OUT/compare"
compare_rc=$?
timeout 60 $PY -m tinygrad_ckpt bench --profile --quick --device cuda --repeats 5 --output-dir "$OUT/profile"
profile_rc=$?
echo "compare exit status: $compare_rc, profile exit status: $profile_rc"
if [ $work_rc -eq 0 ]; then work_rc=$((compare_rc || profile_rc ? 2 : 0)); fi

echo "== done in $(($(date +%s) - start)) s"
summary $tests_rc $work_rc $fit_rc yes
if [ $tests_rc -ne 0 ]; then exit 1; fi
if [ $work_rc -ne 0 ] || [ $fit_rc -ne 0 ]; then exit 2; fi
exit 0
