// pause/resume keeping processes, onTimeout 'pause', and restart re-adoption
// (kill -9 of the daemon must not lose sandboxes).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b'
import { createSandbox, errName, restartDaemon, servePid, sleep, uniqueTag, waitFor } from './helpers.mjs'

const COUNTER = `bash -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/c; sleep 0.2; done'`

async function readCounter(sbx) {
  const s = await sbx.files.read('/tmp/c')
  const n = Number(s.trim())
  assert.ok(Number.isInteger(n), `counter file holds ${JSON.stringify(s)}`)
  return n
}

async function listAll(opts) {
  const pager = Sandbox.list(opts)
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()))
  return out
}

test('pause freezes the sandbox, connect resumes it with its processes and memory', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  const h = await sbx.commands.run(COUNTER, { background: true })
  // a process holding state only in memory
  const mem = await sbx.commands.run(`python3 -c 'import sys, time
secret = "in-memory-" + str(12345 * 3)
for line in sys.stdin:
    print(secret, line.strip(), flush=True)'`, { background: true, stdin: true })
  await waitFor(async () => (await readCounter(sbx).catch(() => 0)) >= 3, { timeoutMs: 10_000, what: 'the counter to start' })

  const before = await readCounter(sbx)
  assert.equal(await sbx.pause(), true)
  const pausedAt = Date.now()

  assert.equal(await sbx.isRunning(), false, 'a paused sandbox must answer 502 on /health')
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.state, 'paused')
  await assert.rejects(sbx.commands.run('echo hi'), (e) => e instanceof SandboxError, 'commands on a paused sandbox must fail')
  await assert.rejects(sbx.files.read('/tmp/c'), (e) => e instanceof SandboxError)
  // checked at the end so the resume checks still run
  const writeWhilePaused = await sbx.files.write('/tmp/w', 'x').then(() => 'succeeded', (e) => e)
  const pausedList = await listAll({ query: { metadata: { tag }, state: ['paused'] } })
  assert.deepEqual(pausedList.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.deepEqual(await listAll({ query: { metadata: { tag }, state: ['running'] } }), [])
  assert.equal((await listAll({ query: { metadata: { tag } } })).length, 1, 'default state filter is running+paused')

  // pausing again: false
  assert.equal(await sbx.pause(), false)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)

  await sleep(2_500)
  const resumed = await Sandbox.connect(sbx.sandboxId)
  const pausedFor = Date.now() - pausedAt
  assert.equal(await resumed.isRunning(), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')

  const after = await readCounter(resumed)
  // frozen, not just hidden: ~pausedFor/200 ms increments would have happened otherwise
  assert.ok(after - before <= 4, `counter advanced ${after - before} while paused for ${pausedFor} ms (before ${before}, after ${after})`)
  await waitFor(async () => (await readCounter(resumed)) > after + 2, { timeoutMs: 5_000, what: 'the counter to advance after resume' })

  const procs = await resumed.commands.list()
  assert.ok(procs.some((p) => p.pid === h.pid), `background pid ${h.pid} gone after resume: ${JSON.stringify(procs.map((p) => p.pid))}`)
  // the in-memory process still answers; its stream can be re-attached
  const out = []
  const again = await resumed.commands.connect(mem.pid, { onStdout: (d) => out.push(d) })
  await resumed.commands.sendStdin(mem.pid, 'ping\n')
  await waitFor(() => out.join('').includes('in-memory-37035 ping'), { timeoutMs: 5_000, what: `python answer, got ${JSON.stringify(out.join(''))}` })
  await again.kill()

  // the original object works again too
  assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')

  // instance connect() resumes as well
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal(await sbx.isRunning(), true)
  assert.equal((await sbx.commands.run('echo twice')).stdout, 'twice\n')

  // a paused sandbox can be killed
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.kill(), true)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)

  assert.ok(writeWhilePaused instanceof TimeoutError,
    `files.write on a paused sandbox: expected TimeoutError (HTTP 502), got ${errName(writeWhilePaused)} ${writeWhilePaused?.cause?.code ?? ''}`)
})

test('pausing cuts open streams; the pending run rejects', async (t) => {
  const sbx = await createSandbox(t)
  const seen = []
  const p = sbx.commands.run('echo go; sleep 30', { onStdout: (d) => seen.push(d) })
  p.catch(() => {})
  await waitFor(() => seen.join('').includes('go'), { timeoutMs: 10_000, what: 'the command to start' })
  assert.equal(await sbx.pause(), true)
  await assert.rejects(p, (e) => e instanceof TimeoutError, 'run must reject with TimeoutError (stream cut, /health 502) when its sandbox is paused')
  await sbx.connect()
})

test('timeout with lifecycle onTimeout "pause": paused, not killed, and resumable', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' }, metadata: { tag } })
  await sbx.files.write('/home/user/keep.txt', 'kept across auto-pause')
  const h = await sbx.commands.run(COUNTER, { background: true })
  const info0 = await sbx.getInfo()
  if (info0.lifecycle) assert.equal(info0.lifecycle.onTimeout, 'pause')

  await waitFor(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused',
    { timeoutMs: 15_000, intervalMs: 250, what: 'the sandbox to be paused at its timeout' })
  assert.equal(await sbx.isRunning(), false)
  const paused = await listAll({ query: { metadata: { tag }, state: ['paused'] } })
  assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.equal(paused[0].state, 'paused')

  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.files.read('/home/user/keep.txt'), 'kept across auto-pause')
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid), 'background process lost by the auto-pause')
  const end = (await sbx.getInfo()).endAt
  assert.ok(end - Date.now() > 30_000, 'connect(timeoutMs) after resume must set a new end time')
})

test('default onTimeout is kill (no pause)', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 2_000 })
  await waitFor(async () => {
    try {
      await Sandbox.getInfo(sbx.sandboxId)
      return false
    } catch (e) {
      if (e instanceof SandboxNotFoundError) return true
      throw e
    }
  }, { timeoutMs: 15_000, intervalMs: 250, what: 'the sandbox to be killed at its timeout' })
  await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
})

test('restart re-adoption: kill -9 of the daemon loses no sandbox', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag, role: 'live' }, timeoutMs: 300_000 })
  await sbx.files.write('/home/user/before-crash.txt', 'written before the crash')
  const h = await sbx.commands.run(COUNTER, { background: true })
  await waitFor(async () => (await readCounter(sbx).catch(() => 0)) >= 2, { timeoutMs: 10_000, what: 'the counter to start' })

  const pausedSbx = await createSandbox(t, { metadata: { tag, role: 'paused' } })
  await pausedSbx.files.write('/home/user/p.txt', 'paused one')
  assert.equal(await pausedSbx.pause(), true)

  const shortSbx = await createSandbox(t, { metadata: { tag, role: 'short' }, timeoutMs: 8_000 })
  const killedSbx = await createSandbox(t, { metadata: { tag, role: 'killed' } })
  assert.equal(await killedSbx.kill(), true)

  const oldPid = servePid()
  const newPid = await restartDaemon()
  assert.notEqual(newPid, oldPid)

  // the old objects keep working
  assert.equal(await sbx.isRunning(), true)
  assert.equal((await sbx.commands.run('echo after-restart')).stdout, 'after-restart\n')
  assert.equal(await sbx.files.read('/home/user/before-crash.txt'), 'written before the crash')
  const procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === h.pid), `background pid ${h.pid} not listed after restart: ${JSON.stringify(procs.map((p) => p.pid))}`)
  const c1 = await readCounter(sbx)
  await waitFor(async () => (await readCounter(sbx)) > c1 + 2, { timeoutMs: 5_000, what: 'the counter to keep counting after the restart' })
  // its stream can be re-attached
  const re = await sbx.commands.connect(h.pid)
  assert.equal(re.pid, h.pid)
  await re.disconnect()

  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { tag, role: 'live' })

  // the list after the restart holds exactly what lived before it
  const listed = await listAll({ query: { metadata: { tag } } })
  const roles = Object.fromEntries(listed.map((s) => [s.metadata.role, s.state]))
  assert.equal(roles.live, 'running')
  assert.equal(roles.paused, 'paused')
  assert.equal(roles.killed, undefined, 'a sandbox killed before the crash came back')

  // the paused one is still paused and resumes
  assert.equal(await pausedSbx.isRunning(), false)
  await pausedSbx.connect()
  assert.equal(await pausedSbx.files.read('/home/user/p.txt'), 'paused one')

  // timeouts are still enforced by the new daemon
  await waitFor(async () => (await shortSbx.isRunning()) === false, { timeoutMs: 20_000, intervalMs: 250, what: 'the 8 s sandbox to die after the restart' })

  // and new sandboxes work
  const fresh = await createSandbox(t)
  assert.equal((await fresh.commands.run('echo fresh')).stdout, 'fresh\n')
})
