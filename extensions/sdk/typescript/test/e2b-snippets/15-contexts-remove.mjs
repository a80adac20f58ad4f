// Source: https://e2b.dev/docs/code-interpreting/contexts ("Remove a Code Context"),
// JavaScript. Unchanged but for the import; the page's `context.contextId` is `context.id`
// here (see 14-contexts-restart.mjs).
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const context = await sandbox.createCodeContext({
  cwd: '/home/user',
  language: 'python',
  requestTimeoutMs: 60_000,
})

// using context object
await sandbox.removeCodeContext(context)

const other = await sandbox.createCodeContext()
// using context ID
await sandbox.removeCodeContext(other.id)
console.log(await sandbox.listCodeContexts())
