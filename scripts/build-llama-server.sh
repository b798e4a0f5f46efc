#!/usr/bin/env bash
# Build llama.cpp's own HTTP server (llama-server) from the llama-cpp-python sdist on PyPI,
# whose vendor/llama.cpp holds the server's source, and install the binary at $2/llama-server.
#
#   scripts/build-llama-server.sh VERSION DEST_DIR [PYTHON]
#
# The binary is statically linked against llama.cpp (no shared libraries beside it), built
# for this machine's CPU, without CURL (models are local files). Built in a temporary
# directory and moved into place only once it runs, so an interrupted build leaves nothing
# behind that looks finished. About 10 minutes on 2 cores (measured: see the README).
set -euo pipefail

version=${1:?usage: build-llama-server.sh VERSION DEST_DIR [PYTHON]}
dest=${2:?usage: build-llama-server.sh VERSION DEST_DIR [PYTHON]}
python=${3:-python3}
jobs=$(nproc 2>/dev/null || echo 2)

command -v cmake >/dev/null || { echo "cmake is missing (Debian: apt-get install cmake)" >&2; exit 1; }
command -v c++ >/dev/null || { echo "a C++ compiler is missing (Debian: apt-get install g++)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "llama-server $version: fetching the llama-cpp-python sdist"
"$python" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/tools/server/CMakeLists.txt" ] || { echo "no tools/server in $src" >&2; exit 1; }

echo "llama-server $version: building with $jobs jobs (this takes a while the first time)"
start=$(date +%s)
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON >"$work/cmake.log" 2>&1 \
  || { tail -40 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 \
  || { tail -60 "$work/build.log" >&2; exit 1; }
binary="$work/build/bin/llama-server"
"$binary" --version >/dev/null 2>&1 || { echo "the built llama-server does not run" >&2; exit 1; }

mkdir -p "$dest"
cp "$binary" "$dest/llama-server.partial"
mv "$dest/llama-server.partial" "$dest/llama-server"
echo "llama-server $version: built in $(( $(date +%s) - start )) s -> $dest/llama-server"
