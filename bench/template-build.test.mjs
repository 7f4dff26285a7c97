// Bench: Template.build() whose steps are all cached (docs/benchmarks.md,
// "Template builds"). Run through the SDK suite's runner, which starts a
// private daemon:
//
//   HUTCH_BIN=build/hutch tests/e2b/run.sh $PWD/bench/template-build.test.mjs
//
// One build fills the cache, then BENCH_N (20) rebuilds of the same recipe
// are timed end to end as the SDK sees them (request, file probes, trigger,
// status polls until ready).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Template } from '../tests/e2b/node_modules/e2b/dist/index.mjs'

const N = Number(process.env.BENCH_N || 20)

test('all-cached Template.build', async () => {
  const dir = mkdtempSync(join(process.env.HUTCH_E2B_TMP, 'bench-'))
  mkdirSync(join(dir, 'app'))
  writeFileSync(join(dir, 'app', 'main.py'), 'print("hi")\n')
  const recipe = () =>
    Template({ fileContextPath: dir })
      .fromTemplate('base')
      .runCmd('echo one > /home/user/one')
      .copy('app', '/home/user/app')
      .setEnvs({ A: '1' })
      .setWorkdir('/home/user/app')
      .runCmd('python3 main.py > out')
  const name = `bench${Date.now().toString(36)}`
  const t0 = performance.now()
  await Template.build(recipe(), name)
  const first = performance.now() - t0
  const ms = []
  for (let i = 0; i < N; i++) {
    const s = performance.now()
    await Template.build(recipe(), name)
    ms.push(performance.now() - s)
  }
  ms.sort((a, b) => a - b)
  const q = (p) => ms[Math.min(ms.length - 1, Math.floor(p * ms.length))].toFixed(0)
  console.log(`first build (5 steps run): ${first.toFixed(0)} ms`)
  console.log(`all-cached rebuild, ${N} runs: median ${q(0.5)} ms, p90 ${q(0.9)} ms, max ${q(1)} ms`)
  assert.ok(ms[ms.length - 1] < 1000, `an all-cached build took ${ms[ms.length - 1]} ms`)
  rmSync(dir, { recursive: true, force: true })
})
