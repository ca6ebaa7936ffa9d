#!/usr/bin/env bash
# tests/gpu/check.sh: the whole GPU check on a lent machine, in one bounded run.
#
#   1. build: meson release build with -Dcuda=enabled for sm_80 and sm_90
#   2. op tests: the CUDA backend against cpu_ref on the op-case table (meson suite cuda);
#      gpu_bench: copy bandwidth, cuBLAS bf16 rate, GEMV / GEMM per weight type (JSON)
#   3. parity: greedy tokens of `ridgekv run --backend cuda` == --backend cpu, on the
#      tiny trained models of shared/ (repo root, ../shared or $RK_SHARED_DIR) when
#      present, and on synthetic models of real shapes (ridgekv synth) in any case
#      and, on the synthetic qwen2.5 shape, the same with RidgeFill (--fill identity over a
#      long prompt: the plan's gathers, scatters and row skipping on the device), with
#      recorded decode steps (RIDGEKV_CUDA_GRAPHS=1), with q8 KV (host rows, staged),
#      with --kv lowram (prefill on the host codec, decode through the fused LR_ATTN; both
#      key caches: kcache=f16 and the default int8) and with --kv-budget (the GPU KV tiers)
#   4. bench: `ridgekv bench --backend cuda` on synthetic qwen2.5-1.5b q4_k_m at 8K and
#      32000 prompt tokens (the trained 32768 holds them and the decode), exact vs RidgeFill
#      (--fill off,identity: identity fill skips the same late-layer work as speed mode,
#      without maps) (JSON), decode at 8K with and
#      without recorded steps, exact vs LowRAM (--kv f16,lowram:kcache=f16,lowram) at 8K and 32K (100K when
#      time is left), a 100K prompt with YaRN x4 and --kv-budget 25% when time is left,
#      and the CPU at 512 beside it for scale
#   5. summary: $OUT/summary.txt (also printed), every log and JSON under $OUT
#
# Every step has its own timeout and the whole script stops at 8 minutes (TOTAL_S).
# Usage: tests/gpu/check.sh [--dry-run] [--out DIR] [--prebuilt DIR]
#   --prebuilt DIR  use the executables of `tests/gpu/pack.sh BUILD DIR` (made where the
#              build works) instead of building: for an image without Criterion / json-c.
#   --dry-run  no GPU needed: builds with CUDA for sm_80 only (or without CUDA when nvcc is
#              missing; BUILD=DIR reuses a build), runs the same steps with cpu_ref in place
#              of cuda for parity and cpu for the bench, at small sizes, so every CPU-side
#              part of this script is exercised anywhere.
# Exit status: 0 when every step passed (a dry run counts a skipped CUDA suite as passed),
# 1 otherwise. Not run by meson test (needs the GPU, takes minutes); tests/gpu/meson.build
# runs the dry-run's argument checks only.
set -u
set -a # the step functions run under timeout in a child bash: they see every variable
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DRY=0
PREBUILT=
OUT_DIR=${OUT:-}
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --out) shift; OUT_DIR=${1:-} ;;
    --prebuilt) shift; PREBUILT=${1:-} ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$OUT_DIR" ] || OUT_DIR=$ROOT/build-gpu-check-out # build*/ is git-ignored
mkdir -p "$OUT_DIR" || { echo "check.sh: cannot create $OUT_DIR" >&2; exit 1; }
OUT_DIR=$(cd "$OUT_DIR" && pwd)
TOTAL_S=${TOTAL_S:-480}
T0=$(date +%s)
JOBS=$(nproc 2>/dev/null || echo 2)
SUMMARY=$OUT_DIR/summary.txt
: > "$SUMMARY"
FAILED=0

if [ $DRY = 1 ]; then
    # cpu_ref stands in for the device in the parity runs (independent kernels, slow: small
    # models, short prompts), cpu in the bench
    BE=cpu_ref BENCH_BE=cpu ARCHS=80 BUILD=${BUILD:-/tmp/rk-gpu-check-dry} JOBS=${DRY_JOBS:-2}
    BENCH_P=256,1024 BENCH_LAYERS=2 BENCH_N=8 CPU_P=128 SYN_LAYERS=2 SYN_VOCAB=400 PARITY_S=300
    FILL_BE=cpu LONG_P=2048 LONG_MIN_S=60 # cpu_ref is too slow for 700-token prompts
else
    BE=cuda BENCH_BE=cuda ARCHS=80,90 BUILD=${BUILD:-$ROOT/build-gpu-check}
    BENCH_P=8192,32000 BENCH_LAYERS=0 BENCH_N=64 CPU_P=512 SYN_LAYERS=4 SYN_VOCAB=4000 PARITY_S=260
    FILL_BE=cuda LONG_P=${LONG_P:-100000} LONG_MIN_S=${LONG_MIN_S:-150} # (env: a shorter check)
fi
BIN=$BUILD/cli/ridgekv

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }
# step NAME BUDGET_S CMD...: runs CMD with timeout min(BUDGET, time left), log in $OUT/NAME.log
step() {
    local name=$1 budget=$2 t rc s0
    shift 2
    t=$(left)
    [ "$budget" -lt "$t" ] || budget=$t
    if [ "$budget" -le 5 ]; then
        say "SKIP  $name (out of time: the script is bounded to ${TOTAL_S}s)"
        FAILED=1
        return 1
    fi
    s0=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then export -f "$1"; fi
    timeout -k 5 "$budget" bash -c '"$@"' step "$@" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    local dt=$(( $(date +%s) - s0 ))
    if [ $rc = 0 ]; then
        say "PASS  $name (${dt}s)"
    elif [ $rc = 77 ]; then # a test program's "no GPU here"
        say "SKIP  $name: $(tail -n 1 "$OUT_DIR/$name.log")"
        [ $DRY = 1 ] || FAILED=1
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
        say "FAIL  $name: timed out after ${budget}s (log: $name.log)"
        FAILED=1
    else
        say "FAIL  $name: exit $rc (log: $name.log; last lines below)"
        tail -n 5 "$OUT_DIR/$name.log" | sed 's/^/      /' | tee -a "$SUMMARY"
        FAILED=1
    fi
    return $rc
}

{
    echo "date: $(date -u +%FT%TZ)  dry-run: $DRY  backend: $BE  archs: $ARCHS"
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    (nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null ||
        echo "nvidia-smi: none") | sed 's/^/gpu: /'
    (nvcc --version 2>/dev/null | tail -1 || echo "nvcc: none") | sed 's/^/nvcc: /'
    echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
} > "$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt" | tee -a "$SUMMARY"

# ---- 1. build ------------------------------------------------------------------
CUDA_OPT=-Dcuda=enabled
if [ $DRY = 1 ] && ! command -v nvcc > /dev/null; then CUDA_OPT=-Dcuda=disabled; fi
build() {
    # a build dir configured from another source tree (an old clone or worktree) is set up again
    local src
    src=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' \
        "$BUILD/meson-info/meson-info.json" 2> /dev/null || true)
    if [ -f "$BUILD/build.ninja" ] && [ "$src" != "$ROOT" ]; then
        say "build: $BUILD was configured from ${src:-an unknown tree}, not $ROOT: setting it up again"
        rm -rf "$BUILD"
    fi
    if [ -f "$BUILD/build.ninja" ]; then
        meson configure "$BUILD" $CUDA_OPT -Dgpu_archs=$ARCHS || return 1
    else
        meson setup "$BUILD" "$ROOT" --buildtype=release $CUDA_OPT -Dgpu_archs=$ARCHS || return 1
    fi
    # only what this script runs (the other suites are CI's)
    local t=(cli/ridgekv tests/gpu/test_gpu_devsim tests/gpu/test_gpu_devsim_tiers)
    [ "$CUDA_OPT" = -Dcuda=enabled ] && t+=(kernels/libridgekv-cuda.so tests/kernels/test_kernels_cuda tests/gpu/gpu_bench) # the module: --backend cuda
    ninja -C "$BUILD" -j "$JOBS" "${t[@]}"
}
if [ -n "$PREBUILT" ]; then
    PREBUILT=$(cd "$PREBUILT" && pwd) || exit 1
    BIN=$PREBUILT/bin/ridgekv
    # the image's CUDA libraries (system toolkit, or the pip wheels next to PyTorch)
    NV=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/*/lib/lib*.so*")})))' 2> /dev/null || true)
    export LD_LIBRARY_PATH=$PREBUILT/lib:/usr/local/cuda/lib64:${NV}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    step prebuilt_runs 30 "$BIN" --version || { say "check.sh: the prebuilt ridgekv does not run here, stopping"; exit 1; }
elif ! step build 300 build; then
    if [ -x "$ROOT/build-gpu-pack/bin/ridgekv" ]; then # carried beside the tree: use it
        say "check.sh: no build here; using the carried build-gpu-pack (tests/gpu/pack.sh)"
        cp "$OUT_DIR/build.log" "$OUT_DIR/build.failed.log" 2> /dev/null
        TOTAL_S=$(left) exec env -u PREBUILT bash "$0" $([ $DRY = 1 ] && echo --dry-run) --out "$OUT_DIR" \
            --prebuilt "$ROOT/build-gpu-pack"
    fi
    say "check.sh: no build (missing packages? see build.log; tests/gpu/pack.sh and --prebuilt), stopping"
    exit 1
fi

# ---- 2. CUDA op tests -------------------------------------------------------------
# meson reports a test that exits 77 (no GPU) as SKIP, which meson counts as success
cuda_tests() {
    meson test -C "$BUILD" --no-rebuild --suite cuda --print-errorlogs --num-processes "$JOBS" || return 1
    if [ $DRY = 0 ] && grep -q "SKIP" "$BUILD/meson-logs/testlog.txt"; then
        echo "the CUDA suite skipped on the GPU machine"; return 1
    fi
}
if [ -n "$PREBUILT" ]; then
    step cuda_op_tests 150 "$PREBUILT/bin/test_kernels_cuda" -j"$JOBS"
elif [ "$CUDA_OPT" = -Dcuda=enabled ]; then
    step cuda_op_tests 150 cuda_tests
    cp "$BUILD/meson-logs/testlog.txt" "$OUT_DIR/cuda_op_tests.testlog.txt" 2>/dev/null
else
    say "SKIP  cuda_op_tests (dry run without nvcc)"
fi
# the ceilings and the op rates of the issue's targets (JSON; exit 77 without a GPU)
GB=$BUILD/tests/gpu/gpu_bench
[ -n "$PREBUILT" ] && GB=$PREBUILT/bin/gpu_bench
if [ -x "$GB" ]; then
    if step gpu_bench 90 sh -c "'$GB' > '$OUT_DIR/gpu_bench.json'"; then
        python3 - "$OUT_DIR/gpu_bench.json" << 'PY' | tee -a "$SUMMARY"
import json, sys
j = json.load(open(sys.argv[1]))
print("ceilings on %s: copy %.0f GB/s (read+write), cuBLAS bf16 %.0f TFLOP/s" % (
    j["device"], j["copy_GBps_read_plus_write"], j["cublas_bf16_TFLOPs"]))
for t in j["types"]:
    print("  %-5s GEMV n=1 %7.1f us %6.0f GB/s = %4.2f x copy | GEMM n=512 %8.1f us %6.1f TFLOP/s = %4.2f x cuBLAS bf16" % (
        t["type"], t["gemv_us"], t["gemv_GBps"], t["gemv_vs_copy"], t["gemm_512_us"], t["gemm_TFLOPs"],
        t["gemm_vs_cublas_bf16"]))
PY
    fi
fi
# the session's device path without a GPU (runs everywhere)
if [ -n "$PREBUILT" ]; then
    step devsim 60 "$PREBUILT/bin/test_gpu_devsim"
    step devsim_tiers 60 "$PREBUILT/bin/test_gpu_devsim_tiers"
else
    step devsim 60 meson test -C "$BUILD" --no-rebuild gpu_devsim --print-errorlogs
    step devsim_tiers 60 meson test -C "$BUILD" --no-rebuild gpu_devsim_tiers --print-errorlogs
fi

# ---- 3. model-level parity -----------------------------------------------------------
MODELS=()
for d in "$ROOT/shared" "$ROOT/../shared" "${RK_SHARED_DIR:-/nonexistent}"; do
    for m in stories260K/stories260K-f32.gguf aidreams260K/aidreams260K-f32.gguf; do
        [ -f "$d/models/$m" ] && MODELS+=("$d/models/$m")
    done
    [ ${#MODELS[@]} -gt 0 ] && break
done
# synthetic models in a temporary folder, not under $OUT (the device tool brings $OUT back)
SYN=$(mktemp -d "${TMPDIR:-/tmp}/rk-gpu-check-models.XXXXXX") || exit 1
trap 'rm -rf "$SYN"' EXIT
synth_models() {
    local a=(--layers "$SYN_LAYERS" --vocab "$SYN_VOCAB")
    "$BIN" synth --shape smollm2-135m --type q8_0 "${a[@]}" -o "$SYN/smollm2-q8_0.gguf" &&
    "$BIN" synth --shape qwen3-0.6b --type q4_k "${a[@]}" -o "$SYN/qwen3-q4_k.gguf" &&
    "$BIN" synth --shape qwen2.5-1.5b --type q4_k_m "${a[@]}" -o "$SYN/qwen2.5-q4_k_m.gguf" &&
    "$BIN" synth --shape llama-3.2-1b --type bf16 "${a[@]}" -o "$SYN/llama3.2-bf16.gguf"
}
step synth_small 120 synth_models
for f in smollm2-q8_0 qwen3-q4_k qwen2.5-q4_k_m llama3.2-bf16; do
    [ -f "$SYN/$f.gguf" ] && MODELS+=("$SYN/$f.gguf")
done
# The referee when the cpu and device texts differ. The synthetic models' logits are
# nearly tied, and the cpu backend dots quantised weights with 8-bit activations (an NMSE
# of up to 2.5e-4 a product, tests/kernels/test_ops.c B_MMQ) while cpu_ref and the device
# keep f32 / f16 activations: a greedy pick can flip on the cpu alone (first lent machine,
# 2026-12-04: the fill case on Q4_K_M and one long Qwen3 prompt, where cpu_ref gave the
# device's text here). referee OUT_FILE ARGS...: cpu_ref's greedy text into OUT_FILE (slow:
# scalar code), bounded by the time left; 0 when it matches OUT_FILE.
referee() {
    local want=$1 t
    shift
    t=$(( $(left) - 60 ))
    [ "$t" -gt 200 ] && t=200
    [ "$t" -gt 20 ] || { echo "  (no time left for the cpu_ref referee)"; return 1; }
    timeout "$t" "$BIN" run "$@" --backend cpu_ref -t 1 > "$OUT_DIR/referee.txt" 2> /dev/null ||
        { echo "  (cpu_ref referee failed or ran past ${t}s)"; return 1; }
    if cmp -s "$OUT_DIR/referee.txt" "$want"; then
        echo "  cpu_ref (the scalar oracle) gives the device's text: the cpu's 8-bit activations flipped a near tie"
        return 0
    fi
    echo "  cpu_ref: $(head -c 200 "$OUT_DIR/referee.txt")"
    return 1
}
# greedy tokens of both backends: the same text (32 tokens after a short prompt, then a
# 300-token prompt so prefill takes the GEMM path); decode uses the GEMV path
parity() {
    local m=$1 ok=0 p rc prompts=("Once upon a time")
    # a 300-token prompt: prefill takes the GEMM path (too slow on cpu_ref in a dry run)
    [ $DRY = 1 ] || prompts+=("$(printf 'The cat sat on the mat and looked at the dog. %.0s' $(seq 1 25))")
    for p in "${prompts[@]}"; do
        "$BIN" run -m "$m" -p "$p" -n 32 --temp 0 --backend cpu -t "$JOBS" > "$OUT_DIR/parity.cpu.txt"
        rc=$?
        # exit 4: the prompt does not fit the model's context (aidreams260K: 128 tokens)
        if [ $rc = 4 ]; then echo "skipped a ${#p}-byte prompt: longer than $(basename "$m")'s context"; continue; fi
        [ $rc = 0 ] || return 1
        "$BIN" run -m "$m" -p "$p" -n 32 --temp 0 --backend "$BE" -t "$JOBS" > "$OUT_DIR/parity.dev.txt" || return 1
        if cmp -s "$OUT_DIR/parity.cpu.txt" "$OUT_DIR/parity.dev.txt"; then
            echo "same greedy text: $(basename "$m") ($(wc -c < "$OUT_DIR/parity.cpu.txt") bytes)"
        else
            echo "DIFFERENT greedy text on $(basename "$m"):"
            echo "  cpu: $(head -c 300 "$OUT_DIR/parity.cpu.txt")"
            echo "  $BE: $(head -c 300 "$OUT_DIR/parity.dev.txt")"
            [ "$BE" != cpu_ref ] && referee "$OUT_DIR/parity.dev.txt" -m "$m" -p "$p" -n 32 --temp 0 || ok=1
        fi
    done
    return $ok
}
for m in "${MODELS[@]}"; do
    step "parity_$(basename "$m" .gguf)" "$PARITY_S" parity "$m"
done
# the device paths beside the plain one, on the synthetic qwen2.5 shape: greedy text of
# cpu vs the device with RidgeFill (identity fill, split 1 of the 4 layers, a prompt well
# past the 512-row tail so its bulk rows are filled), with recorded decode steps, with q8
# KV (host rows), with LowRAM (the fit on the host at the prompt's commit, every decode
# attention the fused LR_ATTN on the device)
parity_paths() {
    local m=$1 ok=0 p name args dev_args
    p="$(printf 'The cat sat on the mat and looked at the dog. %.0s' $(seq 1 58))"
    for name in fill graphs q8 lowram lowram_int8 budget budget_chunks budget_disk; do
        args=() dev_args=()
        case $name in
        fill) args=(--fill identity --split 1 --tail 512) ;;
        q8) args=(--kv q8) ;;
        lowram) args=(--kv lowram:kcache=f16) ;;
        lowram_int8) args=(--kv lowram) ;; # the default int8 key cache: the fused op's key_int8
        # the GPU KV tiers: 4 MiB a layer at -c 4096 (kv_dim 256, f16 K and V), 9M buys two
        # layers: none resident, every layer through the two device slots and the copy lane
        budget) args=(--kv f16 -c 4096 --kv-budget 9M) ;;
        # residency by chunk: 15M = 3 layers (1 resident, 2 slots) and 3 MiB of 512-row chunk
        # frames, 2 per cold layer (the sinks' and the newest chunk: slots assembled from them
        # device to device)
        budget_chunks) args=(--kv f16 -c 4096 --kv-budget 15M) ;;
        # the disk step: one pinned layer, the other cold layers in the spill file ($TMPDIR);
        # --kv-host-budget is refused off cuda, so a dry run checks the budget part only
        budget_disk) args=(--kv f16 -c 4096 --kv-budget 9M)
            [ "$FILL_BE" = cuda ] && dev_args=(--kv-host-budget 4M) ;;
        esac
        "$BIN" run -m "$m" -p "$p" -n 24 --temp 0 --backend cpu -t "$JOBS" "${args[@]}" > "$OUT_DIR/paths.cpu.txt" || return 1
        env $([ $name = graphs ] && echo RIDGEKV_CUDA_GRAPHS=1) "$BIN" run -m "$m" -p "$p" -n 24 --temp 0 \
            --backend "$FILL_BE" -t "$JOBS" "${args[@]}" "${dev_args[@]}" > "$OUT_DIR/paths.dev.txt" || return 1
        if cmp -s "$OUT_DIR/paths.cpu.txt" "$OUT_DIR/paths.dev.txt"; then
            echo "same greedy text with $name: $(basename "$m")"
        else
            echo "DIFFERENT greedy text with $name on $(basename "$m"):"
            echo "  cpu: $(head -c 200 "$OUT_DIR/paths.cpu.txt")"
            echo "  $FILL_BE: $(head -c 200 "$OUT_DIR/paths.dev.txt")"
            [ "$FILL_BE" = cuda ] && referee "$OUT_DIR/paths.dev.txt" -m "$m" -p "$p" -n 24 --temp 0 "${args[@]}" || ok=1
        fi
    done
    return $ok
}
[ -f "$SYN/qwen2.5-q4_k_m.gguf" ] && step parity_paths_qwen2.5-q4_k_m "$PARITY_S" parity_paths "$SYN/qwen2.5-q4_k_m.gguf"

# ---- 4. bench -----------------------------------------------------------------------
BENCH_MODEL=$SYN/qwen2.5-1.5b-q4_k_m.gguf
big_synth() {
    local layers=()
    [ "$BENCH_LAYERS" != 0 ] && layers=(--layers "$BENCH_LAYERS")
    "$BIN" synth --shape qwen2.5-1.5b --type q4_k_m "${layers[@]}" -o "$BENCH_MODEL"
}
if step synth_qwen2.5-1.5b 120 big_synth; then
    # one prompt length per step: a slow long one cannot take the short one's figures with it
    js=()
    # exact vs RidgeFill (identity fill: split at layer 14 of 28, the last 2048 rows exact)
    SPLIT=14
    [ "$BENCH_LAYERS" != 0 ] && SPLIT=1
    for P in ${BENCH_P//,/ }; do
        step bench_"$BENCH_BE"_"$P" 200 sh -c "'$BIN' bench -m '$BENCH_MODEL' --backend $BENCH_BE -p $P -n $BENCH_N -r 1 --fill off,identity --split $SPLIT --tail 512 --json > '$OUT_DIR/bench_${BENCH_BE}_$P.json'"
        js+=("$OUT_DIR/bench_${BENCH_BE}_$P.json")
    done
    # decode with recorded steps (CUDA graphs), beside the plain run at the first length
    P1=${BENCH_P%%,*}
    step bench_graphs_"$P1" 120 sh -c "RIDGEKV_CUDA_GRAPHS=1 '$BIN' bench -m '$BENCH_MODEL' --backend $BENCH_BE -p $P1 -n $BENCH_N -r 1 --json > '$OUT_DIR/bench_graphs_$P1.json'"
    js+=("$OUT_DIR/bench_graphs_$P1.json")
    # exact vs LowRAM decode (prefill: the host codec behind staged rows; decode: LR_ATTN)
    for P in ${BENCH_P//,/ } $([ "$(left)" -gt $((LONG_MIN_S + 200)) ] && echo "$LONG_P"); do
        C=$([ "$P" -gt 32768 ] && echo "-c $((P + 64)) --rope-scaling yarn --rope-scale 4")
        step bench_lowram_"$P" 150 sh -c "'$BIN' bench -m '$BENCH_MODEL' --backend $BENCH_BE -p $P -n $BENCH_N -r 1 $C --kv f16,lowram:kcache=f16,lowram --json > '$OUT_DIR/bench_lowram_$P.json'"
        js+=("$OUT_DIR/bench_lowram_$P.json")
    done
    # a long prompt with YaRN x4 and a KV budget of a quarter of the KV, when enough time is
    # left: on cuda the GPU KV tiers (5 of 28 layers resident, 2 device slots, 23 layers in
    # pinned host memory moved on the copy lane); in the dry run the host tier
    if [ "$(left)" -gt "$LONG_MIN_S" ]; then
        step bench_long_"$LONG_P" $(( $(left) - 20 )) sh -c "'$BIN' bench -m '$BENCH_MODEL' --backend $BENCH_BE -p $LONG_P -n 8 -r 1 -c $((LONG_P + 64)) --rope-scaling yarn --rope-scale 4 --kv-budget 25% --json > '$OUT_DIR/bench_long_$LONG_P.json'"
        js+=("$OUT_DIR/bench_long_$LONG_P.json")
    else
        say "SKIP  bench_long_$LONG_P (under ${LONG_MIN_S}s left)"
    fi
    [ "$BENCH_BE" = cpu ] || step bench_cpu 60 sh -c "'$BIN' bench -m '$BENCH_MODEL' --backend cpu -p $CPU_P -n 8 -r 1 --json > '$OUT_DIR/bench_cpu.json'"
    # one line per prompt length
    [ "$BENCH_BE" = cpu ] || js+=("$OUT_DIR/bench_cpu.json")
    for j in "${js[@]}"; do
        [ -s "$j" ] || continue
        python3 - "$j" << 'PY' | tee -a "$SUMMARY"
import json, sys
j = json.load(open(sys.argv[1]))
for r in j.get("results", []):
    print("bench %-14s %-4s fill %-8s n_prompt %6d: TTFT %9.1f ms (%8.1f tok/s prefill), decode %7.1f tok/s" % (
        sys.argv[1].split("bench_")[-1][:-5], r.get("kv", ""), r.get("fill", ""), r["n_prompt"], r["ttft_ms"],
        r["prefill_tok_s"], r["decode_tok_s"]))
    t = r.get("kv_tier")
    if t:
        # GPU tiers (backend cuda-lane): held = device KV, elsewhere = pinned host, one unit a
        # layer pass; host tier (io_uring / threads): held = memory, elsewhere = spill file, chunks
        print("      kv tier (%s): budget %.0f MiB, held %.0f MiB, elsewhere %.0f MiB; %d hits, %d moved "
              "(%d of them prefetched); %.3f GB moved in, %.3f GB out; host waits %.3f s" % (
              t["backend"], t["budget"] / 2**20, t["resident_bytes"] / 2**20, t["spilled_bytes"] / 2**20,
              t["hits"], t["misses"], t["prefetched"], t["bytes_up"] / 1e9, t["bytes_down"] / 1e9, t["stall_s"]))
PY
    done
fi

# the summary's ratios: RidgeFill TTFT speedup and recorded-step decode speedup
python3 - "$OUT_DIR" "${BENCH_P%%,*}" << 'PY' | tee -a "$SUMMARY"
import json, os, sys
d, p1 = sys.argv[1], int(sys.argv[2])
def res(name):
    try: return json.load(open(os.path.join(d, name))).get("results", [])
    except Exception: return []
for f in sorted(os.listdir(d)):
    if not (f.startswith("bench_") and f.endswith(".json")) or "graphs" in f or "long" in f: continue
    if "lowram" in f:
        r = res(f); ex = [x for x in r if x.get("kv") == "f16"]; lr = [x for x in r if str(x.get("kv", "")).startswith("lowram")]
        for a in ex:
            for b in lr:
                if a["n_prompt"] == b["n_prompt"] and a["decode_tok_s"] > 0:
                    print("ratio %s n_prompt %d: decode LowRAM / exact = %.2fx (TTFT %.0f vs %.0f ms)" % (
                        f[6:-5], a["n_prompt"], b["decode_tok_s"] / a["decode_tok_s"], b["ttft_ms"], a["ttft_ms"]))
        continue
    r = res(f); off = [x for x in r if x.get("fill") == "off"]; idt = [x for x in r if x.get("fill") == "identity"]
    for a in off:
        for b in idt:
            if a["n_prompt"] == b["n_prompt"] and b["ttft_ms"] > 0:
                print("ratio %s n_prompt %d: TTFT exact / RidgeFill(identity) = %.2fx" % (f[6:-5], a["n_prompt"], a["ttft_ms"] / b["ttft_ms"]))
g = res("bench_graphs_%d.json" % p1)
plain = [x for f in os.listdir(d) if f.startswith("bench_") and f.endswith("_%d.json" % p1) and "graphs" not in f
         for x in res(f) if x.get("fill") == "off" and x["n_prompt"] == p1]
if g and plain and plain[0]["decode_tok_s"] > 0:
    print("ratio decode at %d: recorded steps / plain = %.2fx" % (p1, g[0]["decode_tok_s"] / plain[0]["decode_tok_s"]))
PY
say "total: $(( $(date +%s) - T0 ))s of ${TOTAL_S}s; outputs in $OUT_DIR"
if [ $FAILED = 0 ]; then say "RESULT: PASS"; else say "RESULT: FAIL"; fi
exit $FAILED
