// Source: https://e2b.dev/docs/code-interpreting/contexts ("List active Code Contexts"),
// JavaScript. Unchanged but for the import.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const contexts = await sandbox.listCodeContexts()
console.log(contexts)
