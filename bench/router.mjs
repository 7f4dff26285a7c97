// Router overhead (issue 18, docs/benchmarks.md): the stock e2b SDK on one
// sandbox, once through `hutch router` and once straight to the node that
// holds it, interleaved in the same run. Env from bench/router.sh:
// ROUTER_URL, NODE_URLS (comma-separated), E2B_API_KEY, RUNS, MB.
// Prints one JSON object.
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const RUNS = +(process.env.RUNS || 300)
const MB = +(process.env.MB || 50)
const router = process.env.ROUTER_URL
const nodes = process.env.NODE_URLS.split(',')
const ms = (t) => Number(process.hrtime.bigint() - t) / 1e6
const now = () => process.hrtime.bigint()
function stats(xs) {
  const s = [...xs].sort((a, b) => a - b)
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))]
  return { n: s.length, p50: q(0.5), p90: q(0.9), p99: q(0.99) }
}

const via = (url) => ({ apiUrl: url, sandboxUrl: url })
const sb = await Sandbox.create({ ...via(router), timeoutMs: 600_000 })
// the node that holds it: the one whose list has it
let nodeUrl
for (const u of nodes) {
  const r = await fetch(`${u}/sandboxes/${sb.sandboxId}`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  await r.arrayBuffer()
  if (r.status === 200) nodeUrl = u
}
const direct = await Sandbox.connect(sb.sandboxId, via(nodeUrl))
const routed = await Sandbox.connect(sb.sandboxId, via(router))

const out = { sandbox: sb.sandboxId, node: nodeUrl }
for (const s of [direct, routed]) for (let i = 0; i < 20; i++) await s.commands.run('true')
const runs = { direct: [], router: [] }
for (let i = 0; i < RUNS; i++) {
  for (const [k, s] of [['direct', direct], ['router', routed]]) {
    const t = now()
    await s.commands.run('true')
    runs[k].push(ms(t))
  }
}
out.run_direct = stats(runs.direct)
out.run_router = stats(runs.router)
out.run_p50_overhead_ms = out.run_router.p50 - out.run_direct.p50

const data = new Uint8Array(MB << 20)
for (let i = 0; i < data.length; i += 4096) data[i] = i & 255
const xfer = { direct: { up: [], down: [] }, router: { up: [], down: [] } }
for (let i = 0; i < 3; i++) {
  for (const [k, s] of [['direct', direct], ['router', routed]]) {
    let t = now()
    await s.files.write('/tmp/bench.bin', data.buffer)
    xfer[k].up.push(MB / (ms(t) / 1000))
    t = now()
    const back = await s.files.read('/tmp/bench.bin', { format: 'bytes' })
    xfer[k].down.push(MB / (ms(t) / 1000))
    if (back.length !== data.length) throw new Error('short read')
  }
}
const best = (xs) => Math.max(...xs)
for (const k of ['direct', 'router']) out[`upload_MBps_${k}`] = best(xfer[k].up), out[`download_MBps_${k}`] = best(xfer[k].down)
out.upload_loss_pct = 100 * (1 - out.upload_MBps_router / out.upload_MBps_direct)
out.download_loss_pct = 100 * (1 - out.download_MBps_router / out.download_MBps_direct)
await routed.kill()
console.log(JSON.stringify(out, null, 1))
