// Source: https://e2b.dev/docs/filesystem/read-write ("Reading files", "Writing single
// files"), JavaScript, the two snippets one after the other on one sandbox. Unchanged but for
// the import ('e2b' -> '@abx/sdk/e2b') and the placeholder path '/path/to/file', which is
// '/home/user/path/to/file' here: '/path' is not writable in a sandbox (abx: E4014 ReadOnly;
// E2B's user cannot write '/' either).
import { Sandbox } from '@abx/sdk/e2b'

const sandbox = await Sandbox.create()

await sandbox.files.write('/home/user/path/to/file', 'file content')

const fileContent = await sandbox.files.read('/home/user/path/to/file')
console.log(fileContent)
