// The extension's client layer: everything here runs under plain node (no `vscode`).
export * from './broker';
export * from './errors';
export * from './exec';
export * from './types';
export * from './uri';
export * from './version';
export * from './format';
