// The stock @e2b/code-interpreter SDK against hutch serve: the
// code-interpreter-v1 template (its default), every language, every result
// kind, contexts, interrupts, restarts, dead kernels, a sandbox killed during
// a run, and bad input answered in E2B's formats (docs/interpreter.md).
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { Sandbox } from '@e2b/code-interpreter'
import { backend, env } from './helpers.mjs'

const headers = (sbx) => ({
  'Content-Type': 'application/json',
  'E2b-Sandbox-Id': sbx.sandboxId,
  'E2b-Sandbox-Port': '49999',
})

describe('code interpreter', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create({ envs: { HUTCH_SBX_ENV: 'from-create' } })
  })
  after(async () => {
    await sbx?.kill()
  })

  test('the SDK default template is served, and runCode keeps state in the default context', async () => {
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).templateId, 'code-interpreter-v1')
    const a = await sbx.runCode('x = 41\nprint("hi")\nx + 1')
    assert.equal(a.text, '42')
    assert.deepEqual(a.logs.stdout, ['hi\n'])
    assert.ok(a.executionCount >= 1)
    const b = await sbx.runCode('x * 2')
    assert.equal(b.text, '82')
    assert.equal(b.executionCount, a.executionCount + 1)
    // a string result loses its quotes, as E2B's server strips them
    assert.equal((await sbx.runCode('"abc"')).text, 'abc')
  })

  test('streaming callbacks, errors with name, value and traceback', async () => {
    const out = [], errs = [], results = [], errors = []
    const e = await sbx.runCode('import sys\nprint("o1")\nprint("e1", file=sys.stderr)\ndisplay(7)\n1/0', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => errs.push(m.line),
      onResult: (r) => results.push(r),
      onError: (x) => errors.push(x),
    })
    assert.deepEqual(out, ['o1\n'])
    assert.deepEqual(errs, ['e1\n'])
    assert.equal(results.length, 1)
    assert.equal(results[0].text, '7')
    assert.equal(results[0].isMainResult, false)
    assert.equal(e.error.name, 'ZeroDivisionError')
    assert.equal(e.error.value, 'division by zero')
    assert.match(e.error.traceback, /ZeroDivisionError/)
    assert.doesNotMatch(e.error.traceback, /\x1b\[/) // NoColor
    assert.equal(errors.length, 1)
  })

  test('env vars: per call (then restored) and the sandbox\'s own', async () => {
    const code = 'import os\nos.environ.get("HUTCH_T", "unset") + "/" + os.environ.get("HUTCH_SBX_ENV", "unset")'
    assert.equal((await sbx.runCode(code, { envs: { HUTCH_T: "it's set" } })).text, "it's set/from-create")
    assert.equal((await sbx.runCode(code)).text, 'unset/from-create')
  })

  test('result kinds: html, markdown, svg, png, jpeg, pdf, latex, json, javascript, data', async () => {
    const e = await sbx.runCode(`
from IPython.display import display, HTML, Markdown, SVG, Latex, JSON, Javascript, Image
import io, base64
from PIL import Image as PImage
display(HTML("<b>b</b>"))
display(Markdown("# t"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'))
for fmt in ("png", "jpeg"):
    buf = io.BytesIO(); PImage.new("RGB", (4, 4), "red").save(buf, format=fmt.upper()); display(Image(data=buf.getvalue(), format=fmt))
class P:
    def _repr_pdf_(self): return b"%PDF-1.4 tiny"
display(P())
display(Latex(r"$x^2$"))
display(JSON({"k": [1, 2]}))
display(Javascript("console.log(1)"))
import pandas as pd
pd.DataFrame({"a": [1, 2], "t": pd.to_datetime(["2024-01-01", "2024-01-02"])})
`)
    assert.equal(e.error, undefined, JSON.stringify(e.error))
    const r = e.results
    assert.equal(r[0].html, '<b>b</b>')
    assert.equal(r[1].markdown, '# t')
    assert.match(r[2].svg, /<svg/)
    assert.equal(Buffer.from(r[3].png, 'base64').subarray(1, 4).toString(), 'PNG')
    assert.equal(Buffer.from(r[4].jpeg, 'base64')[0], 0xff)
    assert.equal(Buffer.from(r[5].pdf, 'base64').toString(), '%PDF-1.4 tiny')
    assert.equal(r[6].latex, '$x^2$')
    assert.deepEqual(r[7].json, { k: [1, 2] })
    assert.equal(r[8].javascript, 'console.log(1)')
    const main = r[9]
    assert.equal(main.isMainResult, true)
    assert.deepEqual(main.data, { a: [1, 2], t: ['2024-01-01T00:00:00', '2024-01-02T00:00:00'] })
    assert.match(main.html, /<table/)
    assert.ok(main.formats().includes('data'))
  })

  test('multi-MB results arrive byte-exact, in order with small results and printed lines', async () => {
    // strings of 64 KiB or more leave the kernel as ZeroMQ buffers
    // (e2b_startup.py) and hutch-interp writes them into the line
    // (jresult.c): every kind of character, in every place a result has
    const seq = []
    const e = await sbx.runCode(String.raw`
import hashlib, json, random
from IPython.display import display, Image, HTML, Markdown, JSON
r = random.Random(5)
png = b"\x89PNG\r\n\x1a\n" + r.randbytes(3 << 20)
svg = "<svg>" + "".join(r.choice('a"\\\n\t\x01\x1f\x7f/é漢😀< ') for _ in range(1 << 20)) + "</svg>"
class Two:
    def _repr_svg_(self): return svg
    def _repr_html_(self): return svg[::-1]
print("before")
display(Image(data=png))
print("between")
display(Two())
display({"application/x-hutch-big": svg, "text/plain": "extra"}, raw=True)
display(HTML("<b>small</b>"))
h = display(Markdown("m" * 100000), display_id=True)
h.update(Markdown("n" * 100000))
display(JSON({"k": ["x" * 1000] * 1000}))
print(json.dumps([hashlib.sha256(x).hexdigest() for x in (png, svg.encode(), svg[::-1].encode())]))
"q'\"" * 100000
`, {
      onStdout: (m) => seq.push(m.line),
      onResult: (x) => seq.push(x),
    })
    assert.equal(e.error, undefined, JSON.stringify(e.error))
    const sha = (b) => createHash('sha256').update(b).digest('hex')
    assert.equal(seq.length, 11, JSON.stringify(seq.map((x) => typeof x === 'string' ? x : x.formats())))
    const [want_png, want_svg, want_html] = JSON.parse(seq[9])
    assert.deepEqual([seq[0], seq[2]], ['before\n', 'between\n'])
    assert.equal(sha(Buffer.from(seq[1].png, 'base64')), want_png)
    assert.equal(seq[1].isMainResult, false)
    assert.equal(sha(Buffer.from(seq[3].svg)), want_svg)
    assert.equal(sha(Buffer.from(seq[3].html)), want_html)
    assert.equal(seq[4].text, 'extra')
    assert.equal(sha(Buffer.from(seq[4].raw.extra['application/x-hutch-big'])), want_svg)
    assert.equal(seq[5].html, '<b>small</b>')
    assert.equal(seq[6].markdown, 'm'.repeat(100000))
    assert.equal(seq[7].markdown, 'n'.repeat(100000))
    assert.deepEqual(seq[8].json, { k: Array(1000).fill('x'.repeat(1000)) })
    assert.equal(seq[10].isMainResult, true)
    assert.equal(seq[10].text, `q\\'"`.repeat(100000)) // its repr (q\'"...), unquoted
    assert.equal(e.results.length, 8)
    assert.equal(e.text, seq[10].text)
  })

  test('a large non-ASCII printed text arrives whole (the lines are ASCII)', async () => {
    // the SDK decodes each read on its own: a character split between two
    // reads would come out as U+FFFD, were the line not ASCII
    const e = await sbx.runCode('print("漢😀é\\x01" * 300000)')
    assert.equal(e.error, undefined, JSON.stringify(e.error))
    assert.equal(e.logs.stdout.join(''), '漢😀é\x01'.repeat(300000) + '\n')
  })

  test('charts from matplotlib: line, scatter, bar, pie, box-and-whisker, superchart, log and categorical scales', async () => {
    const e = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots(); ax.plot([1, 10, 100], [1, 2, 3], label="sin"); ax.set_xscale("log"); ax.set_title("L"); ax.set_xlabel("Time (s)"); plt.show()
fig, ax = plt.subplots(); ax.scatter([1, 2], [3, 4], label="pts"); plt.show()
fig, ax = plt.subplots(); ax.bar(["a", "b"], [1, 2], label="g"); plt.show()
fig, ax = plt.subplots(); ax.pie([1, 3], labels=["x", "y"]); plt.show()
fig, ax = plt.subplots(); ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]]); plt.show()
fig, axs = plt.subplots(2); axs[0].plot(["p", "q"], [1, 2]); axs[1].bar([1, 2], [3, 4]); fig.suptitle("S"); plt.show()
fig, ax = plt.subplots(); ax.imshow([[1, 2], [3, 4]]); plt.show()
`)
    assert.equal(e.error, undefined, JSON.stringify(e.error))
    const c = e.results.map((r) => r.chart)
    assert.equal(e.results.length, 7)
    for (const r of e.results) assert.ok(r.png && r.text.startsWith('<Figure'))
    assert.equal(c[0].type, 'line')
    assert.equal(c[0].title, 'L')
    assert.equal(c[0].x_scale, 'log')
    assert.equal(c[0].x_unit, 's')
    assert.equal(c[0].y_label, null) // every key is there, null when unknown
    assert.deepEqual(c[0].elements[0], { label: 'sin', points: [[1, 1], [10, 2], [100, 3]] })
    assert.equal(c[1].type, 'scatter')
    assert.deepEqual(c[1].elements[0].points, [[1, 3], [2, 4]])
    assert.equal(c[2].type, 'bar')
    assert.deepEqual(c[2].elements.map((x) => [x.label, x.group, x.value]), [['a', 'g', 1], ['b', 'g', 2]])
    assert.equal(c[3].type, 'pie')
    assert.deepEqual(c[3].elements.map((x) => [x.label, x.angle]), [['x', 90], ['y', 270]])
    assert.equal(c[4].type, 'box_and_whisker')
    assert.deepEqual(c[4].elements[0].outliers, [20])
    assert.equal(c[4].elements[0].median, 3.5)
    assert.equal(c[5].type, 'superchart')
    assert.equal(c[5].title, 'S')
    assert.deepEqual(c[5].elements.map((x) => x.type), ['line', 'bar'])
    assert.equal(c[5].elements[0].x_scale, 'categorical')
    // an image is no chart kind with data: E2B's kind "unknown", no
    // elements, beside its png
    assert.deepEqual(c[6], { type: 'unknown', title: null, elements: [] })
  })

  test('javascript, typescript, r, java and bash keep state between cells', async () => {
    const cases = [
      ['javascript', 'let y = 20; console.log("js")', 'y + 1', '21', 'js\n'],
      ['typescript', 'const z: number = 4; console.log("ts")', 'z * 2', '8', 'ts\n'],
      // IRkernel shows values as display_data, so E2B's R results are not main ones
      ['r', 'v <- 3; cat("r\\n")', 'v * 2', '[1] 6', 'r\n'],
      ['java', 'int w = 5;\nSystem.out.println("java");', 'w * 3', '15', 'java\n'],
      ['bash', 'B=9; echo bash', 'echo $((B + 1))', undefined, 'bash\n'],
    ]
    // in parallel, in two waves: the five kernels at once peak at about
    // 530 MB (measured), at the default 512 MiB limit, and the OOM killer
    // then takes one (docs/interpreter.md); one after the other on gvisor,
    // where the in-memory writable layer counts too
    const waves = [cases.slice(0, 3), cases.slice(3)]
    const each = backend === 'gvisor'
      ? async (f) => { for (const c of cases) await f(c) }
      : async (f) => { for (const w of waves) await Promise.all(w.map(f)) }
    await each(async ([language, first, second, text, out]) => {
      const ctx = await sbx.createCodeContext({ language })
      assert.equal(ctx.language, language)
      const a = await sbx.runCode(first, { context: ctx })
      assert.equal(a.error, undefined, `${language}: ${JSON.stringify(a.error)}`)
      assert.deepEqual(a.logs.stdout, [out], language)
      const b = await sbx.runCode(second, { context: ctx })
      assert.equal(b.error, undefined, `${language}: ${JSON.stringify(b.error)}`)
      if (text !== undefined) assert.equal(b.results[0]?.text, text, language)
      else assert.deepEqual(b.logs.stdout, ['10\n'])
      const bad = await sbx.runCode(language === 'bash' ? 'false' : language === 'r' ? 'stop("boom")' :
        language === 'java' ? 'throw new RuntimeException("boom");' : 'throw new Error("boom")', { context: ctx })
      assert.ok(bad.error, `${language}: an error`)
      await sbx.removeCodeContext(ctx)
    })
    // language names as the SDK users write them
    assert.equal((await sbx.runCode('1 + 2', { language: 'js' })).text, '3')
  })

  test('contexts: cwd, list, independent state, restart keeps the id and loses the state, remove', async () => {
    const a = await sbx.createCodeContext({ cwd: '/tmp' })
    const b = await sbx.createCodeContext()
    assert.equal(a.language, 'python')
    assert.equal(a.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: a })).text, '/tmp')
    await sbx.runCode('s = "a"', { context: a })
    const nb = await sbx.runCode('s', { context: b })
    assert.equal(nb.error.name, 'NameError')
    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(ids.includes(a.id) && ids.includes(b.id))
    assert.ok((await sbx.listCodeContexts()).some((c) => c.language === 'javascript'), 'the javascript default')
    await sbx.restartCodeContext(a)
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === a.id))
    assert.equal((await sbx.runCode('s', { context: a })).error.name, 'NameError')
    await sbx.removeCodeContext(a.id)
    await sbx.removeCodeContext(b)
    await assert.rejects(sbx.runCode('1', { context: a }), (e) => e.name === 'NotFoundError')
    await assert.rejects(sbx.restartCodeContext(a), (e) => e.name === 'NotFoundError')
    await assert.rejects(sbx.removeCodeContext('no-such-context'), (e) => e.name === 'NotFoundError')
  })

  test('concurrent contexts run in parallel; one context runs its cells in order', async () => {
    const [a, b] = await Promise.all([sbx.createCodeContext(), sbx.createCodeContext()])
    await Promise.all([a, b].map((c) => sbx.runCode('0', { context: c }))) // their kernels are up
    const cell = 'import time; time.sleep(1); 1'
    let t0 = Date.now()
    await sbx.runCode(cell, { context: a })
    const one = Date.now() - t0
    t0 = Date.now()
    const rs = await Promise.all([a, b].map((c) => sbx.runCode(cell, { context: c })))
    const par = Date.now() - t0
    assert.deepEqual(rs.map((r) => r.text), ['1', '1'])
    assert.ok(par < one + 700, `one 1 s cell took ${one} ms, two in two contexts ${par} ms`)
    const seq = await Promise.all([0, 1, 2].map((i) => sbx.runCode(`import time; time.sleep(0.2); n = globals().get("n", 0) + 1; n`, { context: a })))
    assert.deepEqual(seq.map((r) => r.text).sort(), ['1', '2', '3'])
    await Promise.all([a, b].map((c) => sbx.removeCodeContext(c)))
  })

  test('timeoutMs interrupts the cell; the kernel survives and the next cell runs', async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('kept = 5', { context: ctx })
    const t0 = Date.now()
    await assert.rejects(sbx.runCode('while True: pass', { context: ctx, timeoutMs: 1000 }), (e) => e.name === 'TimeoutError')
    assert.ok(Date.now() - t0 < 5000)
    const next = await sbx.runCode('kept + 1', { context: ctx })
    assert.equal(next.text, '6')
    await sbx.removeCodeContext(ctx)
  })

  test('a restart or a removal during a cell ends it with an error; text stays whole UTF-8', async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('0', { context: ctx })
    const running = sbx.runCode('import time; time.sleep(30)', { context: ctx })
    await new Promise((r) => setTimeout(r, 300))
    await sbx.restartCodeContext(ctx)
    const e = await running
    assert.equal(e.error.name, 'ContextRestarting')
    const u = await sbx.runCode('print("héllo ✓ 日本"); "ünï"', { context: ctx })
    assert.deepEqual(u.logs.stdout, ['héllo ✓ 日本\n'])
    assert.equal(u.text, 'ünï')
    const gone = sbx.runCode('import time; time.sleep(30)', { context: ctx })
    await new Promise((r) => setTimeout(r, 300))
    await sbx.removeCodeContext(ctx)
    assert.equal((await gone).error.name, 'ContextRemoved')
  })

  test('a kernel that dies is restarted and the caller gets a clear error', async () => {
    const ctx = await sbx.createCodeContext()
    const t0 = Date.now()
    const e = await sbx.runCode('import os; os._exit(3)', { context: ctx })
    assert.equal(e.error.name, 'KernelDied')
    assert.match(e.error.value, /exited \(status 3\)/)
    assert.ok(Date.now() - t0 < 10000)
    assert.equal((await sbx.runCode('2 + 2', { context: ctx })).text, '4')
    // out of memory: the OOM killer takes the kernel, not the server
    const oom = await sbx.runCode('x = b"x" * (2 << 30)', { context: ctx })
    assert.ok(['KernelDied', 'MemoryError'].includes(oom.error?.name), JSON.stringify(oom.error))
    assert.equal((await sbx.runCode('3 + 3', { context: ctx })).text, '6')
    await sbx.removeCodeContext(ctx)
  })

  test('bad input is answered in E2B\'s error formats', async () => {
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), (e) => e.name === 'SandboxError' && /400/.test(e.message))
    await assert.rejects(sbx.createCodeContext({ language: 'cobol' }), (e) => e.name === 'SandboxError')
    await assert.rejects(sbx.runCode('1', { context: { id: 'nope', language: 'python', cwd: '/' } }), (e) => e.name === 'NotFoundError')
    const post = (path, body) => fetch(`${env.sandboxUrl}${path}`, { method: 'POST', headers: headers(sbx), body })
    let r = await post('/execute', '{"code": ')
    assert.equal(r.status, 400)
    assert.match(await r.text(), /not valid JSON/)
    r = await post('/execute', JSON.stringify({ code: '1', language: 'python', context_id: 'x' }))
    assert.equal(r.status, 400)
    assert.equal(await r.text(), 'Only one of context_id or language can be provided')
    r = await post('/execute', JSON.stringify({ code: 'x'.repeat(17 << 20) }))
    assert.equal(r.status, 413)
    // the Python SDK sends nulls
    r = await post('/execute', JSON.stringify({ code: '3', context_id: null, language: null, env_vars: null }))
    assert.equal(r.status, 200)
    const lines = (await r.text()).trim().split('\n').map((l) => JSON.parse(l))
    assert.equal(lines.at(-1).type, 'end_of_execution')
    assert.equal(lines.find((l) => l.type === 'result').text, '3')
    // and the server still works
    assert.equal((await sbx.runCode('5')).text, '5')
  })
})

test('output is bounded: a cell printing more than the limit is cut with a marker', async () => {
  const sbx = await Sandbox.create({ envs: { HUTCH_INTERP_OUTPUT_LIMIT: String(1 << 20) } })
  try {
    const e = await sbx.runCode('import sys\nfor i in range(40): sys.stdout.write("x" * 262144)\nimport base64\nbase64.b64encode(b"y" * (2 << 20)).decode()')
    const printed = e.logs.stdout.join('').length
    assert.ok(printed <= 1 << 20 && printed >= 1 << 19, `printed ${printed}`)
    assert.match(e.logs.stderr.join(''), /output cut/)
    assert.match(e.text, /result cut/)
    assert.equal((await sbx.runCode('1 + 1')).text, '2')
  } finally {
    await sbx.kill()
  }
})

test('killing the sandbox during runCode ends the call at once', async () => {
  const sbx = await Sandbox.create()
  const run = sbx.runCode('import time; time.sleep(60)', { timeoutMs: 0 })
  await new Promise((r) => setTimeout(r, 500))
  const t0 = Date.now()
  await Sandbox.kill(sbx.sandboxId)
  await assert.rejects(run)
  assert.ok(Date.now() - t0 < 5000, `the call ended ${Date.now() - t0} ms after the kill`)
})
