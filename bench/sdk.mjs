// SDK-level benchmark of `hutch serve` (issue 3, docs/design.md §7): the stock e2b
// SDK against the daemon, with the environment set by bench/sdk.sh.
// Prints one JSON object on stdout.
import { createHash } from 'node:crypto'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

// the SDK pinned by tests/e2b's lockfile (ESM resolves from this file, not the cwd)
const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const N = +(process.env.SDK_N || 50)
const CONC = +(process.env.SDK_CONC || 10)
const RUNS = +(process.env.SDK_RUNS || 200)
const MB = +(process.env.SDK_MB || 100)
const IDLE = +(process.env.SDK_IDLE || 0)

const ms = (t) => Number(process.hrtime.bigint() - t) / 1e6
const now = () => process.hrtime.bigint()
function stats(xs) {
  const s = [...xs].sort((a, b) => a - b)
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))]
  return { n: s.length, p50: q(0.5), p99: q(0.99), min: s[0], max: s[s.length - 1] }
}

async function cycle() {
  const t = now()
  const s = await Sandbox.create()
  await s.commands.run('true')
  await s.kill()
  return ms(t)
}

const out = {}
// warm up the connection pools and page cache
for (let i = 0; i < 3; i++) await cycle()

{
  const xs = []
  for (let i = 0; i < N; i++) xs.push(await cycle())
  out.cycle_c1 = stats(xs)
}
{
  const xs = []
  let next = 0
  const total = N * 2
  const t = now()
  await Promise.all(Array.from({ length: CONC }, async () => {
    while (next < total) { next++; xs.push(await cycle()) }
  }))
  out.cycle_c10 = { ...stats(xs), concurrency: CONC, per_sec: total / (ms(t) / 1000) }
}
{
  const s = await Sandbox.create()
  for (let i = 0; i < 5; i++) await s.commands.run('true')
  const xs = []
  for (let i = 0; i < RUNS; i++) { const t = now(); await s.commands.run('true'); xs.push(ms(t)) }
  out.run_true = stats(xs)
  // what that round trip is made of: the SDK's own HTTP floor (a unary RPC)
  // and what `bash -l -c true` (the SDK's command line) costs in the sandbox
  const us = []
  for (let i = 0; i < RUNS; i++) { const t = now(); await s.files.exists('/tmp'); us.push(ms(t)) }
  out.unary = stats(us)
  const r = await s.commands.run("s=$(date +%s%N); for i in $(seq 100); do bash -l -c true; done; e=$(date +%s%N); echo $(( (e - s) / 100 ))")
  out.bash_l_in_sandbox_ms = Number(r.stdout.trim()) / 1e6

  const buf = Buffer.alloc(MB << 20)
  for (let i = 0; i < buf.length; i += 4096) buf.writeUInt32LE((i * 2654435761) >>> 0, i)
  const want = createHash('sha256').update(buf).digest('hex')
  const up = [], down = []
  for (let i = 0; i < 3; i++) {
    let t = now()
    await s.files.write('/home/user/big.bin', buf)
    up.push(ms(t))
    t = now()
    const got = await s.files.read('/home/user/big.bin', { format: 'bytes' })
    down.push(ms(t))
    if (createHash('sha256').update(got).digest('hex') !== want) throw new Error('download differs from upload')
  }
  const mbps = (xs) => (MB / (stats(xs).p50 / 1000))
  out.upload = { ...stats(up), mb: MB, mb_per_s: mbps(up) }
  out.download = { ...stats(down), mb: MB, mb_per_s: mbps(down) }
  await s.kill()
}
if (IDLE > 0) {
  const ids = []
  const t = now()
  let next = 0
  await Promise.all(Array.from({ length: 8 }, async () => {
    while (next < IDLE) { next++; const s = await Sandbox.create({ timeoutMs: 600_000 }); ids.push(s.sandboxId) }
  }))
  out.idle = { n: ids.length, create_s: ms(t) / 1000 }
  // the runner reads the daemon's memory now, and says when it is done
  const { writeFileSync, existsSync } = await import('node:fs')
  writeFileSync(process.env.SDK_SYNC + '.ready', '')
  while (!existsSync(process.env.SDK_SYNC + '.go')) await new Promise((r) => setTimeout(r, 100))
  const k = now()
  await Promise.all(Array.from({ length: 8 }, async (_, w) => {
    for (let i = w; i < ids.length; i += 8) await Sandbox.kill(ids[i])
  }))
  out.idle.kill_s = ms(k) / 1000
}
(await import('node:fs')).writeFileSync(process.env.SDK_OUT, JSON.stringify(out))
