#!/usr/bin/env bash
# Run on the GPU machine: every GPU-marked test (RMM domains where rmm is
# installed, then the device/frames/service tests again on CuPy-pool domains),
# the demo on the GPU, then the benchmarks. Logs go to $OUT (or ./gpu-out).
# Wheels for packages the machine lacks travel in .whl/ (see docs/benchmarks.md):
# rmm-cu13, librmm-cu13, rapids-logger, kvikio-cu13, libkvikio-cu13 (the RMM
# domains and KvikIO reads), nvidia-nvcomp-cu13 + nvidia-libnvcomp-cu13 (GPU
# decompression), dask, distributed, tornado, zict, tblib, partd, locket (the
# cluster's GPU worker test) and redis (the Redis program-cache tests).
#
#   GPU_BENCHMARKS="warmup cold_read graph source_cache serve"  which benchmarks/NAME.py to run
#                                         (warmup at --scale 20, cold_read on a 2 GiB file,
#                                          serve on the cuda backend)
#   BENCH_TIMEOUT=240                     seconds per benchmark
#   PROGRAM_RUNS=3                        runs of the program-cache benchmark
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  # By name from .whl/, so pip picks the wheel built for this machine's Python.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site --find-links .whl \
    $(ls .whl | grep '\.whl$' | sed -E 's/-[0-9].*//' | sort -u) || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys, cupy, numpy; print(sys.version); print("cupy", cupy.__version__, "numpy", numpy.__version__)'
  python3 -c 'import cuda.core; print("cuda.core", cuda.core.__version__)' || true
  python3 -c 'import rmm, kvikio; print("rmm", rmm.__version__, "kvikio", kvikio.__version__)' || true
  python3 -c 'import pyarrow, scipy, networkx; print("pyarrow", pyarrow.__version__, "scipy", scipy.__version__, "networkx", networkx.__version__)' || true
} 2>&1 | tee "$out/env.txt"
{
  python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rs tests
  NEXUS_DEVICE_ALLOCATOR=cupy python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rs \
    tests/gpu/test_device_gpu.py tests/gpu/test_frames_gpu.py tests/gpu/test_service_gpu.py
} 2>&1 | tee "$out/gpu-tests.txt"
timeout 240 python3 -m nexus_cache.cli.main demo --backend cuda ${DEMO_ARGS:-} 2>&1 | tee "$out/demo.txt"
for b in ${GPU_BENCHMARKS:-warmup cold_read graph source_cache serve}; do
  [ -f "benchmarks/$b.py" ] || continue
  case $b in
    warmup) args="--scale 20" ;;
    cold_read) args="--backend cuda --size-mib 2048 --repeats 3" ;;
    serve) args="--backend cuda --repeats 200 --qps-seconds 3 --scan-gib 1" ;;
    *) args="" ;;
  esac
  timeout "${BENCH_TIMEOUT:-240}" python3 "benchmarks/$b.py" $args ${BENCH_ARGS:-} 2>&1 | tee "$out/bench-$b.txt"
done
for i in $(seq 1 "${PROGRAM_RUNS:-0}"); do
  timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/program_cache.py --skip-scale --reps 1000 \
    --store-reps 100 2>&1 | tee "$out/bench-program_cache-$i.txt"
done
