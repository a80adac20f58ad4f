// Source: https://e2b.dev/docs/quickstart ("Write code for starting Sandbox"), JavaScript.
// Unchanged but for the import ('@e2b/code-interpreter' -> '@abx/sdk/e2b/code-interpreter';
// the page's `import 'dotenv/config'` loads E2B_API_KEY, which abx does not need).
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sbx = await Sandbox.create() // By default the sandbox is alive for 5 minutes
const execution = await sbx.runCode('print("hello world")') // Execute Python inside the sandbox
console.log(execution.logs)

const files = await sbx.files.list('/')
console.log(files)
