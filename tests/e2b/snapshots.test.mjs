// Snapshots and forks on the namespace backend, through the stock SDK:
// createSnapshot -> Sandbox.create(snapshotId), listSnapshots,
// deleteSnapshot, Sandbox.fork; the sealed file refuses tampering. What a
// snapshot holds here is the writable layer (files, with their owners and
// modes, deletions included); processes are not kept (docs/snapshots.md).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, writeFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'
import { createSandbox, env, uniqueTag, notOnGvisor } from './helpers.mjs'

test('createSnapshot, then create from it: files, owners, set-id bits and deletions come back', notOnGvisor('runsc sets no_new_privs on every task: sudo refuses'), async (t) => {
  const sbx = await createSandbox(t)
  await sbx.files.write('/home/user/note.txt', 'kept')
  await sbx.commands.run('mkdir -p /home/user/d && echo x > /home/user/d/f && ln -s note.txt /home/user/link')
  await sbx.commands.run('sudo sh -c "echo r > /root/r && chmod 4755 /root/r && rm -f /etc/hostname"')
  const name = uniqueTag('snap')
  const snap = await sbx.createSnapshot({ name })
  assert.match(snap.snapshotId, /^snap_[a-z0-9]{20}$/)
  assert.deepEqual(snap.names, [name])
  // the parent goes on, unchanged by the snapshot
  await sbx.files.write('/home/user/after.txt', 'later')

  const child = await Sandbox.create(snap.snapshotId)
  t.after(() => child.kill().catch(() => {}))
  assert.notEqual(child.sandboxId, sbx.sandboxId)
  assert.equal(await child.files.read('/home/user/note.txt'), 'kept')
  assert.equal(await child.files.exists('/home/user/after.txt'), false)
  const r = await child.commands.run('stat -c "%U %a" /home/user/d/f; readlink /home/user/link; sudo stat -c "%U %a" /root/r; test -e /etc/hostname || echo gone; id -un')
  assert.equal(r.stdout, 'user 644\nnote.txt\nroot 4755\ngone\nuser\n')
  // its own id range: files written in the child are the child's
  await child.files.write('/home/user/mine.txt', 'child')
  assert.equal(await sbx.files.exists('/home/user/mine.txt'), false)
  const info = await child.getInfo()
  assert.equal(info.templateId, snap.snapshotId)
})

test('listSnapshots filters by sandbox and pages; deleteSnapshot removes it', async (t) => {
  const sbx = await createSandbox(t)
  const a = await sbx.createSnapshot()
  const b = await sbx.createSnapshot()
  const mine = []
  const pager = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId, limit: 1 })
  while (pager.hasNext) mine.push(...(await pager.nextItems()))
  assert.deepEqual(mine.map((s) => s.snapshotId).sort(), [a.snapshotId, b.snapshotId].sort())
  assert.equal(await Sandbox.deleteSnapshot(a.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(a.snapshotId), false)
  await assert.rejects(Sandbox.create(a.snapshotId), (e) => /404|not found/i.test(String(e.message)))
  assert.equal(await Sandbox.deleteSnapshot(b.snapshotId), true)
})

test('fork x3: three sandboxes from one layer, each going its own way', async (t) => {
  const sbx = await createSandbox(t, { metadata: { role: 'parent' }, envs: { FROM: 'parent' } })
  await sbx.files.write('/home/user/shared.txt', 'base')
  const forks = await Sandbox.fork(sbx.sandboxId, { count: 3 })
  for (const f of forks) t.after(() => f.kill().catch(() => {}))
  assert.equal(forks.length, 3)
  assert.equal(new Set(forks.map((f) => f.sandboxId)).size, 3)
  await Promise.all(forks.map((f, i) => f.files.write('/home/user/own.txt', `fork ${i}`)))
  for (const [i, f] of forks.entries()) {
    assert.equal(await f.files.read('/home/user/shared.txt'), 'base')
    assert.equal(await f.files.read('/home/user/own.txt'), `fork ${i}`)
    assert.equal((await f.commands.run('echo $FROM')).stdout, 'parent\n')
  }
  assert.equal(await sbx.files.exists('/home/user/own.txt'), false)
  // the fork's snapshot is not kept
  const left = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.deepEqual(left, [])
})

test('a tampered snapshot file is refused, and so is one copied under another id', async (t) => {
  const sbx = await createSandbox(t)
  await sbx.files.write('/home/user/x.txt', 'x')
  const a = await sbx.createSnapshot()
  const b = await sbx.createSnapshot()
  const dir = join(env.dataDir, 'snapshots')
  const fa = join(dir, `${a.snapshotId}.seal`), fb = join(dir, `${b.snapshotId}.seal`)
  const data = readFileSync(fa)
  // one flipped bit, in the middle
  const bad = Buffer.from(data)
  bad[Math.floor(bad.length / 2)] ^= 0x10
  writeFileSync(fa, bad)
  await assert.rejects(Sandbox.create(a.snapshotId), (e) => /422|authenticate/i.test(String(e.message)))
  // b's file replaced by (intact) a's: bound to a's id, refused as b
  writeFileSync(fb, data)
  await assert.rejects(Sandbox.create(b.snapshotId), (e) => /422|authenticate/i.test(String(e.message)))
  // nothing was left behind by the refusals
  const stray = readdirSync(dir).filter((n) => n.startsWith('.'))
  assert.deepEqual(stray, [])
  await Sandbox.deleteSnapshot(a.snapshotId)
  await Sandbox.deleteSnapshot(b.snapshotId)
})

test('another team sees none of it', async (t) => {
  const sbx = await createSandbox(t)
  const snap = await sbx.createSnapshot()
  t.after(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))
  const out = execFileSync(env.bin, ['key', 'create', '--data-dir', env.dataDir, '--team', uniqueTag('team')], { encoding: 'utf8' })
  const other = out.trim().split('\n').pop().trim()
  await assert.rejects(Sandbox.create(snap.snapshotId, { apiKey: other }), (e) => /404|not found/i.test(String(e.message)))
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: other }), false)
  assert.deepEqual(await Sandbox.listSnapshots({ apiKey: other }).nextItems(), [])
})

test('a fork gets placeholders of its own for the parent\'s secrets', async (t) => {
  const { Secret } = await import('e2b')
  const name = uniqueTag('fsec')
  await Secret.create(name, 'v-' + uniqueTag(), { metadata: { hosts: 'api.example.com' } })
  t.after(() => Secret.destroy(name).catch(() => {}))
  const sbx = await createSandbox(t, { envs: { TOK: Secret.fill(name), PLAIN: 'x' } })
  const mine = (await sbx.commands.run('echo $TOK')).stdout.trim()
  const [f] = await Sandbox.fork(sbx.sandboxId, { count: 1 })
  t.after(() => f.kill().catch(() => {}))
  const theirs = (await f.commands.run('echo $TOK $PLAIN')).stdout.trim().split(' ')
  assert.match(theirs[0], /^hsp_[0-9a-f]{40}$/)
  assert.notEqual(theirs[0], mine)
  assert.equal(theirs[1], 'x')
})

test('fork beyond the team limit is refused before any snapshot', async (t) => {
  const sbx = await createSandbox(t)
  await assert.rejects(Sandbox.fork(sbx.sandboxId, { count: 17 }), (e) => /400/.test(String(e.message)))
  const left = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.deepEqual(left, [])
})
