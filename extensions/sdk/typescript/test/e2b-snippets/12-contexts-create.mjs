// Source: https://e2b.dev/docs/code-interpreting/contexts ("Create a new Code Context"),
// JavaScript. Unchanged but for the import.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const context = await sandbox.createCodeContext({
  cwd: '/home/user',
  language: 'python',
  requestTimeoutMs: 60_000,
})

const result = await sandbox.runCode('print("Hello, world!")', { context })
console.log(result)
