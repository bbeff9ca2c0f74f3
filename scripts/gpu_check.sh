#!/usr/bin/env bash
# Run on the GPU machine. Steps run in order of value, each under its own time
# limit, each writing its log under $OUT (or ./gpu-out) as it goes, so a run
# cut short still returns what it measured. summary.txt holds the machine and
# versions, then one line a step: name, exit status, seconds.
#
#   GPU_STEPS="decoder cold_read warmup serve tests demo"   the steps, in order
#       decoder    the GPU page decoder's tests (the corrupt-page ones in a process
#                  of their own, so a device fault there cannot hide the others)
#       cold_read  benchmarks/cold_read.py --backend cuda on a 2 GiB file
#       profile    scripts/profile_decoder.py --size-mib 2048 (PROFILE_ARGS: more
#                  options): where one engine="gpu" read spends its time
#       warmup     benchmarks/warmup.py --scale 20 --runs 2,4
#       serve      benchmarks/serve.py --backend cuda --only-demo
#       tests      every other gpu-marked test (RMM domains where rmm is installed),
#                  then the device/frames/service ones again on CuPy-pool domains
#       demo       nexus-cache demo --backend cuda
#       tables     benchmarks/tables.py --backend cuda (Hive, 1 GiB decoded): filtered
#                  scans with the mask and the gather on the GPU, against pyarrow.dataset
#       graph source_cache program   the remaining benchmarks
#   STEP_TIMEOUT=NAME=SECONDS,...   override a step's limit (defaults below)
#   DEMO_ARGS, BENCH_ARGS, PROFILE_ARGS   extra arguments for the demo, the benchmarks
#                                   and the profile
#
# Wheels for packages the machine lacks travel in .whl/ (ignored by git; name it
# in the device call's carry): rmm-cu13, librmm-cu13, rapids-logger, kvikio-cu13,
# libkvikio-cu13 (RMM domains, KvikIO reads), nvidia-nvcomp-cu13 and
# nvidia-libnvcomp-cu13 (GPU decompression), dask, distributed, tornado, zict,
# tblib, partd, locket (the cluster's GPU test) and redis. The tables step's
# CPU peers travel in .whl-peers/ (polars and polars-runtime-32, about 55 MB): too
# much to carry with .whl in one call, so a call carrying .whl-peers follows one
# carrying .whl on the same warm machine, whose /tmp/site and .whl it keeps.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for wheels in .whl .whl-peers; do
  compgen -G "$wheels/*.whl" >/dev/null || continue
  # By name, so pip picks the wheel built for this machine's Python.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site --find-links "$wheels" \
    $(ls "$wheels" | grep '\.whl$' | sed -E 's/-[0-9].*//' | sort -u) || exit 1
done
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}

declare -A limit=([decoder]=240 [cold_read]=300 [warmup]=300 [serve]=240 [tests]=540
                  [demo]=240 [tables]=300 [profile]=300 [graph]=240 [source_cache]=240 [program]=240)
IFS=',' read -ra overrides <<<"${STEP_TIMEOUT:-}"
for o in "${overrides[@]}"; do [ -n "$o" ] && limit[${o%%=*}]=${o#*=}; done

pytest_gpu() { python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rs "$@"; }
decode_tests=tests/gpu/test_gpudecode_gpu.py
step_decoder() {
  pytest_gpu "$decode_tests" -k "not corrupt"
  local a=$?
  pytest_gpu "$decode_tests" -k corrupt
  local b=$?
  return $((a || b))
}
step_cold_read() {
  python3 benchmarks/cold_read.py --backend cuda --size-mib 2048 --repeats 3 ${BENCH_ARGS:-}
}
step_profile() {
  python3 scripts/profile_decoder.py --size-mib 2048 --out "${OUT:-gpu-out}/profile" ${PROFILE_ARGS:-}
}
step_warmup() { python3 benchmarks/warmup.py --scale 20 --runs 2,4 ${BENCH_ARGS:-}; }
step_serve() { python3 benchmarks/serve.py --backend cuda --only-demo --demo-scale 16 ${BENCH_ARGS:-}; }
step_tests() {
  pytest_gpu tests --deselect "$decode_tests"
  local a=$?
  NEXUS_DEVICE_ALLOCATOR=cupy pytest_gpu \
    tests/gpu/test_device_gpu.py tests/gpu/test_frames_gpu.py tests/gpu/test_service_gpu.py
  local b=$?
  return $((a || b))
}
step_demo() { python3 -m nexus_cache.cli.main demo --backend cuda ${DEMO_ARGS:-}; }
step_tables() {
  python3 benchmarks/tables.py --backend cuda --tables hive --decoded-gib 1 --repeats 3 ${BENCH_ARGS:-}
}
step_graph() { python3 benchmarks/graph.py ${BENCH_ARGS:-}; }
step_source_cache() { python3 benchmarks/source_cache.py ${BENCH_ARGS:-}; }
step_program() {
  python3 benchmarks/program_cache.py --skip-scale --reps 1000 --store-reps 100
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys, cupy, numpy; print(sys.version); print("cupy", cupy.__version__, "numpy", numpy.__version__)'
  python3 -c 'import cuda.core; print("cuda.core", cuda.core.__version__)' || true
  python3 -c 'import rmm, kvikio; print("rmm", rmm.__version__, "kvikio", kvikio.__version__)' || true
  python3 -c 'import nvidia.nvcomp as n; print("nvcomp", getattr(n, "__version__", "?"))' || true
  python3 -c 'import pyarrow, scipy, networkx; print("pyarrow", pyarrow.__version__, "scipy", scipy.__version__, "networkx", networkx.__version__)' || true
} 2>&1 | tee "$out/summary.txt"

failed=0
for s in ${GPU_STEPS:-decoder cold_read warmup serve tests demo}; do
  if ! declare -F "step_$s" >/dev/null; then
    echo "unknown step: $s" | tee -a "$out/summary.txt"
    failed=1
    continue
  fi
  t0=$(date +%s)
  # The step runs in a subshell under timeout, so a hung step ends at its limit
  # and the next one still runs.
  export -f "step_$s" pytest_gpu
  export decode_tests
  timeout --kill-after=10 "${limit[$s]:-240}" bash -c "step_$s" >"$out/$s.txt" 2>&1
  rc=$?
  echo "$s rc=$rc seconds=$(($(date +%s) - t0))" | tee -a "$out/summary.txt"
  tail -n 3 "$out/$s.txt"
  [ $rc -eq 0 ] || failed=1
done
exit $failed
