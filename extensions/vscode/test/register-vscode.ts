// Makes `require('vscode')` load the fake UI surface (test/fake-vscode.ts) under plain node.
import Module = require('node:module');
import * as path from 'node:path';

const fake = path.join(__dirname, 'fake-vscode.js');
const M = Module as unknown as { _resolveFilename: (request: string, ...rest: unknown[]) => string };
const original = M._resolveFilename;
M._resolveFilename = function (request: string, ...rest: unknown[]): string {
  if (request === 'vscode') return fake;
  return original.call(this, request, ...rest);
};
