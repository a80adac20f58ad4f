#!/usr/bin/env bash
# Type-checks, tests and packages the VS Code extension (extensions/vscode).
#
#   ABX_BIN=/path/to/abx extensions/vscode/test.sh
#
# ABX_BIN: the abx binary the tests drive (default: target/debug/abx of the repository; a
# relative path is taken from the directory test.sh is run from). Every test file runs its own
# daemon under a fresh ABX_HOME and stops it at the end.
#
# Installs what it needs by itself on a fresh Debian 12: Node.js >= 20 and npm (apt, then
# Node 20 from the npm registry when apt's is older), then the locked npm packages (npm ci).
# The client layer is the SDK (extensions/sdk/typescript, `@abx/sdk`): it is built and packed
# (npm pack) first, and the extension gets that package as its dependency.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CALLER_DIR="$(pwd)"

log() { printf '==> vscode: %s\n' "$*" >&2; }

node_major() {
  if command -v node >/dev/null 2>&1; then
    node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
  else
    echo 0
  fi
}

ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing nodejs and npm (apt)"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
  fi
  if [ "$(node_major)" -lt 20 ]; then
    # Debian 12's nodejs is 18; @vscode/vsce 3 needs 20: Node's own build, from the npm registry.
    local arch
    case "$(uname -m)" in
      x86_64) arch=x64 ;;
      aarch64 | arm64) arch=arm64 ;;
      *) echo "vscode: no Node 20 package for $(uname -m); install Node.js 20 or later" >&2; exit 1 ;;
    esac
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/abx-vscode/node20-$arch"
    if [ ! -x "$dir/package/bin/node" ]; then
      log "fetching Node 20 (npm package node-linux-$arch)"
      rm -rf "$dir" && mkdir -p "$dir"
      (cd "$dir" && tgz="$(npm pack --silent "node-linux-$arch@20")" && tar xzf "$tgz" && rm -f "$tgz")
    fi
    export PATH="$dir/package/bin:$PATH"
  fi
  log "node $(node --version), npm $(npm --version)"
}

# ---- the abx binary
ABX_BIN="${ABX_BIN:-$ROOT/target/debug/abx}"
case "$ABX_BIN" in
  /*) ;;
  *) ABX_BIN="$CALLER_DIR/$ABX_BIN" ;;
esac
if [ ! -x "$ABX_BIN" ]; then
  echo "vscode: no abx binary at $ABX_BIN: build it (cargo build -p abx-cli) or set ABX_BIN" >&2
  exit 1
fi
export ABX_BIN
log "abx: $ABX_BIN ($("$ABX_BIN" --version))"

ensure_node
SDK="$ROOT/extensions/sdk/typescript"
SDK_TMP="$(mktemp -d "${TMPDIR:-/tmp}/abx-sdk-pack.XXXXXX")"
trap 'rm -rf "$SDK_TMP"' EXIT

# ---- the SDK: its dev packages (locked), build, npm pack
(
  cd "$SDK"
  stamp="node_modules/.abx-lock-sha256"
  want="$(sha256sum package-lock.json | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    log "sdk: npm ci"
    npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
    echo "$want" >"$stamp"
  fi
  log "sdk: build"
  node scripts/build.mjs
  npm pack --silent --pack-destination "$SDK_TMP" >/dev/null
)
SDK_TGZ="$(ls "$SDK_TMP"/*.tgz)"
cd "$HERE"

# ---- npm packages, exactly as locked (reinstalled only when the lock changed)
stamp="node_modules/.abx-lock-sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  log "npm ci"
  # No install scripts: nothing here needs one (vsce-sign's only fetches a signing tool).
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi
# The SDK as just packed (npm ci installed the copy of an earlier build, if any).
rm -rf node_modules/@abx/sdk
mkdir -p node_modules/@abx/sdk
tar xzf "$SDK_TGZ" -C node_modules/@abx/sdk --strip-components=1

# ---- type-check against @types/vscode (pinned to engines.vscode), then build
log "tsc --noEmit"
npx --no-install tsc --noEmit -p .
rm -rf out
npx --no-install tsc -p .

# ---- tests: private temp dir, so any daemon a crashed test left behind is stopped here
TEST_TMP="$(mktemp -d "${TMPDIR:-/tmp}/abx-vscode.XXXXXX")"
cleanup() {
  for h in "$TEST_TMP"/abxv-*; do
    [ -d "$h" ] || continue
    ABX_HOME="$h" "$ABX_BIN" broker stop >/dev/null 2>&1 || true
  done
  rm -rf "$TEST_TMP"
}
trap 'cleanup; rm -rf "$SDK_TMP"' EXIT
log "node --test"
TMPDIR="$TEST_TMP" node --test --test-concurrency=2 out/test/*.test.js

# ---- package: a .vsix with the compiled extension and its runtime dependency
log "vsce package"
files="$(npx --no-install vsce ls </dev/null)"
for f in out/src/extension.js out/src/client/broker.js node_modules/@abx/sdk/package.json node_modules/@abx/sdk/dist/cjs/broker.js media/abx.svg README.md; do
  if ! grep -qx "$f" <<<"$files"; then
    echo "vscode: $f is missing from the package" >&2
    exit 1
  fi
done
if grep -q '^out/test/\|^src/\|^node_modules/typescript/\|^node_modules/vscode-jsonrpc/\|^\.\./' <<<"$files"; then
  echo "vscode: the package holds test, source or dev files" >&2
  exit 1
fi
version="$(node -p 'require("./package.json").version')"
rm -f ./*.vsix
npx --no-install vsce package --skip-license --allow-missing-repository -o "abx-broker-$version.vsix" >/dev/null
test -s "abx-broker-$version.vsix"
log "packaged $HERE/abx-broker-$version.vsix ($(wc -c <"abx-broker-$version.vsix") bytes)"
