// Process behaviours the upstream E2B JS SDK suite relies on
// (tests/sandbox/commands/*, tests/sandbox/pty/*), in our own words:
// connect/kill/list by pid, scoped envs, text round trips, timeouts,
// sandbox killed mid-run, stdin variants, pty create/connect/resize/kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, TimeoutError } from 'e2b'
import { createSandbox, errName, sleep, textCollector, waitFor, notOnGvisor } from './helpers.mjs'

let shared
async function sandbox() {
  if (!shared) shared = await Sandbox.create({ timeoutMs: 600_000 })
  return shared
}
test.after(async () => { if (shared) await shared.kill().catch(() => {}) })

// ---------------------------------------------------------------- connect, kill, list

test('commands.connect to a background process returns a handle with that pid', async () => {
  const sbx = await sandbox()
  const bg = await sbx.commands.run('sleep 10', { background: true })
  const h = await sbx.commands.connect(bg.pid)
  assert.equal(typeof h, 'object')
  assert.equal(h.pid, bg.pid)
  await bg.kill()
})

test('commands.connect to pid 999999 rejects', async () => {
  const sbx = await sandbox()
  await assert.rejects(sbx.commands.connect(999999))
})

test('commands.kill ends the process: kill -0 on its pid then fails', async () => {
  const sbx = await sandbox()
  const bg = await sbx.commands.run('sleep 10', { background: true })
  assert.equal(await sbx.commands.kill(bg.pid), true)
  await assert.rejects(sbx.commands.run(`kill -0 ${bg.pid}`), (e) => {
    assert.ok(e instanceof CommandExitError, errName(e))
    return true
  })
})

test('commands.kill of pid 999999 resolves false', async () => {
  const sbx = await sandbox()
  assert.equal(await sbx.commands.kill(999999), false)
})

test('commands.list shows at least two background sleeps, each with a pid', async () => {
  const sbx = await sandbox()
  const a = await sbx.commands.run('sleep 10', { background: true })
  const b = await sbx.commands.run('sleep 10', { background: true })
  const ps = await sbx.commands.list()
  assert.ok(Array.isArray(ps))
  assert.ok(ps.length >= 2)
  for (const p of ps) assert.ok('pid' in p, JSON.stringify(p))
  const pids = ps.map((p) => p.pid)
  assert.ok(pids.includes(a.pid) && pids.includes(b.pid))
  await a.kill(); await b.kill()
})

// ---------------------------------------------------------------- envs

test('create-level env FOO reaches commands', async (t) => {
  const sbx = await createSandbox(t, { envs: { FOO: 'bar' } })
  const r = await sbx.commands.run('echo $FOO')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout.trim(), 'bar')
})

test('command-scoped env is visible to that command only (not to a later sudo)', notOnGvisor('runsc sets no_new_privs on every task: sudo refuses'), async () => {
  const sbx = await sandbox()
  const r = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })
  assert.equal(r.stdout.trim(), 'bar')
  const r2 = await sbx.commands.run('sudo echo "$FOO"')
  assert.equal(r2.exitCode, 0)
  assert.equal(r2.stdout.trim(), '')
})

test('command-scoped env reaches python3', async () => {
  const sbx = await sandbox()
  const r = await sbx.commands.run('python3 -c "import os; print(os.environ[\'FOO\'])"', { envs: { FOO: 'bar' } })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout.trim(), 'bar')
})

// ---------------------------------------------------------------- run

for (const [name, text] of [['plain', 'Hello, World!'], ['special characters', '!@#$%^&*()_+'], ['multiline', 'Hello,\nWorld!']]) {
  test(`run echo of ${name} text round-trips`, async () => {
    const sbx = await sandbox()
    const r = await sbx.commands.run(`echo "${text}"`)
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, `${text}\n`)
  })
}

test('run within timeoutMs 4000 succeeds', async () => {
  const sbx = await sandbox()
  const r = await sbx.commands.run('echo "Hello, World!"', { timeoutMs: 4000 })
  assert.equal(r.exitCode, 0)
})

test('run sleep 10 with timeoutMs 1000 rejects', async () => {
  const sbx = await sandbox()
  await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 1000 }))
})

test('background sleep 10 with timeoutMs 2000: wait() throws TimeoutError', async () => {
  const sbx = await sandbox()
  const h = await sbx.commands.run('sleep 10', { timeoutMs: 2000, background: true })
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, errName(e))
    return true
  })
})

test('killing the sandbox under a background command: TimeoutError saying it was killed', async (t) => {
  const sbx = await createSandbox(t)
  const h = await sbx.commands.run('sleep 60', { background: true })
  await sbx.kill()
  const err = await h.wait().then(() => undefined, (e) => e)
  assert.ok(err instanceof TimeoutError, `expected TimeoutError, got ${errName(err)}`)
  assert.ok(err.message.includes('sandbox was killed or reached its end of life'), `message: ${err.message}`)
})

// ---------------------------------------------------------------- stdin

async function catWith(sbx, send, expected) {
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await send(h)
  for (let i = 0; i < 5 && h.stdout !== expected; i++) await sleep(500)
  await h.kill()
  return h.stdout
}

for (const [name, text] of [['text', 'Hello, World!'], ['special characters', '!@#$%^&*()_+'], ['multiline', 'Hello,\nWorld!']]) {
  test(`commands.sendStdin(pid, ${name}) is echoed by cat`, async () => {
    const sbx = await sandbox()
    assert.equal(await catWith(sbx, (h) => sbx.commands.sendStdin(h.pid, text), text), text)
  })
}

test('commands.sendStdin with a Uint8Array', async () => {
  const sbx = await sandbox()
  const text = 'Hello, World!'
  assert.equal(await catWith(sbx, (h) => sbx.commands.sendStdin(h.pid, new TextEncoder().encode(text)), text), text)
})

test('handle.sendStdin', async () => {
  const sbx = await sandbox()
  const text = 'Hello, World!'
  assert.equal(await catWith(sbx, (h) => h.sendStdin(text), text), text)
})

test('handle.closeStdin: cat exits 0 with what it was sent', async () => {
  const sbx = await sandbox()
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await h.sendStdin('Hello, World!')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'Hello, World!')
})

test('sending empty stdin is accepted', async () => {
  const sbx = await sandbox()
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, '')
  await h.kill()
  assert.equal(h.stdout, '')
})

// ---------------------------------------------------------------- pty

test('pty.kill returns true and the pty process is gone', async () => {
  const sbx = await sandbox()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sbx.pty.kill(term.pid), true)
  await assert.rejects(sbx.commands.run(`kill -0 ${term.pid}`), (e) => {
    assert.ok(e instanceof CommandExitError, errName(e))
    return true
  })
})

test('pty.kill of pid 999999 resolves false', async () => {
  const sbx = await sandbox()
  assert.equal(await sbx.pty.kill(999999), false)
})

test('pty disconnect, then pty.connect gets later output and the exit code', async () => {
  const sbx = await sandbox()
  const out1 = textCollector()
  const out2 = textCollector()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: out1.onData, envs: { FOO: 'bar' } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $FOO\n'))
  // the first answer arrives before the disconnect (a fixed 300 ms was too
  // short for a login shell on gvisor under load)
  await waitFor(() => out1.text.includes('bar'), { what: 'the first echo before the disconnect' })
  await term.disconnect()
  const again = await sbx.pty.connect(term.pid, { onData: out2.onData })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $FOO\nexit\n'))
  await again.wait()
  assert.equal(again.pid, term.pid)
  assert.equal(again.exitCode, 0)
  assert.ok(out1.text.includes('bar'), JSON.stringify(out1.text))
  assert.ok(out2.text.includes('bar'), JSON.stringify(out2.text))
})

test('pty.create with envs, echo and exit', async () => {
  const sbx = await sandbox()
  const out = textCollector()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData, envs: { ABC: '123' } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $ABC\nexit\n'))
  await term.wait()
  assert.equal(term.exitCode, 0)
  assert.ok(out.text.includes('123'), JSON.stringify(out.text))
})

test('pty `tput cols` reports 80, and 100 after resize', async () => {
  const sbx = await sandbox()
  const out = textCollector()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('tput cols\nexit\n'))
  await term.wait()
  assert.equal(term.exitCode, 0)
  assert.match(out.text, /\b80\b/)
  const out2 = textCollector()
  const term2 = await sbx.pty.create({ cols: 80, rows: 24, onData: out2.onData })
  await sbx.pty.resize(term2.pid, { cols: 100, rows: 24 })
  await sbx.pty.sendInput(term2.pid, new TextEncoder().encode('tput cols\nexit\n'))
  await term2.wait()
  assert.equal(term2.exitCode, 0)
  assert.match(out2.text, /\b100\b/)
})

test('pty `exit` ends with exit code 0', async () => {
  const sbx = await sandbox()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => null })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit\n'))
  await term.wait()
  assert.equal(term.exitCode, 0)
})

// ---------------------------------------------------------------- default env vars (commands/envVars)

test('E2B_SANDBOX=true and E2B_SANDBOX_ID=<id> in the environment and under /run/e2b', async () => {
  const sbx = await sandbox()
  const a = await sbx.commands.run('echo "$E2B_SANDBOX"')
  assert.equal(a.stdout.trim(), 'true')
  const b = await sbx.commands.run('echo "$E2B_SANDBOX_ID"')
  assert.equal(b.stdout.trim(), sbx.sandboxId.split('-')[0])
  const c = await sbx.commands.run('cat /run/e2b/.E2B_SANDBOX')
  assert.equal(c.stdout.trim(), 'true')
  const d = await sbx.commands.run('cat /run/e2b/.E2B_SANDBOX_ID')
  assert.equal(d.stdout.trim(), sbx.sandboxId.split('-')[0])
})
