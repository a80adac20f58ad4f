// Sandbox paths (docs/epp-1.md §6.5). An OpenSandbox sandbox is a whole container; abx's file
// methods and working directories are confined to its /workspace (the working directory of
// commands, created with the sandbox) and /tmp. A relative path is under /workspace; '..' that
// leaves those roots is refused with E4002. Paths keep their meaning inside the container
// (no translation): /workspace/a.txt is /workspace/a.txt for files and for commands.

import * as posix from "node:path/posix";
import { RpcError, pathError } from "./errors.mjs";

export const WORKSPACE = "/workspace";
const ROOTS = ["/workspace", "/tmp"];

export function sandboxPath(p, method = "files", name = "path") {
  if (typeof p !== "string" || p === "") {
    throw new RpcError(-32602, `Invalid params for '${method}': '${name}' must be a non-empty string`);
  }
  if (p.includes("\0")) throw new RpcError(-32602, `Invalid params for '${method}': '${name}' contains a NUL byte`);
  const abs = p.startsWith("/") ? p : `${WORKSPACE}/${p}`;
  const norm = posix.normalize(abs).replace(/(.)\/+$/, "$1");
  if (!ROOTS.some((r) => norm === r || norm.startsWith(`${r}/`))) throw pathError(4002, p);
  return norm;
}

export const parentOf = (p) => posix.dirname(p);
export const baseName = (p) => posix.basename(p);
export const joinPath = (...xs) => posix.join(...xs);
