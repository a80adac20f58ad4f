#!/usr/bin/env bash
# The OpenSandbox provider plugin, end to end, against the stand-in OpenSandbox server:
#   1. start the stand-in (tests/opensandbox/server.mjs) with an API key;
#   2. publish the plugin's current files as a git repository and install it the documented
#      way: abx provider install file://REPO --subdir extensions/providers/opensandbox
#      --ref <full commit> --yes --allow-insecure-transport;
#   3. configure it (the API key through stdin), check provider info and doctor;
#   4. run the contract kit (abx provider test opensandbox): no failure, and nothing skipped
#      but tests of features the plugin does not declare; then the exec and files tests again
#      through the server's proxy (use_server_proxy=true);
#   4b. check that a sandbox made on the server directly reaches `abx events` (the plugin's
#      sandbox/changed, from its polling);
#   5. run the plugin's own node:test suites (parser, errors, states, key, reachability...);
#   6. check that the API key appears in no output, log or data file.
# Uses $ABX_BIN (default: target/debug/abx under the repository root), a private ABX_HOME,
# and stops its broker and the stand-in at the end.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
ABX_BIN="${ABX_BIN:-$ROOT/target/debug/abx}"
PLUGIN_SUBDIR="extensions/providers/opensandbox"

fail() {
  echo "opensandbox: FAIL: $*" >&2
  exit 1
}
say() { echo "opensandbox: $*"; }

[[ -x "$ABX_BIN" ]] || fail "no abx binary at $ABX_BIN (build it, or set ABX_BIN)"
ABX_BIN="$(cd "$(dirname "$ABX_BIN")" && pwd)/$(basename "$ABX_BIN")"
command -v node >/dev/null || fail "node (>= 18) is needed"
command -v git >/dev/null || fail "git is needed"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' || fail "node >= 18 is needed"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/abx-osb-test.XXXXXX")"
export ABX_HOME="$WORK/home"
unset ABX_PROVIDER OPEN_SANDBOX_API_KEY OPEN_SANDBOX_DOMAIN
OUT="$WORK/outputs.log" # every output of abx, checked for the secret at the end
SERVER_PID=""

cleanup() {
  local rc=$?
  "$ABX_BIN" broker stop >/dev/null 2>&1 || true
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 ]]; then
    echo "opensandbox: logs kept in $WORK (stand-in: server.log, broker: home/data/logs/broker.log)" >&2
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT

# abx with its output shown and recorded.
abx() {
  local rc=0
  "$ABX_BIN" "$@" >"$WORK/last.out" 2>&1 || rc=$?
  cat "$WORK/last.out" >>"$OUT"
  cat "$WORK/last.out"
  return $rc
}

# 1. The stand-in ---------------------------------------------------------------------------
API_KEY="osb-$(node -e 'process.stdout.write(require("crypto").randomBytes(12).toString("hex"))')"
OSB_STANDIN_API_KEY="$API_KEY" node "$HERE/server.mjs" --port 0 >"$WORK/server.out" 2>"$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 100); do
  grep -q '^listening ' "$WORK/server.out" 2>/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "the stand-in did not start: $(cat "$WORK/server.log")"
  sleep 0.1
done
BASE_URL="$(sed -n 's/^listening //p' "$WORK/server.out" | head -1)"
[[ -n "$BASE_URL" ]] || fail "the stand-in did not say where it listens"
say "stand-in OpenSandbox server at $BASE_URL"

# 2. Publish and install, pinned -------------------------------------------------------------
REPO="$WORK/repo"
mkdir -p "$REPO/$(dirname "$PLUGIN_SUBDIR")"
cp -R "$ROOT/$PLUGIN_SUBDIR" "$REPO/$PLUGIN_SUBDIR"
git -C "$REPO" -c init.defaultBranch=main init -q
git -C "$REPO" add -A
git -C "$REPO" -c user.name=abx-test -c user.email=abx-test@example.invalid -c commit.gpgsign=false commit -q -m "opensandbox plugin"
COMMIT="$(git -C "$REPO" rev-parse HEAD)"

abx provider install "file://$REPO" --subdir "$PLUGIN_SUBDIR" --ref "$COMMIT" --yes --allow-insecure-transport
grep -q "Installed provider 'opensandbox' 0.1.0 (pinned)" "$WORK/last.out" || fail "install did not say 'Installed provider 'opensandbox' 0.1.0 (pinned)'"

# 3. Configure, info, doctor ----------------------------------------------------------------
printf '%s\n' "$API_KEY" | abx provider configure opensandbox "base_url=$BASE_URL" api_key=-
abx provider info opensandbox
INFO="$WORK/last.out"
expect_info() {
  grep -qF -- "$1" "$INFO" || fail "provider info lacks: $1"
}
expect_info "ID           opensandbox"
expect_info "Name         OpenSandbox (OpenSandbox 开源沙箱)"
expect_info "Version      0.1.0"
expect_info "Kind         exec"
expect_info "Trust        pinned"
expect_info "Features     exec.run, exec.stream, files.rw, ports.url, process.manage, sandbox.lifecycle, sandbox.pause, sandbox.timeout, sessions"
expect_info "Config       base_url, api_key (secret), domain, protocol, use_server_proxy, default_image, image_aliases, entrypoint, ready_timeout, poll_interval, registry_username, registry_password (secret), network_policy, platform, secure_access"
expect_info "Commit       $COMMIT"
expect_info "Runtime      node ./provider.mjs"
expect_info "Security     network: * · filesystem: data_dir · spawns processes: no"
abx provider doctor opensandbox || fail "provider doctor failed"
grep -q "server" "$WORK/last.out" || fail "provider doctor does not show the plugin's own server check"
# The server down (nothing listens on loopback port 9): doctor says so, and fails.
abx provider configure opensandbox "base_url=http://127.0.0.1:9" >/dev/null
if abx provider doctor opensandbox; then
  fail "provider doctor said everything is fine with the server unreachable"
fi
grep -q "127.0.0.1:9" "$WORK/last.out" || fail "provider doctor does not name the unreachable server"
if grep -qF -- "$API_KEY" "$WORK/last.out"; then fail "provider doctor printed the API key"; fi
abx provider configure opensandbox "base_url=$BASE_URL" >/dev/null
abx provider doctor opensandbox || fail "provider doctor failed once the server was back"

# 4. The contract kit -----------------------------------------------------------------------
# Each result: "outcome name: detail"; a failure, or a skip for a declared feature, fails here.
kit() {
  local json="$WORK/kit-$1.json"
  shift
  local rc=0
  "$ABX_BIN" -j provider test opensandbox "$@" >"$json" 2>>"$OUT" || rc=$?
  cat "$json" >>"$OUT"
  node - "$json" <<'EOF' || return 1
const r = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
for (const t of r.results) console.log(`${t.outcome.padEnd(7)} ${t.name}${t.detail ? `: ${t.detail}` : ""}`);
console.log(`${r.passed} passed, ${r.failed} failed, ${r.skipped} skipped (${r.durationMs} ms)`);
const bad = r.results.filter((t) => t.outcome === "failed" || (t.outcome === "skipped" && !/^provider does not declare |declares every feature/.test(t.detail ?? "")));
if (bad.length) {
  console.error(`not accepted: ${bad.map((t) => t.name).join(", ")}`);
  process.exit(1);
}
EOF
  [[ $rc -eq 0 ]] || fail "abx provider test exited $rc"
}
say "contract kit (direct endpoints)"
kit direct || fail "the contract kit failed"
"$ABX_BIN" provider configure opensandbox use_server_proxy=true >>"$OUT" 2>&1
say "contract kit (through the server's proxy), exec and files tests"
kit proxy --filter exec,files,process,cancellation,concurrent,unicode,timeout_kills || fail "the contract kit failed through the server proxy"
"$ABX_BIN" provider configure opensandbox use_server_proxy=false >>"$OUT" 2>&1

# 4b. sandbox/changed through the broker: a sandbox made on the server directly (not through
# abx) reaches `abx events` subscribers, found by the plugin's polling (poll_interval).
say "sandbox/changed for a sandbox made on the server directly"
"$ABX_BIN" provider configure opensandbox poll_interval=1 >>"$OUT" 2>&1
"$ABX_BIN" --provider opensandbox list >>"$OUT" 2>&1 || fail "list failed" # starts the plugin: it polls while it runs
timeout 60 "$ABX_BIN" -j events --count 1 >"$WORK/events.out" 2>>"$OUT" &
EVENTS_PID=$!
sleep 2 # subscribed, and the plugin's first look at the server is done
DIRECT_ID="$(OSB_URL="$BASE_URL" OSB_KEY="$API_KEY" node -e '
fetch(`${process.env.OSB_URL}/v1/sandboxes`, {
  method: "POST",
  headers: { "Content-Type": "application/json", "OPEN-SANDBOX-API-KEY": process.env.OSB_KEY },
  body: JSON.stringify({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 120 }),
}).then(async (r) => process.stdout.write((await r.json()).id));
')"
[[ -n "$DIRECT_ID" ]] || fail "could not create a sandbox on the stand-in directly"
wait "$EVENTS_PID" || fail "abx events got no sandbox/changed within 60 s: $(cat "$WORK/events.out")"
cat "$WORK/events.out" >>"$OUT"
node -e '
const [file, id] = process.argv.slice(1);
const ev = JSON.parse(require("fs").readFileSync(file, "utf8").trim().split("\n")[0]);
console.log(`opensandbox: abx events: ${ev.change} ${ev.provider}:${ev.sandbox}`);
if (ev.change !== "created" || ev.provider !== "opensandbox" || ev.sandbox !== id) process.exit(1);
' "$WORK/events.out" "$DIRECT_ID" || fail "abx events did not report the sandbox made on the server: $(cat "$WORK/events.out")"
"$ABX_BIN" kill "opensandbox:$DIRECT_ID" >>"$OUT" 2>&1 || true
"$ABX_BIN" provider configure opensandbox poll_interval=10 >>"$OUT" 2>&1

# 5. The plugin's own tests -------------------------------------------------------------------
say "node:test suites"
node --test "$HERE"/*.test.mjs >"$WORK/node-test.out" 2>&1 || {
  cat "$WORK/node-test.out"
  fail "node --test failed"
}
grep -E '^# (tests|pass|fail)' "$WORK/node-test.out"

# 6. The secret never shows ---------------------------------------------------------------------
"$ABX_BIN" broker stop >>"$OUT" 2>&1 || true
if grep -qF -- "$API_KEY" "$OUT"; then fail "the API key appears in the output of abx"; fi
# Everywhere under ABX_HOME except the 0600 config file that stores it by design.
leaks="$(grep -rlF -- "$API_KEY" "$ABX_HOME" 2>/dev/null | grep -v "^$ABX_HOME/config/providers/opensandbox.toml$" || true)"
[[ -z "$leaks" ]] || fail "the API key was written to: $leaks"
if grep -qF -- "$API_KEY" "$WORK/node-test.out"; then fail "the API key appears in the node:test output"; fi
mode="$(stat -c %a "$ABX_HOME/config/providers/opensandbox.toml")"
[[ "$mode" == "600" ]] || fail "the config file holding the API key has mode $mode, not 600"

say "ok"
