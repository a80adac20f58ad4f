// Source: https://e2b.dev/docs/filesystem/info ("Getting information about a file",
// "Getting information about a directory"), JavaScript: the two snippets in one file on one
// sandbox (the second's `info` is `dirInfo` here, as two `const info` cannot share a scope).
// Unchanged but for the import.
import { Sandbox } from '@abx/sdk/e2b'

const sandbox = await Sandbox.create()

// Create a new file
await sandbox.files.write('test_file.txt', 'Hello, world!')

// Get information about the file
const info = await sandbox.files.getInfo('test_file.txt')

console.log(info)

// Create a new directory
await sandbox.files.makeDir('test_dir')

// Get information about the directory
const dirInfo = await sandbox.files.getInfo('test_dir')

console.log(dirInfo)
