// Source: https://e2b.dev/docs/sdk-reference/code-interpreter-js-sdk/v2.8.0/sandbox
// ("runCode": the Execution's `error`, "ExecutionError") and
// https://e2b.dev/docs/sdk-reference/js-sdk/v2.51.0/commands ("CommandExitError": thrown by
// `commands.run` when the command exits with a non-zero code). Written from those pages'
// descriptions (they give no single listing); only the import is abx's.
import { Sandbox, CommandExitError } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const execution = await sandbox.runCode('print(undefined_variable)')
if (execution.error) {
  console.log('error name:', execution.error.name)
  console.log('error value:', execution.error.value)
  console.log('traceback has the line:', execution.error.traceback.includes('undefined_variable'))
}

try {
  await sandbox.commands.run('echo oops >&2; exit 3')
} catch (err) {
  if (err instanceof CommandExitError) {
    console.log('exit code:', err.exitCode, 'stderr:', err.stderr.trim())
  }
}
