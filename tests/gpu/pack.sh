#!/usr/bin/env bash
# tests/gpu/pack.sh BUILD DIR: the executables check.sh needs from a CUDA build made on
# this machine (ridgekv, test_kernels_cuda, test_gpu_devsim, test_gpu_devsim_tiers, gpu_bench) and the shared
# libraries they load that a bare CUDA image may lack (Criterion, json-c, libedit and
# their dependencies),
# (and the CUDA backend module libridgekv-cuda.so, in bin/ beside ridgekv, where it is looked for)
# into DIR (bin/, lib/), for `check.sh --prebuilt DIR` on a lent machine that cannot build
# (no Criterion or json-c headers there). Left out: the C library and loader, and the CUDA
# libraries (libcudart, libcublas*, libcuda: the machine's own, found by check.sh).
set -eu
[ $# = 2 ] || { echo "usage: tests/gpu/pack.sh BUILD DIR" >&2; exit 2; }
B=$1 D=$2
mkdir -p "$D/bin" "$D/lib"
for e in cli/ridgekv kernels/libridgekv-cuda.so tests/kernels/test_kernels_cuda tests/gpu/test_gpu_devsim tests/gpu/test_gpu_devsim_tiers tests/gpu/gpu_bench; do
    [ -f "$B/$e" ] || { echo "pack.sh: $B/$e missing (build with -Dcuda=enabled first)" >&2; exit 1; }
    cp "$B/$e" "$D/bin/"
    strip --strip-debug "$D/bin/$(basename "$e")" 2> /dev/null || true
done
for e in "$D"/bin/*; do
    ldd "$e" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so*|libcudart.so*|libcublas*) ;;
    *) cp -L "$lib" "$D/lib/" ;;
    esac
done
du -sh "$D" | awk '{ print "pack.sh: " $1 " in '"$D"'" }'
