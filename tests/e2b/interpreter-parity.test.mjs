// What the code-interpreter repository's own JS SDK tests expect of E2B's
// server and kernels and hutch did not do until stop 26 (found by
// tests/e2b/upstream/run-upstream-interp.sh, docs/conformance.md): ES module
// imports and top-level await in the JavaScript and TypeScript kernels, a
// pie chart's angles rounded as E2B rounds them, a chart of kind "unknown",
// the sandbox's envs as Java system properties, and the interpreter's port
// reached at 0.0.0.0 from inside without the egress proxy in the way.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

describe('code interpreter: parity with the SDK repository\'s tests', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create({ envs: { HUTCH_PARITY: 'from-create' } })
  })
  after(async () => {
    await sbx?.kill()
  })

  test('the interpreter answers at 0.0.0.0:49999 from inside, past the egress proxy', async () => {
    const r = await sbx.commands.run('curl -s -o /dev/null -w "%{http_code}" http://0.0.0.0:49999/health')
    assert.equal(r.stdout.trim(), '200')
  })

  test('javascript: import statements, whose names outlive the cell', async () => {
    const ctx = await sbx.createCodeContext({ language: 'js' })
    const a = await sbx.runCode(
      "import { readFileSync as rfs } from 'fs'\nimport path from 'path'\nimport * as os from 'os'\n" +
      'console.log(typeof rfs, path.sep, typeof os.cpus)', { context: ctx })
    assert.equal(a.error, undefined, JSON.stringify(a.error))
    assert.deepEqual(a.logs.stdout, ['function / function\n'])
    const b = await sbx.runCode('[typeof rfs, typeof path.join, typeof os.hostname].join(",")', { context: ctx })
    assert.equal(b.text, 'function,function,function')
    // a cell run twice (as notebooks do) declares its imports again
    const c = await sbx.runCode("import path from 'path'\npath.basename('/a/b')", { context: ctx })
    assert.equal(c.text, 'b')
  })

  test('javascript and typescript: top-level await, the last expression its value, its declarations kept', async () => {
    const js = await sbx.createCodeContext({ language: 'js' })
    assert.equal((await sbx.runCode("await Promise.resolve('Hello World!')", { context: js })).text, 'Hello World!')
    const a = await sbx.runCode(
      'const n = await new Promise((r) => setTimeout(() => r(20), 20))\n' +
      'let { p, q: [m] } = { p: 1, q: [2] }\nfunction twice(v) { return 2 * v }\nclass K {}\ntwice(n) + p + m',
      { context: js })
    assert.equal(a.text, '43')
    assert.equal((await sbx.runCode('[n, p, m, twice(1), typeof K].join(",")', { context: js })).text, '20,1,2,2,function')
    const e = await sbx.runCode("await Promise.reject(new Error('boom'))", { context: js })
    assert.equal(e.error.name, 'Error')
    assert.equal(e.error.value, 'boom')

    const ts = await sbx.createCodeContext({ language: 'ts' })
    const t = await sbx.runCode(
      "import { sep } from 'path'\nconst k: number = await Promise.resolve(3)\nsep + k * 2", { context: ts })
    assert.equal(t.error, undefined, JSON.stringify(t.error))
    assert.equal(t.text, '/6')
    assert.equal((await sbx.runCode('typeof sep + k', { context: ts })).text, 'string3')
  })

  test('charts: pie angles as E2B rounds them, and a figure of no known kind is "unknown"', async () => {
    const pie = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 8))
ax.pie([90, 10], labels=["No", "No, in blue"], autopct='%1.1f%%', startangle=90)
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
plt.show()`)
    const chart = pie.results[0].chart
    assert.equal(chart.type, 'pie')
    assert.deepEqual(chart.elements.map((e) => [e.label, e.angle, e.radius]), [['No', 324, 1], ['No, in blue', 36, 1]])

    const unk = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
ax.add_artist(plt.Circle((0, 0), 2, fill=False))
ax.grid(True)
plt.title('Two Concentric Circles')
plt.show()`)
    const u = unk.results[0].chart
    assert.ok(u, 'a chart')
    assert.equal(u.type, 'unknown')
    assert.equal(u.title, 'Two Concentric Circles')
    assert.deepEqual(u.elements, [])
    assert.ok(unk.results[0].png, 'and its png')
  })

})

describe('code interpreter: its server comes back, as systemd brings back E2B\'s', () => {
  test('after the sandbox\'s user kills every process of theirs, and after root kills the server', async () => {
    const sbx = await Sandbox.create()
    try {
      const health = async () => (await sbx.commands.run(
        'curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:49999/health || true')).stdout.trim()
      const back = async () => {
        for (let i = 0; i < 120; i++) {
          if (await health() === '200')
            return true
          await new Promise((r) => setTimeout(r, 250))
        }
        return false
      }
      assert.equal((await sbx.runCode('x = 41\nx + 1')).text, '42')
      // the server and its kernels run as the sandbox's user: this ends
      // them all (and the command itself)
      await sbx.commands.run('kill -9 -1', { user: 'user' }).catch(() => {})
      assert.ok(await back(), 'the server answers /health again')
      const r = await sbx.runCode('1 + 1')
      assert.equal(r.error, undefined, JSON.stringify(r.error))
      assert.equal(r.text, '2')
      // a new kernel: the state went with the old one
      assert.equal((await sbx.runCode('x')).error?.name, 'NameError')
      // root kills the server alone: its kernels go with it, and it comes back
      await sbx.commands.run('pkill -9 -x hutch-interp', { user: 'root' })
      assert.ok(await back(), 'the server answers /health again after pkill')
      assert.equal((await sbx.runCode('2 + 2')).text, '4')
      const ps = (await sbx.commands.run('ps -eo ppid=,args= | grep "[h]utch_kernels.py" || true')).stdout
      // every kernel left is the new server's (none was orphaned to init)
      assert.doesNotMatch(ps, /^\s*1\s/m, ps)
    } finally {
      await sbx.kill()
    }
  })
})

describe('code interpreter: a create\'s envs in java', () => {
  test('are system properties, whether the create claimed a warm interpreter or started one', async () => {
    // two creates back to back: whatever the warm pool holds, at least one
    // of them starts its interpreter itself (the path the pool's claim
    // does not take)
    const boxes = await Promise.all([1, 2].map((i) => Sandbox.create({ envs: { HUTCH_PARITY: `create-${i}` } })))
    try {
      for (const [i, b] of boxes.entries()) {
        const r = await b.runCode('System.getProperty("HUTCH_PARITY")', { language: 'java' })
        assert.equal(r.results[0]?.text.trim(), `create-${i + 1}`)
      }
    } finally {
      await Promise.all(boxes.map((b) => b.kill()))
    }
  })
})
