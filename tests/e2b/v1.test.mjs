// The v1 endpoints (POST /sandboxes, POST /sandboxes/{id}/connect) as called by
// e2b 2.45 (installed as the npm alias "e2b-245"). 2.45 also checks the key's
// e2b_<hex> shape on the client.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  CommandExitError,
  FileNotFoundError,
  SandboxNotFoundError,
  AuthenticationError,
} from 'e2b-245'
import { Sandbox as Sandbox251 } from 'e2b'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { uniqueTag, unknownSandboxId, waitFor } from './helpers.mjs'

test('the alias really is e2b 2.45', () => {
  const pkg = JSON.parse(readFileSync(fileURLToPath(new URL('./node_modules/e2b-245/package.json', import.meta.url)), 'utf8'))
  assert.match(pkg.version, /^2\.45\./)
})

test('v1: create (POST /sandboxes), run, files, connect (POST /sandboxes/{id}/connect), kill', async () => {
  const tag = uniqueTag()
  const sbx = await Sandbox.create({ metadata: { tag }, envs: { V1VAR: 'v1' }, timeoutMs: 120_000 })
  try {
    assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
    const r = await sbx.commands.run('echo "hello $V1VAR"; whoami')
    assert.equal(r.stdout, 'hello v1\nuser\n')
    await assert.rejects(sbx.commands.run('echo bad >&2; exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4 && e.stderr === 'bad\n')

    const w = await sbx.files.write('/tmp/v1.txt', 'v1 content')
    assert.equal(w.path, '/tmp/v1.txt')
    assert.equal(await sbx.files.read('/tmp/v1.txt'), 'v1 content')
    await assert.rejects(sbx.files.read('/tmp/v1-missing.txt'), FileNotFoundError)
    assert.deepEqual((await sbx.files.list('/tmp')).filter((e) => e.name === 'v1.txt').map((e) => e.type), ['file'])

    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.name, 'base')
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { tag })
    const lifetime = (info.endAt - info.startedAt) / 1000
    assert.ok(Math.abs(lifetime - 120) <= 5, `timeoutMs 120000 -> ${lifetime} s`)

    // the v1 connect always sends a timeout (300 s by default): it may extend, never shorten
    const other = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await other.commands.run('cat /tmp/v1.txt')).stdout, 'v1 content')
    const after = await sbx.getInfo()
    assert.ok(after.endAt >= info.endAt, 'v1 connect shortened endAt')
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 5_000 })
    assert.ok((await sbx.getInfo()).endAt >= after.endAt, 'v1 connect with a short timeout shortened endAt')

    // v1-created sandboxes are ordinary: the 2.51 SDK sees them (v2 list)
    const listed = Sandbox251.list({ query: { metadata: { tag } } })
    const items = await listed.nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId])
    const s251 = await Sandbox251.connect(sbx.sandboxId)
    assert.equal((await s251.commands.run('echo cross')).stdout, 'cross\n')

    // background + list in 2.45
    const h = await sbx.commands.run('sleep 20', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
    assert.equal(await sbx.commands.kill(h.pid), true)

    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
    assert.equal(await sbx.kill(), false)
    await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('v1: timeout set at create is enforced', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 3_000 })
  try {
    await waitFor(async () => (await sbx.isRunning()) === false, { timeoutMs: 15_000, intervalMs: 250, what: 'the v1 sandbox to die at its 3 s timeout' })
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('v1: unknown id and bad key', async () => {
  await assert.rejects(Sandbox.connect(unknownSandboxId()), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(unknownSandboxId()), false)
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_' + 'f'.repeat(40) }), AuthenticationError)
})
