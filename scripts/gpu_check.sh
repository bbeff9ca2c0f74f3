#!/usr/bin/env bash
# Run on the GPU machine (device tool): GPU-marked tests, then the benchmarks.
# Logs go to $OUT (or ./gpu-out when OUT is unset). Wheels for packages the
# machine lacks travel in .whl/ (see docs/benchmarks.md for how they are made).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys, cupy, numpy; print(sys.version); print("cupy", cupy.__version__, "numpy", numpy.__version__)'
  python3 -c 'import cuda.core; print("cuda.core", cuda.core.__version__)' || true
  python3 -c 'import pyarrow, scipy, networkx; print("pyarrow", pyarrow.__version__, "scipy", scipy.__version__, "networkx", networkx.__version__)' || true
} 2>&1 | tee "$out/env.txt"
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rs tests 2>&1 | tee "$out/gpu-tests.txt"
for b in ${GPU_BENCHMARKS:-device_ledger program_cache}; do
  [ -f "benchmarks/$b.py" ] || continue
  timeout "${BENCH_TIMEOUT:-240}" python3 "benchmarks/$b.py" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench-$b.txt"
done
