// "Build Template from Dockerfile" (src/templates.ts) on the fake UI surface against the real
// broker (issue 49): the explorer's context menu offers it on Dockerfiles, the name is asked
// (default: the folder's name), the steps stream into "abx: Template Build" as docker build
// prints them, a failed build shows its E-code, and cancelling the progress notification sends
// $/cancelRequest, which stops the build (nothing stored).
import './register-vscode';
import * as assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { activate, AbxExtensionApi, deactivate } from '../src/extension';
import { defaultTemplateName, isDockerfile, StepLines, TEMPLATE_COMMANDS, TemplateInfo, validTemplateName } from '../src/templates';
import { ABX_BIN, EXT_DIR, freshHome, Home, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

// ---- a busybox image as an OCI layout (a plain tar layer written here) ----

function tarEntry(name: string, type: '0' | '2' | '5', data: Buffer, mode: number, link = ''): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100);
  h.write(`${mode.toString(8).padStart(7, '0')}\0`, 100);
  h.write('0000000\0', 108);
  h.write('0000000\0', 116);
  h.write(`${data.length.toString(8).padStart(11, '0')}\0`, 124);
  h.write('00000000000\0', 136);
  h.write('        ', 148);
  h.write(type, 156);
  h.write(link, 157, 100);
  h.write('ustar\0', 257);
  h.write('00', 263);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148);
  return Buffer.concat([h, data, Buffer.alloc((512 - (data.length % 512)) % 512)]);
}

function sha(b: Buffer): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}

/** An OCI layout of busybox (the host's /bin/busybox, busybox-static) with its shell. */
function busyboxLayout(dir: string, tag: string): void {
  const entries = [tarEntry('bin/', '5', Buffer.alloc(0), 0o755), tarEntry('tmp/', '5', Buffer.alloc(0), 0o1777)];
  entries.push(tarEntry('bin/busybox', '0', fs.readFileSync('/bin/busybox'), 0o755));
  for (const a of ['sh', 'echo', 'cat', 'sleep']) entries.push(tarEntry(`bin/${a}`, '2', Buffer.alloc(0), 0o777, '/bin/busybox'));
  const layer = Buffer.concat([...entries, Buffer.alloc(1024)]);
  const blobs = path.join(dir, 'blobs', 'sha256');
  fs.mkdirSync(blobs, { recursive: true });
  const put = (b: Buffer) => {
    const d = sha(b);
    fs.writeFileSync(path.join(blobs, d.slice(7)), b);
    return { digest: d, size: b.length };
  };
  const arch = process.arch === 'x64' ? 'amd64' : process.arch;
  const config = Buffer.from(
    JSON.stringify({ architecture: arch, os: 'linux', config: { Env: ['PATH=/bin'] }, rootfs: { type: 'layers', diff_ids: [sha(layer)] } }),
  );
  const manifestBlob = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...put(config) },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...put(layer) }],
    }),
  );
  const m = put(manifestBlob);
  fs.writeFileSync(path.join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  fs.writeFileSync(
    path.join(dir, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...m, annotations: { 'org.opencontainers.image.ref.name': tag } }],
    }),
  );
}

describe('names and steps', () => {
  test('Dockerfiles, default names, valid names', () => {
    assert.ok(isDockerfile('/p/Dockerfile'));
    assert.ok(isDockerfile('/p/app.Dockerfile'));
    assert.ok(isDockerfile('/p/Dockerfile.dev'));
    assert.ok(!isDockerfile('/p/main.py'));
    assert.equal(defaultTemplateName('/home/me/My App'), 'my-app');
    assert.equal(defaultTemplateName('/'), 'template');
    assert.equal(validTemplateName('a b'), 'No spaces and no @ in a template name');
    assert.equal(validTemplateName('team/app:1'), undefined);
  });

  test('progress prints as docker build does', () => {
    const s = new StepLines();
    const p = (step: string, extra: object = {}) => ({ template: 't', bytes: 0, total: 2, step, ...extra });
    assert.deepEqual(
      [
        ...s.lines(p('[1/2] FROM scratch', { cached: true })),
        ...s.lines(p('[2/2] RUN make')),
        ...s.lines(p('[2/2] RUN make', { line: 'cc a.c\n' })),
      ],
      ['CACHED [1/2] FROM scratch', '[2/2] RUN make', '  cc a.c'],
    );
  });

  test('the explorer offers it on Dockerfiles only', () => {
    const entries = (manifest.contributes.menus['explorer/context'] as { command: string; when: string }[]).filter((m) => m.command === 'abx.buildTemplate');
    assert.equal(entries.length, 1);
    const re = new RegExp(/resourceFilename =~ \/(.*)\//.exec(entries[0].when)![1]);
    for (const f of ['Dockerfile', 'app.Dockerfile', 'Dockerfile.dev']) assert.ok(re.test(f), f);
    assert.ok(!re.test('main.py'));
    assert.match(entries[0].when, /resourceScheme == file/);
    const cmd = manifest.contributes.commands.find((c: { command: string }) => c.command === 'abx.buildTemplate');
    assert.equal(cmd.title, 'Build Template from Dockerfile');
  });
});

describe('build a template on the real broker', { timeout: 300_000 }, () => {
  let home: Home;
  const ctx = { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
  let api: AbxExtensionApi;
  let work: string;

  const context = (name: string, dockerfile: string, file = 'Dockerfile'): string => {
    const dir = path.join(work, name);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'hello.txt'), 'hello\n');
    fs.writeFileSync(path.join(dir, file), dockerfile);
    return path.join(dir, file);
  };
  const output = () => (fake.recorded.output.get('abx: Template Build') ?? []).join('');
  const names = async () => {
    const c = await api.service.getClient();
    const l = await c.request<{ templates: { names?: string[] }[] }>('templates/list', {});
    return l.templates.flatMap((t) => t.names ?? []);
  };

  before(async () => {
    home = freshHome();
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'abxv-tpl-'));
    fake.configuration.set('abx.path', ABX_BIN);
    fake.configuration.set('abx.home', home.dir);
    fake.configuration.set('abx.refreshInterval', 0);
    api = activate(ctx as unknown as vscode.ExtensionContext);
    await until(() => api.service.state.kind === 'connected', 'connected');
    busyboxLayout(path.join(work, 'bb'), 'v1');
    const c = await api.service.getClient();
    await c.request('templates/import', { path: path.join(work, 'bb'), name: 'vs/bb:1' });
  });

  after(async () => {
    const done = deactivate();
    for (const d of ctx.subscriptions.splice(0)) d.dispose();
    await done;
    home.cleanup();
    fs.rmSync(work, { recursive: true, force: true });
  });

  test('the command is registered', () => {
    for (const c of TEMPLATE_COMMANDS) assert.ok(fake.recorded.commands.has(c), c);
  });

  test('builds the Dockerfile of an explorer Uri, its steps in the output channel', async () => {
    const file = context('app', 'FROM vs/bb:1\nCOPY hello.txt /srv/hello.txt\nRUN echo built-here && cat /srv/hello.txt\n', 'app.Dockerfile');
    const r = (await vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(file), 'vs/app:1')) as TemplateInfo;
    assert.equal(r?.name, 'vs/app:1', output());
    const out = output();
    assert.ok(out.includes(`>>> abx template build ${path.dirname(file)} -t vs/app:1 -f app.Dockerfile\n`), out);
    assert.match(out, /^\[\d+\/\d+\] COPY hello\.txt \/srv\/hello\.txt$/m);
    assert.match(out, /^\[\d+\/\d+\] RUN echo built-here && cat \/srv\/hello\.txt$/m);
    assert.match(out, /^ {2}built-here$/m);
    assert.match(out, /^Built template 'vs\/app:1' \([0-9a-f]{12}, \d+ bytes\)/m);
    assert.ok(fake.recorded.messages.some((m) => m.level === 'info' && m.text === "Built template 'vs/app:1'."));
    assert.ok((await names()).includes('vs/app:1'));
  });

  test("asks the name, the folder's name first", async () => {
    const file = context('Asked Name', 'FROM vs/bb:1\nCOPY hello.txt /hello.txt\n');
    const w = vscode.window as unknown as { showInputBox: (o?: { value?: string }) => Promise<string | undefined> };
    const orig = w.showInputBox;
    let asked: { value?: string } | undefined;
    w.showInputBox = async (o) => {
      asked = o;
      return 'vs/asked:1';
    };
    try {
      const r = (await vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(file))) as TemplateInfo;
      assert.equal(r?.name, 'vs/asked:1');
      assert.equal(asked?.value, 'asked-name');
    } finally {
      w.showInputBox = orig;
    }
    // No name given (the box dismissed): nothing is built.
    assert.equal(await vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(file)), undefined);
  });

  test('a failed step shows its error; nothing is stored', async () => {
    const file = context('fails', 'FROM vs/bb:1\nRUN echo about-to-fail && exit 3\n');
    const before = fake.recorded.messages.length;
    const r = await vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(file), 'vs/fails:1');
    assert.equal(r, undefined);
    assert.match(output(), /^ {2}about-to-fail$/m);
    const errors = fake.recorded.messages.slice(before).filter((m) => m.level === 'error');
    assert.ok(errors.some((m) => m.text.includes('[E2011]')), JSON.stringify(errors));
    assert.ok(!(await names()).includes('vs/fails:1'));
  });

  test('cancelling the progress notification stops the build ($/cancelRequest)', async () => {
    const file = context('slow', 'FROM vs/bb:1\nRUN echo started-sleeping && busybox sleep 600\n');
    const w = vscode.window as unknown as { withProgress: (o: unknown, task: (p: unknown, t: unknown) => unknown) => Promise<unknown> };
    const orig = w.withProgress;
    const cts = new vscode.CancellationTokenSource();
    w.withProgress = async (_o, task) => task({ report: () => undefined }, cts.token);
    try {
      const before = fake.recorded.messages.length;
      const running = vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(file), 'vs/slow:1');
      await until(() => /^ {2}started-sleeping$/m.test(output()), 'the RUN step running', 120_000);
      cts.cancel();
      assert.equal(await running, undefined);
      assert.match(output(), /The build of 'vs\/slow:1' was cancelled/);
      assert.ok(!fake.recorded.messages.slice(before).some((m) => m.level === 'error'), 'a cancel is no error');
    } finally {
      w.withProgress = orig;
    }
    assert.ok(!(await names()).includes('vs/slow:1'));
    // The broker is free for the next build.
    const quick = context('quick', 'FROM vs/bb:1\nCOPY hello.txt /hello.txt\n');
    const r = (await vscode.commands.executeCommand('abx.buildTemplate', vscode.Uri.file(quick), 'vs/quick:1')) as TemplateInfo;
    assert.equal(r?.name, 'vs/quick:1');
  });
});
