// Template builds through the stock SDK (docs/templates.md "Building"):
// Template().fromTemplate('base') with runCmd, copy (files, a directory with a
// symlink, a glob), setEnvs, setWorkdir, setUser, setStartCmd; Template.build
// with its logs, a fully cached rebuild, buildInBackground + getBuildStatus,
// a failing step, exists, tags; then Sandbox.create(name) from the result.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { execFileSync, spawn } from 'node:child_process'
import { Sandbox, Template, BuildError } from 'e2b'
import { release } from 'node:os'
import { backend, env, sleep, uniqueTag } from './helpers.mjs'

function context(t) {
  const dir = mkdtempSync(join(env.tmp, 'ctx-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  mkdirSync(join(dir, 'app', 'sub'), { recursive: true })
  writeFileSync(join(dir, 'app', 'a.txt'), 'alpha\n')
  writeFileSync(join(dir, 'app', 'sub', 'b.txt'), 'beta\n')
  symlinkSync('a.txt', join(dir, 'app', 'link.txt'))
  writeFileSync(join(dir, 'top1.txt'), 'one\n')
  writeFileSync(join(dir, 'top2.txt'), 'two\n')
  writeFileSync(join(dir, 'tool.sh'), '#!/bin/sh\necho tool\n')
  return dir
}

function recipe(dir, marker) {
  return Template({ fileContextPath: dir })
    .fromTemplate('base')
    .runCmd(`echo built ${marker} > /home/user/marker && echo step output on stdout`)
    .copy('app', '/opt/app')
    .copy('*.txt', '/opt/globbed/')
    .copy('tool.sh', '/opt/bin/tool.sh', { mode: 0o755 })
    .setEnvs({ GREETING: 'hello world', HOMEVAR: '$HOME' })
    .runCmd('echo "$GREETING" > /home/user/greeting && echo "$HOMEVAR" > /home/user/homevar')
    .setWorkdir('/home/user/work')
    .runCmd('pwd > here && whoami > who')
    .setUser('root')
    .setStartCmd('echo "$GREETING" | grep -q hello && echo started > /tmp/started; sleep 1000', '[ -f /tmp/started ]')
}

test('Template.build: steps run in a sandbox, logs stream, a rebuild is all cached, Sandbox.create(name) gets the result', async (t) => {
  const dir = context(t)
  const name = uniqueTag('tpl')
  const logs = []
  const info = await Template.build(recipe(dir, name), `${name}:v1`, { onBuildLogs: (l) => logs.push(l) }).catch((e) => {
    throw new Error(`${e.message}\n${logs.map((l) => l.message).join('\n')}`)
  })
  assert.match(info.templateId, /^[a-z0-9]{20}$/)
  assert.match(info.buildId, /^[0-9a-f-]{36}$/)
  assert.deepEqual(info.tags, ['v1'])
  const text = logs.map((l) => l.message).join('\n')
  assert.match(text, /\[base\] FROM base/)
  assert.match(text, /\[builder 1\/\d+\] RUN echo built/)
  assert.match(text, /\[builder 1\/\d+\] \[stdout\]: step output on stdout/)
  assert.match(text, /Template is ready/)
  assert.doesNotMatch(text, /CACHED \[builder 1/)

  // every step cached: no sandbox, well under a second
  const cached = []
  const t0 = performance.now()
  const again = await Template.build(recipe(dir, name), `${name}:v1`, { onBuildLogs: (l) => cached.push(l.message) })
  const ms = performance.now() - t0
  assert.equal(again.templateId, info.templateId, 'a rebuild of an owned alias keeps the templateID')
  assert.notEqual(again.buildId, info.buildId)
  assert.ok(cached.some((m) => /^CACHED \[builder 1\//.test(m)), cached.join('\n'))
  assert.ok(!cached.some((m) => /^\[builder \d+\//.test(m)), `a step ran again:\n${cached.join('\n')}`)
  assert.ok(ms < 1000, `an all-cached build took ${ms.toFixed(0)} ms`)
  console.log(`all-cached Template.build: ${ms.toFixed(0)} ms`)

  assert.equal(await Template.exists(`${name}:v1`), true)
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists(`${name}:nope`), false)
  assert.equal(await Template.exists(uniqueTag('never')), false)

  const sbx = await Sandbox.create(`${name}:v1`)
  t.after(() => sbx.kill().catch(() => {}))
  assert.equal((await sbx.getInfo()).templateId, info.templateId)
  const kernel = (await sbx.commands.run('cat /proc/version')).stdout
  assert.equal(!kernel.includes(release()), backend === 'gvisor', kernel)
  const r = await sbx.commands.run(
    'cat /home/user/marker /opt/app/a.txt /opt/app/sub/b.txt; readlink /opt/app/link.txt; ls /opt/globbed; ' +
      'stat -c "%a %U" /opt/bin/tool.sh /opt/app/a.txt; cat /home/user/greeting /home/user/homevar; ' +
      'cat /home/user/work/here /home/user/work/who; whoami; pwd; grep TEMPLATE_ID /.e2b; echo "env:$GREETING"; ' +
      'cat /tmp/started; stat -c %U /tmp/started',
  )
  assert.equal(
    r.stdout,
    `built ${name}\nalpha\nbeta\na.txt\ntop1.txt\ntop2.txt\n755 user\n644 user\nhello world\n/root\n` +
      `/home/user/work\nuser\nroot\n/home/user/work\nTEMPLATE_ID=${info.templateId}\nenv:\nstarted\nroot\n`,
  )

  // tags: assign, get, remove
  const tagged = await Template.assignTags(`${name}:v1`, ['prod', 'stable'])
  assert.equal(tagged.buildId, again.buildId)
  assert.deepEqual(tagged.tags, ['prod', 'stable'])
  let tags = (await Template.getTags(info.templateId)).map((x) => x.tag).sort()
  assert.deepEqual(tags, ['prod', 'stable', 'v1'])
  await Template.removeTags(name, 'prod')
  tags = (await Template.getTags(name)).map((x) => x.tag).sort()
  assert.deepEqual(tags, ['stable', 'v1'])
  assert.equal(await Template.exists(`${name}:stable`), true)
  assert.equal(await Template.exists(`${name}:prod`), false)
  await assert.rejects(Template.removeTags(name, 'default'), /default/)
})

test('buildInBackground + getBuildStatus; a failing step is a BuildError naming it; /health answers during a build', async (t) => {
  const name = uniqueTag('bg')
  const tpl = Template().fromTemplate('base').runCmd('sleep 2; echo slow').runCmd(`echo ${name}; false`)
  const bi = await Template.buildInBackground(tpl, name)
  assert.deepEqual(bi.tags, ['default'])
  // the loop stays responsive while the builder works
  const h0 = performance.now()
  const health = await fetch(`${env.apiUrl}/health`)
  assert.equal(health.status, 200)
  assert.ok(performance.now() - h0 < 500)
  let st
  for (let i = 0; i < 200; i++) {
    st = await Template.getBuildStatus(bi)
    if (st.status === 'ready' || st.status === 'error') break
    assert.ok(['waiting', 'building'].includes(st.status))
    await sleep(200)
  }
  assert.equal(st.status, 'error')
  assert.equal(st.reason.step, '2')
  assert.match(st.reason.message, /failed to run command/)
  // offsets index the same log
  const all = await Template.getBuildStatus(bi, { logsOffset: 0 })
  const later = await Template.getBuildStatus(bi, { logsOffset: 2 })
  assert.deepEqual(later.logEntries.map((l) => l.message), all.logEntries.slice(2).map((l) => l.message))
  assert.ok(all.logEntries.some((l) => /\[stdout\]: slow/.test(l.message)))

  await assert.rejects(
    Template.build(Template().fromTemplate('base').runCmd('exit 3'), uniqueTag('fail')),
    (e) => e instanceof BuildError && /exit status 3/.test(e.message),
  )
  // a failed build is never a template a sandbox starts from
  await assert.rejects(Sandbox.create(name), /not found|no ready build/)
})

test('a build step reaches no network: a RUN step cannot connect to a server on the host', async (t) => {
  // a server in a network namespace of its own, reachable from the host
  const ns = uniqueTag('hb').slice(0, 12)
  execFileSync('ip', ['netns', 'add', ns])
  t.after(() => execFileSync('ip', ['netns', 'del', ns]))
  execFileSync('ip', ['link', 'add', `${ns}a`, 'type', 'veth', 'peer', 'name', `${ns}b`])
  t.after(() => { try { execFileSync('ip', ['link', 'del', `${ns}a`]) } catch {} })
  execFileSync('ip', ['link', 'set', `${ns}b`, 'netns', ns])
  const o3 = 100 + Math.floor(Math.random() * 100)
  execFileSync('ip', ['addr', 'add', `10.231.${o3}.1/30`, 'dev', `${ns}a`])
  execFileSync('ip', ['link', 'set', `${ns}a`, 'up'])
  execFileSync('ip', ['netns', 'exec', ns, 'ip', 'addr', 'add', `10.231.${o3}.2/30`, 'dev', `${ns}b`])
  execFileSync('ip', ['netns', 'exec', ns, 'ip', 'link', 'set', `${ns}b`, 'up'])
  const srv = spawn('ip', ['netns', 'exec', ns, 'python3', '-m', 'http.server', '--bind', `10.231.${o3}.2`, '18080'], { stdio: 'ignore' })
  t.after(() => srv.kill('SIGKILL'))
  // the host reaches it (so a refusal below is the sandbox's)
  let ok = false
  for (let i = 0; i < 50 && !ok; i++) {
    try { ok = (await fetch(`http://10.231.${o3}.2:18080/`)).status === 200 } catch { await sleep(100) }
  }
  assert.ok(ok, 'the test server is reachable from the host')
  const logs = []
  await assert.rejects(
    Template.build(
      Template().fromTemplate('base').runCmd(`curl -sS -m 3 http://10.231.${o3}.2:18080/ && echo REACHED`),
      uniqueTag('net'),
      { onBuildLogs: (l) => logs.push(l.message) },
    ),
    BuildError,
  )
  assert.ok(!logs.some((m) => /\[stdout\]: REACHED/.test(m)), logs.join('\n'))
  assert.ok(logs.some((m) => /\[stderr\]: curl: \(7\)/.test(m)), logs.join('\n'))
})

test('hutch template build FILE: the same builder from the CLI, then Sandbox.create(name)', async (t) => {
  const dir = context(t)
  const name = uniqueTag('cli')
  writeFileSync(
    join(dir, 'hutch.build'),
    `# a build file\nFROM base\nRUN echo from-cli > /home/user/cli\nCOPY app /opt/capp\nWORKDIR /opt/capp\nUSER root\n`,
  )
  const out = execFileSync(env.bin, ['template', 'build', join(dir, 'hutch.build'), '--name', name], {
    env: { ...process.env, HUTCH_DATA_DIR: env.dataDir, HUTCH_RUN_DIR: env.runDir },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  assert.match(out, /^[a-z0-9]{20}$/m)
  const sbx = await Sandbox.create(name)
  t.after(() => sbx.kill().catch(() => {}))
  const r = await sbx.commands.run('cat /home/user/cli /opt/capp/a.txt; pwd; whoami')
  assert.equal(r.stdout, 'from-cli\nalpha\n/opt/capp\nroot\n')
})

test('fromImage: an image template of this host (imported) is the base; its Env reaches the steps; the result keeps its files', async (t) => {
  const dir = context(t)
  const tarPath = join(dir, 'bb.tar')
  const here = new URL('.', import.meta.url).pathname
  execFileSync('python3', [join(here, '..', 'helpers', 'busybox_image.py'), tarPath])
  const img = uniqueTag('bb')
  execFileSync(env.bin, ['template', 'import', tarPath, '--name', img], {
    env: { ...process.env, HUTCH_DATA_DIR: env.dataDir, HUTCH_RUN_DIR: env.runDir },
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  const name = uniqueTag('fromimg')
  const logs = []
  const tpl = Template({ fileContextPath: dir })
    .fromImage(img)
    .runCmd('echo "$IMAGE_VAR" > /home/user/var; id -un > /home/user/who')
    .copy('app', '/home/user/app')
    .setWorkdir('/home/user/app')
  await Template.build(tpl, name, { onBuildLogs: (l) => logs.push(l.message) }).catch((e) => {
    throw new Error(`${e.message}\n${logs.join('\n')}`)
  })
  assert.ok(logs.some((m) => m.includes(`[base] FROM ${img}`)), logs.join('\n'))
  const sbx = await Sandbox.create(name)
  t.after(() => sbx.kill().catch(() => {}))
  const r = await sbx.commands.run('cat /home/user/var /home/user/who a.txt 2>&1; pwd; test -e /usr/bin/python3 || echo no-host-usr; ls /bin/busybox')
  assert.equal(r.stdout, 'from-the-image\nuser\nalpha\n/home/user/app\nno-host-usr\n/bin/busybox\n')
  // on the daemon's backend: gvisor runs the sentry's kernel, ns the host's
  const kernel = (await sbx.commands.run('cat /proc/version')).stdout
  assert.equal(!kernel.includes(release()), backend === 'gvisor', kernel)
  // a snapshot of it starts on the same image, with the build's files and its own
  await sbx.files.write('/home/user/later.txt', 'after the build')
  const snap = await sbx.createSnapshot()
  const again = await Sandbox.create(snap.snapshotId)
  t.after(() => again.kill().catch(() => {}))
  const r2 = await again.commands.run('cat /home/user/var /home/user/later.txt; echo; test -e /usr/bin/python3 || echo no-host-usr')
  assert.equal(r2.stdout, 'from-the-image\nafter the build\nno-host-usr\n')
  // a missing image is a BuildError at the base step, with what to do
  await assert.rejects(
    Template.build(Template().fromImage('nosuchimage:1.0').runCmd('true'), uniqueTag('noimg')),
    (e) => e instanceof BuildError && /nosuchimage:1.0.*the pull failed/.test(e.message),
  )
  // fromImage is the client's word: the daemon's builds pull only from the
  // registries its registries.conf names, and refuse before connecting
  await assert.rejects(
    Template.build(Template().fromImage('127.0.0.1:9/elsewhere/img:1').runCmd('true'), uniqueTag('unlisted')),
    (e) => e instanceof BuildError && /does not list .*refused/.test(e.message),
  )
})

// fromImage(ref, {username, password}): the SDK's fromImageRegistry, a
// build's own credentials, against a docker-registry with htpasswd auth on the
// host's loopback (docs/templates.md "Credentials")
test('fromImage with credentials: a private image is pulled with them; wrong ones fail the build without the password', async (t) => {
  const dir = mkdtempSync(join(env.tmp, 'regcred-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  for (const tool of ['docker-registry', 'skopeo', 'htpasswd']) {
    try { execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }) } catch { t.skip(`needs ${tool}`); return }
  }
  const password = `pw-${Math.random().toString(36).slice(2)}${Date.now()}`
  const wrong = `wrong-${Math.random().toString(36).slice(2)}`
  writeFileSync(join(dir, 'htpasswd'), execFileSync('htpasswd', ['-Bbn', 'alice', password]))
  const port = execFileSync('node', ['-e', 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})']).toString().trim()
  const reg = `127.0.0.1:${port}`
  writeFileSync(join(dir, 'reg.yml'), `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/store\n` +
    `http:\n  addr: ${reg}\nauth:\n  htpasswd:\n    realm: hutch-sdk\n    path: ${dir}/htpasswd\n`)
  const srv = spawn('docker-registry', ['serve', join(dir, 'reg.yml')], { stdio: 'ignore' })
  t.after(() => srv.kill())
  const here = new URL('.', import.meta.url).pathname
  execFileSync('python3', [join(here, '..', 'helpers', 'busybox_image.py'), join(dir, 'bb.tar')])
  for (let i = 0; ; i++) {
    try {
      execFileSync('skopeo', ['copy', '--dest-tls-verify=false', '--dest-creds', `alice:${password}`,
        `docker-archive:${join(dir, 'bb.tar')}`, `docker://${reg}/private/bb:1`], { stdio: 'ignore' })
      break
    } catch (e) { if (i > 50) throw e; await sleep(200) }
  }
  // the daemon's pulls are restricted: the operator lists the registry
  const conf = join(env.dataDir, 'registries.conf')
  let before = null
  try { before = readFileSync(conf, 'utf8') } catch {}
  writeFileSync(conf, `${before ?? ''}\ninsecure ${reg}\nallow ${reg}\n`)
  t.after(() => (before === null ? rmSync(conf, { force: true }) : writeFileSync(conf, before)))

  const ref = `${reg}/private/bb:1`
  const name = uniqueTag('regcred')
  const logs = []
  const tpl = Template().fromImage(ref, { username: 'alice', password }).runCmd('echo "$IMAGE_VAR" > /home/user/var; env > /home/user/buildenv')
  await Template.build(tpl, name, { onBuildLogs: (l) => logs.push(l.message) }).catch((e) => {
    throw new Error(`${e.message}\n${logs.join('\n')}`)
  })
  assert.ok(logs.some((m) => m.includes("with the build's credentials")), logs.join('\n'))
  assert.ok(!logs.join('\n').includes(password))
  const sbx = await Sandbox.create(name)
  t.after(() => sbx.kill().catch(() => {}))
  assert.equal((await sbx.commands.run('cat /home/user/var; ls /bin/busybox')).stdout, 'from-the-image\n/bin/busybox\n')
  // the build step's environment had no credentials
  const buildenv = (await sbx.commands.run('cat /home/user/buildenv')).stdout
  assert.match(buildenv, /IMAGE_VAR=from-the-image/)
  assert.ok(!buildenv.includes(password) && !buildenv.includes('alice'), buildenv)

  // wrong credentials: a BuildError that names the registry's refusal, not the password
  await assert.rejects(
    Template.build(Template().fromImage(ref, { username: 'alice', password: wrong }).runCmd('true'), uniqueTag('regwrong')),
    (e) => e instanceof BuildError && /refused .*the build's credentials \(HTTP 401\)/.test(e.message) && !e.message.includes(wrong),
  )
  // none: the registry's 401, though this host pulled the image a moment ago
  await assert.rejects(
    Template.build(Template().fromImage(ref).runCmd('true'), uniqueTag('regnone')),
    (e) => e instanceof BuildError && /401/.test(e.message),
  )
  // aws: the key goes to ECR's API only for an ECR registry of its region
  await assert.rejects(
    Template.build(Template().fromAWSRegistry(ref, { accessKeyId: 'AKIAEXAMPLE', secretAccessKey: wrong, region: 'us-east-1' }).runCmd('true'), uniqueTag('regaws')),
    (e) => e instanceof BuildError && /is not an Amazon ECR registry of region us-east-1/.test(e.message) && !e.message.includes(wrong),
  )
})

test('e2b 2.45: the legacy Template.build(t, {alias}) overload (cpuCount and memoryMB always sent) builds and starts', async (t) => {
  const { Template: Template245, Sandbox: Sandbox245 } = await import('e2b-245')
  const alias = uniqueTag('old')
  const info = await Template245.build(Template245().fromTemplate('base').runCmd('echo legacy > /home/user/old'), { alias })
  assert.match(info.templateId, /^[a-z0-9]{20}$/)
  const st = await Template245.getBuildStatus(info)
  assert.equal(st.status, 'ready')
  const sbx = await Sandbox245.create(alias)
  t.after(() => sbx.kill().catch(() => {}))
  assert.equal((await sbx.commands.run('cat /home/user/old')).stdout, 'legacy\n')
})

test('Template.exists: the templates every team creates from without a build (base, host) exist, as public ones', async () => {
  // the SDK's GET /templates/aliases/NAME: 200 (or 403) is true, 404 false
  assert.equal(await Template.exists('base'), true)
  assert.equal(await Template.exists('host'), true)
  assert.equal(await Template.exists(uniqueTag('never')), false)
  assert.equal(await Template.exists('base:v9'), false)
  const res = await fetch(`${process.env.E2B_API_URL}/templates/aliases/base`, {
    headers: { 'X-API-KEY': process.env.E2B_API_KEY },
  })
  assert.equal(res.status, 200)
  assert.deepEqual(await res.json(), { templateID: 'base', public: true })
})
