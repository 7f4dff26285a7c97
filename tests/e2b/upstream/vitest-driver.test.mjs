// Runs the upstream E2B JS SDK test files (prepared by run-upstream.sh) with
// vitest against the daemon run.sh started, one file at a time, and writes
// per-file pass/fail/skip counts and the failing tests' messages to
// $HUTCH_UPSTREAM_OUT. Not part of `make test`: run.sh only globs
// tests/e2b/*.test.mjs, and this file lives in tests/e2b/upstream/.
import { spawnSync } from 'node:child_process'
import { readFileSync, writeFileSync, existsSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

const dir = process.env.HUTCH_UPSTREAM_DIR
const out = process.env.HUTCH_UPSTREAM_OUT
const files = (process.env.HUTCH_UPSTREAM_FILES ?? '').split(/\s+/).filter(Boolean)

test('upstream E2B JS SDK files', { timeout: 4 * 3600 * 1000 }, () => {
  mkdirSync(out, { recursive: true })
  const summary = []
  for (const f of files) {
    const json = join(out, f.replace(/[/]/g, '__') + '.json')
    const r = spawnSync('npx', ['vitest', 'run', '--config', 'hutch.vitest.config.mts',
      '--reporter=json', `--outputFile=${json}`, '--reporter=default', f],
    { cwd: dir, env: process.env, encoding: 'utf8', maxBuffer: 1 << 28 })
    writeFileSync(join(out, f.replace(/[/]/g, '__') + '.log'), r.stdout + r.stderr)
    let pass = 0, fail = 0, skip = 0
    const failures = []
    if (existsSync(json)) {
      const res = JSON.parse(readFileSync(json, 'utf8'))
      for (const tr of res.testResults ?? []) {
        if ((tr.assertionResults ?? []).length === 0 && tr.status === 'failed')
          failures.push({ name: '(file)', message: tr.message })
        for (const a of tr.assertionResults ?? []) {
          if (a.status === 'passed') pass++
          else if (a.status === 'failed') {
            fail++
            failures.push({ name: a.fullName, message: (a.failureMessages ?? []).join('\n').slice(0, 600) })
          } else skip++
        }
      }
    } else failures.push({ name: '(file)', message: 'no vitest report (exit ' + r.status + ')' })
    summary.push({ file: f, pass, fail, skip, failures })
    console.log(`${f}: ${pass} passed, ${fail} failed, ${skip} skipped`)
    for (const x of failures) console.log(`  FAIL ${x.name}: ${x.message.split('\n')[0]}`)
  }
  writeFileSync(join(out, 'summary.json'), JSON.stringify(summary, null, 1))
})
