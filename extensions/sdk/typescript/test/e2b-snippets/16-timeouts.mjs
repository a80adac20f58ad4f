// Source: https://e2b.dev/docs/sandbox ("Sandbox lifecycle": "Change sandbox timeout during
// runtime", "Retrieve sandbox information", "Shutdown sandbox"), JavaScript, the three
// snippets one after the other on one sandbox. Unchanged but for the import.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

// Create sandbox with and keep it running for 60 seconds.
const sandbox = await Sandbox.create({ timeoutMs: 60_000 })

// Change the sandbox timeout to 30 seconds.
// 🚨 The new timeout will be 30 seconds from now.
await sandbox.setTimeout(30_000)

// Retrieve sandbox information.
const info = await sandbox.getInfo()

console.log(info)

// Shutdown the sandbox immediately.
await sandbox.kill()
