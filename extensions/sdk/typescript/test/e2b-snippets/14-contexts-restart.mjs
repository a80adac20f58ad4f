// Source: https://e2b.dev/docs/code-interpreting/contexts ("Restart a Code Context"),
// JavaScript. Unchanged but for the import. The page's last call passes
// `context.contextId`, which E2B's Context type does not have (its id is `context.id`): it
// passes undefined, and abx refuses that with an InvalidArgumentError.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const context = await sandbox.createCodeContext({
  cwd: '/home/user',
  language: 'python',
  requestTimeoutMs: 60_000,
})

// using context object
await sandbox.restartCodeContext(context)

// using context ID
await sandbox.restartCodeContext(context.contextId)
