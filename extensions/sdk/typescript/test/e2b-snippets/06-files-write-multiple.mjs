// Source: https://e2b.dev/docs/filesystem/read-write ("Writing multiple files"), JavaScript.
// Unchanged but for the import and the placeholder paths, under /home/user here (see
// 05-files-write-read.mjs).
import { Sandbox } from '@abx/sdk/e2b'

const sandbox = await Sandbox.create()

await sandbox.files.write([
    { path: '/home/user/path/to/a', data: 'file content' },
    { path: '/home/user/another/path/to/b', data: 'file content' }
])
console.log(await sandbox.files.read('/home/user/another/path/to/b'))
