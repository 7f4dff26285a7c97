// Snapshot, restore, fork and pause on the namespace backend, through the
// stock SDK (bench/snapshots.sh starts the daemon). Markdown on stdout.
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

// the SDK pinned for the tests (tests/e2b/package-lock.json)
const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const N = Number(process.env.SNAP_N || 20)
const MB = Number(process.env.SNAP_MB || 8)
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.round(p / 100 * (s.length - 1)))] }
const fmt = (xs) => `${pct(xs, 50).toFixed(1)} / ${pct(xs, 99).toFixed(1)}`
const now = () => Number(process.hrtime.bigint()) / 1e6
async function time(fn) { const t = now(); const r = await fn(); return [now() - t, r] }

const rows = {}
const add = (k, v) => { (rows[k] ||= []).push(v) }

const parent = await Sandbox.create()
await parent.commands.run(`head -c ${MB << 20} /dev/urandom > /home/user/blob && mkdir -p /home/user/src && for i in $(seq 200); do echo $i > /home/user/src/f$i; done`)
for (let i = 0; i < N; i++) {
  const [tc, r0] = await time(async () => { const s = await Sandbox.create(); await s.commands.run('true'); return s })
  add('create → first output (fresh)', tc)
  await r0.kill()
  const [ts, snap] = await time(() => parent.createSnapshot())
  add(`snapshot (${MB} MiB random + 200 files written)`, ts)
  const [tr, s] = await time(async () => { const c = await Sandbox.create(snap.snapshotId); await c.commands.run('true'); return c })
  add('create from snapshot → first output', tr)
  await s.kill()
  await Sandbox.deleteSnapshot(snap.snapshotId)
  const [tf, forks] = await time(() => Sandbox.fork(parent.sandboxId, { count: 3 }))
  add('fork ×3', tf)
  await Promise.all(forks.map((f) => f.kill()))
  const [tp] = await time(() => parent.pause())
  add('pause (freeze)', tp)
  const [tu] = await time(() => parent.connect())
  add('resume (connect)', tu)
}
await parent.kill()
console.log(`### Snapshots, fork, pause on the namespace backend (${N} rounds, ms p50 / p99)\n`)
console.log('| | ms p50 / p99 |\n|---|---|')
for (const [k, v] of Object.entries(rows)) console.log(`| ${k} | ${fmt(v)} |`)
