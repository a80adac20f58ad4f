// Source: https://e2b.dev/docs/code-interpreting/supported-languages/javascript and
// .../supported-languages/bash ("Run JavaScript/Bash code"), JavaScript. Unchanged but for the
// import; both snippets on one sandbox.
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sbx = await Sandbox.create()
const execution = await sbx.runCode('console.log("Hello, world!")', { language: 'js' })
console.log(execution)

const bash = await sbx.runCode('echo "Hello, world!"', { language: 'bash' })
console.log(bash)
