// Sandboxes on the gvisor backend through the stock SDK, chosen per sandbox
// with metadata hutch.backend (the daemon's default stays ns). The whole
// suite also runs on gvisor with HUTCH_E2B_BACKEND=gvisor (docs/gvisor.md).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { execFile, execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'
import { createSandbox, env, restartDaemon, sleep, textCollector, waitFor } from './helpers.mjs'

const GV = { metadata: { 'hutch.backend': 'gvisor' } }
const haveRunsc = existsSync('/usr/bin/runsc') || existsSync('/usr/local/bin/runsc')
const opt = { skip: haveRunsc ? false : 'runsc is not installed' }

function hostCmdlines() {
  const out = []
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try { out.push(readFileSync(`/proc/${d}/cmdline`, 'latin1').replaceAll('\0', ' ')) } catch {}
  }
  return out
}

test('commands, output streams and exit codes run on the user-space kernel', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const r = await sbx.commands.run('echo out; echo err >&2; dmesg | head -1; id -un; exit 0')
  assert.match(r.stdout, /^out\n.*gVisor.*\nuser\n$/s)
  assert.equal(r.stderr, 'err\n')
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e.exitCode === 3)
  const root = await sbx.commands.run('id -u', { user: 'root' })
  assert.equal(root.stdout, '0\n')
  const info = await sbx.getInfo()
  assert.equal(info.metadata['hutch.backend'], 'gvisor')
})

test('ls, stat and find work: the preloaded shim drops the AT_NO_AUTOMOUNT this runsc refuses', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  await sbx.files.write('/home/user/f.txt', 'abc')
  const r = await sbx.commands.run('ls -la /home/user | grep -c f.txt; stat -c "%n %s %U" /home/user/f.txt; ' +
    'find /home/user -name f.txt; cat /etc/ld.so.preload')
  assert.equal(r.stdout, '1\n/home/user/f.txt 3 user\n/home/user/f.txt\n/run/hutch/gvisor-compat.so\n')
  // only under gVisor: a namespace sandbox has no preload list
  const ns = await createSandbox(t, { metadata: { 'hutch.backend': 'ns' } })
  await assert.rejects(ns.commands.run('cat /etc/ld.so.preload'), (e) => e.exitCode === 1)
})

test('the writable layer has the sandbox disk size, and getMetrics diskUsed follows it', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const df = await sbx.commands.run('df -B1 --output=size / | tail -n 1; df -B1 --output=size /tmp | tail -n 1')
  const [root, tmp] = df.stdout.trim().split('\n').map(Number)
  // one layer under / and /tmp, of the sandbox's disk size (the daemon's
  // --disk: 1 GiB by default, run.sh's HUTCH_E2B_DISK)
  const want = { '': 1024 ** 3, '256M': 256 * 1024 ** 2 }[process.env.HUTCH_E2B_DISK || '']
  assert.equal(root, want, df.stdout)
  assert.equal(tmp, root)
  await sbx.commands.run('dd if=/dev/zero of=/home/user/layer.bin bs=1M count=24 2>/dev/null')
  const m = await waitFor(async () => {
    const all = await sbx.getMetrics()
    const last = all[all.length - 1]
    return last && last.diskUsed >= 24 * 1024 * 1024 ? last : null
  }, { timeoutMs: 30_000, intervalMs: 500, what: 'a metrics sample with the 24 MiB file' })
  assert.ok(m.diskUsed <= m.diskTotal && m.diskTotal === root, `diskUsed ${m.diskUsed} of ${m.diskTotal}`)
})

test('files: write, read back (small and 5 MB), list, remove, stdin to a background command', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  await sbx.files.write('/home/user/a.txt', 'hello')
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'hello')
  const big = Buffer.alloc(5 << 20)
  for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 11)) & 255
  await sbx.files.write('/tmp/big.bin', big)
  const back = Buffer.from(await sbx.files.read('/tmp/big.bin', { format: 'bytes' }))
  assert.ok(back.equals(big), 'the 5 MB file came back whole')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('a.txt'))
  await sbx.files.remove('/home/user/a.txt')
  assert.equal(await sbx.files.exists('/home/user/a.txt'), false)
  const h = await sbx.commands.run('cat > /tmp/in.txt', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'through stdin\n')
  await sbx.commands.closeStdin(h.pid)
  await h.wait()
  assert.equal(await sbx.files.read('/tmp/in.txt'), 'through stdin\n')
})

test('pty: output, input and exit', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const out = textCollector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
  await waitFor(() => out.text.includes('pty-42'), { what: 'pty output' })
  assert.match(out.text, /24 80/)
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('exit 0\n'))
  await h.wait()
})

test('watch reports a file written inside', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  await sbx.files.makeDir('/home/user/w')
  const seen = []
  const w = await sbx.files.watchDir('/home/user/w', (e) => seen.push(e.name))
  await sbx.commands.run('echo x > /home/user/w/f1')
  await waitFor(() => seen.includes('f1'), { what: 'a watch event for f1' })
  await w.stop()
})

test('pause checkpoints to disk: nothing runs while paused, memory is freed, resume continues counting', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const id = sbx.sandboxId
  await sbx.commands.run(`bash -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/c; sleep 0.2; done'`, { background: true })
  await waitFor(async () => Number((await sbx.files.read('/tmp/c')).trim()) >= 3, { what: 'the counter to start' })
  await sbx.pause()
  // the runtime is gone (no sentry, gofer or relay holds memory), the
  // checkpoint is sealed on disk, and the API says paused
  // the relay has exited when pause answers; runsc's own processes end with
  // it, a moment later under load (one CI run saw one still exiting)
  const deadline = Date.now() + 3000
  let left
  while ((left = hostCmdlines().filter((c) => c.includes(id))).length && Date.now() < deadline) await sleep(50)
  assert.deepEqual(left, [], 'no host process of the paused sandbox')
  const image = `${env.dataDir}/paused/${id}.seal`
  assert.ok(existsSync(image), 'the sealed checkpoint')
  assert.ok(!readFileSync(image).includes(Buffer.from('while true; do i=')), 'the image is not plaintext')
  assert.equal((await Sandbox.getInfo(id)).state, 'paused')
  await sleep(1000)
  await sbx.connect()
  const c1 = Number((await sbx.files.read('/tmp/c')).trim())
  await waitFor(async () => Number((await sbx.files.read('/tmp/c')).trim()) > c1, { what: 'the counter to go on' })
  assert.ok(c1 >= 3 && c1 < 12, `counted on from memory, not while paused: ${c1}`)
  assert.ok(!existsSync(image), 'the image is gone after the resume')
  assert.ok((await sbx.commands.list()).some((p) => p.args.join(' ').includes('while true')), 'the process is listed again')
  assert.equal((await sbx.commands.run('echo works')).stdout, 'works\n')
})

test('a paused gvisor sandbox survives a daemon restart; killed while paused, it leaves nothing', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const id = sbx.sandboxId
  await sbx.commands.run('echo 41 > /tmp/n; sleep 1000 &', { background: false })
  await sbx.pause()
  // the engine knows it as suspended, and gc (which removes sandboxes whose
  // init is gone) leaves it alone
  const hutch = (...a) => execFileSync(env.bin, a, { env: { ...process.env, HUTCH_RUN_DIR: env.runDir, HUTCH_DATA_DIR: env.dataDir } }).toString()
  hutch('gc')
  const ps = JSON.parse(hutch('ps', '--json')).find((x) => x.id === id)
  assert.equal(ps?.state, 'suspended', JSON.stringify(ps))
  // what a crash in the middle of a pause or checkpoint would leave: swept
  // at the next start, while the live sandbox's image stays
  const junk = [`${env.dataDir}/paused/.image-crashed`, `${env.dataDir}/paused/${'z'.repeat(20)}.seal`,
    `${env.dataDir}/paused/${id}.seal.tmp`]
  for (const f of junk) writeFileSync(f, 'left over')
  mkdirSync(`${env.dataDir}/gvisor/.ckpt-${'z'.repeat(20)}-abcdef`)
  await restartDaemon()
  assert.deepEqual(junk.filter((f) => existsSync(f)), [])
  assert.ok(!existsSync(`${env.dataDir}/gvisor/.ckpt-${'z'.repeat(20)}-abcdef`))
  assert.ok(existsSync(`${env.dataDir}/paused/${id}.seal`), 'the paused sandbox keeps its image')
  assert.equal((await Sandbox.getInfo(id)).state, 'paused')
  await sbx.connect()
  assert.equal((await sbx.commands.run('cat /tmp/n')).stdout, '41\n')
  assert.ok((await sbx.commands.list()).some((p) => p.cmd.includes('sleep') || p.args.join(' ').includes('sleep')) ||
    (await sbx.commands.run('pgrep -c sleep || true')).stdout.trim() !== '0', 'sleep still runs')
  await sbx.pause()
  await sbx.kill()
  await waitFor(() => !existsSync(`${env.dataDir}/paused/${id}.seal`) && !existsSync(`${env.runDir}/sandboxes/${id}`) &&
    !existsSync(`${env.dataDir}/gvisor/${id}`), { what: `the image, state and scratch of ${id} to go` })
})

test('a running gvisor sandbox survives a daemon restart: the new daemon reaches it through the relay', opt, async (t) => {
  // the new daemon connects to the relay's control socket (a new client of
  // the relay, under the relay's seccomp filter) and re-adopts the process
  const sbx = await createSandbox(t, GV)
  await sbx.files.write('/tmp/kept', 'before the restart')
  const h = await sbx.commands.run('sh -c "while true; do date +%s%N > /tmp/tick; sleep 0.2; done"', { background: true })
  await restartDaemon()
  assert.equal((await sbx.commands.run('echo after-restart')).stdout, 'after-restart\n')
  assert.equal(await sbx.files.read('/tmp/kept'), 'before the restart')
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid), 'the background process is listed again')
  const re = await sbx.commands.connect(h.pid)
  assert.equal(re.pid, h.pid)
  await re.disconnect()
  const t1 = (await sbx.files.read('/tmp/tick')).trim()
  await waitFor(async () => (await sbx.files.read('/tmp/tick')).trim() !== t1, { timeoutMs: 10_000, what: 'the process to go on' })
})

test('a tampered pause image is refused and the sandbox stays paused', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  const id = sbx.sandboxId
  await sbx.commands.run('echo kept > /tmp/k')
  await sbx.pause()
  const image = `${env.dataDir}/paused/${id}.seal`
  const good = readFileSync(image)
  const bad = Buffer.from(good)
  bad[bad.length >> 1] ^= 1
  writeFileSync(image, bad)
  await assert.rejects(sbx.connect(), (e) => /authenticate|500/i.test(`${e.message}`))
  assert.equal((await Sandbox.getInfo(id)).state, 'paused')
  writeFileSync(image, good)
  await sbx.connect()
  assert.equal((await sbx.commands.run('cat /tmp/k')).stdout, 'kept\n')
})

test('past the memory limit the largest process is killed, not the sandbox', opt, async (t) => {
  // the daemon's default limit is 512 MiB; 64 MiB steps, each committed at once
  const sbx = await createSandbox(t, GV)
  const grow = 'import mmap\nm = []\nwhile True:\n    m.append(mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000))\n'
  await sbx.files.write('/tmp/grow.py', grow)
  const bystander = await sbx.commands.run('sleep 600', { background: true })
  await assert.rejects(sbx.commands.run('python3 /tmp/grow.py', { timeoutMs: 60_000 }),
    (e) => e.exitCode !== 0 && /kill/i.test(`${e.error} ${e.message}`))
  const r = await sbx.commands.run('echo alive')
  assert.equal(r.stdout, 'alive\n')
  const procs = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(procs.includes(bystander.pid), 'the small bystander process lives on')
})

test('kill leaves no runsc process, relay or state behind', opt, async (t) => {
  const sbx = await Sandbox.create(GV)
  const id = sbx.sandboxId
  assert.ok(hostCmdlines().some((c) => c.includes(id) && c.startsWith('runsc-sandbox')), 'a sentry runs for it')
  await sbx.kill()
  await waitFor(() => !hostCmdlines().some((c) => c.includes(id)), { what: `no host process mentions ${id}` })
  // the daemon finishes the teardown once the relay has exited
  await waitFor(() => !existsSync(`${env.runDir}/sandboxes/${id}`) && !existsSync(`${env.dataDir}/gvisor/${id}`),
    { what: `the state and scratch dirs of ${id} to go` })
})

const COUNTER = `bash -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/c; sleep 0.2; done'`
const counter = async (sbx) => Number((await sbx.files.read('/tmp/c')).trim())

test('snapshot keeps running processes and memory: a sandbox created from it goes on counting', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  await sbx.commands.run(COUNTER, { background: true })
  await sbx.commands.run('echo parent > /home/user/who')
  await waitFor(async () => (await counter(sbx)) >= 3, { what: 'the counter to start' })
  const snap = await sbx.createSnapshot()
  t.after(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))
  // the parent goes on after its checkpoint: its processes, and new commands
  const p0 = await counter(sbx)
  await waitFor(async () => (await counter(sbx)) > p0, { what: 'the parent to count on after its snapshot' })
  assert.equal((await sbx.commands.run('echo after')).stdout, 'after\n')
  assert.ok((await sbx.commands.list()).some((p) => p.args.join(' ').includes('while true')),
    'the counting process is listed again')
  const copy = await Sandbox.create(snap.snapshotId)
  t.after(() => copy.kill().catch(() => {}))
  assert.notEqual(copy.sandboxId, sbx.sandboxId)
  const c0 = await counter(copy)
  assert.ok(c0 >= 3, `the copy starts from the parent's count (${c0})`)
  await waitFor(async () => (await counter(copy)) > c0, { what: 'the copy to run the counting process it was given' })
  assert.equal(await copy.files.read('/home/user/who'), 'parent\n')
  assert.match((await copy.commands.run('dmesg | head -1')).stdout, /gVisor/)
  // a gvisor snapshot cannot start a namespace sandbox
  const res = await fetch(`${env.apiUrl}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-KEY': env.apiKey, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: snap.snapshotId, backend: 'ns' }),
  })
  assert.equal(res.status, 409)
})

test('hutch gc run throughout snapshots and a pause/resume never takes the sandbox in transit for dead', opt, async (t) => {
  // Between a checkpoint and the new relay's restore the sandbox has no init:
  // the engine holds its directory's lock, and gc leaves a locked sandbox
  // alone (before the lock, gc tore such a sandbox down).
  const sbx = await createSandbox(t, GV)
  await sbx.commands.run(COUNTER, { background: true })
  await waitFor(async () => (await counter(sbx)) >= 2, { what: 'the counter to start' })
  const gcEnv = { ...process.env, HUTCH_RUN_DIR: env.runDir, HUTCH_DATA_DIR: env.dataDir }
  let stop = false
  let runs = 0
  const loop = (async () => {
    while (!stop) {
      await new Promise((resolve) => execFile(env.bin, ['gc'], { env: gcEnv }, () => resolve()))
      runs++
    }
  })()
  try {
    for (let i = 0; i < 3; i++) {
      const snap = await sbx.createSnapshot()
      t.after(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))
    }
    await sbx.pause()
    await sbx.connect()
  } finally {
    stop = true
    await loop
  }
  assert.ok(runs >= 5, `gc ran ${runs} times during the transitions`)
  const c0 = await counter(sbx)
  await waitFor(async () => (await counter(sbx)) > c0, { what: 'the sandbox to count on after gc' })
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
})

test('fork ×3: running processes come along, writes diverge', opt, async (t) => {
  const sbx = await createSandbox(t, GV)
  await sbx.commands.run(COUNTER, { background: true })
  await waitFor(async () => (await counter(sbx)) >= 2, { what: 'the counter to start' })
  const forks = await Sandbox.fork(sbx.sandboxId, { count: 3 })
  t.after(() => Promise.all(forks.map((f) => f.kill().catch(() => {}))))
  assert.equal(forks.length, 3)
  const ids = new Set([sbx.sandboxId, ...forks.map((f) => f.sandboxId)])
  assert.equal(ids.size, 4)
  for (const f of forks) await f.files.write('/home/user/me', f.sandboxId)
  for (const f of forks) {
    assert.equal(await f.files.read('/home/user/me'), f.sandboxId)
    const a = await counter(f)
    // it counts on (waited for: four gvisor sandboxes share the CPUs)
    await waitFor(async () => (await counter(f)) > a, { what: `fork ${f.sandboxId} to count on from ${a}` })
  }
  assert.equal(await sbx.files.exists('/home/user/me'), false)
})

test('a bad backend is a 400', opt, async (t) => {
  const res = await fetch(`${env.apiUrl}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-KEY': env.apiKey, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', backend: 'firecracker' }),
  })
  assert.equal(res.status, 400)
  assert.match(await res.text(), /backend must be/)
  const both = await fetch(`${env.apiUrl}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-KEY': env.apiKey, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', backend: 'ns', metadata: { 'hutch.backend': 'gvisor' } }),
  })
  assert.equal(both.status, 400)
})
