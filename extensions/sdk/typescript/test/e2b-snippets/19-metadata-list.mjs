// Source: https://e2b.dev/docs/sandbox/list ("Listing sandboxes"), JavaScript.
// Unchanged but for the import ('@e2b/code-interpreter' -> '@abx/sdk/e2b/code-interpreter';
// the page's TypeScript also imports the type `SandboxInfo`, which plain JavaScript cannot).
// As with E2B, the second nextItems() throws 'No more items to fetch' when the first page
// held them all (abx does not page: the first page is every sandbox).
import { Sandbox } from '@abx/sdk/e2b/code-interpreter'

const sandbox = await Sandbox.create(
  {
    metadata: {
      name: 'My Sandbox',
    },
  },
)

const paginator = Sandbox.list()

// Get the first page of running sandboxes
const firstPage = await paginator.nextItems()

const runningSandbox = firstPage[0]

console.log('Running sandbox metadata:', runningSandbox.metadata)
console.log('Running sandbox id:', runningSandbox.sandboxId)
console.log('Running sandbox started at:', runningSandbox.startedAt)
console.log('Running sandbox template id:', runningSandbox.templateId)

// Get the next page of running sandboxes
const nextPage = await paginator.nextItems()
