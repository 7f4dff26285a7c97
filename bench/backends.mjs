// The two isolation backends side by side, through the stock SDK against one
// daemon (bench/backends.sh starts it with no warm pool, so every create is
// cold on both): create → first output, pause, resume, fork ×3, idle memory
// running and paused.
// The backend is chosen per sandbox with metadata hutch.backend. Markdown on stdout.
import { readFileSync, existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const N = Number(process.env.BACKENDS_N || 10)
const IDLE = Number(process.env.BACKENDS_IDLE || 10)
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.round(p / 100 * (s.length - 1)))] }
const fmt = (xs) => xs.length ? `${pct(xs, 50).toFixed(1)} / ${pct(xs, 99).toFixed(1)}` : 'n/a'
const now = () => Number(process.hrtime.bigint()) / 1e6
async function time(fn) { const t = now(); const r = await fn(); return [now() - t, r] }

const backends = ['ns', 'gvisor']
const rows = {}
const add = (k, b, v) => { ((rows[k] ||= {})[b] ||= []).push(v) }
const notes = {}

// every process of a sandbox's cgroup (v1 pids hierarchy or v2)
function cgroupPids(id) {
  for (const d of [`/sys/fs/cgroup/pids/hutch/${id}`, `/sys/fs/cgroup/hutch/${id}`, `/sys/fs/cgroup/unified/hutch/${id}`]) {
    if (existsSync(`${d}/cgroup.procs`)) return readFileSync(`${d}/cgroup.procs`, 'utf8').split('\n').filter(Boolean).map(Number)
  }
  return []
}
function pssKiB(pid) {
  try {
    const m = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))
    return m ? Number(m[1]) : 0
  } catch { return 0 }
}
function rssKiB(pid) {
  try { return Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] || 0) } catch { return 0 }
}

for (const b of backends) {
  const md = { metadata: { 'hutch.backend': b } }
  const parent = await Sandbox.create(md)
  await parent.commands.run('echo warm > /home/user/w')
  for (let i = 0; i < N; i++) {
    const [tc, s] = await time(async () => { const s = await Sandbox.create(md); await s.commands.run('true'); return s })
    add('create → first output (SDK, commands.run("true"))', b, tc)
    const [tk] = await time(() => s.kill())
    add('kill', b, tk)
    const [tp] = await time(() => parent.pause())
    add('pause (ns: cgroup freeze; gvisor: checkpoint to disk, runtime stopped)', b, tp)
    const [tu] = await time(async () => { await parent.connect(); await parent.commands.run('true') })
    add('resume (connect) → first output (gvisor: restore)', b, tu)
    const [ts, snap] = await time(() => parent.createSnapshot())
    add('snapshot (ns: the layer; gvisor: memory checkpoint)', b, ts)
    const [tr, copy] = await time(async () => { const c = await Sandbox.create(snap.snapshotId); await c.commands.run('true'); return c })
    add('create from snapshot → first output', b, tr)
    await copy.kill()
    await Sandbox.deleteSnapshot(snap.snapshotId)
    try {
      const [tf, forks] = await time(() => Sandbox.fork(parent.sandboxId, { count: 3 }))
      add('fork ×3', b, tf)
      await Promise.all(forks.map((f) => f.kill()))
    } catch (e) {
      notes[b] = `fork: ${String(e.message).slice(0, 120)}`
    }
  }
  await parent.kill()
  // idle memory: IDLE sandboxes with nothing running, PSS of everything in their cgroups
  const idle = []
  for (let i = 0; i < IDLE; i++) idle.push(await Sandbox.create(md))
  await new Promise((r) => setTimeout(r, 3000))
  let pss = 0, rss = 0, procs = 0
  for (const s of idle) for (const p of cgroupPids(s.sandboxId)) { pss += pssKiB(p); rss += rssKiB(p); procs++ }
  add('idle memory per sandbox, PSS MiB (host processes each)', b, pss / 1024 / IDLE)
  notes[`${b}-idle`] = `${(rss / 1024 / IDLE).toFixed(1)} MiB RSS, ${(procs / IDLE).toFixed(1)} host processes per sandbox`
  // the same sandboxes paused: what they hold on the host then
  for (const s of idle) await s.pause()
  pss = 0; rss = 0; procs = 0
  for (const s of idle) for (const p of cgroupPids(s.sandboxId)) { pss += pssKiB(p); rss += rssKiB(p); procs++ }
  add('idle memory per sandbox, paused, PSS MiB', b, pss / 1024 / IDLE)
  notes[`${b}-paused`] = `${(rss / 1024 / IDLE).toFixed(1)} MiB RSS, ${(procs / IDLE).toFixed(1)} host processes per paused sandbox`
  await Promise.all(idle.map((s) => s.kill()))
}

console.log(`### Backends side by side (\`bench/backends.sh\`, ${N} rounds, medians / p99 in ms; stock e2b SDK, no warm pool)\n`)
console.log('| | ns | gvisor |')
console.log('|---|---|---|')
for (const [k, v] of Object.entries(rows)) {
  if (k.startsWith('idle')) console.log(`| ${k} | ${(v.ns?.[0] ?? 0).toFixed(1)} | ${(v.gvisor?.[0] ?? 0).toFixed(1)} |`)
  else console.log(`| ${k} | ${fmt(v.ns || [])} | ${fmt(v.gvisor || [])} |`)
}
console.log('')
for (const [k, v] of Object.entries(notes)) console.log(`- ${k}: ${v}`)
