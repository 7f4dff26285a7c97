// Control plane through the SDK: create, getInfo, isRunning, kill, connect,
// setTimeout, list (filters, pagination), metrics, auth errors, unknown ids and
// team isolation.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  AuthenticationError,
  TimeoutError,
} from 'e2b'
import {
  createSandbox,
  createTeamKey,
  env,
  errName,
  hutch,
  sleep,
  uniqueTag,
  unknownSandboxId,
  waitFor,
} from './helpers.mjs'

const ID_RE = /^[a-z0-9]{20}$/

function semverAtLeast(v, min) {
  const a = v.split('-')[0].split('.').map(Number)
  const b = min.split('.').map(Number)
  for (let i = 0; i < 3; i++) {
    if ((a[i] ?? 0) !== b[i]) return (a[i] ?? 0) > b[i]
  }
  return true
}

async function listAll(opts) {
  const pager = Sandbox.list(opts)
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()))
  return out
}

test('create with defaults: id shape, running, getInfo fields, 300 s default timeout', async (t) => {
  const before = Date.now()
  const sbx = await createSandbox(t)
  assert.match(sbx.sandboxId, ID_RE)
  assert.equal(await sbx.isRunning(), true)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(typeof info.templateId, 'string')
  assert.ok(info.templateId.length > 0, 'templateId is empty')
  assert.equal(info.name, 'base')
  assert.deepEqual(info.metadata, {})
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `startedAt ${info.startedAt}`)
  assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), `endAt ${info.endAt}`)
  assert.ok(info.startedAt < info.endAt, 'startedAt < endAt')
  assert.ok(info.startedAt.getTime() >= before - 5_000 && info.startedAt.getTime() <= Date.now() + 5_000,
    `startedAt ${info.startedAt.toISOString()} is not about now`)
  const lifetime = (info.endAt - info.startedAt) / 1000
  assert.ok(Math.abs(lifetime - 300) <= 5, `default timeout should be 300 s, endAt-startedAt = ${lifetime} s`)
  assert.ok(info.cpuCount > 0, `cpuCount ${info.cpuCount}`)
  assert.ok(info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
  assert.ok(semverAtLeast(info.envdVersion, '0.6.13'), `envdVersion ${info.envdVersion} < 0.6.13`)

  // The static form answers the same.
  const info2 = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info2.sandboxId, sbx.sandboxId)
  assert.equal(info2.templateId, info.templateId)
})

test('create with metadata, envs and timeoutMs', async (t) => {
  const metadata = { purpose: 'conformance', tag: uniqueTag() }
  const sbx = await createSandbox(t, { metadata, envs: { FOO: 'bar', SPACED: 'a b c' }, timeoutMs: 120_000 })
  const info = await sbx.getInfo()
  assert.deepEqual(info.metadata, metadata)
  const lifetime = (info.endAt - info.startedAt) / 1000
  assert.ok(Math.abs(lifetime - 120) <= 5, `timeoutMs 120000 should give ~120 s, got ${lifetime} s`)
  const r = await sbx.commands.run('printf "%s|%s" "$FOO" "$SPACED"')
  assert.equal(r.stdout, 'bar|a b c')
})

test('create with an explicit template name "base"', async (t) => {
  const sbx = await createSandbox(t, { template: 'base' })
  const info = await sbx.getInfo()
  assert.equal(info.name, 'base')
  const r = await sbx.commands.run('echo ok')
  assert.equal(r.stdout, 'ok\n')
})

test('create with an unknown template fails with a SandboxError (not a crash)', async () => {
  await assert.rejects(
    Sandbox.create('no-such-template-' + uniqueTag()),
    (e) => e instanceof SandboxError && e.statusCode >= 400 && e.statusCode < 500,
  )
})

test('kill: isRunning false afterwards, second kill returns false, data plane gone', async (t) => {
  const sbx = await createSandbox(t)
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await sbx.kill(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  // envd of a killed sandbox answers 502 -> the SDK reports it as not running
  await assert.rejects(sbx.commands.run('echo hi'), (e) => e instanceof SandboxError, 'run on a killed sandbox must fail')
  await assert.rejects(sbx.files.read('/etc/hostname'), (e) => e instanceof SandboxError)
  // uploads too: the 502 must reach the SDK (not a dropped connection -> TypeError)
  await assert.rejects(sbx.files.write('/tmp/x.txt', 'x'), (e) => {
    assert.ok(e instanceof TimeoutError, `files.write on a killed sandbox: expected TimeoutError (HTTP 502), got ${errName(e)} ${e.cause?.code ?? ''}`)
    return true
  })
})

test('Sandbox.connect(id) from a second object runs commands and shares the filesystem', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 120_000 })
  await sbx.files.write('/tmp/from-first.txt', 'first')
  const other = await Sandbox.connect(sbx.sandboxId)
  assert.equal(other.sandboxId, sbx.sandboxId)
  const r = await other.commands.run('cat /tmp/from-first.txt; echo; whoami')
  assert.equal(r.stdout, 'first\nuser\n')
  await other.files.write('/tmp/from-second.txt', 'second')
  assert.equal(await sbx.files.read('/tmp/from-second.txt'), 'second')
  assert.equal(await other.isRunning(), true)
})

test('connect never shortens endAt but extends it', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 120_000 })
  const endAt0 = (await sbx.getInfo()).endAt
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 })
  const endAt1 = (await sbx.getInfo()).endAt
  assert.ok(endAt1 >= endAt0, `connect with a shorter timeout moved endAt back: ${endAt0.toISOString()} -> ${endAt1.toISOString()}`)
  await sbx.connect({ timeoutMs: 600_000 })
  const endAt2 = (await sbx.getInfo()).endAt
  const ahead = (endAt2 - Date.now()) / 1000
  assert.ok(ahead > 550 && ahead < 610, `connect(timeoutMs 600000) should put endAt ~600 s ahead, got ${ahead} s`)
})

test('setTimeout extends the life of a sandbox past its original timeout', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 3_000 })
  await sbx.setTimeout(60_000)
  const info = await sbx.getInfo()
  const ahead = (info.endAt - Date.now()) / 1000
  assert.ok(ahead > 50 && ahead < 65, `endAt should be ~60 s ahead, got ${ahead} s`)
  await sleep(6_000)
  assert.equal(await sbx.isRunning(), true, 'sandbox died at its original 3 s timeout despite setTimeout(60000)')
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
})

test('setTimeout shortens: the sandbox really disappears at its new end time', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 300_000 })
  await Sandbox.setTimeout(sbx.sandboxId, 3_000)
  const info = await sbx.getInfo()
  const ahead = (info.endAt - Date.now()) / 1000
  assert.ok(ahead <= 4 && ahead > -1, `endAt should be ~3 s ahead, got ${ahead} s`)
  await waitFor(async () => (await sbx.isRunning()) === false, { timeoutMs: 15_000, intervalMs: 250, what: 'isRunning() false after the shortened timeout' })
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  assert.equal(await sbx.kill(), false)
})

test('create timeoutMs 3 s: sandbox is killed at its end time', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 3_000 })
  assert.equal(await sbx.isRunning(), true)
  const t0 = Date.now()
  await waitFor(async () => (await sbx.isRunning()) === false, { timeoutMs: 15_000, intervalMs: 250, what: 'isRunning() false after the 3 s timeout' })
  assert.ok(Date.now() - t0 >= 1_000, 'sandbox vanished long before its timeout')
  await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
  const listed = await listAll({ query: { state: ['running', 'paused'] } })
  assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId), 'timed-out sandbox is still listed')
})

test('list: metadata filter (AND of pairs) and state filter', async (t) => {
  const tag = uniqueTag()
  const a = await createSandbox(t, { metadata: { tag, role: 'a', 'odd key': 'v=1&x' } })
  const b = await createSandbox(t, { metadata: { tag, role: 'b' } })

  const both = await listAll({ query: { metadata: { tag } } })
  assert.deepEqual(both.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())
  for (const s of both) {
    assert.equal(s.state, 'running')
    assert.equal(s.name, 'base')
    assert.equal(s.metadata.tag, tag)
    assert.ok(s.startedAt < s.endAt)
    assert.ok(s.cpuCount > 0 && s.memoryMB > 0)
  }

  const onlyA = await listAll({ query: { metadata: { tag, role: 'a' } } })
  assert.deepEqual(onlyA.map((s) => s.sandboxId), [a.sandboxId])
  assert.deepEqual(onlyA[0].metadata, { tag, role: 'a', 'odd key': 'v=1&x' })

  const none = await listAll({ query: { metadata: { tag, role: 'c' } } })
  assert.deepEqual(none, [])

  const running = await listAll({ query: { metadata: { tag }, state: ['running'] } })
  assert.equal(running.length, 2)
  const paused = await listAll({ query: { metadata: { tag }, state: ['paused'] } })
  assert.deepEqual(paused, [])

  await b.kill()
  const afterKill = await listAll({ query: { metadata: { tag } } })
  assert.deepEqual(afterKill.map((s) => s.sandboxId), [a.sandboxId], 'killed sandbox still listed')

  // the SDK encodes keys and values itself, then as a query string, then as a
  // URL parameter: the server decodes all three levels (E2B: url.ParseQuery +
  // url.QueryUnescape of each key and value)
  const special = await listAll({ query: { metadata: { tag, 'odd key': 'v=1&x' } } })
  assert.deepEqual(special.map((s) => s.sandboxId), [a.sandboxId], 'metadata with = & and space must round-trip through the filter')
})

test('list: limit + X-Next-Token pagination and order', async (t) => {
  const tag = uniqueTag()
  const ids = []
  for (let i = 0; i < 3; i++) {
    ids.push((await createSandbox(t, { metadata: { tag, n: String(i) } })).sandboxId)
  }
  const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 2, order: 'asc' })
  assert.equal(pager.hasNext, true)
  const page1 = await pager.nextItems()
  assert.equal(page1.length, 2, `first page should hold 2, got ${page1.length}`)
  assert.equal(pager.hasNext, true, 'hasNext should be true after a full first page of 3 items')
  assert.ok(pager.nextToken, 'nextToken missing')
  const page2 = await pager.nextItems()
  assert.equal(page2.length, 1, `second page should hold 1, got ${page2.length}`)
  assert.equal(pager.hasNext, false)
  const seen = [...page1, ...page2].map((s) => s.sandboxId)
  assert.equal(new Set(seen).size, 3, 'pages overlap')
  assert.deepEqual([...seen].sort(), [...ids].sort())
  const asc = [...page1, ...page2].map((s) => s.startedAt.getTime())
  assert.deepEqual(asc, [...asc].sort((x, y) => x - y), 'order asc not respected across pages')

  const desc = await listAll({ query: { metadata: { tag } }, order: 'desc' })
  const dt = desc.map((s) => s.startedAt.getTime())
  assert.deepEqual(dt, [...dt].sort((x, y) => y - x), 'order desc not respected')

  // startedAfter is inclusive
  const first = [...page1, ...page2][0]
  const after = await listAll({ query: { metadata: { tag }, startedAfter: first.startedAt } })
  assert.equal(after.length, 3, 'startedAfter must be inclusive')
  const future = await listAll({ query: { metadata: { tag }, startedAfter: new Date(Date.now() + 3_600_000) } })
  assert.deepEqual(future, [])

  // template filter: by name and by id
  const byName = await listAll({ query: { metadata: { tag }, template: 'base' } })
  assert.equal(byName.length, 3, 'template filter "base" (the name) must match')
  const byId = await listAll({ query: { metadata: { tag }, template: byName[0].templateId } })
  assert.equal(byId.length, 3, `template filter "${byName[0].templateId}" (the id) must match`)
  assert.deepEqual(await listAll({ query: { metadata: { tag }, template: 'no-such-template' } }), [])

  // a nextToken can be fed to a fresh paginator
  const p2 = Sandbox.list({ query: { metadata: { tag } }, limit: 2, order: 'asc' })
  await p2.nextItems()
  const resumed = await Sandbox.list({ query: { metadata: { tag } }, limit: 2, order: 'asc', nextToken: p2.nextToken }).nextItems()
  assert.deepEqual(resumed.map((s) => s.sandboxId), page2.map((s) => s.sandboxId))
})

test('getMetrics returns real samples', async (t) => {
  const sbx = await createSandbox(t)
  // some load so cpu/mem are not all zero
  await sbx.commands.run('head -c 20000000 /dev/urandom | sha256sum >/dev/null; dd if=/dev/zero of=/home/user/m bs=1M count=8 2>/dev/null')
  const metrics = await waitFor(async () => {
    const m = await sbx.getMetrics()
    return m.length > 0 ? m : null
  }, { timeoutMs: 15_000, intervalMs: 500, what: 'a metrics sample' })
  const m = metrics[metrics.length - 1]
  assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), `timestamp ${m.timestamp}`)
  assert.ok(Math.abs(m.timestamp.getTime() - Date.now()) < 120_000, `timestamp ${m.timestamp.toISOString()} is not recent`)
  assert.ok(m.cpuCount > 0, `cpuCount ${m.cpuCount}`)
  assert.equal(typeof m.cpuUsedPct, 'number')
  assert.ok(m.cpuUsedPct >= 0, `cpuUsedPct ${m.cpuUsedPct}`)
  assert.ok(m.memTotal > 0, `memTotal ${m.memTotal}`)
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed} of ${m.memTotal}`)
  assert.ok(m.diskTotal > 0, `diskTotal ${m.diskTotal}`)
  assert.ok(m.diskUsed >= 0 && m.diskUsed <= m.diskTotal, `diskUsed ${m.diskUsed} of ${m.diskTotal}`)

  const stat = await Sandbox.getMetrics(sbx.sandboxId)
  assert.ok(stat.length > 0)
  // a range that ends before the sandbox existed is empty
  const old = await sbx.getMetrics({ start: new Date(Date.now() - 7_200_000), end: new Date(Date.now() - 3_600_000) })
  assert.deepEqual(old, [])
})

test('a bad API key gives AuthenticationError', async () => {
  const apiKey = 'e2b_' + '0'.repeat(40)
  assert.notEqual(apiKey, env.apiKey)
  await assert.rejects(Sandbox.create({ apiKey }), AuthenticationError)
  await assert.rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError)
  await assert.rejects(Sandbox.getInfo(unknownSandboxId(), { apiKey }), AuthenticationError)
  await assert.rejects(Sandbox.create({ apiKey: 'not-even-a-key' }), AuthenticationError)
})

test('unknown sandbox ids: SandboxNotFoundError / kill false', async () => {
  const id = unknownSandboxId()
  await assert.rejects(Sandbox.getInfo(id), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout(id, 10_000), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(id), SandboxNotFoundError)
  await assert.rejects(Sandbox.getMetrics(id), SandboxNotFoundError)
  await assert.rejects(Sandbox.pause(id), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(id), false)
  // ids of the wrong shape are just as unknown
  await assert.rejects(Sandbox.getInfo('../../etc'), (e) => e instanceof SandboxError, 'bad id must not succeed')
})

test('a second team cannot see, kill, connect to, time out or list the first team\'s sandbox', async (t) => {
  const otherKey = createTeamKey('other-' + uniqueTag(), 'conformance second team')
  assert.match(otherKey, /^e2b_[0-9a-f]{40}$/)
  assert.notEqual(otherKey, env.apiKey)
  const tag = uniqueTag()
  const mine = await createSandbox(t, { metadata: { tag } })
  const other = { apiKey: otherKey }

  await assert.rejects(Sandbox.getInfo(mine.sandboxId, other), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(mine.sandboxId, other), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout(mine.sandboxId, 1_000, other), SandboxNotFoundError)
  await assert.rejects(Sandbox.getMetrics(mine.sandboxId, other), SandboxNotFoundError)
  await assert.rejects(Sandbox.pause(mine.sandboxId, other), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(mine.sandboxId, other), false)
  assert.deepEqual(await listAll({ ...other, query: { metadata: { tag } } }), [])
  assert.ok(!(await listAll(other)).some((s) => s.sandboxId === mine.sandboxId))

  // untouched for its owner
  await sleep(1_500) // the 1 s setTimeout, had it applied
  assert.equal(await mine.isRunning(), true)
  const info = await mine.getInfo()
  assert.ok(info.endAt - Date.now() > 60_000, 'the other team shortened the timeout')

  // and the other way round
  const theirs = await createSandbox(t, { apiKey: otherKey, metadata: { tag } })
  assert.equal((await theirs.commands.run('echo theirs')).stdout, 'theirs\n')
  await assert.rejects(Sandbox.getInfo(theirs.sandboxId), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(theirs.sandboxId), false)
  const mineListed = await listAll({ query: { metadata: { tag } } })
  assert.deepEqual(mineListed.map((s) => s.sandboxId), [mine.sandboxId])
  const theirsListed = await listAll({ ...other, query: { metadata: { tag } } })
  assert.deepEqual(theirsListed.map((s) => s.sandboxId), [theirs.sandboxId])

  // the envd plane is guarded by the sandbox's own token: a connect by the other
  // team gets no token, so it cannot reach the first sandbox's files
  assert.equal(await Sandbox.kill(theirs.sandboxId, other), true)
})

test('hutch key revoke: the revoked key is refused with AuthenticationError', async (t) => {
  const label = 'revoke-me-' + uniqueTag()
  const key = createTeamKey('other-' + uniqueTag(), label)
  const sbx = await createSandbox(t, { apiKey: key })
  assert.equal((await Sandbox.getInfo(sbx.sandboxId, { apiKey: key })).sandboxId, sbx.sandboxId)
  assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: key }), true)

  const listing = hutch(['key', 'list', '--data-dir', env.dataDir])
  const line = listing.split('\n').find((l) => l.includes(label))
  assert.ok(line, `hutch key list does not show the label ${label}:\n${listing}`)
  // the key id is the first field of the line (JSON lines: its "id")
  let keyId
  try { keyId = JSON.parse(line).id } catch { keyId = line.trim().split(/\s+/)[0] }
  assert.ok(keyId, `no key id in: ${line}`)
  assert.ok(!line.includes(key), 'hutch key list prints the secret key itself')
  hutch(['key', 'revoke', '--data-dir', env.dataDir, String(keyId)])
  await waitFor(async () => {
    try {
      await Sandbox.list({ apiKey: key }).nextItems()
      return false
    } catch (e) {
      if (e instanceof AuthenticationError) return true
      throw new Error(errName(e))
    }
  }, { timeoutMs: 5_000, what: 'the revoked key to be refused with AuthenticationError' })
  await assert.rejects(Sandbox.create({ apiKey: key }), AuthenticationError)
  // the main key still works
  assert.ok(Array.isArray(await Sandbox.list().nextItems()))
})
