// Volumes through the stock SDK: the Volume class (control and content
// planes) and Sandbox.create({volumeMounts}). run.sh exports
// E2B_VOLUME_API_URL (the SDK's content-plane base) and makes volumes of
// HUTCH_E2B_VOLUME_SIZE (32M).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { backend, createSandbox, createTeamKey, env, errName, restartDaemon, uniqueTag } from './helpers.mjs'

// the SDK turns the content plane's 404 into VolumePathNotFoundError
const isNotFound = (e) => e instanceof VolumePathNotFoundError
// HUTCH_E2B_BACKEND=gvisor runs this file against gvisor sandboxes
const onGvisor = backend === 'gvisor'
const GV = { metadata: { 'hutch.backend': 'gvisor' } }
const NS = { metadata: { 'hutch.backend': 'ns' } }

async function createVolume(t, name = uniqueTag('vol'), opts = {}) {
  const vol = await Volume.create(name, opts)
  t.after(async () => {
    try { await Volume.destroy(vol.volumeId, opts) } catch {}
  })
  return vol
}

test('control plane: create, list, getInfo, connect, destroy with E2B status codes', async (t) => {
  const name = uniqueTag('ctl')
  const vol = await createVolume(t, name)
  assert.match(vol.volumeId, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
  assert.equal(vol.name, name)
  assert.ok(vol.token.length >= 32)
  const list = await Volume.list()
  assert.ok(list.some((v) => v.volumeId === vol.volumeId && v.name === name), JSON.stringify(list))
  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.name, name)
  assert.equal(info.token, vol.token, 'getInfo gives the same token again')
  const again = await Volume.connect(vol.volumeId)
  assert.equal(again.token, vol.token)

  await assert.rejects(Volume.create(name), (e) => e instanceof VolumeError && /400: Volume with name '.*' already exists/.test(e.message), 'duplicate name')
  await assert.rejects(Volume.create('bad name!'), (e) => /400: Invalid volume name/.test(e.message))
  await assert.rejects(Volume.destroy('junk'), (e) => /400: Invalid volume ID/.test(e.message))
  assert.equal(await Volume.destroy('00000000-0000-4000-8000-000000000000'), false)
  await assert.rejects(Volume.getInfo('00000000-0000-4000-8000-000000000000'), (e) => e instanceof VolumeNotFoundError)

  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  assert.ok(!(await Volume.list()).some((v) => v.volumeId === vol.volumeId))
  // the name is free again, and its image is gone from the data dir
  const files = readdirSync(join(env.dataDir, 'volumes'))
  assert.ok(!files.some((f) => f.startsWith(vol.volumeId)), files.join(' '))
})

test('content plane: write, read, list, makeDir, getInfo, exists, updateMetadata, remove', async (t) => {
  const vol = await createVolume(t)
  const st = await vol.writeFile('/dir/sub/a.txt', 'hello volume') // parents are made
  assert.equal(st.type, 'file')
  assert.equal(st.path, '/dir/sub/a.txt')
  assert.equal(st.size, 12)
  assert.equal(st.uid, 1000)
  assert.ok(st.mtime instanceof Date && !Number.isNaN(st.mtime.getTime()))
  assert.equal(await vol.readFile('/dir/sub/a.txt'), 'hello volume')
  const bytes = await vol.readFile('/dir/sub/a.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello volume')
  await vol.writeFile('/dir/sub/a.txt', 'overwritten')
  assert.equal(await vol.readFile('/dir/sub/a.txt'), 'overwritten')
  await vol.writeFile('/empty', '')
  assert.equal(await vol.readFile('/empty'), '')

  const d = await vol.makeDir('/made/deep', { force: true, mode: 0o750 })
  assert.equal(d.type, 'directory')
  assert.equal(d.mode, 0o750)
  await assert.rejects(vol.makeDir('/missing/parent/x'), isNotFound, 'no parents without force')
  const top = await vol.list('/')
  assert.deepEqual(top.map((e) => e.name).sort(), ['dir', 'empty', 'made'])
  const deep = await vol.list('/', { depth: 3 })
  assert.ok(deep.some((e) => e.path === '/dir/sub/a.txt'), JSON.stringify(deep.map((e) => e.path)))
  assert.equal((await vol.getInfo('/dir')).type, 'directory')
  assert.equal(await vol.exists('/dir/sub/a.txt'), true)
  assert.equal(await vol.exists('/nope'), false)

  const m = await vol.updateMetadata('/dir/sub/a.txt', { uid: 1234, gid: 4321, mode: 0o600 })
  assert.deepEqual([m.uid, m.gid, m.mode], [1234, 4321, 0o600])

  await assert.rejects(vol.readFile('/../../etc/passwd'), (e) => /400/.test(e.message), '.. is refused')
  await assert.rejects(vol.list('/dir/sub/a.txt'), (e) => /400/.test(e.message), 'listing a file')
  await vol.remove('/dir')
  assert.equal(await vol.exists('/dir/sub/a.txt'), false)
  await assert.rejects(vol.remove('/dir'), isNotFound)

  // a token bound to another volume opens nothing here
  const other = await createVolume(t)
  const forged = new Volume(vol.volumeId, vol.name, other.token)
  await assert.rejects(forged.readFile('/empty'), (e) => /403/.test(e.message))
})

test('mounts: two sandboxes share a volume; ids are the sandbox ids on disk; data outlives kill and restart', async (t) => {
  const vol = await createVolume(t)
  const a = await createSandbox(t, { volumeMounts: { '/mnt/data': vol } })
  const b = await createSandbox(t, { volumeMounts: { '/data': vol.name } })
  const info = await a.getInfo()
  assert.deepEqual(info.volumeMounts, [{ name: vol.name, path: '/mnt/data' }])
  const listed = (await Sandbox.list().nextItems()).find((s) => s.sandboxId === b.sandboxId)
  assert.deepEqual(listed?.volumeMounts, [{ name: vol.name, path: '/data' }])

  // written by `user` in a, seen at once in b (one file system) and by the content plane
  await a.commands.run('echo from-a > /mnt/data/shared.txt && mkdir /mnt/data/d')
  const r = await b.commands.run('cat /data/shared.txt; stat -c %u:%g /data/shared.txt')
  assert.equal(r.stdout, 'from-a\n1000:1000\n')
  assert.equal(await vol.readFile('/shared.txt'), 'from-a\n')
  assert.equal((await vol.getInfo('/shared.txt')).uid, 1000, 'on disk the id is 1000, not the sandbox host uid')
  // and the other way round, as root in b
  await b.commands.run('echo root-b > /data/root.txt', { user: 'root' })
  assert.equal((await vol.getInfo('/root.txt')).uid, 0)
  assert.equal((await a.commands.run('stat -c %u /mnt/data/root.txt')).stdout, '0\n')

  // b lives through a restart of the daemon: re-adopted with its mount, it
  // still shares one file system with sandboxes made after the restart
  await a.kill()
  await restartDaemon()
  assert.deepEqual((await Sandbox.getInfo(b.sandboxId)).volumeMounts, [{ name: vol.name, path: '/data' }])
  const c = await createSandbox(t, { volumeMounts: { '/v': vol } })
  assert.equal((await c.commands.run('cat /v/shared.txt')).stdout, 'from-a\n')
  await b.commands.run('echo after-restart > /data/late.txt')
  assert.equal((await c.commands.run('cat /v/late.txt')).stdout, 'after-restart\n')
  assert.equal(await vol.readFile('/late.txt'), 'after-restart\n')
  await b.kill()
  await c.kill()
  assert.equal(await vol.readFile('/root.txt'), 'root-b\n', 'the data outlives every sandbox')
})

test('mounts: the size limit is ENOSPC inside the sandbox', async (t) => {
  const vol = await createVolume(t)
  const sb = await createSandbox(t, { volumeMounts: { '/mnt/v': vol } })
  const r = await sb.commands.run('dd if=/dev/zero of=/mnt/v/big bs=1M count=64 2>&1; df -m /mnt/v | tail -1', {
    timeoutMs: 60_000,
  }).catch((e) => e)
  assert.match(r.stdout ?? '', /No space left on device/)
  const total = Number((r.stdout.trim().split('\n').pop().split(/\s+/)[1]))
  assert.ok(total > 16 && total <= 32, `df says ${total} MiB`)
})

test('mounts: bad mounts are 400 with infra messages; another team\'s volume is not found', async (t) => {
  const vol = await createVolume(t)
  await assert.rejects(
    Sandbox.create({ volumeMounts: { relative: vol, '/a/../b': vol, '/proc/x': vol, '/nope': 'no-such-volume' } }),
    (e) => {
      assert.match(e.message, /^400: invalid mounts:/)
      assert.match(e.message, /volume mount #0: path must be absolute/)
      assert.match(e.message, /volume mount #1: path must not contain any '\.' or '\.\.' components/)
      assert.match(e.message, /volume mount #2: path is inside a directory hutch sets up itself/)
      assert.match(e.message, /volume mount #3: volume 'no-such-volume' not found/)
      return true
    })
  const key = createTeamKey(uniqueTag('team'))
  const theirs = await Volume.create(uniqueTag('theirs'), { apiKey: key })
  t.after(() => Volume.destroy(theirs.volumeId, { apiKey: key }))
  assert.ok(!(await Volume.list()).some((v) => v.volumeId === theirs.volumeId))
  await assert.rejects(Volume.getInfo(theirs.volumeId), (e) => e instanceof VolumeNotFoundError)
  await assert.rejects(Sandbox.create({ volumeMounts: { '/x': theirs.name } }), (e) =>
    /volume mount #0: volume '.*' not found/.test(e.message))
})

test('a volume is not part of a snapshot; a sandbox from it mounts nothing', async (t) => {
  const vol = await createVolume(t)
  const sb = await createSandbox(t, { volumeMounts: { '/mnt/v': vol } })
  await sb.commands.run('echo layer > /home/user/in-layer && echo vol > /mnt/v/in-volume')
  const snap = await sb.createSnapshot()
  t.after(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))
  await vol.remove('/in-volume')
  const from = await Sandbox.create(snap.snapshotId)
  t.after(() => from.kill().catch(() => {}))
  const r = await from.commands.run('cat /home/user/in-layer; ls -A /mnt/v | wc -l')
  assert.equal(r.stdout, 'layer\n0\n', 'the mount point is an empty directory of the layer')
  assert.deepEqual((await from.getInfo()).volumeMounts, [])
  // (on gvisor the copy's mount point is a read-only stand-in: runsc
  // restores only into the mounts a checkpoint was taken with)
  assert.equal((await sb.commands.run('cat /mnt/v/in-volume 2>&1; ls /mnt/v | wc -l')).stdout, 'cat: /mnt/v/in-volume: No such file or directory\n0\n',
    'the snapshotted sandbox keeps its mount')
})

test('a delete while mounted: the row goes at once, the sandbox keeps its files until it ends', async (t) => {
  const vol = await createVolume(t)
  const sb = await createSandbox(t, { volumeMounts: { '/mnt/v': vol } })
  await sb.commands.run('echo kept > /mnt/v/f')
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(vol.readFile('/f'), (e) => /403/.test(e.message), 'the content plane is closed')
  await assert.rejects(Sandbox.create({ volumeMounts: { '/v': vol.name } }), (e) => /not found/.test(e.message))
  assert.equal((await sb.commands.run('cat /mnt/v/f; echo more > /mnt/v/g && echo ok')).stdout, 'kept\nok\n')
  const fresh = await createVolume(t, vol.name) // the name is free again
  assert.notEqual(fresh.volumeId, vol.volumeId)
  assert.equal(await fresh.exists('/f'), false)
})

test('hostile: links planted by a sandbox never lead the content plane out of the volume', async (t) => {
  const vol = await createVolume(t)
  const sb = await createSandbox(t, { volumeMounts: { '/mnt/v': vol } })
  const marker = join(env.tmp, `host-secret-${uniqueTag()}`)
  execFileSync('sh', ['-c', `echo host-secret > ${marker}`])
  await sb.commands.run([
    `ln -s ${marker} /mnt/v/abs`,
    'ln -s ../../../../../../../../etc/passwd /mnt/v/rel',
    'ln -s / /mnt/v/root',
    `ln -s ${env.tmp} /mnt/v/dirlink`,
    'mkfifo /mnt/v/fifo',
  ].join(' && '))
  await assert.rejects(vol.readFile('/abs'), isNotFound)
  await assert.rejects(vol.readFile('/rel'), isNotFound)
  await assert.rejects(vol.readFile('/root/etc/passwd'), isNotFound)
  // a link to a directory resolves inside the volume: the host's dir is not listed
  const viaRoot = await vol.list('/root')
  assert.ok(viaRoot.every((e) => ['abs', 'rel', 'root', 'dirlink', 'fifo'].includes(e.name)), JSON.stringify(viaRoot))
  await assert.rejects(vol.list('/dirlink'), isNotFound)
  // writing through a link creates the file inside the volume, never on the host
  await vol.writeFile('/abs', 'replaced')
  assert.equal(execFileSync('cat', [marker], { encoding: 'utf8' }), 'host-secret\n')
  assert.equal((await vol.getInfo('/abs')).type, 'file')
  await vol.writeFile('/dirlink/x', 'no').catch(() => {}) // refused or inside the volume: either way not on the host
  assert.equal(existsSync(join(env.tmp, 'x')), false)
  // (under gVisor a fifo is the sentry's own: nothing is made on disk)
  await assert.rejects(vol.readFile('/fifo'), (e) => (onGvisor ? isNotFound(e) : /400/.test(e.message)),
    'a fifo is no file to read')
  const st = await vol.getInfo('/rel')
  assert.equal(st.type, 'symlink')
  assert.equal(st.target, '../../../../../../../../etc/passwd')
})

test('pause and resume keep the mount; the content plane works while the sandbox is paused', async (t) => {
  const vol = await createVolume(t)
  const sb = await createSandbox(t, { volumeMounts: { '/mnt/v': vol } })
  await sb.commands.run('echo before > /mnt/v/p')
  assert.equal(await sb.pause(), true)
  await vol.writeFile('/while-paused', 'api')
  assert.equal(await vol.readFile('/p'), 'before\n')
  const again = await Sandbox.connect(sb.sandboxId)
  assert.equal((await again.commands.run('cat /mnt/v/p /mnt/v/while-paused')).stdout, 'before\napi')
  assert.deepEqual((await again.getInfo()).volumeMounts, [{ name: vol.name, path: '/mnt/v' }])
})

test('e2b 2.45 (POST /sandboxes): Volume and volumeMounts work the same', async (t) => {
  const { Sandbox: Sandbox245, Volume: Volume245 } = await import('e2b-245')
  const vol = await Volume245.create(uniqueTag('old'))
  t.after(() => Volume245.destroy(vol.volumeId).catch(() => {}))
  await vol.writeFile('/from-245.txt', 'old sdk')
  const sb = await Sandbox245.create({ volumeMounts: { '/mnt/old': vol } })
  t.after(() => sb.kill().catch(() => {}))
  assert.equal((await sb.commands.run('cat /mnt/old/from-245.txt')).stdout, 'old sdk')
  assert.deepEqual((await sb.getInfo()).volumeMounts, [{ name: vol.name, path: '/mnt/old' }])
})

test('an ns and a gvisor sandbox mount one volume at once: one file system, the same ids', async (t) => {
  const vol = await createVolume(t)
  const g = await createSandbox(t, { ...GV, volumeMounts: { '/mnt/v': vol } })
  const n = await createSandbox(t, { ...NS, volumeMounts: { '/data': vol } })
  await g.commands.run('echo from-gvisor > /mnt/v/g && mkdir -p /mnt/v/d')
  assert.equal((await n.commands.run('cat /data/g; stat -c %u:%g /data/g /data/d')).stdout,
    'from-gvisor\n1000:1000\n1000:1000\n')
  await n.commands.run('echo from-ns > /data/n', { user: 'root' })
  assert.equal((await g.commands.run('cat /mnt/v/n; stat -c %u /mnt/v/n')).stdout, 'from-ns\n0\n')
  assert.equal((await vol.getInfo('/g')).uid, 1000)
  await vol.writeFile('/api', 'from-api')
  assert.equal((await g.commands.run('cat /mnt/v/api')).stdout, 'from-api')
  // the size limit holds on gvisor too
  const r = await g.commands.run('dd if=/dev/zero of=/mnt/v/big bs=1M count=64 2>&1; rm -f /mnt/v/big', {
    timeoutMs: 60_000,
  }).catch((e) => e)
  assert.match(r.stdout ?? r.result?.stdout ?? '', /No space left on device/)
  assert.deepEqual((await g.getInfo()).volumeMounts, [{ name: vol.name, path: '/mnt/v' }])
})
