#!/usr/bin/env bash
# Builds the libFuzzer targets for the GGUF parser + dequantizers and for the
# strict NPU emulator:
#
#   bash tests/fuzz/build.sh OUTDIR        ->  OUTDIR/fuzz_gguf, OUTDIR/fuzz_npu_emu, OUTDIR/fuzz_o4n1
#
# (tests/fuzz/run.py builds them and runs any target, C or Python, for a given
# time: python3 tests/fuzz/run.py --list)
#
# Needs clang with the libFuzzer runtime (Debian bookworm: apt-get install
# clang libclang-rt-14-dev). CC=clang-NN overrides the compiler.
#
# Running it by hand (the seed corpus is generated, never stored in the repo):
#
#   python3 tests/fuzz/seeds.py /tmp/gguf-corpus
#   ASAN_OPTIONS=detect_leaks=1 OUTDIR/fuzz_gguf /tmp/gguf-corpus \
#       -dict=tests/fuzz/gguf.dict -max_total_time=600 -rss_limit_mb=2048 -timeout=10 \
#       -print_final_stats=1 -artifact_prefix=/tmp/gguf-crash-
#
# Replay a reproducer:  OUTDIR/fuzz_gguf /tmp/gguf-crash-<sha1>
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
core="$here/../../csrc/ork"
out="$1"
mkdir -p "$out"
CC="${CC:-clang}"
# the strict NPU emulator over untrusted command bytes (seeds: seeds_npu.py)
"$CC" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1 -std=c11 -D_GNU_SOURCE \
  -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -I"$core" \
  "$here/fuzz_npu_emu.c" "$core/npu/emu.c" "$core/npu/regcmd.c" "$core/status.c" -o "$out/fuzz_npu_emu"
# the O4N1/O8N1 parser + the matmul over what it accepts, on every ISA of this
# CPU (seeds: seeds_o4n1.py, corpus/o4n1/). Each file gets its SIMD flags as
# in setup.py, so the SIMD kernels are compiled as in the extension.
objs="$out/o4n1-objs"
mkdir -p "$objs"
srcs=(o4n1.c affine.c pack.c actspec.c cpu.c pool.c status.c quant.c quant_ref.c matmul_ref.c gemm_f32_ref.c attn_ref.c ggml_types.c dequant.c)
case "$(uname -m)" in
  x86_64|amd64) srcs+=(quant_avx2.c matmul_avx2.c gemm_f32_avx2.c attn_avx2.c) ;;
  aarch64|arm64) srcs+=(quant_neon.c matmul_neon.c matmul_neondot.c gemm_f32_neon.c attn_neon.c) ;;
esac
o4n1_objs=()
for s in "${srcs[@]}" ../../tests/fuzz/fuzz_o4n1.c; do
  simd=()
  case "$s" in
    *_avx2.c) simd=(-mavx2 -mfma) ;;
    *_neondot.c) simd=(-march=armv8.2-a+dotprod) ;;
  esac
  o="$objs/$(basename "$s" .c).o"
  "$CC" -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -g -O1 -std=c11 -D_GNU_SOURCE \
    -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers "${simd[@]}" \
    -I"$core" -c "$core/$s" -o "$o"
  o4n1_objs+=("$o")
done
"$CC" -fsanitize=fuzzer,address,undefined "${o4n1_objs[@]}" -pthread -lm -o "$out/fuzz_o4n1"
# the GGUF parser + dequantizers: gguf.c the parser, with the core objects above (ggml_types.c the type
# table, dequant.c the block dequantizers, which quant.c's float16 rows use too; ork_dequant_tensor runs on
# pool.c's threads, hence -pthread; its F16 rows take cpu.c's ISA), all but the O4N1 target's main
gguf_objs=()
for s in gguf.c; do
  o="$objs/$(basename "$s" .c).o"
  "$CC" -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -g -O1 -std=c11 -D_GNU_SOURCE \
    -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
    -I"$core" -c "$core/$s" -o "$o"
  gguf_objs+=("$o")
done
core_objs=()
for o in "${o4n1_objs[@]}"; do
  case "$o" in */fuzz_o4n1.o) ;; *) core_objs+=("$o") ;; esac
done
"$CC" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1 -std=c11 -D_GNU_SOURCE \
  -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -I"$core" \
  "$here/fuzz_gguf.c" "${gguf_objs[@]}" "${core_objs[@]}" -pthread -lm -o "$out/fuzz_gguf"
echo "$out/fuzz_gguf"
echo "$out/fuzz_npu_emu"
echo "$out/fuzz_o4n1"
