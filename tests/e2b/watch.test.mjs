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

// The exact sequences envd sends (docs/protocol.md, "Watch events"): its
// watcher reports what the kernel's inotify says about the syscalls of each
// operation, so hutch's atomic writes must report what envd's in-place ones
// cause, not their temporary file.
const seq = (events) => events.map((e) => `${e.type}:${e.name}`)

// Run act, wait for the event `last` ('type:name'), give stragglers a moment,
// and return the events from then on as 'type:name'.
async function caused(events, act, last) {
  events.length = 0
  await act()
  await waitFor(() => seq(events).includes(last), { timeoutMs: 5_000, what: last }).catch((e) => {
    throw new Error(`${e.message}; got ${show(events)}`)
  })
  await sleep(300)
  return seq(events)
}

test('watchDir sequences like envd: SDK writes (chown is a CHMOD, truncation and data a WRITE, metadata a CHMOD)', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('wq')}`
  await sbx.files.makeDir(d)
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e))
  t.after(() => h.stop())

  // new file: open(O_CREAT|O_TRUNC), chown, write
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/n.txt`, 'one'), 'write:n.txt'),
    ['create:n.txt', 'chmod:n.txt', 'write:n.txt'])
  // existing file: chown, open(O_TRUNC) + write (merged by the kernel)
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/n.txt`, 'two'), 'write:n.txt'),
    ['chmod:n.txt', 'write:n.txt'])
  // nothing written: no WRITE for a new file, the truncation's for an old one
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/e.txt`, ''), 'chmod:e.txt'),
    ['create:e.txt', 'chmod:e.txt'])
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/e.txt`, ''), 'write:e.txt'),
    ['chmod:e.txt', 'write:e.txt'])
  // metadata keys set, then cleared by a write without them: a CHMOD last
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/m.txt`, 'm', { metadata: { k: 'v' } }), 'write:m.txt'),
    ['create:m.txt', 'chmod:m.txt', 'write:m.txt', 'chmod:m.txt'])
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/m.txt`, 'm'), 'write:m.txt'),
    ['chmod:m.txt', 'write:m.txt', 'chmod:m.txt'])
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/m.txt`, 'm'), 'write:m.txt'),
    ['chmod:m.txt', 'write:m.txt'])
  // a large upload: envd's WRITE count varies (the kernel merges queued
  // IN_MODIFY events), at least one, and nothing else after the CHMOD
  const big = await caused(events, () => sbx.files.write(`${d}/big.bin`, new Uint8Array(3 << 20).fill(7).buffer), 'write:big.bin')
  assert.deepEqual(big.slice(0, 3), ['create:big.bin', 'chmod:big.bin', 'write:big.bin'])
  assert.ok(big.slice(3).every((e) => e === 'write:big.bin'), `after the first WRITE: ${big}`)
  // a write into a new directory: its mkdir and chown (nothing inside: not recursive)
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/nd/f.txt`, 'f'), 'chmod:nd'),
    ['create:nd', 'chmod:nd'])
  assert.ok(!events.some((e) => e.name.includes('.hutch-')), `a temporary file showed: ${show(events)}`)
})

test('watchDir sequences like envd: makeDir, rename, remove, commands, the watched directory itself', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('wo')}`
  await sbx.files.makeDir(d)
  await sbx.files.write(`${d}/f.txt`, 'f')
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e))
  t.after(() => h.stop())

  // MakeDir: mkdir, chown
  assert.deepEqual(await caused(events, () => sbx.files.makeDir(`${d}/m1`), 'chmod:m1'), ['create:m1', 'chmod:m1'])
  events.length = 0
  assert.equal(await sbx.files.makeDir(`${d}/m1`), false)
  // rename: the old name's RENAME, the new name's CREATE
  assert.deepEqual(await caused(events, () => sbx.files.rename(`${d}/f.txt`, `${d}/r.txt`), 'create:r.txt'),
    ['rename:f.txt', 'create:r.txt'])
  // into a new directory: its mkdir and chown first
  assert.deepEqual(await caused(events, () => sbx.files.rename(`${d}/r.txt`, `${d}/x/r.txt`), 'rename:r.txt'),
    ['create:x', 'chmod:x', 'rename:r.txt'])
  assert.deepEqual(await caused(events, () => sbx.files.remove(`${d}/x`), 'remove:x'), ['remove:x'])
  assert.deepEqual(await caused(events, () => sbx.files.remove(`${d}/m1`), 'remove:m1'), ['remove:m1'])

  // commands: whatever their syscalls cause
  const run = (cmd) => () => sbx.commands.run(cmd, { cwd: d })
  assert.deepEqual(await caused(events, run('echo hi > c.txt'), 'write:c.txt'), ['create:c.txt', 'write:c.txt'])
  assert.deepEqual(await caused(events, run('echo more >> c.txt'), 'write:c.txt'), ['write:c.txt'])
  assert.deepEqual(await caused(events, run('touch t.txt'), 'chmod:t.txt'), ['create:t.txt', 'chmod:t.txt'])
  assert.deepEqual(await caused(events, run('chmod 600 t.txt'), 'chmod:t.txt'), ['chmod:t.txt'])
  assert.deepEqual(await caused(events, run('mkdir cd1'), 'create:cd1'), ['create:cd1'])
  assert.deepEqual(await caused(events, run('rm t.txt'), 'remove:t.txt'), ['remove:t.txt'])
  // the watched directory itself is "."
  assert.deepEqual(await caused(events, run('chmod 700 .'), 'chmod:.'), ['chmod:.'])

  // a watched directory deleted: what it held, then "."
  const g = `/home/user/${uniqueTag('wg')}`
  await sbx.files.write(`${g}/a.txt`, 'a')
  const gone = []
  const hg = await sbx.files.watchDir(g, (e) => gone.push(e))
  t.after(() => hg.stop())
  assert.deepEqual(await caused(gone, () => sbx.files.remove(g), 'remove:.'), ['remove:a.txt', 'remove:.'])
  // moved: "." renamed, and nothing after
  const v = `/home/user/${uniqueTag('wv')}`
  await sbx.files.makeDir(v)
  const moved = []
  const hv = await sbx.files.watchDir(v, (e) => moved.push(e))
  t.after(() => hv.stop())
  assert.deepEqual(await caused(moved, () => sbx.files.rename(v, `${v}-2`), 'rename:.'), ['rename:.'])
  await sbx.files.write(`${v}-2/after.txt`, 'x')
  await sleep(500)
  assert.deepEqual(seq(moved), ['rename:.'])
})

test('watchDir recursive sequences like envd: new directories are walked, subdirectory chmod twice', async (t) => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('wy')}`
  await sbx.files.makeDir(`${d}/sub`)
  const events = []
  const h = await sbx.files.watchDir(d, (e) => events.push(e), { recursive: true })
  t.after(() => h.stop())
  const run = (cmd) => () => sbx.commands.run(cmd, { cwd: d })

  assert.deepEqual(await caused(events, () => sbx.files.makeDir(`${d}/late`), 'chmod:late'), ['create:late', 'chmod:late'])
  assert.deepEqual(await caused(events, () => sbx.files.write(`${d}/late/f.txt`, 'f'), 'write:late/f.txt'),
    ['create:late/f.txt', 'chmod:late/f.txt', 'write:late/f.txt'])
  // the kernel tells the parent's watch and the directory's own: two CHMODs
  assert.deepEqual(await caused(events, run('chmod 700 sub'), 'chmod:sub'), ['chmod:sub', 'chmod:sub'])
  // a tree moved in from elsewhere: its entries announced, by name, each
  // directory before what it holds
  const tree = await caused(events, run('mkdir -p ../o-$$/o1/b && touch ../o-$$/o1/z ../o-$$/o1/b/y ../o-$$/a && mv ../o-$$ in'), 'create:in/o1/z')
  assert.deepEqual(tree, ['create:in', 'create:in/a', 'create:in/o1', 'create:in/o1/b', 'create:in/o1/b/y', 'create:in/o1/z'])
  // moved within the watch: no announcements, and the new names are watched
  assert.deepEqual(await caused(events, () => sbx.files.rename(`${d}/in`, `${d}/in2`), 'create:in2'), ['rename:in', 'create:in2'])
  assert.deepEqual(await caused(events, run('touch in2/o1/b/w'), 'chmod:in2/o1/b/w'), ['create:in2/o1/b/w', 'chmod:in2/o1/b/w'])
  // mkdir -p and files right after: every level seen, whatever the timing
  const fast = await caused(events, run('mkdir -p n1/n2 && echo x > n1/n2/f.txt'), 'create:n1/n2/f.txt')
  assert.equal(fast[0], 'create:n1')
  assert.ok(fast.includes('create:n1/n2'), `create:n1/n2 in ${fast}`)
  // a tree removed: what it held first, then the directory
  const rm = await caused(events, () => sbx.files.remove(`${d}/in2`), 'remove:in2')
  assert.equal(rm.at(-1), 'remove:in2')
  assert.deepEqual([...rm].sort(), ['remove:in2', 'remove:in2/a', 'remove:in2/o1', 'remove:in2/o1/b', 'remove:in2/o1/b/w',
    'remove:in2/o1/b/y', 'remove:in2/o1/z'])
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
