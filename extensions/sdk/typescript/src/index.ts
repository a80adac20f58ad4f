//! @abx/sdk: the TypeScript client of the abx broker. `Sandbox` (sandbox.ts) is the API most
//! code wants; `BrokerClient` (broker.ts) is one connection with a method per broker call.
//! The wire type of a sandbox record is exported as `SandboxInfo`.
export * from './broker.js';
export * from './errors.js';
export * from './exec.js';
export * from './jsonrpc.js';
export * from './methods.js';
export * from './sandbox.js';
export { Sandbox } from './sandbox.js';
export * from './transport.js';
export * from './types.js';
export type { Sandbox as SandboxInfo } from './types.js';
export * from './version.js';
