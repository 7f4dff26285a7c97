// Shared helpers for the E2B SDK conformance tests. run.sh starts `hutch serve`
// and exports the variables read here; the tests only talk to the daemon through
// the stock `e2b` SDK (and plain fetch for signed URLs).
import { execFileSync, spawn } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { appendFileSync, existsSync, openSync, readFileSync, writeFileSync, closeSync } from 'node:fs'
import { join } from 'node:path'
import { Sandbox } from 'e2b'

function required(name) {
  const v = process.env[name]
  if (!v) throw new Error(`${name} is not set: run the tests through tests/e2b/run.sh`)
  return v
}

export const env = {
  get apiUrl() { return required('E2B_API_URL') },
  get sandboxUrl() { return required('E2B_SANDBOX_URL') },
  get apiKey() { return required('E2B_API_KEY') },
  get bin() { return required('HUTCH_BIN') },
  get dataDir() { return required('HUTCH_DATA_DIR') },
  get runDir() { return required('HUTCH_RUN_DIR') },
  get tmp() { return required('HUTCH_E2B_TMP') },
  get listen() { return required('HUTCH_LISTEN') },
  get log() { return required('HUTCH_SERVE_LOG') },
  get pidFile() { return required('HUTCH_SERVE_PIDFILE') },
}

/** The backend the daemon under test gives sandboxes (run.sh's HUTCH_E2B_BACKEND). */
export const backend = process.env.HUTCH_E2B_BACKEND || 'ns'

/**
 * node:test options for a test that cannot pass on the gvisor backend for a
 * documented reason (docs/gvisor.md, "Differences"): skipped there, and
 * reported as skipped with the reason; run everywhere else.
 */
export const notOnGvisor = (why) => (backend === 'gvisor' ? { skip: `gvisor: ${why}` } : {})

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** A tag unique to this run, for metadata filters. */
export function uniqueTag(prefix = 't') {
  return `${prefix}${Date.now().toString(36)}${randomBytes(4).toString('hex')}`
}

/** A syntactically valid sandbox id ([a-z0-9]{20}) that was never created. */
export function unknownSandboxId() {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789'
  let s = ''
  for (const b of randomBytes(20)) s += alphabet[b % alphabet.length]
  return s
}

export const sha256 = (buf) => createHash('sha256').update(buf).digest('hex')

/**
 * Sandbox.create() whose sandbox is killed when test `t` ends (pass or fail).
 * `opts` goes to Sandbox.create unchanged.
 */
export async function createSandbox(t, opts = {}) {
  const sbx = await Sandbox.create(opts)
  t.after(async () => {
    await Sandbox.kill(sbx.sandboxId, opts.apiKey ? { apiKey: opts.apiKey } : undefined).catch(() => {})
  })
  return sbx
}

/**
 * Poll `fn` until it returns a truthy value (returned) or the time is up (throws,
 * quoting `what` and the last value or error).
 */
export async function waitFor(fn, { timeoutMs = 10_000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs
  let last, lastErr
  for (;;) {
    try {
      last = await fn()
      lastErr = undefined
      if (last) return last
    } catch (e) {
      lastErr = e
    }
    if (Date.now() >= deadline) {
      const detail = lastErr ? `last error: ${lastErr?.constructor?.name}: ${lastErr?.message}` : `last value: ${JSON.stringify(last)}`
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (${detail})`)
    }
    await sleep(intervalMs)
  }
}

/** Run the hutch CLI (not a sandboxed command: `key create|list|revoke`). */
export function hutch(args) {
  return execFileSync(env.bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 })
}

/**
 * A key of another team (created if it does not exist). Recorded in the tmp dir
 * so that run.sh can kill that team's leftover sandboxes at the end.
 */
export function createTeamKey(team, label) {
  if (process.env.HUTCH_E2B_KEYS_FILE) {
    // behind the router (run.sh HUTCH_E2B_ROUTER): a key every node gets from
    // the keys-file, read again within a second of the change
    const key = 'e2b_' + randomBytes(20).toString('hex')
    appendFileSync(process.env.HUTCH_E2B_KEYS_FILE, `${team} ${key}\n`)
    appendFileSync(join(env.tmp, 'extra-keys'), key + '\n')
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1100)
    return key
  }
  const args = ['key', 'create', '--data-dir', env.dataDir, '--team', team]
  if (label) args.push('--label', label)
  const out = hutch(args).trim()
  const m = out.match(/e2b_[0-9a-f]{40}/)
  if (!m) throw new Error(`hutch key create printed no e2b_ key: ${JSON.stringify(out)}`)
  appendFileSync(join(env.tmp, 'extra-keys'), m[0] + '\n')
  return m[0]
}

/** PID of the daemon now serving (restartDaemon() rewrites the pid file). */
export function servePid() {
  if (existsSync(env.pidFile)) {
    const pid = Number(readFileSync(env.pidFile, 'utf8').trim())
    if (pid > 0) return pid
  }
  return Number(required('HUTCH_SERVE_PID'))
}

function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // state is the field after the ")" that closes comm
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3)
    return state !== 'Z' && state !== 'X'
  } catch {
    return false
  }
}

/** Wait until the control plane answers GET /v2/sandboxes with 200. */
export async function waitDaemonReady(timeoutMs = 30_000, pid = undefined) {
  await waitFor(async () => {
    if (pid && !alive(pid)) throw new Error(`hutch serve (pid ${pid}) exited; see ${env.log}`)
    const res = await fetch(`${env.apiUrl}/v2/sandboxes`, { headers: { 'X-API-KEY': env.apiKey } })
    await res.arrayBuffer()
    return res.status === 200
  }, { timeoutMs, intervalMs: 100, what: 'hutch serve to answer GET /v2/sandboxes with 200' })
}

/**
 * kill -9 the daemon, start it again with the same arguments (as run.sh does),
 * record its pid in the pid file and wait until it answers.
 */
export async function restartDaemon() {
  const old = servePid()
  try { process.kill(old, 'SIGKILL') } catch {}
  await waitFor(() => !alive(old), { timeoutMs: 10_000, what: `old daemon ${old} to die` })
  const log = openSync(env.log, 'a')
  appendFileSync(env.log, `\n===== restartDaemon(): killed ${old} with SIGKILL, starting again =====\n`)
  // HUTCH_E2B_ROUTER (run.sh): the process on the SDK's address is the router;
  // a new router replica takes over from the one killed (the nodes run on)
  const args = process.env.HUTCH_E2B_ROUTER_ARGS
    ? JSON.parse(process.env.HUTCH_E2B_ROUTER_ARGS)
    : ['serve', '--listen', env.listen, '--data-dir', env.dataDir, '--run-dir', env.runDir,
      '--backend', process.env.HUTCH_E2B_BACKEND || 'ns',
      ...(process.env.HUTCH_E2B_VOLUME_SIZE ? ['--volume-size', process.env.HUTCH_E2B_VOLUME_SIZE] : []),
      ...(process.env.HUTCH_E2B_SANDBOX_DOMAIN ? ['--sandbox-domain', process.env.HUTCH_E2B_SANDBOX_DOMAIN] : []),
      ...(process.env.HUTCH_E2B_DISK ? ['--disk', process.env.HUTCH_E2B_DISK] : [])]
  const child = spawn(env.bin, args, {
    detached: true,
    stdio: ['ignore', log, log],
  })
  closeSync(log)
  child.unref()
  writeFileSync(env.pidFile, `${child.pid}\n`)
  process.env.HUTCH_SERVE_PID = String(child.pid)
  await waitDaemonReady(30_000, child.pid)
  return child.pid
}

/** Collect the decoded text of a stream of Uint8Array chunks (pty output). */
export function textCollector() {
  const dec = new TextDecoder()
  const c = { text: '', onData: (d) => { c.text += dec.decode(d, { stream: true }) } }
  return c
}

/** Read a whole web ReadableStream into a Buffer. */
export async function readAll(stream) {
  const chunks = []
  for await (const chunk of stream) chunks.push(Buffer.from(chunk))
  return Buffer.concat(chunks)
}

/** Classname of an error, for assertion messages. */
export const errName = (e) => `${e?.constructor?.name}: ${e?.message}`
