// Source: https://e2b.dev/docs/filesystem/watch ("Watch directory for changes"), JavaScript.
// Unchanged but for the import ('@e2b/code-interpreter' -> '@abx/sdk/e2b/code-interpreter').
import { Sandbox, FilesystemEventType } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create()
const dirname = '/home/user'

// Start watching directory for changes
const handle = await sandbox.files.watchDir(dirname, async (event) => {
  console.log(event)
  if (event.type === FilesystemEventType.WRITE) {
    console.log(`wrote to file ${event.name}`)
  }
})

// Trigger file write event
await sandbox.files.write(`${dirname}/my-file`, 'hello')
