// A broker on "another machine" over ssh: a real sshd (Debian's openssh-server) started here
// on a loopback port with throwaway keys, as the same user; the remote `abx rpc` is the debug
// abx (remoteBin / ABX_REMOTE_BIN), its ABX_HOME set by sshd (SetEnv), so the remote broker
// is this suite's daemon and what it made is seen through the local socket too. Also the
// ssh failures: no abx there (E1016), nothing listening (E1014), a key that is not
// authorized (E1015), each with the fix.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { ABX_BIN, driftOf, freshHome, SENT, trace } from './helpers.mjs';

const SSHD = '/usr/sbin/sshd';
let home;
let dir;
let sshd;
let port;
let sshOptions;
let host;
const user = os.userInfo().username;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

function keygen(file) {
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', file], { stdio: 'ignore' });
}

before(async () => {
  assert.ok(fs.existsSync(SSHD), `${SSHD} is missing: install openssh-server (scripts/test does)`);
  home = freshHome();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'abxts-sshd-'));
  keygen(path.join(dir, 'host_key'));
  keygen(path.join(dir, 'client_key'));
  keygen(path.join(dir, 'stranger_key'));
  fs.copyFileSync(path.join(dir, 'client_key.pub'), path.join(dir, 'authorized_keys'));
  port = await freePort();
  fs.writeFileSync(
    path.join(dir, 'sshd_config'),
    [
      `Port ${port}`,
      'ListenAddress 127.0.0.1',
      `HostKey ${path.join(dir, 'host_key')}`,
      `AuthorizedKeysFile ${path.join(dir, 'authorized_keys')}`,
      `PidFile ${path.join(dir, 'sshd.pid')}`,
      'PermitRootLogin yes',
      'StrictModes no',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'UsePAM no',
      `SetEnv ABX_HOME=${home.dir}`,
      '',
    ].join('\n'),
  );
  fs.mkdirSync('/run/sshd', { recursive: true, mode: 0o755 });
  sshd = spawn(SSHD, ['-f', path.join(dir, 'sshd_config'), '-D', '-e'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`sshd did not start: ${log}`)), 30_000);
    sshd.stderr.setEncoding('utf8');
    sshd.stderr.on('data', (s) => {
      log += s;
      if (/Server listening on 127\.0\.0\.1 port/.test(log)) {
        clearTimeout(t);
        resolve();
      }
    });
    sshd.once('exit', (c) => {
      clearTimeout(t);
      reject(new Error(`sshd exited (${c}): ${log}`));
    });
  });
  const base = ['-F', '/dev/null', '-o', 'IdentitiesOnly=yes', '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'BatchMode=yes', '-o', 'LogLevel=ERROR'];
  sshOptions = [...base, '-i', path.join(dir, 'client_key')];
  host = `ssh://${user}@127.0.0.1:${port}`;
});

after(async () => {
  await sdk.closeAll();
  sshd?.kill('SIGTERM');
  home?.cleanup();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
  assert.deepEqual(driftOf(SENT), []);
});

describe('ssh', () => {
  test('host option: ssh -p PORT user@host -- abx rpc; a sandbox made there is the remote broker\'s', async () => {
    const sb = await sdk.Sandbox.create({ host, sshOptions, remoteBin: ABX_BIN, processEnv: home.env, trace, timeout: 120 });
    try {
      assert.equal(sb.client.mode, 'ssh');
      assert.deepEqual(sb.client.sshTarget, { user, host: '127.0.0.1', port });
      assert.ok(sb.client.label.endsWith(`-p ${port} -T -o BatchMode=yes -- ${user}@127.0.0.1 ${ABX_BIN} rpc`), sb.client.label);
      const r = await sb.exec("printf '\\377ssh'");
      assert.deepEqual(r.stdoutBytes, Buffer.from([0xff, 0x73, 0x73, 0x68]));
      const s = await sb.execStream('for i in $(seq 1 100); do echo $i; done');
      let text = '';
      let exits = 0;
      for await (const ev of s) {
        if (ev.type === 'output') text += ev.text;
        else exits++;
      }
      assert.equal(text, Array.from({ length: 100 }, (_, i) => `${i + 1}\n`).join(''));
      assert.equal(exits, 1);
      // The remote daemon is this suite's (sshd's SetEnv ABX_HOME): the local socket sees it.
      const local = await sdk.Sandbox.list(home.options);
      assert.ok(local.some((x) => `${x.provider}:${x.id}` === sb.id));
      const st = await sb.client.status();
      assert.equal(st.socket, path.join(home.dir, 'run', 'broker.sock'));
    } finally {
      await sb.kill();
    }
  });

  test('ABX_SSH_CONFIG is passed as ssh -F, as the CLI does: no sshOptions needed', async () => {
    const cfg = path.join(dir, 'abx_ssh_config');
    fs.writeFileSync(
      cfg,
      `Host *\n  IdentityFile ${path.join(dir, 'client_key')}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n`,
    );
    const c = await sdk.BrokerClient.connect({ host, remoteBin: ABX_BIN, env: { ...home.env, ABX_SSH_CONFIG: cfg }, trace });
    try {
      assert.ok(c.label.includes(`-F ${cfg} -p ${port} -T -o BatchMode=yes -- ${user}@127.0.0.1`), c.label);
      assert.deepEqual(await c.ping(), {});
    } finally {
      await c.close();
    }
  });

  test('ABX_HOST and ABX_REMOTE_BIN in the environment choose ssh', async () => {
    const c = await sdk.BrokerClient.connect({ env: { ...home.env, ABX_HOST: host, ABX_REMOTE_BIN: ABX_BIN }, sshOptions, trace });
    try {
      assert.equal(c.mode, 'ssh');
      assert.deepEqual(await c.ping(), {});
      assert.equal(c.server.protocolVersion, 'abx/1');
    } finally {
      await c.close();
    }
  });

  test('ssh failures carry the code and the fix: E1016 no abx there, E1014 nothing listening, E1015 a key not authorized', async () => {
    await assert.rejects(
      sdk.BrokerClient.connect({ host, sshOptions, remoteBin: '/nonexistent/abx', env: home.env }),
      (e) => e instanceof sdk.RemoteAbxNotFoundError && e.abx === 'E1016' && e instanceof sdk.BrokerUnreachableError && /'\/nonexistent\/abx' cannot be run on host '127\.0\.0\.1'/.test(e.message) && /ABX_REMOTE_BIN/.test(e.suggestion),
    );
    const closed = await freePort();
    await assert.rejects(
      sdk.BrokerClient.connect({ host: `${user}@127.0.0.1:${closed}`, sshOptions, remoteBin: ABX_BIN, env: home.env }),
      (e) => e instanceof sdk.HostUnreachableError && e.abx === 'E1014' && /Cannot reach host '127\.0\.0\.1' over ssh/.test(e.message) && e.suggestion.includes(`'ssh -p ${closed} ${user}@127.0.0.1 true'`),
    );
    const stranger = [...sshOptions.slice(0, -2), '-i', path.join(dir, 'stranger_key')];
    await assert.rejects(
      sdk.BrokerClient.connect({ host, sshOptions: stranger, remoteBin: ABX_BIN, env: home.env }),
      (e) => e instanceof sdk.HostAuthError && e.abx === 'E1015' && /ssh could not log in to '127\.0\.0\.1'/.test(e.message) && /ssh-agent/.test(e.suggestion) && e.suggestion.includes(`'ssh -p ${port} ${user}@127.0.0.1 true'`),
    );
  });
});
