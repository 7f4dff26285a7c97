// PTY sessions: real window sizes, resize, input, exit, kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { createSandbox, errName, textCollector, waitFor, notOnGvisor } from './helpers.mjs'

const enc = (s) => new TextEncoder().encode(s)

test('pty: size 80x24, resize to 100x30, a real tty, exit ends the session', notOnGvisor('the pty of this runsc does not raise SIGINT for Ctrl-C'), async (t) => {
  const sbx = await createSandbox(t)
  const out = textCollector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData, timeoutMs: 60_000 })
  assert.ok(Number.isInteger(h.pid) && h.pid > 0)

  // the pty process is listed
  const procs = await sbx.commands.list()
  const p = procs.find((x) => x.pid === h.pid)
  assert.ok(p, `pty pid ${h.pid} not listed: ${JSON.stringify(procs)}`)
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args, ['-i', '-l'])

  await sbx.pty.sendInput(h.pid, enc('stty size; echo "S=$((6*7))"\n'))
  await waitFor(() => /24 80\r?\n/.test(out.text) && out.text.includes('S=42'), { timeoutMs: 10_000, what: `"24 80" in pty output ${JSON.stringify(out.text.slice(-300))}` })

  await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(h.pid, enc('stty size; echo "R=$((7*7))"\n'))
  await waitFor(() => /30 100\r?\n/.test(out.text) && out.text.includes('R=49'), { timeoutMs: 10_000, what: `"30 100" in pty output ${JSON.stringify(out.text.slice(-300))}` })

  await sbx.pty.sendInput(h.pid, enc('tty; echo "T=$TERM"; whoami\n'))
  await waitFor(() => /\/dev\/pts\/\d+/.test(out.text) && out.text.includes('T=xterm-256color') && /\buser\r?\n/.test(out.text),
    { timeoutMs: 10_000, what: `tty, TERM and whoami in pty output ${JSON.stringify(out.text.slice(-300))}` })

  // the line discipline works: Ctrl-C interrupts a foreground sleep
  await sbx.pty.sendInput(h.pid, enc('sleep 30\n'))
  await new Promise((r) => setTimeout(r, 500))
  await sbx.pty.sendInput(h.pid, enc('\x03'))
  await sbx.pty.sendInput(h.pid, enc('echo "after $((40+2))"\n'))
  await waitFor(() => out.text.includes('after 42'), { timeoutMs: 10_000, what: 'Ctrl-C to interrupt sleep 30' })

  await sbx.pty.sendInput(h.pid, enc('exit\n'))
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  await waitFor(async () => !(await sbx.commands.list()).some((x) => x.pid === h.pid), { timeoutMs: 5_000, what: 'pty pid to leave the list' })
})

test('pty: kill ends the session; a second kill returns false', async (t) => {
  const sbx = await createSandbox(t)
  const out = textCollector()
  const h = await sbx.pty.create({ cols: 120, rows: 40, onData: out.onData, user: 'root', cwd: '/tmp', envs: { PTYVAR: 'pv' } })
  await sbx.pty.sendInput(h.pid, enc('echo "$(whoami):$(pwd):$PTYVAR"; stty size\n'))
  await waitFor(() => out.text.includes('root:/tmp:pv') && /40 120\r?\n/.test(out.text), { timeoutMs: 10_000, what: `root:/tmp:pv in ${JSON.stringify(out.text.slice(-300))}` })
  assert.equal(await sbx.pty.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, errName(e))
    assert.equal(e.exitCode, -1)
    return true
  })
  assert.equal(await sbx.pty.kill(h.pid), false)
})

test('pty: output through a non-default exit code', async (t) => {
  const sbx = await createSandbox(t)
  const out = textCollector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData })
  await sbx.pty.sendInput(h.pid, enc('exit 5\n'))
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5)
})
