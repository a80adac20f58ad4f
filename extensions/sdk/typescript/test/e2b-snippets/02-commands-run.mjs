// Source: https://e2b.dev/docs/commands ("Run commands in sandbox"), JavaScript.
// Unchanged but for the import.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const result = await sandbox.commands.run('ls -l')
console.log(result)
