// Source: https://e2b.dev/docs/sandbox/environment-variables ("Global environment
// variables", "Setting environment variables when running code" and "... running commands"),
// JavaScript. Unchanged but for the import; console.log added to show the results.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create({
  envs: {
    MY_VAR: 'my_value',
  },
})

const result = await sandbox.runCode(
  'import os; print(os.environ.get("MY_VAR"))',
  {
    envs: {
      MY_VAR: 'my_value',
    },
  }
)
console.log(result.logs.stdout)

const cmd = await sandbox.commands.run('echo $MY_VAR', {
  envs: {
    MY_VAR: '123',
  },
})
console.log(cmd.stdout)

const global = await sandbox.commands.run('echo $MY_VAR')
console.log(global.stdout)
