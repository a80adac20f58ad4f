#!/usr/bin/env bash
# Builds, packs and tests the TypeScript SDK (extensions/sdk/typescript, `@abx/sdk`).
#
#   ABX_BIN=/path/to/abx extensions/sdk/typescript/test.sh
#
# ABX_BIN: the abx binary the tests drive (default: target/debug/abx of the repository; a
# relative path is taken from the directory test.sh is run from); its abx-broker sits beside
# it. Every test file runs its own daemon under a fresh ABX_HOME and stops it at the end
# (test/one-daemon.test.mjs: its daemons under temp HOMEs, no ABX_HOME). The
# ssh suite starts its own sshd (/usr/sbin/sshd, Debian's openssh-server) on a loopback port.
#
# Installs what it needs on a fresh Debian 12: Node.js >= 18 and npm (apt), then the locked
# dev packages (npm ci: typescript, @types/node, and E2B's own SDKs pinned, `e2b` 2.51.0 and
# `@e2b/code-interpreter` 2.8.0, whose .d.ts test/e2b-drift.test.mjs compares `@abx/sdk/e2b`
# with; the package itself has no dependencies). test/e2b.test.mjs's matplotlib examples use
# target/pyvenv (scripts/test installs it) and are skipped, saying so, without it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CALLER_DIR="$(pwd)"

log() { printf '==> sdk-ts: %s\n' "$*" >&2; }

ABX_BIN="${ABX_BIN:-$ROOT/target/debug/abx}"
case "$ABX_BIN" in
  /*) ;;
  *) ABX_BIN="$CALLER_DIR/$ABX_BIN" ;;
esac
if [ ! -x "$ABX_BIN" ]; then
  echo "sdk-ts: no abx binary at $ABX_BIN: build it (cargo build --workspace --bins) or set ABX_BIN" >&2
  exit 1
fi
export ABX_BIN

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing nodejs and npm (apt)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "sdk-ts: node $(node --version) is too old: the SDK needs Node.js 18 or later" >&2
  exit 1
fi
log "node $(node --version), npm $(npm --version); abx: $ABX_BIN ($("$ABX_BIN" --version))"
cd "$HERE"

stamp="node_modules/.abx-lock-sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  log "npm ci"
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

log "build (dist/esm, dist/cjs, .d.ts)"
node scripts/build.mjs

TEST_TMP="$(mktemp -d "${TMPDIR:-/tmp}/abx-sdk-ts.XXXXXX")"
cleanup() {
  for h in "$TEST_TMP"/abxts-*; do
    [ -d "$h" ] && [ -d "$h/run" ] || continue
    ABX_HOME="$h" "$ABX_BIN" broker stop >/dev/null 2>&1 || true
  done
  # one-daemon.test.mjs's temp HOMEs, if it could not stop their daemons itself: found from
  # HOME alone (the data dir's record), and their /tmp/abx-<uid>/<key> runtime dirs.
  for h in "$TEST_TMP"/abx-home-*; do
    [ -d "$h/.local/share/abx" ] || continue
    env -i HOME="$h" PATH="$PATH" "$ABX_BIN" broker stop >/dev/null 2>&1 || true
    rm -rf "/tmp/abx-$(id -u)/$(printf %s "$h/.local/share/abx" | sha256sum | cut -c1-16)"
  done
  rm -rf "$TEST_TMP"
}
trap cleanup EXIT

# ---- npm pack: what is published, and that it loads as ESM and as CommonJS with no dependencies
log "npm pack"
tgz="$TEST_TMP/$(npm pack --silent --pack-destination "$TEST_TMP")"
files="$(tar tzf "$tgz")"
for f in package/package.json package/README.md package/dist/esm/index.js package/dist/esm/index.d.ts \
  package/dist/cjs/index.js package/dist/cjs/index.d.ts package/dist/cjs/package.json package/examples/sdk_run.mjs \
  package/dist/esm/e2b.js package/dist/esm/e2b.d.ts package/dist/esm/e2b/code-interpreter.js package/dist/esm/e2b/code-interpreter.d.ts \
  package/dist/cjs/e2b.js package/dist/cjs/e2b/code-interpreter.js; do
  grep -qx "$f" <<<"$files" || { echo "sdk-ts: $f is missing from the package" >&2; exit 1; }
done
if grep -q '^package/src/\|^package/test/\|^package/node_modules/' <<<"$files"; then
  echo "sdk-ts: the package holds source, test or dependency files" >&2
  exit 1
fi
node -e 'const p=require(process.argv[1]); if (p.dependencies && Object.keys(p.dependencies).length) { console.error("sdk-ts: runtime dependencies:", p.dependencies); process.exit(1) }' "$HERE/package.json"
app="$TEST_TMP/app"
mkdir -p "$app/node_modules/@abx/sdk"
tar xzf "$tgz" -C "$app/node_modules/@abx/sdk" --strip-components=1
(cd "$app" && node --input-type=module -e "import { Sandbox, SandboxNotFoundError } from '@abx/sdk'; if (typeof Sandbox.create !== 'function' || !(new SandboxNotFoundError('E2009', 'x') instanceof Error)) process.exit(1);" \
  && node -e "const s = require('@abx/sdk'); if (typeof s.Sandbox.create !== 'function' || typeof s.BrokerClient.connect !== 'function') process.exit(1);" \
  && node --input-type=module -e "import { Sandbox, CommandExitError } from '@abx/sdk/e2b'; import CI, { Sandbox as S2 } from '@abx/sdk/e2b/code-interpreter'; if (typeof Sandbox.create !== 'function' || typeof S2.prototype.runCode !== 'function' || CI !== S2 || !(new CommandExitError({exitCode: 1, stdout: '', stderr: ''}) instanceof Error)) process.exit(1);" \
  && node -e "const e = require('@abx/sdk/e2b'), c = require('@abx/sdk/e2b/code-interpreter'); if (typeof e.Sandbox.create !== 'function' || typeof c.Sandbox.prototype.runCode !== 'function') process.exit(1);")
log "packed $(basename "$tgz") ($(wc -c <"$tgz") bytes): loads as ESM and CommonJS (@abx/sdk, @abx/sdk/e2b, @abx/sdk/e2b/code-interpreter)"

log "node --test"
TMPDIR="$TEST_TMP" node --test test/*.test.mjs
