// Source: https://e2b.dev/docs/sandbox/connect ("Connect to a running sandbox"), JavaScript.
// Unchanged but for the import ('e2b' -> '@abx/sdk/e2b') and its first line, added: the page
// assumes a sandbox is running, so one is created first.
import { Sandbox } from "@abx/sdk/e2b"

const sbx = await Sandbox.create()

// Get all running sandboxes
const runningSandboxes = await Sandbox.list().nextItems()
if (runningSandboxes.length === 0) {
  throw new Error("No running sandboxes found")
}

// Get the ID of the sandbox you want to connect to
const sandboxId = runningSandboxes[0].sandboxId

// Connect to the sandbox
const sandbox = await Sandbox.connect(sandboxId)
// Now you can use the sandbox as usual
// ...
const result = await sandbox.commands.run("whoami")
console.log(`Running in sandbox ${sandbox.sandboxId} as "${result.stdout.trim()}"`)
