// Image templates through the stock SDK (docs/templates.md): an OCI layout
// made here (tests/helpers/ociimage.py, from busybox-static) is imported with
// `hutch template import` into the daemon's data dir, and Sandbox.create(NAME)
// starts from its layers: the image's files and whiteouts, its Env under the
// create's envs, its WorkingDir as the default cwd, and hutch's own /etc
// pieces. Namespace backend only (gvisor refuses image templates).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { release, tmpdir } from 'node:os'
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Sandbox } from 'e2b'
import { backend, env, hutch, uniqueTag } from './helpers.mjs'

const helpers = fileURLToPath(new URL('../helpers', import.meta.url))

function makeImage(dir) {
  const py = `
import sys
sys.path.insert(0, ${JSON.stringify(helpers)})
import ociimage as oi
bb = open("/bin/busybox", "rb").read()
base = [oi.dir_entry("bin"), oi.file_entry("bin/busybox", bb, mode=0o755)]
base += [oi.symlink_entry("bin/" + t, "busybox") for t in ("sh", "cat", "ls", "id", "pwd", "env", "echo", "test")]
base += [oi.dir_entry("etc"), oi.file_entry("etc/os-release", b"ID=sdkimage\\n"),
         oi.file_entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\\n"), oi.file_entry("etc/group", b"root:x:0:\\n"),
         oi.dir_entry("old"), oi.file_entry("old/f", b"x"),
         # the SDK runs commands with bash -l -c: busybox's sh stands in
         oi.file_entry("bin/bash", b"#!/bin/sh\\nexec /bin/sh \\"$@\\"\\n", mode=0o755)]
top = [oi.dir_entry("work"), oi.file_entry("work/data.txt", b"from the image\\n"), oi.file_entry(".wh.old")]
oi.write_oci_layout(sys.argv[1], [oi.make_tar(base), oi.make_tar(top)],
                    env=["PATH=/bin", "IMAGE_VAR=image", "BOTH=image"], workdir="/work")
`
  execFileSync('/usr/bin/python3', ['-c', py, dir], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 })
}

test('Sandbox.create(image template): its layers, Env, WorkingDir and hutch /etc', async (t) => {
  const work = mkdtempSync(join(tmpdir(), 'hutch-e2b-image-'))
  t.after(() => rmSync(work, { recursive: true, force: true }))
  makeImage(join(work, 'oci'))
  const name = uniqueTag('img').toLowerCase().replace(/[^a-z0-9-]/g, '-')
  assert.equal(hutch(['template', 'import', join(work, 'oci'), '--name', name]).trim(), name)
  t.after(() => { try { hutch(['template', 'rm', name]) } catch {} })

  const sbx = await Sandbox.create(name, { envs: { BOTH: 'create' } })
  t.after(() => sbx.kill().catch(() => {}))
  const info = await sbx.getInfo()
  assert.equal(info.templateId, name)
  const r = await sbx.commands.run('cat /etc/os-release; pwd; echo $IMAGE_VAR $BOTH; id -un; cat /etc/hostname; test -e /old || echo no-old')
  assert.equal(r.stdout, 'ID=sdkimage\n/work\nimage create\nuser\nhutch\nno-old\n')
  assert.equal(await sbx.files.read('/work/data.txt'), 'from the image\n')
  // on the daemon's backend: gvisor runs the sentry's kernel, ns the host's
  const kernel = (await sbx.commands.run('cat /proc/version')).stdout
  assert.equal(!kernel.includes(release()), backend === 'gvisor', kernel)
  // the writable layer is the sandbox's own; the image's files are not changed
  await sbx.files.write('/home/user/mine.txt', 'mine')
  const again = await Sandbox.create(name)
  t.after(() => again.kill().catch(() => {}))
  assert.equal(await again.files.exists('/home/user/mine.txt'), false)
  assert.equal((await again.commands.run('cat /work/data.txt')).stdout, 'from the image\n')
})

test('Sandbox.create of a template that is not there: 404', async () => {
  await assert.rejects(Sandbox.create('no-such-image-template'), (e) => /not found/i.test(e?.message ?? ''))
})
