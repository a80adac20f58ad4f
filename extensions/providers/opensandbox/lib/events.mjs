// The execd event stream (POST /command, POST /code).
//
// execd labels the response `text/event-stream`, but the body is not SSE: it is a sequence of
// bare JSON objects, each followed by a blank line ("{...}\n\n"), with no `data:` prefix. The
// events are `init` (text = the command id), `ping`, `stdout` / `stderr` (one event per line of
// output, line terminator stripped; a blank line arrives as the text "\n"), `status`, `result`,
// and finally `execution_complete` or `error` (error.evalue is the exit code as a string).
// The server keeps the connection open for about a second after that terminal event, so a
// client must stop reading at it instead of waiting for the end of the body.
//
// The parser is fed raw bytes in whatever chunks the network delivers: a chunk may end in the
// middle of an object, of a separator, or of a multi-byte UTF-8 character. It also accepts real
// SSE framing (`data: {...}` lines, `\r\n` line ends) so that a proxy that "fixes" the stream
// does not break it.

const TERMINAL = new Set(["execution_complete", "error"]);

export function isTerminal(event) {
  return event != null && TERMINAL.has(event.type);
}

export class EventStreamParser {
  constructor() {
    this.decoder = new TextDecoder("utf-8"); // streaming: keeps split characters for the next chunk
    this.buffer = "";
    this.done = false; // a terminal event was returned: everything after it is ignored
  }

  // Feed bytes (Buffer/Uint8Array) or text; returns the complete events they finish, in order,
  // up to and including the first terminal event.
  push(chunk) {
    if (this.done) return [];
    this.buffer += typeof chunk === "string" ? chunk : this.decoder.decode(chunk, { stream: true });
    return this.drain(false);
  }

  // The body ended: whatever is left is the last block (a server may omit the final blank line).
  end() {
    if (this.done) return [];
    this.buffer += this.decoder.decode();
    return this.drain(true);
  }

  drain(final) {
    const out = [];
    for (;;) {
      const m = /\r?\n[ \t]*\r?\n/.exec(this.buffer);
      let block;
      if (m) {
        block = this.buffer.slice(0, m.index);
        this.buffer = this.buffer.slice(m.index + m[0].length);
      } else if (final && this.buffer.trim() !== "") {
        block = this.buffer;
        this.buffer = "";
      } else {
        break;
      }
      for (const event of parseBlock(block)) {
        out.push(event);
        if (isTerminal(event)) {
          this.done = true;
          this.buffer = "";
          return out;
        }
      }
    }
    return out;
  }
}

// One block between blank lines: usually one JSON object; with SSE framing, `data:` lines
// (several data lines of one event are joined); comment lines (`:`) and `event:`/`id:` lines are
// ignored. A block that does not parse is reported as an event of type "invalid" so the caller
// can log it without losing the stream.
export function parseBlock(block) {
  const text = block.trim();
  if (text === "") return [];
  const lines = text.split(/\r?\n/);
  if (lines.some((l) => /^data:/.test(l))) {
    const data = lines
      .filter((l) => /^data:/.test(l))
      .map((l) => l.replace(/^data: ?/, ""))
      .join("\n");
    return parseJson(data);
  }
  const kept = lines.filter((l) => !/^(:|event:|id:|retry:)/.test(l));
  if (kept.length === 0) return [];
  // Normally one object; tolerate several objects separated by single newlines.
  const joined = kept.join("\n");
  const one = parseJson(joined);
  if (one.length && one[0].type !== "invalid") return one;
  if (kept.length > 1) return kept.flatMap((l) => parseJson(l));
  return one;
}

function parseJson(text) {
  try {
    const v = JSON.parse(text);
    if (v && typeof v === "object" && !Array.isArray(v)) return [v];
  } catch {
    // fall through
  }
  return [{ type: "invalid", text }];
}

// The exit code a terminal event carries: 0 for execution_complete, the integer in
// error.evalue for a CommandExecError, or null when evalue is not a number (the command could
// not be started, e.g. a missing cwd; then `reason` says why).
export function exitOf(event) {
  if (!event) return { code: null, reason: "the stream ended without a terminal event" };
  if (event.type === "execution_complete") return { code: 0, reason: null };
  const err = event.error ?? {};
  const value = typeof err.evalue === "string" ? err.evalue.trim() : err.evalue;
  if (typeof value === "number" && Number.isInteger(value)) return { code: value, reason: null };
  if (typeof value === "string" && /^-?\d+$/.test(value)) return { code: Number(value), reason: null };
  const reason = [err.ename, value ?? err.traceback?.join(" ")].filter(Boolean).join(": ");
  return { code: null, reason: reason || "the command failed" };
}

// Text of an output event as it was printed: execd strips the line terminator of each line and
// sends a blank line as "\n".
export function lineText(event) {
  const t = typeof event.text === "string" ? event.text : "";
  return t === "\n" ? "\n" : `${t}\n`;
}

// execd reports a command killed by a signal as evalue "-1" (Go's ExitError.ExitCode()), with
// the Go error text in the traceback: "signal: killed", "signal: terminated", ... (syscall
// Signal.String()). -> {name, number} of that signal, or null.
const GO_SIGNALS = {
  hangup: ["HUP", 1],
  interrupt: ["INT", 2],
  quit: ["QUIT", 3],
  aborted: ["ABRT", 6],
  killed: ["KILL", 9],
  "user defined signal 1": ["USR1", 10],
  "user defined signal 2": ["USR2", 12],
  "broken pipe": ["PIPE", 13],
  "alarm clock": ["ALRM", 14],
  terminated: ["TERM", 15],
};
export function signalOfTraceback(event) {
  const err = event?.error ?? {};
  const text = [...(Array.isArray(err.traceback) ? err.traceback : []), typeof err.evalue === "string" ? err.evalue : ""].join("\n");
  const m = /signal: ([a-z0-9 ]+)/i.exec(text);
  const known = m && GO_SIGNALS[m[1].trim().toLowerCase()];
  return known ? { name: known[0], number: known[1] } : null;
}
