# Functions of tools/build_llama_cpp.sh that decide, apart from the hour-long build, whether a built
# llama.cpp runs here and how to build it when it does not (sourced; tested with fake binaries in
# tests/unit/test_reliability_round5.py).
#
# Why: GGML_NATIVE=ON compiles for every instruction set /proc/cpuinfo lists. Some VMs list AMX
# (amx_tile amx_int8 amx_bf16) that the hypervisor does not let a guest run: the native build's
# `--version` works, and its first inference dies of SIGILL at a `tilezero` in libggml-cpu (rc 132).

# Exit status of a process killed by SIGILL, as a shell reports it (128 + 4).
LLAMA_CPP_SIGILL_RC=132

# The cmake options of a portable build for CPU flags $1 (space-separated, /proc/cpuinfo names): no
# GGML_NATIVE, the AVX/AVX2/AVX-512 kernels the CPU has switched on one by one, every AMX kernel off.
llama_cpp_portable_flags() {
  local have=" $1 " out="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  local pair flag opt
  for pair in avx:GGML_AVX avx2:GGML_AVX2 fma:GGML_FMA f16c:GGML_F16C avx512f:GGML_AVX512 \
    avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI avx512_bf16:GGML_AVX512_BF16; do
    flag="${pair%%:*}"; opt="${pair##*:}"
    case "$have" in
      *" $flag "*) out="$out -D$opt=ON" ;;
      *) out="$out -D$opt=OFF" ;;
    esac
  done
  echo "$out"
}

# Run a tiny inference with the build in bin folder $1 on GGUF $2 (4 prompt tokens, 2 generated, one
# thread); its output goes to $3. Returns llama-bench's exit status (LLAMA_CPP_SIGILL_RC: the build
# uses instructions this CPU cannot run).
llama_cpp_probe() {
  local bin="$1" model="$2" log="$3" rc=0
  "$bin/llama-bench" -m "$model" -p 4 -n 2 -t 1 -r 1 > "$log" 2>&1 || rc=$?
  return "$rc"
}

# What to do after a probe that returned $1 from a build of kind $2 (native | no-amx): ok, rebuild
# (a native build that died of SIGILL: build without AMX) or fail.
llama_cpp_verdict() {
  local rc="$1" kind="$2"
  if [ "$rc" -eq 0 ]; then
    echo ok
  elif [ "$rc" -eq "$LLAMA_CPP_SIGILL_RC" ] && [ "$kind" = native ]; then
    echo rebuild
  else
    echo fail
  fi
}
