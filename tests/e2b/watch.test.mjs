// filesystem.Filesystem/WatchDir through sbx.files.watchDir.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  FileNotFoundError,
  InvalidArgumentError,
  SandboxError,
  TimeoutError,
} from 'e2b'
import { errName, sleep, uniqueTag, waitFor } from './helpers.mjs'

let shared
async function sandbox() {
  if (!shared) shared = await Sandbox.create({ timeoutMs: 600_000 })
  return shared
}
test.after(async () => { if (shared) await shared.kill().catch(() => {}) })

const has = (events, name, type) => events.some((e) => e.name === name && e.type === type)
const show = (events) => JSON.stringify(events.map((e) => `${e.type}:${e.name}`))

test('watchDir (non-recursive): create, write, chmod, remove events with relative names', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('w')}`
  await sbx.files.makeDir(`${d}/sub`)
  const events = []
  let exited = false
  const h = await sbx.files.watchDir(d, (e) => events.push(e), { onExit: () => { exited = true } })
  t.after(() => h.stop())

  await sbx.files.write(`${d}/a.txt`, 'one')
  await waitFor(() => has(events, 'a.txt', 'create'), { timeoutMs: 5_000, what: `create a.txt in ${show(events)}` })
  await waitFor(() => has(events, 'a.txt', 'write'), { timeoutMs: 5_000, what: `write a.txt in ${show(events)}` })

  await sbx.commands.run(`chmod 600 ${d}/a.txt`)
  await waitFor(() => has(events, 'a.txt', 'chmod'), { timeoutMs: 5_000, what: `chmod a.txt in ${show(events)}` })

  await sbx.commands.run(`echo more >> ${d}/a.txt`)
  await sbx.files.remove(`${d}/a.txt`)
  await waitFor(() => has(events, 'a.txt', 'remove'), { timeoutMs: 5_000, what: `remove a.txt in ${show(events)}` })

  // a rename shows up as rename (old name) and create (new name)
  await sbx.files.write(`${d}/r1.txt`, 'r')
  await sbx.files.rename(`${d}/r1.txt`, `${d}/r2.txt`)
  await waitFor(() => has(events, 'r1.txt', 'rename') && has(events, 'r2.txt', 'create'),
    { timeoutMs: 5_000, what: `rename r1.txt / create r2.txt in ${show(events)}` })

  // not recursive: nothing from inside sub/
  await sbx.files.write(`${d}/sub/inner.txt`, 'x')
  await sleep(1_000)
  assert.ok(!events.some((e) => e.name.includes('inner')), `non-recursive watch reported ${show(events)}`)
  for (const e of events) {
    assert.ok(!e.name.startsWith('/'), `event name must be relative: ${e.name}`)
    assert.equal(e.entry, undefined, 'entry sent without includeEntry')
  }
  assert.equal(exited, false)
})

test('watchDir recursive: names like sub/file.txt, also in directories created later', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('wr')}`
  await sbx.files.makeDir(`${d}/sub/deeper`)
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e), { recursive: true })
  t.after(() => h.stop())

  await sbx.files.write(`${d}/sub/file.txt`, 'x')
  await waitFor(() => has(events, 'sub/file.txt', 'create'), { timeoutMs: 5_000, what: `create sub/file.txt in ${show(events)}` })
  await sbx.files.write(`${d}/sub/deeper/f2.txt`, 'y')
  await waitFor(() => has(events, 'sub/deeper/f2.txt', 'create'), { timeoutMs: 5_000, what: `create sub/deeper/f2.txt in ${show(events)}` })

  await sbx.files.makeDir(`${d}/late`)
  await waitFor(() => has(events, 'late', 'create'), { timeoutMs: 5_000, what: `create late in ${show(events)}` })
  await sleep(500) // let the watcher add the new directory
  await sbx.files.write(`${d}/late/new.txt`, 'z')
  await waitFor(() => has(events, 'late/new.txt', 'create'), { timeoutMs: 5_000, what: `create late/new.txt in ${show(events)}` })

  await sbx.files.remove(`${d}/sub/file.txt`)
  await waitFor(() => has(events, 'sub/file.txt', 'remove'), { timeoutMs: 5_000, what: `remove sub/file.txt in ${show(events)}` })
})

test('watchDir includeEntry: events carry the entry', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('we')}`
  await sbx.files.makeDir(d)
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e), { includeEntry: true })
  t.after(() => h.stop())
  await sbx.files.write(`${d}/e.txt`, 'entry!')
  const ev = await waitFor(() => events.find((e) => e.name === 'e.txt' && e.type === 'write' && e.entry?.size === 6),
    { timeoutMs: 5_000, what: `a write event for e.txt with entry size 6 in ${JSON.stringify(events)}` })
  assert.equal(ev.entry.name, 'e.txt')
  assert.equal(ev.entry.path, `${d}/e.txt`)
  assert.equal(ev.entry.type, 'file')
  assert.equal(ev.entry.owner, 'user')
  const created = events.find((e) => e.name === 'e.txt' && e.type === 'create')
  assert.ok(created?.entry, 'create event without entry')
  assert.equal(created.entry.path, `${d}/e.txt`)
})

test('watch stop() ends the stream: no more events', async () => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('ws')}`
  await sbx.files.makeDir(d)
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e))
  await sbx.files.write(`${d}/before.txt`, 'b')
  await waitFor(() => has(events, 'before.txt', 'create'), { timeoutMs: 5_000, what: 'create before.txt' })
  await h.stop()
  await sleep(300)
  const n = events.length
  await sbx.files.write(`${d}/after.txt`, 'a')
  await sleep(1_000)
  assert.equal(events.length, n, `events after stop(): ${show(events.slice(n))}`)
  // the sandbox still works afterwards, and a new watch on the same dir works
  const again = []
  const h2 = await sbx.files.watchDir(d, (e) => again.push(e))
  await sbx.files.write(`${d}/third.txt`, 'c')
  await waitFor(() => has(again, 'third.txt', 'create'), { timeoutMs: 5_000, what: 'create third.txt on the second watch' })
  await h2.stop()
})

test('watchDir timeoutMs: the stream ends with a TimeoutError in onExit', async () => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('wt')}`
  await sbx.files.makeDir(d)
  let exitErr = null
  let exited = false
  const t0 = Date.now()
  const h = await sbx.files.watchDir(d, () => {}, { timeoutMs: 1_500, onExit: (e) => { exited = true; exitErr = e } })
  await waitFor(() => exited, { timeoutMs: 10_000, what: 'onExit after the 1.5 s watch timeout' })
  assert.ok(Date.now() - t0 >= 1_000, `watch ended after ${Date.now() - t0} ms`)
  assert.ok(exitErr instanceof TimeoutError, `onExit got ${errName(exitErr)}`)
  await h.stop()
})

test('watchDir on a missing directory or a file fails', async () => {
  const sbx = await sandbox()
  await assert.rejects(sbx.files.watchDir(`/home/user/${uniqueTag('nope')}`, () => {}), FileNotFoundError)
  const f = `/home/user/${uniqueTag('file')}.txt`
  await sbx.files.write(f, 'f')
  await assert.rejects(sbx.files.watchDir(f, () => {}), (e) => e instanceof InvalidArgumentError || (e instanceof SandboxError && !(e instanceof FileNotFoundError)),
    'watching a file must be invalid_argument')
})

test('killing the sandbox ends its watch with an error', async () => {
  const sbx = await Sandbox.create()
  try {
    await sbx.files.makeDir('/home/user/wk')
    let exitErr
    let exited = false
    await sbx.files.watchDir('/home/user/wk', () => {}, { timeoutMs: 0, onExit: (e) => { exited = true; exitErr = e } })
    await sleep(300)
    await sbx.kill()
    await waitFor(() => exited, { timeoutMs: 10_000, what: 'onExit after the sandbox was killed' })
    assert.ok(exitErr instanceof TimeoutError, `onExit got ${errName(exitErr)}; expected TimeoutError (stream cut, /health 502)`)
  } finally {
    await sbx.kill().catch(() => {})
  }
})
