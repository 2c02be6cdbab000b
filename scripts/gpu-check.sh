#!/usr/bin/env bash
# The GPU check, for a lent machine with a GPU: nvcc, CMake and CUDA there, but no package
# registry. Run scripts/gpu-bundle.sh here first; it fetches the Debian packages into .gpu-debs/,
# which travels with the working tree (carry it). This script then:
#   1. unpacks them into a prefix (.gpu-prefix/, never into /) and points CMake, pkg-config and
#      the loader at it; finds NCCL next to CUDA, or in the Python wheel nvidia-nccl;
#   2. configures with GRADSYNC_CUDA=ON for the local GPU's architecture and builds (build-gpu/);
#   3. runs the CUDA tests (models_cuda_test, cuda_binary_test, nccl_test) and the device-path
#      tests; a GPU test that skips is not a pass here (where nvidia-smi lists a GPU that CUDA
#      cannot use, the tests themselves fail: tests/support/gpu_gate.h);
#   4. prints the table: MLP training-step time CPU vs GPU at batch 64 and 1024, and NCCL
#      all-reduce algbw/busbw for 1 rank (and 2 where there are 2 GPUs);
#   5. runs the CPU experiments that need more cores than a small development machine has
#      (Fashion-MNIST from the bundle): bench/overlap_compare.sh (overlap on and off, both
#      paths) and experiments/specs/largebatch.textproto (1 worker vs 8 with linear scaling and
#      warm-up), their tables printed and their summaries in $OUT;
#   6. with the time left, the whole test suite on this machine's CPU (other BLAS kernels, more
#      cores than the development machine).
# Each stage has a time limit; the whole stays under 9 minutes on a 16-core machine. The output
# also goes to $OUT/gpu-check.log when $OUT is set. Exit status: 0 only if every stage ran and
# passed; a failed stage, a skipped one (no GPU, a skipped GPU test, no dataset, no time left, tests
# left out) and one cut off by its time limit are each reported and make it non-zero (none of
# them passed). Stages that GPU_ONLY leaves out are not counted: the caller asked.
#   scripts/gpu-bundle.sh                      # here, once
#   scripts/gpu-check.sh                       # there (or here: it builds, and the GPU parts skip)
# Environment: GPU_PREFIX (.gpu-prefix), GPU_BUILD_DIR (build-gpu), GPU_USE_SYSTEM=1 to use
# installed packages instead of .gpu-debs, GPU_REUSE_BUILD=1 to use GPU_BUILD_DIR as it is (no
# configure or build: a second call on a warm machine), JOBS (all cores).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t0=$SECONDS
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT" && exec > >(tee "$OUT/gpu-check.log") 2>&1; fi
say() { printf '[gpu-check %3ds] %s\n' $((SECONDS - t0)) "$*"; }
# The whole script stays under 9 minutes: each stage gets its own limit or what is left of 530 s.
limit() { local left=$((530 - (SECONDS - t0))); ((left < 5)) && left=5; echo $(($1 < left ? $1 : left)); }
failed=0
out_of_time=()  # stages cut off by their time limit: not finished, so not passed
skipped=()      # stages (or parts of them) that did not run: not passed either
finish() {
  # The logs come back with the output (the build's and the tests'), where $OUT is set.
  if [[ -n "${OUT:-}" ]]; then
    if [[ $failed != 0 ]]; then cp -f "$build.configure.log" "$build.build.log" "$OUT/" 2>/dev/null; fi
  fi
  local verdict="$failed stage(s) FAILED"
  if [[ $failed == 0 && ${#skipped[@]} == 0 && ${#out_of_time[@]} == 0 ]]; then verdict="every stage ran and passed"; fi
  [[ ${#skipped[@]} -gt 0 ]] && verdict+="; SKIPPED (not passed): ${skipped[*]}"
  [[ ${#out_of_time[@]} -gt 0 ]] && verdict+="; OUT OF TIME (not passed): ${out_of_time[*]}"
  say "done in $((SECONDS - t0)) s; $verdict"
  exit $((failed + ${#skipped[@]} + ${#out_of_time[@]} > 0))
}

prefix=${GPU_PREFIX:-$root/.gpu-prefix}
build=${GPU_BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

say "machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(nvidia-smi: no GPU)"
echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
echo "cmake: $(cmake --version | head -1)"
echo "c++: $(${CXX:-c++} --version | head -1)"
echo "cores: $(nproc)"

# 1. Dependencies into the prefix.
cmake_args=()
if [[ "${GPU_USE_SYSTEM:-0}" != 1 && "${GPU_REUSE_BUILD:-0}" != 1 ]]; then
  if ! compgen -G ".gpu-debs/*.deb" >/dev/null; then
    say "no .gpu-debs/*.deb: run scripts/gpu-bundle.sh on a machine with the registry and carry .gpu-debs"
    failed=1
    finish
  fi
  say "unpacking $(ls .gpu-debs/*.deb | wc -l) packages into $prefix"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for d in .gpu-debs/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$d" "$prefix"
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d) && (cd "$tmp" && ar x "$root/$d" && tar -xf data.tar.* -C "$prefix") && rm -rf "$tmp"
    fi
  done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  # What Debian's maintainer scripts would have made: the alternatives' links for OpenBLAS, and
  # libz.so (its link in zlib1g-dev is absolute, to the build machine's zlib).
  ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
  ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
  zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  if [[ -n "$zlib" ]]; then ln -sf "$zlib" "$lib/libz.so"; fi
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  pkgconfig=$(command -v pkg-config || echo "$prefix/usr/bin/pkgconf")
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgconfig"
               -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc")
fi
# NCCL: next to CUDA, NCCL_HOME, or the nvidia-nccl wheel that PyTorch brings.
if [[ -z "${NCCL_HOME:-}" ]] && ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null &&
   ! compgen -G "/usr/local/cuda/targets/*/include/nccl.h" >/dev/null && ! compgen -G "/usr/include/nccl.h" >/dev/null; then
  wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [[ -n "$wheel" && -f "$wheel/include/nccl.h" ]]; then
    mkdir -p "$prefix/nccl/lib"
    ln -sfn "$wheel/include" "$prefix/nccl/include"
    ln -sf "$wheel/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so"
    ln -sf "$wheel/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so.2"
    export NCCL_HOME="$prefix/nccl"
    export LD_LIBRARY_PATH="$prefix/nccl/lib:$LD_LIBRARY_PATH"
    say "NCCL from the Python wheel: $wheel"
  else
    say "NCCL not found: the NCCL targets will not build"
  fi
fi

# 2. Configure and build.
arch=native
if ! nvidia-smi -L >/dev/null 2>&1; then arch=90; fi  # no GPU to ask: Hopper (H100/H200)
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ "${GPU_REUSE_BUILD:-0}" == 1 ]]; then
  say "GPU_REUSE_BUILD=1: $build as it is (not configured or built again)"
else
say "configuring $build (GRADSYNC_CUDA=ON, CUDA architectures $arch)"
if ! timeout "$(limit 120)" cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${cmake_args[@]}" > "$build.configure.log" 2>&1; then
  tail -30 "$build.configure.log"
  say "configure FAILED"
  failed=1
  finish
fi
grep -E '^-- gradsync' "$build.configure.log"
grep -E '^(Protobuf_LIBRARY_RELEASE|Protobuf_PROTOC_EXECUTABLE|Boost_DIR|cppzmq_DIR|GTest_DIR|NCCL_LIBRARY|pkgcfg_lib_OPENBLAS_openblas|ZeroMQ_LIBRARY|ZLIB_LIBRARY_RELEASE|CUDA_cublas_LIBRARY):' \
  "$build/CMakeCache.txt" | sed 's/^/  /'
say "building with $jobs jobs"
if ! timeout "$(limit 300)" cmake --build "$build" -j "$jobs" > "$build.build.log" 2>&1; then
  grep -E 'error|Error' "$build.build.log" | head -30
  say "build FAILED (or ran out of time); see $build.build.log"
  failed=1
  finish
fi
say "built"
fi  # GPU_REUSE_BUILD

# GPU_ONLY=overlap: build, then stage 5's overlap bench alone (a short second call);
# GPU_ONLY=device: build, the CUDA tests and the tables (stages 3 and 4) only.
only=${GPU_ONLY:-}
# 3. Tests.
if [[ -z "$only" || "$only" == device ]]; then
say "tests: CUDA model vs CPU, CUDA jobs, NCCL, the trainers' device path"
stage_s=$(limit 300)
(cd "$build" && timeout "$stage_s" ctest --output-on-failure --no-tests=error --timeout 240 -j 4 \
   -R 'CudaModel|CudaBinary|Nccl|DevicePath') > "$build.gpu-tests.log" 2>&1
case $? in
  0) ;;
  124) say "GPU tests: out of their $stage_s s"; out_of_time+=(gpu-tests) ;;
  *) say "tests FAILED"; failed=$((failed + 1)) ;;
esac
cat "$build.gpu-tests.log"
# ctest counts a skipped test as passed; here it is not: the GPU tests are what this machine is for.
gpu_skips=$(grep -c -- '\*\*\*Skipped' "$build.gpu-tests.log")
if ((gpu_skips > 0)); then
  say "$gpu_skips GPU test(s) SKIPPED, not passed; why (tests per reason):"
  grep -A1 -E ': Skipped$' "$build/Testing/Temporary/LastTest.log" 2>/dev/null | grep -vE ': Skipped$|^--$' | sort | uniq -c
  skipped+=("gpu-tests($gpu_skips)")
fi
[[ -n "${OUT:-}" ]] && cp -f "$build/Testing/Temporary/LastTest.log" "$OUT/ctest.log" 2>/dev/null

# 4. The table.
if nvidia-smi -L >/dev/null 2>&1; then
  say "MLP step (784-256-128-10) CPU ($jobs OpenBLAS threads) vs GPU, and NCCL all-reduce"
  timeout "$(limit 150)" "$build/bin/gradsync-bench-cuda" --threads="$jobs" --batches=64,1024 --nccl-mb=4,64,256 ||
    { say "bench FAILED"; failed=$((failed + 1)); }
  say "the same step with the wide MLP (784-2048-2048-10), in fp32, bf16 and fp16 (3 runs of 10 steps: the CPU side is slow)"
  timeout "$(limit 120)" "$build/bin/gradsync-bench-cuda" --threads="$jobs" --hidden=2048,2048 --batches=64,1024 --nccl-mb=none \
    --precisions=fp32,bf16,fp16 --warmup=3 --iters=10 --repeats=3 || { say "bench FAILED"; failed=$((failed + 1)); }
else
  say "no GPU listed by nvidia-smi: the table is SKIPPED (not passed)"
  skipped+=(gpu-table)
fi
fi  # GPU_ONLY

# 5. CPU experiments on this machine's cores.
data=""
for d in "$prefix/usr/share/datasets/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  if [[ -f "$d/train-images-idx3-ubyte.gz" ]]; then data=$d; break; fi
done
if [[ "$only" == device ]]; then
  say "(CPU experiments skipped: GPU_ONLY=device)"
elif [[ -n "$data" ]]; then
  export GRADSYNC_DATA_DIR="$data"
  say "overlap, both paths, on $(nproc) cores (bench/overlap_compare.sh)"
  stage_s=$(limit 200)
  BUILD_DIR="$build" timeout "$stage_s" bench/overlap_compare.sh "$build/bench-overlap"
  case $? in
    0) ;;
    124) say "overlap bench: out of its $stage_s s (GPU_ONLY=overlap runs it alone)"; out_of_time+=(overlap) ;;
    *) say "overlap bench FAILED"; failed=$((failed + 1)) ;;
  esac
  [[ -n "${OUT:-}" ]] && cp -f "$build/bench-overlap/overlap/summary.md" "$OUT/overlap-summary.md" 2>/dev/null
  say "large-batch rules (experiments/specs/largebatch.textproto)"
  if [[ -n "$only" ]]; then
    say "(skipped: GPU_ONLY=$only)"
  elif stage_s=$(limit 150); timeout "$stage_s" "$build/bin/gradsync-run" experiments/specs/largebatch.textproto --out "$build/results" \
         --only=1w,8w-linear-warmup,8w-linear,8w-unscaled,ps-8w-linear-warmup,b64,b4096-sgd-linear-warmup,b4096-lars,b4096-lamb,mlp-fp32,mlp-bf16,mlp-fp16 \
         > "$build/largebatch.log" 2>&1 ||
       grep -q "plots need gnuplot" "$build/largebatch.log"; then  # everything but the plots
    grep -E '^\| (run|1w|8w|ps-8w|b64|b4096|mlp)' "$build/results/largebatch/summary.md" | cut -d'|' -f2,3,6,7,11,12,13,14,15
    echo "test accuracy after each epoch (worker 0):"
    for f in "$build"/results/largebatch/*/metrics.csv; do
      awk -F, 'NR > 1 && $2 == 0 && $14 != "" { a = a sprintf(" %.2f%%", 100 * $14) } END { printf "  %-20s%s\n", run, a }' \
        run="$(basename "$(dirname "$f")")" "$f"
    done
    [[ -n "${OUT:-}" ]] && cp -f "$build/results/largebatch/summary.md" "$OUT/largebatch-summary.md"
  else
    tail -5 "$build/largebatch.log"
    if grep -q "interrupted during run" "$build/largebatch.log"; then
      say "largebatch: out of its $stage_s s"
      out_of_time+=(largebatch)
    else
      say "largebatch FAILED"
      failed=$((failed + 1))
    fi
  fi
else
  say "no Fashion-MNIST (scripts/gpu-bundle.sh bundles it): the CPU experiments are SKIPPED (not passed)"
  skipped+=(cpu-experiments)
fi

# 6. Every test, on this CPU, with the time that is left.
left=$((530 - (SECONDS - t0) - 10))
if [[ -n "$only" ]]; then
  :
elif ((left > 60)); then
  # gradsync-run draws its plots and timelines with gnuplot (scripts/setup.sh installs it); a lent
  # machine may lack it, and the tests of gradsync-run's outputs cannot pass there.
  skip=()
  if ! command -v gnuplot >/dev/null 2>&1; then
    skip=(-E 'RunBinaryTest|TraceBinaryTest')
    say "no gnuplot here: RunBinaryTest and TraceBinaryTest SKIPPED, not passed (they check gradsync-run's plots)"
    skipped+=("suite(RunBinaryTest,TraceBinaryTest: no gnuplot)")
  fi
  say "the whole test suite on this CPU ($left s at most)"
  (cd "$build" && timeout "$left" ctest -j 8 --timeout 120 "${skip[@]}" > "$build.suite.log" 2>&1)
  case $? in
    0) ;;
    124) say "test suite: out of its $left s"; out_of_time+=(suite) ;;
    *) say "test suite FAILED"; failed=$((failed + 1)) ;;
  esac
  grep -E 'tests passed|\*\*\*Failed|\*\*\*Timeout|Exception' "$build.suite.log"
  [[ -n "${OUT:-}" ]] && cp -f "$build/Testing/Temporary/LastTest.log" "$OUT/ctest-all.log" 2>/dev/null
else
  say "no time left for the whole test suite: SKIPPED (not passed)"
  skipped+=(suite)
fi
finish
