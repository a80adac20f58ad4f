// The SDK's method table (src/methods.ts) and its error classes against docs/openrpc.json:
// fails when a method or param name drifts, or an E-code has no class of its family.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { driftOf, OPENRPC } from './helpers.mjs';

test('every method and param name the SDK sends is in docs/openrpc.json', () => {
  const messages = Object.entries(sdk.METHODS).map(([method, params]) => ({ method, params: Object.fromEntries(params.map((p) => [p, 1])) }));
  assert.deepEqual(driftOf(messages), []);
  assert.ok(messages.length > 40);
});

test('the drift check itself fails on an unknown method or param', () => {
  assert.deepEqual(driftOf([{ method: 'sandbox/explode', params: {} }]), ['sandbox/explode: not in docs/openrpc.json']);
  assert.deepEqual(driftOf([{ method: 'sandbox/create', params: { templat: 'x' } }]), ["sandbox/create: param 'templat' is not in docs/openrpc.json"]);
});

test('every E-code of docs/openrpc.json is thrown as a class of its family', () => {
  const family = { 1: sdk.ProtocolError, 2: sdk.SandboxError, 3: sdk.ExecError, 4: sdk.FilesError, 5: sdk.PortError, 8: sdk.ProviderError, 9: sdk.InternalError };
  const codes = Object.keys(OPENRPC.components.errors);
  assert.ok(codes.length > 40);
  for (const abx of codes) {
    const e = sdk.AbxError.from({ code: Number(abx.slice(1)), message: 'm', data: { abx, suggestion: 's' } }, 'x/y');
    assert.ok(e instanceof family[abx[1]], `${abx} is a ${family[abx[1]].name}`);
    assert.ok(e instanceof sdk.AbxError);
    assert.equal(e.abx, abx);
    assert.equal(e.suggestion, 's');
    assert.equal(e.method, 'x/y');
  }
  for (const [abx, C] of Object.entries(sdk.ERROR_CLASSES)) {
    // The ssh codes come with the CLI's --host (the protocol's enum); until then only the SDK raises them.
    assert.ok(codes.includes(abx) || sdk.SSH_CODES.includes(abx), `${abx} (${C.name}) is an E-code of docs/openrpc.json`);
  }
  // The Python SDK's names are the same classes.
  assert.equal(sdk.WireError, sdk.ProtocolError);
  assert.equal(sdk.RequestCancelledError, sdk.CancelledError);
  assert.equal(sdk.SandboxFileNotFoundError, sdk.FileNotFoundError);
  assert.equal(sdk.ProviderNotInstalledError, sdk.ProviderNotFoundError);
  assert.equal(sdk.RefusedError, sdk.ConfirmationRequiredError);
  assert.equal(sdk.AbxError.from({ code: 2009, message: 'm', data: { abx: 'E2009' } }).name, 'SandboxNotFoundError');
  assert.ok(sdk.AbxError.from({ code: 8004, message: 'm', data: { abx: 'E8004' } }) instanceof sdk.FeatureNotSupportedError);
  assert.ok(sdk.AbxError.from({ code: -32800, message: 'c' }) instanceof sdk.CancelledError);
});

test('the methods the extension requires are all in the table', () => {
  for (const m of sdk.REQUIRED_METHODS) assert.ok(sdk.METHODS[m], m);
});

test('ABX_HOST forms parse; anything but ssh is refused with E1004', () => {
  assert.deepEqual(sdk.parseHost('ssh://dev@box:2222'), { user: 'dev', host: 'box', port: 2222 });
  assert.deepEqual(sdk.parseHost('dev@box'), { user: 'dev', host: 'box', port: undefined });
  assert.deepEqual(sdk.parseHost('ssh://[::1]:22'), { user: undefined, host: '::1', port: 22 });
  // As the CLI runs it (cli/client/src/remote.rs): ABX_SSH_CONFIG as -F, no pty, never a prompt.
  assert.deepEqual(sdk.sshArgs(sdk.parseHost('ssh://u@h:7'), 'abx'), ['-p', '7', '-T', '-o', 'BatchMode=yes', '--', 'u@h', 'abx', 'rpc']);
  assert.deepEqual(sdk.sshArgs(sdk.parseHost('h'), '/opt/abx'), ['-T', '-o', 'BatchMode=yes', '--', 'h', '/opt/abx', 'rpc']);
  assert.deepEqual(sdk.sshArgs(sdk.parseHost('h'), '/opt/my abx', [], '/cfg'), ['-F', '/cfg', '-T', '-o', 'BatchMode=yes', '--', 'h', "'/opt/my abx'", 'rpc']);
  assert.equal(sdk.sshCheckCommand(sdk.parseHost('ssh://root@127.0.0.1:2222')), 'ssh -p 2222 root@127.0.0.1 true');
  assert.equal(sdk.sshCheckCommand(sdk.parseHost('h')), 'ssh h true');
  for (const bad of ['http://x', 'ssh://-oProxyCommand=x', 'ssh://h:99999', '']) {
    assert.throws(() => sdk.parseHost(bad), (e) => e instanceof sdk.InvalidParamsError && e.abx === 'E1004', bad);
  }
});
