// The client layer lives in the SDK (extensions/sdk/typescript, `@abx/sdk`): this module
// re-exports it so the extension and its tests keep their imports.
export * from '@abx/sdk/types';
