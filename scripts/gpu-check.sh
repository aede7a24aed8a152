#!/usr/bin/env bash
# The one script for a lent GPU machine: configure, build for sm_90, run every test (GPU tests
# included), the GPU allocator and darray tests under compute-sanitizer memcheck (darray's also
# under racecheck and synccheck), the benchmarks and the PyTorch plug-in check. Logs go under
# $OUT (default ./gpu-out); a short table is printed last, with any failed test by name.
#   scripts/gpu-check.sh [--quick] [--darray | --pools]
#     --quick: shorter benchmarks; --darray: build, then only the darray tests (and the function
#     profiler's GPU timing, which the demo uses), demo and benchmark
#     (for a multi-GPU machine when the single-GPU parts already ran); --pools: everything but
#     those. GPU_BUILD_DIR overrides the build directory (default build-gpu in the tree).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu-out}"
mkdir -p "$out"
build="${GPU_BUILD_DIR:-$root/build-gpu}"
quick=""
only=""
for a in "$@"; do
  case "$a" in
    --quick) quick="--quick" ;;
    --darray) only="darray" ;;
    --pools) only="pools" ;;
  esac
done
# Never use NVLink multicast on the shared machines (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# A lent machine (the `run` tool sets OUT) sends back at most 8 files from $OUT, the first 8 by
# name: the logs stay files of their own, the JSON results, reports and traces go into one archive.
pack_results() {
  [ -n "${OUT:-}" ] || return 0
  (cd "$out" && results=$(ls -- *.json *.json.gz 2>/dev/null) && [ -n "$results" ] &&
     tar -czf results.tar.gz $results && rm -f $results)
  echo "under \$OUT: $(cd "$out" && ls | tr '\n' ' ')"
}

declare -a rows
row() { rows+=("$(printf '%-34s %s' "$1" "$2")"); }
step() {  # name logfile command...
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  echo "== $name" | tee -a "$log"
  "$@" >>"$log" 2>&1
  local rc=$?
  row "$name" "$( [ $rc -eq 0 ] && echo ok || echo "FAILED (rc=$rc)") $((SECONDS - t0)) s"
  return $rc
}

{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(cat "$root/.snapshot-commit" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1
} >"$out/summary.txt" 2>&1
cat "$out/summary.txt"

# WERROR off here: the GPU image's newer g++ may warn where CI's does not; warnings are in the log.
step "configure+build (sm_90)" "$out/build.log" bash -c "
  cmake -S '$root' -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DPOOLSCOPE_WERROR=OFF && cmake --build '$build' -j \$(nproc) -- -k 0" || {
  grep -E 'error|FAILED' "$out/build.log" | head -40; }

# 120 s per test: the longest takes seconds; a hang fails its test instead of the whole call (the
# CUDA randomized darray test has hung at process exit: docs/perf.md, "A hang at process exit").
if [ "$only" = darray ]; then
  # The CUDA backend's own tests are named cuda_backend_* (and run again under memcheck below).
  step "ctest darray+tools+profiler GPU timing (GPUs present)" "$out/tests.log" \
    ctest --test-dir "$build" --output-on-failure -j 2 --timeout 120 \
      -R 'darray|cuda_backend|function_profiler_gpu'
else
  step "ctest (all, GPU present)" "$out/tests.log" \
    ctest --test-dir "$build" --output-on-failure -j 4 --timeout 120
fi
grep -E "tests passed|tests failed|Skipped|SKIPPED" "$out/tests.log" | tail -5
# The failed tests by name in the table too: it is printed last, where a truncated output or a
# log that did not come back still shows it.
while read -r failed; do
  row "  failed test" "$failed"
done < <(sed -n '/The following tests FAILED:/,$p' "$out/tests.log" | grep -E '^[[:space:]]+[0-9]+ - ' |
         sed 's/^[[:space:]]*//' | head -10)
# And what they said (GoogleTest's failure lines with the values after them), printed again just
# before the closing table: a lent machine returns at most 8 files from $OUT, and tests.log may
# not be among them.
failures=""
if grep -q "The following tests FAILED:" "$out/tests.log"; then
  failures="$(grep -E -A4 ': Failure$' "$out/tests.log" | head -40)"
fi
print_failures() {
  [ -n "$failures" ] || return 0
  echo "---- failures (from tests.log) ----"; printf '%s\n' "$failures"
}

# darray on every GPU: the CUDA backend tests under memcheck (small cases), the demo (trace and
# report come back under $OUT), its CUPTI overhead (the demo's times without CUPTI beside them)
# and the D1-D5 benchmark.
cli="$build/bin/poolscope"
# Whether a merged trace joins every piece between ranks (its summary's line is logged either way).
flows_joined() {  # trace
  "$cli" trace summary "$1" | grep "piece flows between ranks" | tee /dev/stderr |
    grep -E "piece flows between ranks: [1-9][0-9]* \(0 " >/dev/null
}
# The GPU tests of a suite, by name (compute-sanitizer runs only these: host tests add nothing).
gpu_tests='*cuda*:*Cuda*:*gpu*:*Gpu*'
if [ "$only" != pools ]; then
  # memcheck, then shared-memory hazards and barrier misuse in darray's kernels (the reductions
  # and the gemm share memory within a block). NCCL's own kernels are left out of racecheck: their
  # flag-based protocols read as races to it. initcheck is not run: NCCL's send kernel reads a
  # send buffer rounded up to 16 bytes, so every NCCL transfer reports, and with NCCL's kernels
  # left out the bytes they deliver read as never written (docs/perf.md, "compute-sanitizer and
  # NCCL").
  for tool in memcheck racecheck synccheck; do
    skip=()
    [ "$tool" = racecheck ] && skip=(--kernel-name-exclude kns=nccl)
    step "$tool darray (cuda tests)" "$out/sanitizer.log" \
      compute-sanitizer --tool "$tool" --report-api-errors no ${skip[@]+"${skip[@]}"} \
      --error-exitcode 99 "$build/bin/poolscope_darray_tests" --gtest_filter="$gpu_tests"
  done
  # How far each GPU's clock drifts from the host's: why darray's GPU spans place their times
  # between anchors (docs/perf.md, "GPU clocks against the host's").
  step "GPU clocks against the host's" "$out/clock_drift.log" "$build/bin/gpu_clock_drift"
  # The demos compared below run after a warm-up demo and keep the best of 10 rounds each, and
  # CUPTI on and off run twice in turn (on, off, on, off): a fresh host can run its first demo
  # processes much slower than the same command later, sometimes more than one, which would read
  # as CUPTI's cost (docs/perf.md, "Fresh hosts' first processes"). Each mode's figure is the
  # better of its two processes.
  step "demo warm-up (cuda, not compared)" "$out/demo.log" "$cli" demo --devices cuda \
    --no-cupti --repeat 1 --trace /tmp/demo_warmup.json --report /tmp/demo_warmup_report.json
  demo_step() {  # label trace report [demo options...]
    local label="$1" trace="$2" report="$3"; shift 3
    step "demo (cuda, $label)" "$out/demo.log" "$cli" demo --devices cuda --repeat 10 \
      --trace "$trace" --report "$report" "$@"
  }
  demo_step "CUPTI on" "$out/demo_trace.json.gz" "$out/demo_report.json"
  demo_step "CUPTI off" /tmp/demo_nocupti.json /tmp/demo_nocupti_report.json --no-cupti
  demo_step "CUPTI on, again" /tmp/demo_trace2.json.gz /tmp/demo_report2.json
  demo_step "CUPTI off, again" /tmp/demo_nocupti2.json /tmp/demo_nocupti_report2.json --no-cupti
  demo_step "CUPTI all kinds" /tmp/demo_allcupti.json "$out/demo_allcupti_report.json" \
    --cupti-kinds all
  # CUPTI's cost: the demo's step times with the default kinds and with all, over those without
  # (each process's figures, then the better of each mode's two).
  if command -v python3 >/dev/null; then
    python3 - "$out/demo_report.json" /tmp/demo_report2.json /tmp/demo_nocupti_report.json \
      /tmp/demo_nocupti_report2.json "$out/demo_allcupti_report.json" <<'PY' | tee -a "$out/demo.log"
import json, sys
def demo(p):
    try:
        return json.load(open(p))["run"]["demo"]
    except (OSError, ValueError, KeyError):
        return None
on1, on2, off1, off2, every = (demo(p) for p in sys.argv[1:])
keys = ("add", "reshard", "fused")
def best(*runs):
    runs = [r for r in runs if r is not None]
    return {k: min(r["t_%s_ms" % k] for r in runs) for k in keys} if runs else None
def show(label, r):
    if r is not None:
        print("%-26s " % label + ", ".join("%s %.3f ms" % (k, r["t_%s_ms" % k]) for k in keys))
for label, r in (("CUPTI on, 1st process", on1), ("CUPTI off, 1st process", off1),
                 ("CUPTI on, 2nd process", on2), ("CUPTI off, 2nd process", off2)):
    show(label, r)
off = best(off1, off2)
for name, r in (("default kinds", best(on1, on2)), ("all kinds", best(every))):
    if r is not None and off is not None:
        print("CUPTI %s / off (better of each): " % name + ", ".join(
            "%s %.3f/%.3f ms (%+.1f %%)" % (k, r[k], off[k], 100.0 * (r[k] / off[k] - 1.0))
            for k in keys))
PY
  fi
  step "trace summary (demo)" "$out/demo.log" "$cli" trace summary "$out/demo_trace.json.gz"
  step "trace summary (demo.fused)" "$out/demo.log" "$cli" trace summary \
    "$out/demo_trace.json.gz" --range demo.fused --each --top 3
  if "$cli" bench darray --help >/dev/null 2>&1; then
    step "bench darray (D1-D5)" "$out/bench_darray.log" "$cli" bench darray \
      --json "$out/bench_darray.json"
  fi
  # Across processes, one GPU per rank (docs/multiprocess.md): the darray tests for several ranks,
  # the demo (a trace and a report per rank), and D1 beside the same workload in one process on
  # the same GPUs (the target: within 10 % of its time, eta >= 0.8). By default the ranks' GPUs
  # exchange pieces by the copy engines through CUDA IPC; the same again with NCCL between them.
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if command -v mpirun >/dev/null && [ "$ngpu" -ge 2 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ranks=(mpirun -np "$ngpu" --oversubscribe)
    step "darray tests across $ngpu ranks" "$out/ranks.log" "${ranks[@]}" \
      "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1:darray_ranks_gpu_adopted.*'
    step "demo across $ngpu ranks (cuda:1 each)" "$out/ranks.log" "${ranks[@]}" "$cli" demo \
      --devices cuda:1 --repeat 10 --trace "$out/ranks_trace.json.gz" \
      --report "$out/ranks_report.json"
    step "bench D1, one process, $ngpu GPUs" "$out/ranks.log" "$cli" bench darray \
      --devices "cuda:$ngpu" --only D1 --json "$out/bench_d1_one_process.json"
    step "bench D1 across $ngpu ranks" "$out/ranks.log" "${ranks[@]}" "$cli" bench darray \
      --devices cuda:1 --only D1 --json "$out/bench_d1_ranks.json" \
      --trace "$out/bench_d1_ranks_trace.json.gz"
    step "piece flows in the merged bench trace (CUDA IPC)" "$out/ranks.log" flows_joined \
      "$out/bench_d1_ranks_trace.json.gz"
    step "darray tests across $ngpu ranks (NCCL)" "$out/ranks_nccl.log" \
      env POOLSCOPE_TEST_BETWEEN_RANKS=nccl "${ranks[@]}" -x POOLSCOPE_TEST_BETWEEN_RANKS \
      "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1:darray_ranks_gpu_adopted.*'
    step "bench D1 across $ngpu ranks (NCCL)" "$out/ranks_nccl.log" "${ranks[@]}" "$cli" bench \
      darray --devices cuda:1 --between-ranks nccl --only D1 --json "$out/bench_d1_ranks_nccl.json"
    # One process moving by NCCL too: what NCCL costs against the copy engines, apart from the
    # processes (docs/perf.md, "A GPU per rank, NCCL between them").
    step "bench D1, one process, $ngpu GPUs, NCCL" "$out/ranks.log" "$cli" bench darray \
      --devices "cuda:$ngpu" --only D1 --transport nccl --json "$out/bench_d1_one_process_nccl.json"
    # Twice as many ranks as GPUs, every rank seeing them all: the ranks wrap round the GPUs
    # (0, 1, 0, 1, ...) and CUDA IPC links every pair, those sharing a GPU included.
    twice=(mpirun -np $((2 * ngpu)) --oversubscribe)
    step "darray tests, $((2 * ngpu)) ranks on $ngpu GPUs" "$out/ranks_twice.log" "${twice[@]}" \
      "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1'
    step "demo, $((2 * ngpu)) ranks on $ngpu GPUs" "$out/ranks_twice.log" "${twice[@]}" "$cli" \
      demo --devices cuda:1 --repeat 3 --trace "$out/ranks_twice_trace.json.gz"
    step "piece flows in the merged trace ($((2 * ngpu)) ranks)" "$out/ranks_twice.log" flows_joined \
      "$out/ranks_twice_trace.json.gz"
    # A PyTorch program's own NCCL communicator, adopted (examples/torch_adopt.cpp): torchrun starts
    # a rank per GPU, no MPI; built against an install of this build and the machine's libtorch.
    if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
      ex="$build/examples-torch"
      step "torch_adopt: build against libtorch" "$out/torch_adopt.log" bash -c "
        cmake --install '$build' --prefix '$build/prefix' &&
        cmake -S '$root/examples' -B '$ex' -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_PREFIX_PATH=\"$build/prefix;\$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\" &&
        cmake --build '$ex' --target torch_adopt"
      step "torch_adopt: $ngpu ranks by torchrun" "$out/torch_adopt.log" \
        python3 -m torch.distributed.run --no-python --nproc-per-node "$ngpu" "$ex/torch_adopt"
    fi
    # Each rank a host of its own name, a GPU each (tests/support/own_host.sh): the path between
    # GPUs of different machines, NCCL's network transport over loopback.
    if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
      own=(env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 mpirun -np 2 --oversubscribe
        -x NCCL_SOCKET_IFNAME -x NCCL_IB_DISABLE "$root/tests/support/own_host.sh")
      step "darray tests, 2 ranks as two hosts" "$out/ranks_own_host.log" "${own[@]}" \
        "$build/bin/poolscope_darray_tests" \
        --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1'
      step "demo, 2 ranks as two hosts" "$out/ranks_own_host.log" "${own[@]}" "$cli" demo \
        --devices cuda:1 --repeat 3 --trace "$out/ranks_own_host_trace.json.gz"
      step "piece flows in the merged trace (two hosts)" "$out/ranks_own_host.log" flows_joined \
        "$out/ranks_own_host_trace.json.gz"
    fi
  fi
  # Two ranks sharing GPU 0, MPI through pinned host memory between them (--between-ranks mpi:
  # docs/multiprocess.md): the path of several ranks on a machine of one GPU.
  if command -v mpirun >/dev/null && [ "$ngpu" -ge 1 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    shared=(env CUDA_VISIBLE_DEVICES=0 POOLSCOPE_TEST_BETWEEN_RANKS=mpi mpirun -np 2 --oversubscribe
      -x CUDA_VISIBLE_DEVICES -x POOLSCOPE_TEST_BETWEEN_RANKS)
    step "darray tests, 2 ranks on one GPU (MPI)" "$out/ranks_mpi.log" "${shared[@]}" \
      "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1:mpi_staging.*'
    step "demo, 2 ranks on one GPU (MPI)" "$out/ranks_mpi.log" "${shared[@]}" "$cli" demo \
      --devices cuda:1 --between-ranks mpi --repeat 5 --trace "$out/ranks_mpi_trace.json.gz" \
      --report "$out/ranks_mpi_report.json"
    # The merged trace has a flow from each piece's send to its receive (none left unjoined).
    step "piece flows in the merged trace (MPI)" "$out/ranks_mpi.log" flows_joined \
      "$out/ranks_mpi_trace.json.gz"
    step "bench D1, 2 ranks on one GPU (MPI)" "$out/ranks_mpi.log" "${shared[@]}" "$cli" \
      bench darray --devices cuda:1 --between-ranks mpi --only D1 \
      --json "$out/bench_d1_ranks_mpi.json" --trace "$out/bench_d1_ranks_mpi_trace.json.gz"
    # The same with pieces moved whole (no chunks: each piece's three steps one after another).
    step "bench D1, 2 ranks on one GPU (MPI), pieces whole" "$out/ranks_mpi.log" "${shared[@]}" \
      "$cli" bench darray --devices cuda:1 --between-ranks mpi --staging-chunk 0 --only D1 \
      --json "$out/bench_d1_ranks_mpi_whole.json"
    step "piece flows in the merged bench trace (MPI)" "$out/ranks_mpi.log" flows_joined \
      "$out/bench_d1_ranks_mpi_trace.json.gz"
    # Two ranks sharing GPU 0 through CUDA IPC (the default between ranks of one host).
    ipc_one=(env CUDA_VISIBLE_DEVICES=0 mpirun -np 2 --oversubscribe -x CUDA_VISIBLE_DEVICES)
    step "darray tests, 2 ranks on one GPU (CUDA IPC)" "$out/ranks_ipc_one.log" "${ipc_one[@]}" \
      "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1:darray_ranks_gpu_adopted.*'
    step "demo, 2 ranks on one GPU (CUDA IPC)" "$out/ranks_ipc_one.log" "${ipc_one[@]}" "$cli" \
      demo --devices cuda:1 --repeat 3 --trace "$out/ranks_ipc_one_trace.json.gz"
    # NCCL between two ranks on GPU 0: each rank a host of its own to NCCL (NCCL_HOSTID), which
    # joins them by its network transport over loopback (docs/multiprocess.md, "One GPU, NCCL
    # between ranks"): the NCCL path between processes where no second GPU is lent.
    hostid='NCCL_HOSTID=poolscope-rank$OMPI_COMM_WORLD_RANK exec "$0" "$@"'
    nccl_one=(env CUDA_VISIBLE_DEVICES=0 NCCL_SOCKET_IFNAME=lo POOLSCOPE_TEST_BETWEEN_RANKS=nccl
      mpirun -np 2 --oversubscribe -x CUDA_VISIBLE_DEVICES -x NCCL_SOCKET_IFNAME
      -x POOLSCOPE_TEST_BETWEEN_RANKS sh -c "$hostid")
    step "darray tests, 2 ranks on one GPU (NCCL as two hosts)" "$out/ranks_nccl_one.log" \
      "${nccl_one[@]}" "$build/bin/poolscope_darray_tests" \
      --gtest_filter='darray_ranks.*:transports/darray_ranks_gpu.*:backends/darray_random.*/cuda1:darray_ranks_gpu_adopted.*'
    step "demo, 2 ranks on one GPU (NCCL as two hosts)" "$out/ranks_nccl_one.log" \
      "${nccl_one[@]}" "$cli" demo --devices cuda:1 --between-ranks nccl --repeat 3 \
      --trace "$out/ranks_nccl_one_trace.json.gz"
    step "piece flows in the merged trace (NCCL as two hosts)" "$out/ranks_nccl_one.log" flows_joined \
      "$out/ranks_nccl_one_trace.json.gz"
    step "bench D1, 2 ranks on one GPU (NCCL as two hosts)" "$out/ranks_nccl_one.log" \
      "${nccl_one[@]}" "$cli" bench darray --devices cuda:1 --between-ranks nccl --only D1 \
      --json "$out/bench_d1_ranks_nccl_one.json"
    # The same unbound: Open MPI binds each of two ranks to one core, which the rank's threads
    # share (docs/multiprocess.md, "Between ranks by MPI"); the two rows show what that costs.
    step "bench D1, 2 ranks on one GPU (MPI), unbound" "$out/ranks_mpi.log" "${shared[@]}" \
      --bind-to none "$cli" bench darray --devices cuda:1 --between-ranks mpi --only D1 \
      --json "$out/bench_d1_ranks_mpi_unbound.json"
  fi
fi
if [ "$only" = darray ]; then
  echo "---- demo ----"; grep -vE '^\[demo\]' "$out/demo.log" | tail -60
  echo "---- bench darray ----"; tail -30 "$out/bench_darray.log" 2>/dev/null
  print_failures
  echo "---- summary ----"; printf '%s\n' "${rows[@]}" | tee -a "$out/summary.txt"
  pack_results
  exit 0
fi

# compute-sanitizer on the GPU allocator tests (device memory paths only: host tests add nothing).
for exe in "$build"/bin/poolscope_pool_tests; do
  step "memcheck $(basename "$exe")" "$out/sanitizer.log" \
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$exe" --gtest_filter="$gpu_tests"
done

# NVTX memory API: an out-of-bounds write inside a pool block is reported only with registration.
prof="$build/bin/poolscope_profiler_tests"
if [ -x "$prof" ]; then
  # Must be reported (an invalid write inside the block), and the test itself must have run.
  step "memcheck --nvtx: OOB with registration" "$out/sanitizer.log" bash -c "
    log=\$(compute-sanitizer --tool memcheck --report-api-errors no --nvtx yes '$prof' \
          --gtest_filter='*NvtxOob*WithRegistration*' 2>&1); echo \"\$log\"
    echo \"\$log\" | grep -q 'Invalid __global__ write' && echo \"\$log\" | grep -q '1 test from'"
  step "memcheck --nvtx: OOB w/o registration" "$out/sanitizer.log" bash -c "
    log=\$(compute-sanitizer --tool memcheck --report-api-errors no --nvtx yes --error-exitcode 99 \
          '$prof' --gtest_filter='*NvtxOob*WithoutRegistration*' 2>&1); rc=\$?; echo \"\$log\"
    [ \$rc -eq 0 ] && echo \"\$log\" | grep -q '1 test from'"
fi

bench="$build/bin/poolscope"
step "bench alloc (cuda)" "$out/bench.log" "$bench" bench alloc --resource cuda $quick --compare-thread-cache \
  --json "$out/bench_alloc.json"
for b in "$build"/bin/*_bench*; do
  [ -x "$b" ] || continue
  step "$(basename "$b")" "$out/bench.log" "$b" --benchmark_min_time=0.2
done

if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  step "PyTorch plug-in workload" "$out/plugin.log" env POOLSCOPE_ALLOCATOR=bfc \
    python3 "$root/scripts/torch_plugin_check.py" "$build" --trace "$out/torch_trace.json"
  # POOLSCOPE_TRACE through the Python package: pool events, counters and CUPTI's kernels.
  step "PyTorch plug-in trace" "$out/plugin.log" \
    "$build/bin/poolscope" trace summary "$out/torch_trace.json" --top 5
  # Its line profile (POOLSCOPE_PROFILE): rendered, and every stack must start at the plug-in's
  # caller (PyTorch), never inside libpoolscope_alloc.so.
  rm -f /tmp/torch_profile.json
  step "PyTorch plug-in line profile" "$out/plugin.log" bash -c "
    POOLSCOPE_ALLOCATOR=bfc POOLSCOPE_PROFILE=/tmp/torch_profile.json \
      python3 '$root/scripts/torch_plugin_check.py' '$build' >/dev/null &&
    '$build/bin/poolscope' report /tmp/torch_profile.json | head -40 &&
    python3 - /tmp/torch_profile.json <<'PY'
import json, sys
todo, leaves = [json.load(open(sys.argv[1]))['root']], []
while todo:
    n = todo.pop()
    if n['self']['count'] > 0:
        leaves.append(n)
    todo += n.get('children', [])
inside = [n['label'] for n in leaves if 'poolscope_alloc' in n['module'] or n['function'].startswith('poolscope_')]
print(f'{len(leaves)} call sites; inside the plug-in: {inside}')
sys.exit(1 if inside or not leaves else 0)
PY"
fi
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  # Memory snapshots (docs/snapshot.md): PyTorch's and the plug-in's (every strategy, and bfc
  # over vmm against PyTorch's expandable segments) through torch.cuda._memory_viz, poolscope's
  # against PyTorch's structure, and `poolscope replay` of PyTorch's against its
  # max_memory_reserved(). (The files go to /tmp: $OUT returns only a few.)
  step "memory snapshots vs PyTorch" "$out/snapshot.log" \
    python3 "$root/scripts/snapshot_gpu_check.py" "$build/lib/libpoolscope_alloc.so" \
      --out /tmp/poolscope-gpu-check --poolscope "$build/bin/poolscope"
  # What recording costs per tensor (docs/perf.md, "Recording and snapshots").
  step "PyTorch recording cost per tensor" "$out/snapshot.log" \
    python3 "$root/scripts/torch_recording_bench.py" "$build/lib/libpoolscope_alloc.so"
fi
if python3 -c "import cupy" 2>/dev/null && [ -f "$root/scripts/cupy_plugin_check.py" ]; then
  step "CuPy plug-in workload" "$out/plugin.log" \
    python3 "$root/scripts/cupy_plugin_check.py" "$build" --trace "$out/cupy_trace.json"
  step "CuPy plug-in trace" "$out/plugin.log" \
    "$build/bin/poolscope" trace summary "$out/cupy_trace.json" --top 5
fi

echo
echo "---- bench (tail) ----"; tail -30 "$out/bench.log"
print_failures
echo "---- summary ----"
printf '%s\n' "${rows[@]}" | tee -a "$out/summary.txt"
pack_results
