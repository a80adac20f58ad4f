// The `abx:` FileSystemProvider: abx://<provider:id>/workspace/... is a sandbox's file, read
// and written through the broker's files/* methods; watched with files/watch.

import * as vscode from 'vscode';
import type { BrokerClient } from '../client/broker';
import { AbxError } from '../client/errors';
import type { FileEntry, FilesChanged } from '../client/types';
import { decodeAuthority, encodeAuthority, ROOTS, sandboxPath, SCHEME } from '../client/uri';

/** The URI of a sandbox path (default its workspace). */
export function sandboxUri(sandbox: string, path = '/workspace'): vscode.Uri {
  return vscode.Uri.from({ scheme: SCHEME, authority: encodeAuthority(sandbox), path });
}

/** `{sandbox, path}` of an `abx:` URI. */
export function parseSandboxUri(uri: vscode.Uri): { sandbox: string; path: string } {
  return { sandbox: decodeAuthority(uri.authority), path: sandboxPath(uri.path) };
}

function fileType(t: string): vscode.FileType {
  switch (t) {
    case 'file':
      return vscode.FileType.File;
    case 'directory':
      return vscode.FileType.Directory;
    case 'symlink':
      return vscode.FileType.SymbolicLink | vscode.FileType.File;
    default:
      return vscode.FileType.Unknown;
  }
}

/** A broker error as the FileSystemError VS Code acts on (FileNotFound, FileExists, ...). */
export function toFsError(err: unknown, uri: vscode.Uri): vscode.FileSystemError | AbxError {
  const e = AbxError.from(err);
  const msg = `${uri.toString(true)}: ${e.headline}`;
  switch (e.abx) {
    case 'E4001':
    case 'E2009':
    case 'E2003':
      return vscode.FileSystemError.FileNotFound(msg);
    case 'E4006':
      return vscode.FileSystemError.FileExists(msg);
    case 'E4003':
      return vscode.FileSystemError.FileIsADirectory(msg);
    case 'E4004':
      return vscode.FileSystemError.FileNotADirectory(msg);
    case 'E4002':
    case 'E4008':
    // read-only: a system directory, an `ro` mount (issue 43)
    case 'E4014':
    case 'E8004':
      return vscode.FileSystemError.NoPermissions(msg);
    case 'E1007':
      return vscode.FileSystemError.Unavailable(msg);
    default:
      return e;
  }
}

const CHANGE: Record<string, vscode.FileChangeType> = {
  created: vscode.FileChangeType.Created,
  modified: vscode.FileChangeType.Changed,
  removed: vscode.FileChangeType.Deleted,
};

export class AbxFileSystemProvider implements vscode.FileSystemProvider {
  private readonly emitter = new vscode.EventEmitter<vscode.FileChangeEvent[]>();
  readonly onDidChangeFile: vscode.Event<vscode.FileChangeEvent[]> = this.emitter.event;
  /** Watches being set up. */
  private readonly settingUp = new Set<Promise<void>>();

  constructor(
    private readonly client: () => Promise<BrokerClient>,
    private readonly log: (line: string) => void = () => undefined,
  ) {}

  private async call<T>(uri: vscode.Uri, f: (c: BrokerClient, sandbox: string, path: string) => Promise<T>): Promise<T> {
    const { sandbox, path } = parseSandboxUri(uri);
    try {
      return await f(await this.client(), sandbox, path);
    } catch (err) {
      throw toFsError(err, uri);
    }
  }

  private fire(uri: vscode.Uri, type: vscode.FileChangeType): void {
    this.emitter.fire([{ uri, type }]);
  }

  watch(uri: vscode.Uri, options: { readonly recursive: boolean; readonly excludes: readonly string[] }): vscode.Disposable {
    const { sandbox, path } = parseSandboxUri(uri);
    const paths = path === '/' ? ROOTS.map((r) => `/${r}`) : [path];
    const subs: { dispose(): void }[] = [];
    let disposed = false;
    const onChange = (c: FilesChanged) => {
      const changed = uri.with({ path: c.path });
      const parent = { uri: parentOf(changed), type: vscode.FileChangeType.Changed };
      if (c.kind === 'renamed') {
        // A rename names both ends with the same kind: whether the path exists now tells
        // which end it is.
        void this.client()
          .then((cl) => cl.filesStat(sandbox, c.path))
          .then(
            () => vscode.FileChangeType.Created,
            () => vscode.FileChangeType.Deleted,
          )
          .then((type) => this.emitter.fire([{ uri: changed, type }, parent]));
        return;
      }
      const type = CHANGE[c.kind] ?? vscode.FileChangeType.Changed;
      this.emitter.fire(c.kind === 'modified' ? [{ uri: changed, type }] : [{ uri: changed, type }, parent]);
    };
    const setup = (async () => {
      for (const p of paths) {
        try {
          const w = await (await this.client()).filesWatch(sandbox, p, options.recursive, onChange);
          if (disposed) w.dispose();
          else subs.push(w);
        } catch (err) {
          // No watch (a provider without files.watch, a gone sandbox): the explorer still
          // refreshes on its own writes and on demand. A path that does not exist (VS Code
          // watches `.vscode/settings.json` and the like in every folder) is not worth a
          // log line: its creation shows in the watch of the folder above it.
          const e = AbxError.from(err);
          if (e.abx !== 'E4001') this.log(`watch ${uri.toString(true)}: ${e.headline}`);
        }
      }
    })();
    this.settingUp.add(setup);
    void setup.finally(() => this.settingUp.delete(setup));
    return new vscode.Disposable(() => {
      disposed = true;
      for (const s of subs) s.dispose();
    });
  }

  /** Resolves once the watches asked for so far are set up (or have failed). */
  async watchesSettled(): Promise<void> {
    while (this.settingUp.size) await Promise.allSettled([...this.settingUp]);
  }

  async stat(uri: vscode.Uri): Promise<vscode.FileStat> {
    const { path } = parseSandboxUri(uri);
    if (path === '/') {
      return { type: vscode.FileType.Directory, ctime: 0, mtime: 0, size: 0, permissions: vscode.FilePermission.Readonly };
    }
    const e = await this.call(uri, (c, sb, p) => c.filesStat(sb, p));
    return toStat(e);
  }

  async readDirectory(uri: vscode.Uri): Promise<[string, vscode.FileType][]> {
    const { path } = parseSandboxUri(uri);
    if (path === '/') return ROOTS.map((r) => [r, vscode.FileType.Directory]);
    const entries = await this.call(uri, (c, sb, p) => c.filesList(sb, p));
    return entries.map((e) => [e.name, fileType(e.type)]);
  }

  async readFile(uri: vscode.Uri): Promise<Uint8Array> {
    const buf = await this.call(uri, (c, sb, p) => c.filesReadAll(sb, p));
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  async writeFile(
    uri: vscode.Uri,
    content: Uint8Array,
    options: { readonly create: boolean; readonly overwrite: boolean },
  ): Promise<void> {
    const { path } = parseSandboxUri(uri);
    if (path === '/') throw vscode.FileSystemError.FileIsADirectory(uri);
    const existing = await this.statOrUndefined(uri);
    if (existing?.type === 'directory') throw vscode.FileSystemError.FileIsADirectory(uri);
    if (!existing && !options.create) throw vscode.FileSystemError.FileNotFound(uri);
    if (existing && options.create && !options.overwrite) throw vscode.FileSystemError.FileExists(uri);
    // Keep an existing file's mode (a saved script stays executable).
    const mode = existing ? parseInt(existing.mode, 8) : undefined;
    await this.call(uri, (c, sb, p) => c.filesWriteAll(sb, p, content, Number.isNaN(mode) ? undefined : mode));
    if (!existing) this.fire(parentOf(uri), vscode.FileChangeType.Changed);
    this.fire(uri, existing ? vscode.FileChangeType.Changed : vscode.FileChangeType.Created);
  }

  async createDirectory(uri: vscode.Uri): Promise<void> {
    await this.call(uri, (c, sb, p) => c.filesMkdir(sb, p));
    this.fire(parentOf(uri), vscode.FileChangeType.Changed);
    this.fire(uri, vscode.FileChangeType.Created);
  }

  async delete(uri: vscode.Uri, options: { readonly recursive: boolean }): Promise<void> {
    const { path } = parseSandboxUri(uri);
    if (path === '/' || ROOTS.some((r) => path === `/${r}`)) throw vscode.FileSystemError.NoPermissions(uri);
    await this.call(uri, (c, sb, p) => c.filesRemove(sb, p, options.recursive));
    this.fire(parentOf(uri), vscode.FileChangeType.Changed);
    this.fire(uri, vscode.FileChangeType.Deleted);
  }

  async rename(oldUri: vscode.Uri, newUri: vscode.Uri, options: { readonly overwrite: boolean }): Promise<void> {
    const from = parseSandboxUri(oldUri);
    const to = parseSandboxUri(newUri);
    if (from.sandbox !== to.sandbox) {
      // Across sandboxes VS Code copies and deletes on its own when this is refused.
      throw vscode.FileSystemError.Unavailable(`${newUri.toString(true)}: rename across sandboxes`);
    }
    const target = await this.statOrUndefined(newUri);
    if (target) {
      if (!options.overwrite) throw vscode.FileSystemError.FileExists(newUri);
      const source = await this.call(oldUri, (c, sb, p) => c.filesStat(sb, p));
      // rename(2) replaces a file atomically, but not a directory or a file with a directory.
      if (target.type === 'directory' || source.type === 'directory') {
        await this.call(newUri, (c, sb, p) => c.filesRemove(sb, p, true));
      }
    }
    await this.call(oldUri, (c, sb) => c.filesRename(sb, from.path, to.path));
    this.emitter.fire([
      { uri: oldUri, type: vscode.FileChangeType.Deleted },
      { uri: newUri, type: vscode.FileChangeType.Created },
    ]);
  }

  private async statOrUndefined(uri: vscode.Uri): Promise<FileEntry | undefined> {
    try {
      return await this.call(uri, (c, sb, p) => c.filesStat(sb, p));
    } catch (err) {
      if (err instanceof vscode.FileSystemError && err.code === 'FileNotFound') return undefined;
      throw err;
    }
  }
}

function toStat(e: FileEntry): vscode.FileStat {
  const mtime = Date.parse(e.modifiedAt) || 0;
  const mode = parseInt(e.mode, 8);
  const readonly = !Number.isNaN(mode) && (mode & 0o200) === 0;
  return {
    type: fileType(e.type),
    ctime: mtime,
    mtime,
    size: e.size,
    ...(readonly ? { permissions: vscode.FilePermission.Readonly } : {}),
  };
}

function parentOf(uri: vscode.Uri): vscode.Uri {
  const p = uri.path.replace(/\/+$/, '');
  const i = p.lastIndexOf('/');
  return uri.with({ path: i <= 0 ? '/' : p.slice(0, i) });
}
