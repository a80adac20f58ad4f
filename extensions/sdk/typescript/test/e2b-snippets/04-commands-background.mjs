// Source: https://e2b.dev/docs/commands/background ("Running commands in background"),
// JavaScript. Unchanged but for the import ('e2b' -> '@abx/sdk/e2b').
import { Sandbox } from '@abx/sdk/e2b'

const sandbox = await Sandbox.create()

// Start the command in the background
const command = await sandbox.commands.run('echo hello; sleep 10; echo world', {
  background: true,
  onStdout: (data) => {
    console.log(data)
  },
})

// Kill the command
await command.kill()
