// The code interpreter through the stock @e2b/code-interpreter SDK
// (bench/interp.sh starts the daemon): runCode('1+1') on a warm context next
// to the same cell sent straight to the kernel with jupyter_client inside
// the sandbox, create -> first result next to python's own import of the
// kernel, and a 1 MB PNG result's throughput with where its time goes.
// Prints markdown.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = require('@e2b/code-interpreter')

const N = Number(process.env.INTERP_N || 200), C = Number(process.env.INTERP_CREATES || 5)
const PN = Number(process.env.INTERP_PNG_N || 50)
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(s.length * p))] }
const f = (x) => x.toFixed(1)

const sbx = await Sandbox.create()
try {
  await new Promise((r) => setTimeout(r, 5000)) // the warm pool refills meanwhile: not during the measure
  for (let i = 0; i < 10; i++) await sbx.runCode('1+1')
  const warm = []
  for (let i = 0; i < N; i++) {
    const t = performance.now()
    const e = await sbx.runCode('1+1')
    warm.push(performance.now() - t)
    if (e.text !== '2') throw new Error(`1+1 gave ${e.text}`)
  }
  await sbx.files.write('/tmp/direct.py', readFileSync(new URL('./interp_direct.py', import.meta.url), 'utf8'))
  const d = JSON.parse((await sbx.commands.run(`python3 /tmp/direct.py ${N}`, { timeoutMs: 120000 })).stdout)
  const imp = []
  for (let i = 0; i < 5; i++) {
    const r = await sbx.commands.run("python3 -c 'import time; t = time.perf_counter(); import ipykernel.kernelapp, ipykernel.ipkernel; print((time.perf_counter() - t) * 1000)'")
    imp.push(Number(r.stdout))
  }
  const startup = []
  for (let i = 0; i < 5; i++) {
    const r = await sbx.commands.run("/usr/bin/time -f %e python3 -c 'import ipykernel.kernelapp, ipykernel.ipkernel' 2>&1 || python3 -c 'import time,subprocess; t=time.time(); subprocess.run([\"python3\",\"-c\",\"import ipykernel.kernelapp, ipykernel.ipkernel\"]); print(time.time()-t)'")
    startup.push(Number(r.stdout.trim().split('\n').pop()) * 1000)
  }
  // a 1 MB PNG (noise does not compress)
  await sbx.runCode(`
import io, numpy as np
from PIL import Image as _I
from IPython.display import Image, display
_b = io.BytesIO(); _I.fromarray(np.random.default_rng(1).integers(0, 255, (590, 590, 3), dtype=np.uint8)).save(_b, format="PNG")
png = _b.getvalue(); len(png)`)
  const size = Number((await sbx.runCode('len(png)')).text)
  const pngT = []
  for (let i = 0; i < PN; i++) {
    const t = performance.now()
    const e = await sbx.runCode('display(Image(data=png))')
    pngT.push(performance.now() - t)
    if (Buffer.from(e.results[0].png, 'base64').length !== size) throw new Error('png size')
  }
  // where its time goes: display() inside the kernel (formatting, base64,
  // the message to hutch-interp), the cell sent to hutch-interp from inside
  // the sandbox (no daemon, no SDK), and the SDK's own reading of a line of
  // that size fed in 64 KiB reads, Node's socket read size (no network)
  const kern = Number((await sbx.runCode(`import time as _t
_ts = []
for _ in range(${PN}):
    _s = _t.perf_counter(); display(Image(data=png)); _ts.append(_t.perf_counter() - _s)
sorted(_ts)[len(_ts) // 2] * 1000`, { onResult: () => {} })).text)
  await sbx.files.write('/tmp/inside.py', readFileSync(new URL('./interp_inside.py', import.meta.url), 'utf8'))
  const inside = JSON.parse((await sbx.commands.run(`python3 /tmp/inside.py ${PN}`, { timeoutMs: 120000 })).stdout)
  const line = new TextEncoder().encode(JSON.stringify({ type: 'result', png: 'A'.repeat(Math.ceil(size / 3) * 4) + '\n', extra: {}, is_main_result: false }) + '\n')
  const sdkRead = []
  for (let i = 0; i < PN; i++) {
    const t = performance.now()
    let buffer = '' // what @e2b/code-interpreter 2.8.0's readLines does per read
    for (let o = 0; o < line.length; o += 65536) {
      buffer += new TextDecoder().decode(line.subarray(o, o + 65536))
      let k
      do {
        k = buffer.indexOf('\n')
        if (k !== -1) { JSON.parse(buffer.slice(0, k)); buffer = buffer.slice(k + 1) }
      } while (k !== -1)
    }
    sdkRead.push(performance.now() - t)
  }
  // create -> first result: from the warm pool (a pause between creates lets
  // it refill; not counted), and back to back, when the pool is empty
  const createRun = async () => {
    const t = performance.now()
    const s = await Sandbox.create()
    const e = await s.runCode('1+1')
    const ms = performance.now() - t
    if (e.text !== '2') throw new Error('first result')
    await s.kill()
    return ms
  }
  const warmCreates = [], coldCreates = []
  for (let i = 0; i < C; i++) {
    await new Promise((r) => setTimeout(r, 5000))
    warmCreates.push(await createRun())
  }
  await createRun() // takes the pooled one, if any
  for (let i = 0; i < C; i++) coldCreates.push(await createRun())
  console.log(`| measure | p50 | p99 |\n|---|---|---|`)
  console.log(`| runCode('1+1'), warm context, through hutch serve (ms) | ${f(pct(warm, 0.5))} | ${f(pct(warm, 0.99))} |`)
  console.log(`| the same cell, jupyter_client to the kernel inside the sandbox (ms) | ${f(d.p50)} | ${f(d.p99)} |`)
  console.log(`| ratio | ${(pct(warm, 0.5) / d.p50).toFixed(2)}x | |`)
  console.log(`| create -> first runCode result, from the warm pool (ms, ${C} creates) | ${f(pct(warmCreates, 0.5))} | ${f(pct(warmCreates, 0.99))} |`)
  console.log(`| create -> first runCode result, pool empty (ms, ${C} creates back to back) | ${f(pct(coldCreates, 0.5))} | ${f(pct(coldCreates, 0.99))} |`)
  console.log(`| python3 start + import of ipykernel, in the sandbox (ms) | ${f(pct(startup, 0.5))} | |`)
  console.log(`| import of ipykernel alone, in the sandbox (ms) | ${f(pct(imp, 0.5))} | |`)
  const p = pct(pngT, 0.5)
  console.log(`| ${(size / 1e6).toFixed(2)} MB PNG result, runCode end to end (ms; MB/s of PNG; ${PN} runs) | ${f(p)} (${f(size / 1e6 / (p / 1000))} MB/s) | ${f(pct(pngT, 0.99))} |`)
  console.log(`| of which: display() inside the kernel (ms) | ${f(kern)} | |`)
  console.log(`| the same cell to hutch-interp from inside the sandbox, whole response read (ms) | ${f(inside.p50)} | ${f(inside.p99)} |`)
  console.log(`| the SDK's line reading alone, a line of that size in 64 KiB reads (ms) | ${f(pct(sdkRead, 0.5))} | ${f(pct(sdkRead, 0.99))} |`)
} finally {
  await sbx.kill()
}
