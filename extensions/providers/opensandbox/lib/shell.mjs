// The bash scripts the plugin runs through execd (execd runs every command as `bash -c`).
//
// execd has no stdin (outside its PTY API), reports a signal death as exit code -1, and sends
// output as text lines. So each command runs inside a small wrapper that
//   - starts the command as a background job with job control on (`set -m`), so the command
//     and its children form their own process group, which the plugin signals as a whole
//     (`kill -s SIG -- -PGID`, run as another execd command) for exec/kill, process/kill,
//     timeouts and cancellation, while the wrapper survives and reports 128+n like a shell;
//   - reports the job's pid (= its process group) as the first line on its stdout, before
//     anything the command prints: "\x01abx-pid PGID WRAPPER_PID";
//   - for exec/run ("capture"): sends the command's stdout and stderr to files in a per-exec
//     directory under /tmp/.abx-exec, which the plugin downloads afterwards byte-exact, and
//     gives it the uploaded stdin file or /dev/null;
//   - for exec/start ("stream"): lets the output go to execd's event stream (text lines), and
//     feeds the command's stdin from a fifo: a feeder loop copies the chunk files the plugin
//     uploads (c.N, then the marker r.N) into it, in order, until the marker file "eof"
//     (the plugin removes the directory once the command ended and its uploads settled);
//   - with a timeout, arms a watchdog that kills the job a few seconds after the plugin would
//     (the plugin enforces timeouts itself; the watchdog covers a plugin that died).
//   - traps the signals execd relays to the process group of the shell it started (INT, TERM,
//     HUP, QUIT, USR1, USR2; its interrupt sends TERM there too), which is the wrapper's group,
//     not the job's: they are passed on to the job, the wrapper keeps waiting for it and exits
//     with the job's status, and names the signal ("\x01abx-signal NAME") when the job died of
//     it. Only a SIGKILL of the wrapper's group (execd's cancelled request) ends the wrapper
//     early: execd then reports -1, and the plugin kills the job itself.

import * as os from "node:os";
import { RpcError } from "./errors.mjs";

export const EXEC_ROOT = "/tmp/.abx-exec";
export const MARK_PID = "\u0001abx-pid ";
export const MARK_NOCMD = "\u0001abx-nocmd";
export const MARK_ERROR = "\u0001abx-error ";
export const MARK_SIGNAL = "\u0001abx-signal ";

// The signals execd forwards to a /command's process group (the wrapper's, not the job's own
// group): alibaba/OpenSandbox components/execd/pkg/runtime/command.go, runCommand, relays what
// execd receives with syscall.Kill(-cmd.Process.Pid, sig) (forwardSignals in newer versions).
export const FORWARDED_SIGNALS = ["INT", "TERM", "HUP", "QUIT", "USR1", "USR2"];

// Single-quote a word for sh/bash.
export function shq(s) {
  return `'${String(s).replace(/'/g, `'\\''`)}'`;
}

// "TERM", "SIGTERM", 15, "15" -> {name: "TERM", number: 15}; null/undefined -> KILL.
export function parseSignal(v, method) {
  if (v == null) return { name: "KILL", number: 9 };
  const signals = os.constants.signals;
  if (typeof v === "number" || (typeof v === "string" && /^\d+$/.test(v))) {
    const n = Number(v);
    const name = Object.keys(signals).find((k) => signals[k] === n);
    if (name && n > 0 && n < 32) return { name: name.replace(/^SIG/, ""), number: n };
  } else if (typeof v === "string") {
    const up = v.trim().toUpperCase();
    const full = up.startsWith("SIG") ? up : `SIG${up}`;
    if (signals[full] !== undefined && signals[full] < 32) return { name: full.slice(3), number: signals[full] };
  }
  throw new RpcError(-32602, `Invalid params for '${method}': unknown signal ${JSON.stringify(v)}`);
}

export function signalNumber(name) {
  const n = os.constants.signals[`SIG${String(name).replace(/^SIG/, "")}`];
  return typeof n === "number" ? n : null;
}

export function signalName(number) {
  const signals = os.constants.signals;
  return Object.keys(signals).find((k) => signals[k] === number) ?? null;
}

// The body of the job: the pid line on fd 3, then the user's command as `sh -c`, or argv run as
// is (after checking that the program exists: MARK_NOCMD on fd 3 before the pid line, so that
// a missing program is known before the exec counts as started).
function jobBody({ command, argv }, mark) {
  if (argv) {
    const words = argv.map(shq).join(" ");
    return (
      `command -v -- ${shq(argv[0])} >/dev/null 2>&1 || { printf '\\001abx-nocmd\\n' >&3; exit 127; }; ` +
      `${mark}; exec 3>&-; exec -- ${words}`
    );
  }
  return `${mark}; exec 3>&-; exec sh -c ${shq(command)}`;
}

// The wrapper script. `dir` is the per-exec directory (under EXEC_ROOT); `mode` "capture" or
// "stream"; `stdin` (capture) "file" (dir/in was uploaded) or "null"; `watchdog` seconds or null;
// `env` variables exported to the command (they also travel as execd's `envs`, which older execd
// versions ignore; names that are not shell identifiers only travel that way).
export function wrapperScript({ dir, command, argv, mode, stdin = "null", watchdog = null, env = {} }) {
  const D = shq(dir);
  const lines = [
    "set -m",
    ...Object.entries(env)
      .filter(([k]) => /^[A-Za-z_][A-Za-z0-9_]*$/.test(k))
      .map(([k, v]) => `export ${k}=${shq(v)}`),
    `__abx_d=${D}`,
    'mkdir -p -- "$__abx_d" 2>/dev/null',
    "exec 3>&1",
    // bash reports finished background jobs ("[2]+ Done ...") on its stderr, also when the job
    // ends before the wrapper reaches its `wait`: the wrapper's stderr goes nowhere, and the
    // command gets the original one (fd 4) explicitly.
    "exec 4>&2 2>/dev/null",
    "__abx_f=; __abx_w=; __abx_p=; __abx_s=",
    // A signal that reaches the wrapper (execd forwards the signals it gets, and its interrupt
    // sends TERM, to the wrapper's process group, never to the job's own group) is passed on
    // to the job, which ends as the signal says; the wrapper goes on waiting for it and
    // reports how it ended. (Subshells do not inherit these traps: the job gets defaults.)
    ...FORWARDED_SIGNALS.map((g) => `trap '__abx_s=${g}; [ -n "$__abx_p" ] && kill -s ${g} -- -"$__abx_p" 2>/dev/null' ${g}`),
  ];
  const mark = `printf '\\001abx-pid %s %s\\n' "$BASHPID" "$$" >&3`;
  const body = jobBody({ command, argv }, mark);
  if (mode === "stream") {
    lines.push(
      'rm -f -- "$__abx_d/in"; mkfifo -- "$__abx_d/in" || { printf \'\\001abx-error cannot create a fifo in %s\\n\' "$__abx_d"; exit 125; }',
      '( __abx_i=0; exec 4>"$__abx_d/in"; while :; do ' +
        'if [ -e "$__abx_d/r.$__abx_i" ]; then cat -- "$__abx_d/c.$__abx_i" >&4 || break; ' +
        // The upload of chunk N may still be finishing (execd chmods after writing); the plugin
        // sends N+1 only after N returned, so chunk N-1 is safe to remove now.
        'rm -f -- "$__abx_d/c.$((__abx_i-1))" "$__abx_d/r.$((__abx_i-1))"; __abx_i=$((__abx_i+1)); ' +
        'elif [ -e "$__abx_d/eof" ]; then [ -e "$__abx_d/r.$__abx_i" ] || break; ' +
        "else sleep 0.05 2>/dev/null || sleep 1; fi; done ) </dev/null >/dev/null 2>&1 4>&- &",
      "__abx_f=$!",
      `( ${body} ) <"$__abx_d/in" 2>&4 4>&- &`,
    );
  } else {
    const input = stdin === "file" ? '"$__abx_d/in"' : "/dev/null";
    lines.push(`( ${body} ) <${input} >"$__abx_d/out" 2>"$__abx_d/err" 4>&- &`);
  }
  lines.push("__abx_p=$!");
  if (watchdog != null) {
    lines.push(`( sleep ${Math.ceil(watchdog)}; kill -s KILL -- -"$__abx_p" ) </dev/null >/dev/null 2>&1 4>&- &`, "__abx_w=$!");
  }
  lines.push(
    "exec 4>&-",
    // With job control, wait also returns when the job is merely stopped (a paused sandbox):
    // wait again until it is gone.
    // A trapped signal also ends a wait early (128+n, not the job's status): wait again.
    'while :; do wait "$__abx_p"; __abx_r=$?; kill -0 "$__abx_p" 2>/dev/null || break; sleep 0.2 2>/dev/null || sleep 1; done',
    // The job's own status, when the last wait was cut short by a trap (127: already given).
    '__abx_q=0; if [ -n "$__abx_s" ]; then wait "$__abx_p" 2>/dev/null; __abx_q=$?; [ "$__abx_q" -ne 127 ] && __abx_r=$__abx_q; fi',
    // The signal that was passed on, when the job died of it: the plugin names it.
    'if [ -n "$__abx_s" ] && [ "$__abx_r" -eq $((128 + $(kill -l "$__abx_s" 2>/dev/null || echo 0))) ]; then printf \'\\001abx-signal %s\\n\' "$__abx_s" >&3; fi',
    'for __abx_x in $__abx_f $__abx_w; do kill -- -"$__abx_x" 2>/dev/null; done',
  );
  // The directory stays: stdin uploads may still be landing in it; the plugin removes it.
  lines.push('exit "$__abx_r"');
  return lines.join("\n");
}

// Signal a job's process group.
export function killScript(pgid, signal) {
  return `kill -s ${signal} -- -${Number(pgid)} 2>&1 || kill -s ${signal} ${Number(pgid)} 2>&1`;
}

// Signal one process that abx did not start (process/kill of a foreign pid).
export function killPidScript(pid, signal) {
  return `kill -0 ${Number(pid)} 2>/dev/null || { echo no-such-process; exit 3; }; kill -s ${signal} ${Number(pid)} 2>&1`;
}

// Append an uploaded chunk to a file (files/write at the file's end).
export function appendScript(chunk, target) {
  return `cat -- ${shq(chunk)} >> ${shq(target)}; __abx_r=$?; rm -f -- ${shq(chunk)}; exit $__abx_r`;
}

// Rename `src` over the existing non-directory `dest`, atomically (rename(2)): execd's
// /files/mv refuses an existing destination. `mv -T` keeps a link to a directory from being
// taken for that directory; where mv has no -T (old BusyBox) a plain mv does, after making
// sure `dest` is no directory (a link is removed first, not followed).
export function replaceScript(src, dest) {
  const S = shq(src);
  const D = shq(dest);
  return [
    `mv -f -T -- ${S} ${D} 2>/dev/null && exit 0`,
    `if [ -d ${D} ] && [ ! -L ${D} ]; then echo "mv: cannot overwrite: Is a directory" >&2; exit 1; fi`,
    `if [ -L ${D} ]; then rm -f -- ${D} || exit 1; fi`,
    `mv -f -- ${S} ${D}`,
  ].join("\n");
}

export const SYSTEM_INFO_SCRIPT = [
  "echo os=$(uname -s 2>/dev/null)",
  "echo arch=$(uname -m 2>/dev/null)",
  "echo kernel=$(uname -r 2>/dev/null)",
  "echo hostname=$(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null)",
  "echo cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)",
  "echo mem=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)",
  "echo disk=$(df -Pk /workspace 2>/dev/null | awk 'NR==2 {print $2\" \"$4}')",
  "echo distro=$( (. /etc/os-release 2>/dev/null && echo \"$PRETTY_NAME\") )",
].join("; ");
