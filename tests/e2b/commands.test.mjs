// process.Process through sbx.commands: run, streams, exit codes, envs, cwd,
// users, background commands, stdin, connect, kill, timeouts, large output.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox,
  AuthenticationError,
  CommandExitError,
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  TimeoutError,
} from 'e2b'
import { createSandbox, errName, restartDaemon, sha256, sleep, waitFor, notOnGvisor } from './helpers.mjs'

// One sandbox for the cheap tests; tests that damage it create their own.
let shared
async function sandbox(t) {
  if (!shared) {
    shared = await Sandbox.create({ envs: { GLOBAL_VAR: 'from-create', OVERRIDE_ME: 'create' }, timeoutMs: 600_000 })
  }
  return shared
}
test.after(async () => { if (shared) await shared.kill().catch(() => {}) })

test('run echo', async (t) => {
  const sbx = await sandbox(t)
  const r = await sbx.commands.run('echo hello')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, '')
  assert.equal(r.error, undefined)
})

test('stdout and stderr are kept apart', async (t) => {
  const sbx = await sandbox(t)
  const r = await sbx.commands.run('echo out; echo err 1>&2; echo out2')
  assert.equal(r.stdout, 'out\nout2\n')
  assert.equal(r.stderr, 'err\n')
})

test('exit code 3 -> CommandExitError with exitCode, stdout, stderr, error', async (t) => {
  const sbx = await sandbox(t)
  await assert.rejects(sbx.commands.run('echo out; echo err 1>&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, errName(e))
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'out\n')
    assert.equal(e.stderr, 'err\n')
    assert.equal(e.error, 'exit status 3')
    return true
  })
  // a missing command is exit 127 from bash
  await assert.rejects(sbx.commands.run('no-such-command-xyz'), (e) => e instanceof CommandExitError && e.exitCode === 127 && /not found/.test(e.stderr))
})

test('envs: create-level envVars, per-command envs override them', async (t) => {
  const sbx = await sandbox(t)
  const r = await sbx.commands.run('printf "%s|%s|%s" "$GLOBAL_VAR" "$OVERRIDE_ME" "$LOCAL_VAR"', {
    envs: { OVERRIDE_ME: 'command', LOCAL_VAR: 'x=1 y' },
  })
  assert.equal(r.stdout, 'from-create|command|x=1 y')
  // per-command envs do not leak into the next command
  const r2 = await sbx.commands.run('printf "%s|%s" "$OVERRIDE_ME" "${LOCAL_VAR-unset}"')
  assert.equal(r2.stdout, 'create|unset')
  // PATH, HOME, USER are set
  const r3 = await sbx.commands.run('printf "%s|%s|%s" "$HOME" "$USER" "$(command -v python3)"')
  const [home, user, py] = r3.stdout.split('|')
  assert.equal(home, '/home/user')
  assert.equal(user, 'user')
  assert.match(py, /python3$/)
  // what E2B's sandboxes tell their processes about themselves
  const r4 = await sbx.commands.run('printf "%s|%s|%s" "$E2B_SANDBOX" "$E2B_SANDBOX_ID" "$E2B_TEMPLATE_ID"')
  // the template's id as getInfo says it: host (base is its alias), or the
  // built base's (`hutch template base`)
  const { templateId } = await sbx.getInfo()
  assert.ok(['host', 'base'].includes(templateId), templateId)
  assert.equal(r4.stdout, `true|${sbx.sandboxId}|${templateId}`)
  // and the same in files, readable by the user, owned by root
  const r5 = await sbx.commands.run('cat /run/e2b/.E2B_SANDBOX; echo; cat /run/e2b/.E2B_SANDBOX_ID; echo; stat -c %U /run/e2b/.E2B_SANDBOX_ID')
  assert.equal(r5.stdout, `true\n${sbx.sandboxId}\nroot\n`)
})

test('long commands: a 100 KB inline script and a 64 KiB env value run, are listed after a daemon restart, past the kernel bound -> InvalidArgumentError naming it', async (t) => {
  // The init protocol's frame holds 60 KiB and a field 4 KiB: longer command
  // lines go ahead in staged parts, up to execve's own bounds.
  const sbx = await createSandbox(t)
  const payload = 'x'.repeat(100_000)
  const r = await sbx.commands.run(`s='${payload}'; printf %s "$s" | wc -c; printf %s "$BIG" | wc -c`,
    { envs: { BIG: 'y'.repeat(64 * 1024) } })
  assert.equal(r.stdout, '100000\n65536\n')
  // listed (and, after a daemon restart, found again: init's listing cuts
  // long strings to a field, and that is not an error)
  const h = await sbx.commands.run(`sleep 60 # ${payload}`, { background: true })
  const mine = (await sbx.commands.list()).find((p) => p.pid === h.pid)
  assert.ok(mine, 'the long command is listed')
  assert.ok(mine.args.join(' ').startsWith('-l -c sleep 60 # xxx'), mine.args.join(' ').slice(0, 40))
  await restartDaemon()
  const again = (await sbx.commands.list()).find((p) => p.pid === h.pid)
  assert.ok(again && again.args.join(' ').startsWith('-l -c sleep 60 # xxx'), 're-adopted with its (cut) command line')
  await sbx.commands.kill(h.pid)
  await assert.rejects(sbx.commands.run(`echo ${'z'.repeat(140_000)}`),
    (e) => e instanceof InvalidArgumentError && /is 140005 bytes: at most 131071/.test(e.message), 'one argument past MAX_ARG_STRLEN')
  await assert.rejects(sbx.commands.run('true', { envs: Object.fromEntries([...Array(20)].map((_, i) => [`V${i}`, 'v'.repeat(120_000)])) }),
    (e) => e instanceof InvalidArgumentError && /at most 2097152/.test(e.message), 'argv and env past ARG_MAX')
  assert.equal((await sbx.commands.run('echo still fine')).stdout, 'still fine\n')
})

test('cwd: explicit, default (home of the user), missing -> InvalidArgumentError', async (t) => {
  const sbx = await sandbox(t)
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout, '/root\n')
  await assert.rejects(sbx.commands.run('pwd', { cwd: '/does/not/exist' }), (e) => e instanceof InvalidArgumentError, 'missing cwd must be invalid_argument')
})

test('users: default user, root, sudo', notOnGvisor('runsc sets no_new_privs on every task: sudo refuses'), async (t) => {
  const sbx = await sandbox(t)
  const def = await sbx.commands.run('whoami; id -u; echo $HOME')
  const [name, uid, home] = def.stdout.trim().split('\n')
  assert.equal(name, 'user')
  assert.notEqual(uid, '0')
  assert.equal(home, '/home/user')
  assert.equal((await sbx.commands.run('whoami; id -u', { user: 'root' })).stdout, 'root\n0\n')
  assert.equal((await sbx.commands.run('echo $HOME', { user: 'root' })).stdout, '/root\n')
  assert.equal((await sbx.commands.run('sudo -n whoami')).stdout, 'root\n')
  // files created by the default user belong to it
  await sbx.commands.run('touch /tmp/by-user')
  assert.equal((await sbx.commands.run('stat -c %U:%G /tmp/by-user')).stdout, 'user:user\n')
  // unknown user: envd answers unauthenticated -> AuthenticationError
  await assert.rejects(sbx.commands.run('whoami', { user: 'nobody-such-user' }), AuthenticationError)
})

test('onStdout/onStderr stream data before the command ends', async (t) => {
  const sbx = await sandbox(t)
  const out = []
  const err = []
  let firstAt = 0
  const t0 = Date.now()
  const r = await sbx.commands.run('echo first; echo efirst >&2; sleep 2; echo second; echo esecond >&2', {
    onStdout: (d) => { if (!firstAt) firstAt = Date.now(); out.push(d) },
    onStderr: (d) => err.push(d),
  })
  const end = Date.now()
  assert.equal(out.join(''), 'first\nsecond\n')
  assert.equal(err.join(''), 'efirst\nesecond\n')
  assert.equal(r.stdout, 'first\nsecond\n')
  assert.ok(firstAt - t0 < 1_500, `first stdout chunk came ${firstAt - t0} ms after start: output is not streamed`)
  assert.ok(end - firstAt >= 1_500, 'first chunk was delivered only at the end')
})

test('output with multi-byte UTF-8 split across chunks', async (t) => {
  const sbx = await sandbox(t)
  // 9-byte unit written 7 bytes at a time: most writes end inside a character
  const r = await sbx.commands.run(`python3 -c 'import os, time
b = "\\u00e9\\u20ac\\U0001F600".encode("utf-8") * 3000
for i in range(0, len(b), 7):
    os.write(1, b[i:i+7])
    if i % 700 == 0: time.sleep(0.001)'`)
  assert.equal(r.stdout, '\u00e9\u20ac\u{1F600}'.repeat(3000))
})

test('background command: list shows it with cmd/args, sendStdin, kill -> wait throws', async (t) => {
  const sbx = await sandbox(t)
  const chunks = []
  const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => chunks.push(d) })
  assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
  const procs = await sbx.commands.list()
  const p = procs.find((x) => x.pid === h.pid)
  assert.ok(p, `pid ${h.pid} not in list: ${JSON.stringify(procs)}`)
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args, ['-l', '-c', 'cat'])

  await h.sendStdin('abc\n')
  await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('def\n'))
  await waitFor(() => chunks.join('') === 'abc\ndef\n', { timeoutMs: 5_000, what: 'cat to echo its stdin' })

  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, errName(e))
    assert.equal(e.exitCode, -1)
    assert.match(e.error ?? '', /killed/)
    assert.equal(e.stdout, 'abc\ndef\n')
    return true
  })
  await waitFor(async () => !(await sbx.commands.list()).some((x) => x.pid === h.pid), { timeoutMs: 5_000, what: 'killed pid to leave the list' })
})

test('commands.connect(pid) re-attaches and receives later output', async (t) => {
  const sbx = await sandbox(t)
  const h = await sbx.commands.run('for i in $(seq 1 15); do echo tick$i; sleep 0.2; done', { background: true })
  await sleep(500)
  await h.disconnect()
  await sleep(500)
  const later = []
  const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => later.push(d) })
  assert.equal(h2.pid, h.pid)
  const r = await h2.wait()
  assert.equal(r.exitCode, 0)
  const text = later.join('')
  assert.match(text, /tick15\n$/, `re-attached output: ${JSON.stringify(text)}`)
  assert.ok(!text.startsWith('tick1\n'), 'connect replayed the output from before the re-attach; expected only later output')
  assert.equal(r.stdout, text)
})

test('commands.connect to an unknown pid -> NotFoundError; kill unknown pid -> false', async (t) => {
  const sbx = await sandbox(t)
  await assert.rejects(sbx.commands.connect(999_999), (e) => e instanceof NotFoundError, 'connect to unknown pid')
  assert.equal(await sbx.commands.kill(999_999), false)
  await assert.rejects(sbx.commands.sendStdin(999_999, 'x'), (e) => e instanceof SandboxError)
})

test('timeoutMs: run("sleep 10", {timeoutMs: 1000}) -> TimeoutError and the process is killed', async (t) => {
  const sbx = await sandbox(t)
  const t0 = Date.now()
  await assert.rejects(sbx.commands.run('sleep 10; echo never', { timeoutMs: 1_000 }), (e) => e instanceof TimeoutError, 'expected TimeoutError')
  assert.ok(Date.now() - t0 < 5_000, `took ${Date.now() - t0} ms`)
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.args?.[2]?.startsWith('sleep 10')),
    { timeoutMs: 5_000, what: 'the timed-out process to leave commands.list()' })
  const ps = await sbx.commands.run('pgrep -f "^sleep 10$" || true')
  assert.equal(ps.stdout, '', 'sleep 10 still running in the sandbox')
})

test('timeoutMs also kills background commands (Connect-Timeout-Ms)', async (t) => {
  const sbx = await sandbox(t)
  const h = await sbx.commands.run('sleep 30', { background: true, timeoutMs: 1_500 })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  await assert.rejects(h.wait(), (e) => e instanceof TimeoutError || e instanceof CommandExitError, 'wait() must fail')
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid),
    { timeoutMs: 6_000, what: 'the background process to be killed at its timeout' })
})

test('timeoutMs: 0 means no deadline', async (t) => {
  const sbx = await sandbox(t)
  const r = await sbx.commands.run('sleep 1.2; echo done', { timeoutMs: 0 })
  assert.equal(r.stdout, 'done\n')
})

test('5 MB of output arrives intact', async (t) => {
  const sbx = await sandbox(t)
  const lines = 625_000 // 8 bytes a line
  const r = await sbx.commands.run(`seq -f '%07g' 0 ${lines - 1}`, { timeoutMs: 120_000 })
  let expected = ''
  for (let i = 0; i < lines; i++) expected += String(i).padStart(7, '0') + '\n'
  assert.equal(r.stdout.length, 5_000_000)
  assert.equal(sha256(r.stdout), sha256(expected))
  // and on stderr at the same time
  const r2 = await sbx.commands.run('head -c 3000000 /dev/zero | tr "\\0" e >&2; head -c 2000000 /dev/zero | tr "\\0" o', { timeoutMs: 120_000 })
  assert.equal(r2.stderr.length, 3_000_000)
  assert.equal(r2.stdout.length, 2_000_000)
  assert.ok(/^e+$/.test(r2.stderr) && /^o+$/.test(r2.stdout))
})

test('stdin: sendStdin + closeStdin gives cat EOF; without stdin cat reads /dev/null', async (t) => {
  const sbx = await sandbox(t)
  const h = await sbx.commands.run('cat; echo "[eof]"', { background: true, stdin: true })
  await h.sendStdin('hello\n')
  await h.sendStdin('world\n')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\nworld\n[eof]\n')

  const h2 = await sbx.commands.run('wc -c', { background: true, stdin: true })
  await sbx.commands.sendStdin(h2.pid, new Uint8Array(100_000).fill(65))
  await sbx.commands.closeStdin(h2.pid)
  assert.equal((await h2.wait()).stdout.trim(), '100000')

  const t0 = Date.now()
  const r3 = await sbx.commands.run('cat; echo rc=$?', { timeoutMs: 10_000 })
  assert.equal(r3.stdout, 'rc=0\n')
  assert.ok(Date.now() - t0 < 5_000, 'cat without stdin blocked')
})

test('many concurrent commands', async (t) => {
  const sbx = await sandbox(t)
  const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => sbx.commands.run(`sleep 0.3; echo ${i}`)))
  assert.deepEqual(rs.map((r) => r.stdout), Array.from({ length: 20 }, (_, i) => `${i}\n`))
})

test('killing the sandbox during run rejects the pending run with TimeoutError', async (t) => {
  const sbx = await createSandbox(t)
  const started = []
  const p = sbx.commands.run('echo started; sleep 30', { onStdout: (d) => started.push(d) })
  p.catch(() => {})
  await waitFor(() => started.join('').includes('started'), { timeoutMs: 10_000, what: 'the command to start' })
  const t0 = Date.now()
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof TimeoutError, `expected TimeoutError (stream cut, /health 502), got ${errName(e)}`)
    return true
  })
  assert.ok(Date.now() - t0 < 10_000, `pending run rejected only after ${Date.now() - t0} ms`)
})
