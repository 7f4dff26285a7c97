// The audit trail's cost (issue 15, docs/audit.md): the stock e2b SDK's
// commands.run and files.write against two daemons of one build, one with
// `audit = on` and one with `audit = off`, in alternating rounds of one
// run so that drift of the machine hits both alike. bench/audit.sh starts
// the daemons and sets AUDIT_ON / AUDIT_OFF ("url key"). Prints JSON.
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const require = createRequire(new URL('../tests/e2b/package.json', import.meta.url))
const { Sandbox } = await import(pathToFileURL(require.resolve('e2b')).href)

const ROUNDS = +(process.env.AUDIT_ROUNDS || 10)
const PER = +(process.env.AUDIT_PER || 40)
const ms = (t) => Number(process.hrtime.bigint() - t) / 1e6
const now = () => process.hrtime.bigint()
function stats(xs) {
  const s = [...xs].sort((a, b) => a - b)
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))]
  return { n: s.length, p50: q(0.5), p90: q(0.9), mean: s.reduce((a, b) => a + b, 0) / s.length }
}

const sides = {}
for (const name of ['on', 'off']) {
  const [url, key] = process.env['AUDIT_' + name.toUpperCase()].split(' ')
  const opts = { apiKey: key, apiUrl: url, sandboxUrl: url }
  const s = await Sandbox.create(opts)
  for (let i = 0; i < 5; i++) await s.commands.run('true')
  sides[name] = { s, run: [], write: [] }
}
const payload = 'x'.repeat(4096)
for (let r = 0; r < ROUNDS; r++) {
  // alternate which side goes first
  for (const name of r % 2 ? ['off', 'on'] : ['on', 'off']) {
    const x = sides[name]
    for (let i = 0; i < PER; i++) { const t = now(); await x.s.commands.run('true'); x.run.push(ms(t)) }
    for (let i = 0; i < PER; i++) { const t = now(); await x.s.files.write(`/tmp/a${i}`, payload); x.write.push(ms(t)) }
  }
}
const out = {}
for (const name of ['on', 'off']) {
  out[name] = { run: stats(sides[name].run), write: stats(sides[name].write) }
  await sides[name].s.kill()
}
for (const op of ['run', 'write'])
  out[op + '_cost_pct'] = { p50: 100 * (out.on[op].p50 / out.off[op].p50 - 1), mean: 100 * (out.on[op].mean / out.off[op].mean - 1) }
console.log(JSON.stringify(out))
