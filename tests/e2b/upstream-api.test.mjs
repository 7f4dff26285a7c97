// Control-plane behaviours that the upstream E2B JS SDK suite relies on
// (tests/api/*, tests/sandbox/{create,connect,kill,timeout,metrics,
// lifecyclePayload,secure}.test.ts), written in our own words against hutch:
// list filters/pagination across states, kill of an id of any shape,
// connect semantics, short timeouts, metrics, lifecycle keepMemory, secure.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  SandboxNotFoundError,
  InvalidArgumentError,
} from 'e2b'
import { createSandbox, errName, sleep, uniqueTag, notOnGvisor } from './helpers.mjs'

const firstPage = (query, extra = {}) => Sandbox.list({ query, ...extra }).nextItems()
// id@startedAt of each listed/created sandbox, for assertion messages
const show = (xs) => JSON.stringify(xs.map((s) => `${s.sandboxId}@${s.startedAt?.toISOString?.() ?? '?'}:${s.state ?? ''}`))
const infos = (...sbxs) => Promise.all(sbxs.map((s) => Sandbox.getInfo(s.sandboxId)))

// ---------------------------------------------------------------- api/info, api/kill

test('Sandbox.getInfo (static) returns the id it was asked for', async (t) => {
  const sbx = await createSandbox(t)
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.sandboxId, sbx.sandboxId)
})

test('Sandbox.kill (static) removes it from the running list', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
  const ids = (await firstPage({ state: ['running'], metadata: { tag } })).map((s) => s.sandboxId)
  assert.ok(!ids.includes(sbx.sandboxId), `killed sandbox still listed: ${ids}`)
})

test('Sandbox.kill of an id that is not even id-shaped resolves false', async () => {
  // upstream uses the literal 'nonexistingsandbox' (18 chars, not [a-z0-9]{20})
  let r, err
  try { r = await Sandbox.kill('nonexistingsandbox') } catch (e) { err = e }
  assert.equal(err, undefined, `kill threw ${errName(err)}`)
  assert.equal(r, false)
})

// ---------------------------------------------------------------- api/list

test('list with a metadata filter returns exactly the matching sandbox', async (t) => {
  const uniq = uniqueTag('u')
  const sbx = await createSandbox(t, { metadata: { uniqueId: uniq } })
  const got = await firstPage({ metadata: { uniqueId: uniq } })
  assert.equal(got.length, 1)
  assert.equal(got[0].sandboxId, sbx.sandboxId)
})

test('list state filter: running and paused (instance and static betaPause)', async (t) => {
  const tag = uniqueTag()
  const a = await createSandbox(t, { metadata: { tag } })
  const b = await createSandbox(t, { metadata: { tag } })
  await a.betaPause()
  await Sandbox.betaPause(b.sandboxId)
  const c = await createSandbox(t, { metadata: { tag } })

  const paused = await firstPage({ metadata: { tag }, state: ['paused'] })
  assert.deepEqual(new Set(paused.map((s) => s.sandboxId)), new Set([a.sandboxId, b.sandboxId]))
  assert.ok(paused.every((s) => s.state === 'paused'))

  const running = await firstPage({ metadata: { tag }, state: ['running'] })
  assert.deepEqual(running.map((s) => s.sandboxId), [c.sandboxId])
  assert.equal(running[0].state, 'running')
})

async function twoPages(query) {
  const pager = Sandbox.list({ limit: 1, query })
  const p1 = await pager.nextItems()
  const hasNext1 = pager.hasNext
  const token1 = pager.nextToken
  const p2 = await pager.nextItems()
  return { p1, hasNext1, token1, p2, hasNext2: pager.hasNext, token2: pager.nextToken }
}

test('paginate running sandboxes with limit 1: newest first, then the older, then no token', async (t) => {
  const tag = uniqueTag()
  const older = await createSandbox(t, { metadata: { tag } })
  const newer = await createSandbox(t, { metadata: { tag } })
  const r = await twoPages({ metadata: { tag }, state: ['running'] })
  assert.equal(r.p1.length, 1)
  assert.equal(r.p1[0].sandboxId, newer.sandboxId, `page1 ${show(r.p1)} page2 ${show(r.p2)}; created in order ${show(await infos(older, newer))}`)
  assert.equal(r.p1[0].state, 'running')
  assert.equal(r.hasNext1, true)
  assert.notEqual(r.token1, undefined)
  assert.equal(r.p2.length, 1)
  assert.equal(r.p2[0].sandboxId, older.sandboxId)
  assert.equal(r.hasNext2, false)
  assert.equal(r.token2, undefined)
})

test('paginate paused sandboxes with limit 1', async (t) => {
  const tag = uniqueTag()
  const older = await createSandbox(t, { metadata: { tag } })
  await older.betaPause()
  const newer = await createSandbox(t, { metadata: { tag } })
  await newer.betaPause()
  const r = await twoPages({ metadata: { tag }, state: ['paused'] })
  assert.deepEqual(r.p1.map((s) => [s.sandboxId, s.state]), [[newer.sandboxId, 'paused']], `page1 ${show(r.p1)} page2 ${show(r.p2)}; created in order ${show(await infos(older, newer))}`)
  assert.equal(r.hasNext1, true)
  assert.notEqual(r.token1, undefined)
  assert.deepEqual(r.p2.map((s) => [s.sandboxId, s.state]), [[older.sandboxId, 'paused']])
  assert.equal(r.hasNext2, false)
  assert.equal(r.token2, undefined)
})

test('paginate running+paused with limit 1: ordered by start time, not by state (newer paused)', async (t) => {
  const tag = uniqueTag()
  const older = await createSandbox(t, { metadata: { tag } })
  const newer = await createSandbox(t, { metadata: { tag } })
  await newer.betaPause()
  const r = await twoPages({ metadata: { tag }, state: ['running', 'paused'] })
  assert.deepEqual(r.p1.map((s) => [s.sandboxId, s.state]), [[newer.sandboxId, 'paused']], `page1 ${show(r.p1)} page2 ${show(r.p2)}; created in order ${show(await infos(older, newer))}`)
  assert.equal(r.hasNext1, true)
  assert.deepEqual(r.p2.map((s) => [s.sandboxId, s.state]), [[older.sandboxId, 'running']])
  assert.equal(r.hasNext2, false)
  assert.equal(r.token2, undefined)
})

test('paginate running+paused with limit 1: ordered by start time, not by state (older paused)', async (t) => {
  const tag = uniqueTag()
  const older = await createSandbox(t, { metadata: { tag } })
  const newer = await createSandbox(t, { metadata: { tag } })
  await Sandbox.betaPause(older.sandboxId)
  const r = await twoPages({ metadata: { tag }, state: ['running', 'paused'] })
  assert.deepEqual(r.p1.map((s) => [s.sandboxId, s.state]), [[newer.sandboxId, 'running']], `page1 ${show(r.p1)} page2 ${show(r.p2)}; created in order ${show(await infos(older, newer))}`)
  assert.equal(r.hasNext1, true)
  assert.deepEqual(r.p2.map((s) => [s.sandboxId, s.state]), [[older.sandboxId, 'paused']])
  assert.equal(r.hasNext2, false)
})

test('list order asc/desc by start time', async (t) => {
  const tag = uniqueTag()
  const first = await createSandbox(t, { metadata: { tag } })
  const second = await createSandbox(t, { metadata: { tag } })
  const asc = await Sandbox.list({ query: { metadata: { tag } }, order: 'asc' }).nextItems()
  const created = show(await infos(first, second))
  assert.deepEqual(asc.map((s) => s.sandboxId), [first.sandboxId, second.sandboxId], `asc ${show(asc)}; created in order ${created}`)
  const desc = await Sandbox.list({ query: { metadata: { tag } }, order: 'desc' }).nextItems()
  assert.deepEqual(desc.map((s) => s.sandboxId), [second.sandboxId, first.sandboxId], `desc ${show(desc)}; created in order ${created}`)
})

test('list startedAfter: inclusive at startedAt, excludes a second later', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  const info = await sbx.getInfo()
  const at = await firstPage({ metadata: { tag }, startedAfter: info.startedAt })
  assert.ok(at.some((s) => s.sandboxId === sbx.sandboxId), 'startedAfter=startedAt must include it')
  const later = await firstPage({ metadata: { tag }, startedAfter: new Date(info.startedAt.getTime() + 1000) })
  assert.ok(!later.some((s) => s.sandboxId === sbx.sandboxId), 'startedAfter=startedAt+1s must exclude it')
})

test('list template filter: the sandbox templateId matches, an unknown template matches nothing', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  const info = await sbx.getInfo()
  const hit = await firstPage({ metadata: { tag }, template: info.templateId })
  assert.ok(hit.some((s) => s.sandboxId === sbx.sandboxId), `template=${info.templateId} did not list it`)
  const miss = await firstPage({ metadata: { tag }, template: 'unknown-template' })
  assert.equal(miss.length, 0)
})

test('list template filter also accepts the template name "base"', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  const hit = await firstPage({ metadata: { tag }, template: 'base' })
  assert.ok(hit.some((s) => s.sandboxId === sbx.sandboxId), 'template=base did not list it')
})

test('unfiltered list carries the metadata given at create', async (t) => {
  const metadata = { 'test-key': 'test-value' }
  const sbx = await createSandbox(t, { timeoutMs: 60_000, metadata })
  const all = await Sandbox.list().nextItems()
  const mine = all.find((s) => s.sandboxId === sbx.sandboxId)
  assert.ok(mine, 'created sandbox missing from the first page of an unfiltered list')
  assert.deepEqual(mine.metadata, metadata)
})

// ---------------------------------------------------------------- sandbox/create, connect, kill, timeout

test('create with timeoutMs 5000: running, envd version known', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 5_000 })
  assert.equal(await sbx.isRunning(), true)
  assert.equal(typeof sbx.envdApi?.version, 'string')
  assert.ok(sbx.envdApi.version.length > 0)
})

test('connect from a second object to a 10 s sandbox', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 10_000 })
  assert.equal(await sbx.isRunning(), true)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.isRunning(), true)
})

test('Sandbox.connect resumes a sandbox paused with pause()', async (t) => {
  const sbx = await createSandbox(t)
  await sbx.pause()
  assert.equal(await sbx.isRunning(), false)
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await resumed.isRunning(), true)
})

test('Sandbox.connect to a killed sandbox throws SandboxNotFoundError', async (t) => {
  const sbx = await createSandbox(t)
  await sbx.kill()
  await assert.rejects(Sandbox.connect(sbx.sandboxId), (e) => {
    assert.equal(e.name, 'SandboxNotFoundError', errName(e))
    assert.ok(e instanceof SandboxNotFoundError)
    return true
  })
})

test('connect with a shorter timeout keeps endAt exactly', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 300_000 })
  const before = await Sandbox.getInfo(sbx.sandboxId)
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 })
  const after = await sbx.getInfo()
  assert.equal(after.endAt.getTime(), before.endAt.getTime())
})

test('sbx.connect with a longer timeout extends endAt', async (t) => {
  const sbx = await createSandbox(t)
  const before = await sbx.getInfo()
  await sbx.connect({ timeoutMs: 600_000 })
  const after = await sbx.getInfo()
  assert.ok(after.endAt.getTime() > before.endAt.getTime(),
    `endAt not extended: ${before.endAt.toISOString()} -> ${after.endAt.toISOString()}`)
})

test('sbx.kill resolves true and the sandbox leaves the running list', async (t) => {
  const tag = uniqueTag()
  const sbx = await createSandbox(t, { metadata: { tag } })
  assert.equal(await sbx.kill(), true)
  const ids = (await firstPage({ state: ['running'], metadata: { tag } })).map((s) => s.sandboxId)
  assert.ok(!ids.includes(sbx.sandboxId))
})

test('setTimeout(5000) then 6 s later the sandbox is gone', async (t) => {
  const sbx = await createSandbox(t)
  await sbx.setTimeout(5000)
  await sleep(6000)
  assert.equal(await sbx.isRunning(), false)
})

test('setTimeout(5000), 1 s later setTimeout(10000), 6 s later still running', async (t) => {
  const sbx = await createSandbox(t)
  await sbx.setTimeout(5000)
  await sleep(1000)
  await sbx.setTimeout(10000)
  await sleep(6000)
  assert.equal(await sbx.isRunning(), true)
})

// ---------------------------------------------------------------- sandbox/metrics

async function pollMetrics(sbx, opts) {
  let m = []
  for (let i = 0; i < 60 && m.length === 0; i++) {
    m = await sbx.getMetrics(opts?.())
    if (m.length === 0) await sleep(500)
  }
  return m
}

test('metrics: a sample within 30 s with disk/mem/cpu fields', async (t) => {
  const sbx = await createSandbox(t)
  const m = await pollMetrics(sbx)
  assert.ok(m.length > 0, 'no metrics within 30 s')
  for (const k of ['diskTotal', 'diskUsed', 'memTotal', 'memUsed', 'cpuUsedPct', 'cpuCount']) {
    assert.notEqual(m[0][k], undefined, `metric.${k} is undefined: ${JSON.stringify(m[0])}`)
  }
})

test('metrics: range since the test start has samples inside it (10 s slack); a range an hour back is empty', async (t) => {
  const sbx = await createSandbox(t)
  const start = new Date()
  let end = new Date()
  const m = await pollMetrics(sbx, () => { end = new Date(); return { start, end } })
  assert.ok(m.length > 0, 'no metrics in [start, now] within 30 s')
  for (const s of m) {
    assert.ok(s.timestamp.getTime() >= start.getTime() - 10_000, `sample ${s.timestamp.toISOString()} before start`)
    assert.ok(s.timestamp.getTime() <= end.getTime() + 10_000, `sample ${s.timestamp.toISOString()} after end`)
  }
  const none = await sbx.getMetrics({ start: new Date(start - 3600_000), end: new Date(start - 1800_000) })
  assert.equal(none.length, 0)
})

// ---------------------------------------------------------------- sandbox/lifecyclePayload

test('lifecycle keepMemory:false with autoResume is rejected by the SDK (InvalidArgumentError)', async () => {
  await assert.rejects(Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
    InvalidArgumentError)
})

test('lifecycle onTimeout pause + autoResume:false: paused at timeout, connect wakes it', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: false } })
  await sleep(5_000)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal((await sbx.getInfo()).state, 'running')
  assert.equal(await sbx.isRunning(), true)
})

test('lifecycle pause keepMemory:false: files survive, connect cold-boots (boot_id changes)', notOnGvisor('the sentry has no /proc/sys/kernel/random/boot_id'), async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await sbx.files.write('/home/user/auto-pause-marker.txt', 'marker-fs-only')
  const bootBefore = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
  await sleep(5_000)
  assert.equal((await sbx.getInfo()).state, 'paused')
  await sbx.connect()
  assert.equal((await sbx.files.read('/home/user/auto-pause-marker.txt')).trim(), 'marker-fs-only')
  const bootAfter = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
  assert.notEqual(bootAfter, bootBefore, `boot_id unchanged after a filesystem-only resume (${bootAfter})`)
})

test('pause with keepMemory:false then connect: running processes do not survive (cold boot)', async (t) => {
  const sbx = await createSandbox(t)
  const bg = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await Sandbox.pause(sbx.sandboxId, { keepMemory: false }), true)
  await sbx.connect()
  const pids = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(!pids.includes(bg.pid), `background pid ${bg.pid} still listed after a filesystem-only resume: ${JSON.stringify(pids)}`)
})

// ---------------------------------------------------------------- sandbox/internetAccess (disabled only)

test('allowInternetAccess:false: an outbound curl fails with CommandExitError', async (t) => {
  const sbx = await createSandbox(t, { allowInternetAccess: false })
  await assert.rejects(sbx.commands.run('curl --connect-timeout 3 --max-time 5 -Is https://connectivitycheck.gstatic.com/generate_204'), (e) => {
    assert.equal(e.name, 'CommandExitError', errName(e))
    assert.notEqual(e.exitCode, 0)
    return true
  })
})

// ---------------------------------------------------------------- sandbox/secure

test('secure sandbox: unsigned-expiry downloadUrl works, a reconnected object can write', async (t) => {
  const sbx = await createSandbox(t, { secure: true })
  await sbx.files.write('hello.txt', 'hello world')
  const res = await fetch(await sbx.downloadUrl('hello.txt'))
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello world')
  const again = await Sandbox.connect(sbx.sandboxId)
  await again.files.write('hello.txt', 'hello again')
  assert.equal(await sbx.files.read('hello.txt'), 'hello again')
})
