// /files and filesystem.Filesystem through sbx.files, signed URLs with fetch.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import {
  Sandbox,
  FileNotFoundError,
  InvalidArgumentError,
  NotEnoughSpaceError,
  SandboxError,
  getSignature,
} from 'e2b'
import { createSandbox, errName, readAll, sha256, uniqueTag, notOnGvisor } from './helpers.mjs'

let shared
async function sandbox() {
  if (!shared) shared = await Sandbox.create({ timeoutMs: 600_000 })
  return shared
}
test.after(async () => { if (shared) await shared.kill().catch(() => {}) })

const dir = () => `/tmp/${uniqueTag('d')}`

test('write/read text; write returns name, path, type', async () => {
  const sbx = await sandbox()
  const p = `${dir()}/a.txt`
  const info = await sbx.files.write(p, 'hello wörld\n')
  assert.equal(info.name, 'a.txt')
  assert.equal(info.path, p)
  assert.equal(info.type, 'file')
  assert.equal(await sbx.files.read(p), 'hello wörld\n')
  // overwrite truncates
  await sbx.files.write(p, 'x')
  assert.equal(await sbx.files.read(p), 'x')
  // empty file
  await sbx.files.write(p, '')
  assert.equal(await sbx.files.read(p), '')
  assert.equal((await sbx.files.read(p, { format: 'bytes' })).length, 0)
  // what a command sees
  await sbx.files.write(p, 'from sdk')
  assert.equal((await sbx.commands.run(`cat ${p}`)).stdout, 'from sdk')
})

test('bytes, blob and stream formats, binary-safe', async () => {
  const sbx = await sandbox()
  const d = dir()
  const all = new Uint8Array(256 * 4).map((_, i) => i % 256)
  await sbx.files.write(`${d}/bytes.bin`, all)
  const back = await sbx.files.read(`${d}/bytes.bin`, { format: 'bytes' })
  assert.ok(back instanceof Uint8Array)
  assert.deepEqual(Buffer.from(back), Buffer.from(all))

  await sbx.files.write(`${d}/ab.bin`, all.buffer)
  assert.deepEqual(Buffer.from(await sbx.files.read(`${d}/ab.bin`, { format: 'bytes' })), Buffer.from(all))

  await sbx.files.write(`${d}/blob.txt`, new Blob(['blob ', 'content']))
  const blob = await sbx.files.read(`${d}/blob.txt`, { format: 'blob' })
  assert.ok(blob instanceof Blob)
  assert.equal(await blob.text(), 'blob content')

  // ReadableStream upload -> octet-stream, chunked
  const parts = [randomBytes(70_000), randomBytes(3), randomBytes(200_000)]
  const rs = new ReadableStream({
    start(c) { for (const p of parts) c.enqueue(new Uint8Array(p)); c.close() },
  })
  await sbx.files.write(`${d}/stream.bin`, rs)
  const stream = await sbx.files.read(`${d}/stream.bin`, { format: 'stream' })
  const got = await readAll(stream)
  assert.equal(sha256(got), sha256(Buffer.concat(parts)))

  // explicit octet-stream upload of a string
  await sbx.files.write(`${d}/octet.txt`, 'octet', { useOctetStream: true })
  assert.equal(await sbx.files.read(`${d}/octet.txt`), 'octet')
})

test('read of a missing file -> FileNotFoundError; read of a directory fails', async () => {
  const sbx = await sandbox()
  await assert.rejects(sbx.files.read(`/tmp/${uniqueTag('missing')}.txt`), FileNotFoundError)
  await assert.rejects(sbx.files.read(`/tmp/${uniqueTag('missing')}/x`, { format: 'bytes' }), FileNotFoundError)
  await assert.rejects(sbx.files.read('/tmp'), (e) => e instanceof SandboxError && !(e instanceof FileNotFoundError), 'reading a directory must be an error (400)')
})

test('write creates missing parent directories, owned by the user', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.write(`${d}/n1/n2/n3/deep.txt`, 'deep')
  assert.equal(await sbx.files.read(`${d}/n1/n2/n3/deep.txt`), 'deep')
  for (const p of [`${d}/n1`, `${d}/n1/n2`, `${d}/n1/n2/n3`]) {
    const i = await sbx.files.getInfo(p)
    assert.equal(i.type, 'dir', p)
    assert.equal(i.owner, 'user', `${p} owner`)
  }
})

test('relative paths resolve against the user\'s home', async () => {
  const sbx = await sandbox()
  const name = `${uniqueTag('rel')}.txt`
  const info = await sbx.files.write(name, 'relative')
  assert.equal(info.path, `/home/user/${name}`)
  assert.equal(await sbx.files.read(`/home/user/${name}`), 'relative')
  assert.equal(await sbx.files.read(name), 'relative')
  assert.equal((await sbx.commands.run(`cat ~/${name}`)).stdout, 'relative')
  assert.equal(await sbx.files.exists(name), true)
  // root's relative paths go to /root
  const rinfo = await sbx.files.write(name, 'root relative', { user: 'root' })
  assert.equal(rinfo.path, `/root/${name}`)
  assert.equal((await sbx.commands.run(`cat /root/${name}`, { user: 'root' })).stdout, 'root relative')
})

test('ownership and modes: user by default, root when written as root', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.write(`${d}/u.txt`, '12345')
  const u = await sbx.files.getInfo(`${d}/u.txt`)
  assert.equal(u.name, 'u.txt')
  assert.equal(u.path, `${d}/u.txt`)
  assert.equal(u.type, 'file')
  assert.equal(u.size, 5)
  assert.equal(u.mode, 0o644)
  assert.equal(u.permissions, '-rw-r--r--')
  assert.equal(u.owner, 'user')
  assert.equal(u.group, 'user')
  assert.ok(u.modifiedTime instanceof Date && Math.abs(u.modifiedTime - Date.now()) < 60_000, `modifiedTime ${u.modifiedTime}`)
  assert.equal((await sbx.commands.run(`stat -c %U:%G:%a ${d}/u.txt`)).stdout, 'user:user:644\n')

  await sbx.files.write(`${d}/r.txt`, 'r', { user: 'root' })
  const r = await sbx.files.getInfo(`${d}/r.txt`)
  assert.equal(r.owner, 'root')
  assert.equal(r.group, 'root')
  assert.equal((await sbx.commands.run(`stat -c %U ${d}/r.txt`)).stdout, 'root\n')

  // the user cannot write into a root-only directory (the write runs as the user)
  await sbx.commands.run(`mkdir ${d}/rootonly && chmod 700 ${d}/rootonly`, { user: 'root' })
  await assert.rejects(sbx.files.write(`${d}/rootonly/nope.txt`, 'x'), (e) => e instanceof Error, 'user must not write into a root 0700 dir')
  assert.equal((await sbx.commands.run(`test -e ${d}/rootonly/nope.txt && echo exists || echo absent`, { user: 'root' })).stdout, 'absent\n')
  // but root can
  await sbx.files.write(`${d}/rootonly/yes.txt`, 'y', { user: 'root' })
  assert.equal(await sbx.files.read(`${d}/rootonly/yes.txt`, { user: 'root' }), 'y')
  await assert.rejects(sbx.files.read(`${d}/rootonly/yes.txt`), (e) => e instanceof Error, 'user must not read through a root 0700 dir')

  const dinfo = await sbx.files.getInfo(d)
  assert.equal(dinfo.type, 'dir')
  assert.equal(dinfo.mode, 0o755)
  assert.equal(dinfo.permissions, 'drwxr-xr-x')
  assert.equal(dinfo.owner, 'user')
})

test('writeFiles: several files in one multipart request', async () => {
  const sbx = await sandbox()
  const d = dir()
  const bin = randomBytes(1000)
  const infos = await sbx.files.writeFiles([
    { path: `${d}/m/x.txt`, data: 'xx' },
    { path: `${d}/m/y.bin`, data: new Uint8Array(bin) },
    { path: `${d}/other/z.txt`, data: new Blob(['zzz']) },
  ])
  assert.equal(infos.length, 3)
  assert.deepEqual(infos.map((i) => i.path).sort(), [`${d}/m/x.txt`, `${d}/m/y.bin`, `${d}/other/z.txt`])
  assert.deepEqual(infos.map((i) => i.name).sort(), ['x.txt', 'y.bin', 'z.txt'])
  assert.equal(await sbx.files.read(`${d}/m/x.txt`), 'xx')
  assert.deepEqual(Buffer.from(await sbx.files.read(`${d}/m/y.bin`, { format: 'bytes' })), bin)
  assert.equal(await sbx.files.read(`${d}/other/z.txt`), 'zzz')
  // the array form of write() is the same call
  const arr = await sbx.files.write([{ path: `${d}/w1.txt`, data: '1' }, { path: `${d}/w2.txt`, data: '2' }])
  assert.equal(arr.length, 2)
  assert.equal(await sbx.files.read(`${d}/w2.txt`), '2')
})

test('list with depth 1 and 2; list errors', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.makeDir(`${d}/a/b`)
  await sbx.files.write(`${d}/f.txt`, 'f')
  await sbx.files.write(`${d}/a/g.txt`, 'gg')
  await sbx.files.write(`${d}/a/b/h.txt`, 'hhh')

  const l1 = await sbx.files.list(d)
  assert.deepEqual(l1.map((e) => e.name).sort(), ['a', 'f.txt'])
  assert.deepEqual(l1.map((e) => e.path).sort(), [`${d}/a`, `${d}/f.txt`])
  const f = l1.find((e) => e.name === 'f.txt')
  assert.equal(f.type, 'file')
  assert.equal(f.size, 1)
  assert.equal(f.owner, 'user')
  assert.equal(f.permissions, '-rw-r--r--')
  assert.equal(l1.find((e) => e.name === 'a').type, 'dir')

  const l2 = await sbx.files.list(d, { depth: 2 })
  assert.deepEqual(l2.map((e) => e.path).sort(), [`${d}/a`, `${d}/a/b`, `${d}/a/g.txt`, `${d}/f.txt`])
  assert.equal(l2.find((e) => e.path === `${d}/a/g.txt`).size, 2)

  const l3 = await sbx.files.list(d, { depth: 3 })
  assert.ok(l3.some((e) => e.path === `${d}/a/b/h.txt`))

  await assert.rejects(sbx.files.list(`${d}/nope`), FileNotFoundError)
  await assert.rejects(sbx.files.list(`${d}/f.txt`), (e) => e instanceof InvalidArgumentError, 'listing a file: invalid_argument')
  await assert.rejects(sbx.files.list(d, { depth: 0 }), InvalidArgumentError) // client-side check
})

test('exists, makeDir (true, then false), makeDir over a file', async () => {
  const sbx = await sandbox()
  const d = dir()
  assert.equal(await sbx.files.exists(d), false)
  assert.equal(await sbx.files.makeDir(`${d}/x/y`), true)
  assert.equal(await sbx.files.exists(`${d}/x/y`), true)
  assert.equal(await sbx.files.makeDir(`${d}/x/y`), false)
  assert.equal((await sbx.files.getInfo(`${d}/x/y`)).owner, 'user')
  await sbx.files.write(`${d}/file`, 'f')
  assert.equal(await sbx.files.exists(`${d}/file`), true)
  await assert.rejects(sbx.files.makeDir(`${d}/file`), InvalidArgumentError)
  await assert.rejects(sbx.files.getInfo(`${d}/none`), FileNotFoundError)
})

test('rename: returns the new entry, creates parents, old path gone', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.write(`${d}/old.txt`, 'content')
  const e = await sbx.files.rename(`${d}/old.txt`, `${d}/sub/new.txt`)
  assert.equal(e.name, 'new.txt')
  assert.equal(e.path, `${d}/sub/new.txt`)
  assert.equal(e.type, 'file')
  assert.equal(await sbx.files.exists(`${d}/old.txt`), false)
  assert.equal(await sbx.files.read(`${d}/sub/new.txt`), 'content')
  // directories move too
  const de = await sbx.files.rename(`${d}/sub`, `${d}/sub2`)
  assert.equal(de.type, 'dir')
  assert.equal(await sbx.files.read(`${d}/sub2/new.txt`), 'content')
  await assert.rejects(sbx.files.rename(`${d}/missing`, `${d}/x`), FileNotFoundError)
})

test('remove: files, whole trees, missing paths are fine', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.write(`${d}/t/a/b.txt`, 'b')
  await sbx.files.write(`${d}/single.txt`, 's')
  await sbx.files.remove(`${d}/single.txt`)
  assert.equal(await sbx.files.exists(`${d}/single.txt`), false)
  await sbx.files.remove(`${d}/t`)
  assert.equal(await sbx.files.exists(`${d}/t`), false)
  await sbx.files.remove(`${d}/never-existed`)
})

test('symlinks: getInfo reports the target type and symlinkTarget', async () => {
  const sbx = await sandbox()
  const d = dir()
  await sbx.files.write(`${d}/target.txt`, 'target')
  await sbx.commands.run(`ln -s ${d}/target.txt ${d}/link`)
  const i = await sbx.files.getInfo(`${d}/link`)
  assert.equal(i.symlinkTarget, `${d}/target.txt`)
  assert.equal(i.type, 'file')
  assert.equal(await sbx.files.read(`${d}/link`), 'target')
})

test('file metadata: stored on write (keys lowercased), returned by getInfo/list, replaced by the next write', async () => {
  const sbx = await sandbox()
  const d = `/home/user/${uniqueTag('meta')}` // on the writable layer (xattrs)
  const w = await sbx.files.write(`${d}/meta.txt`, 'm', { metadata: { Owner: 'alice', 'k-2': 'v 2' } })
  assert.deepEqual(w.metadata, { owner: 'alice', 'k-2': 'v 2' })
  assert.deepEqual((await sbx.files.getInfo(`${d}/meta.txt`)).metadata, { owner: 'alice', 'k-2': 'v 2' })
  const listed = (await sbx.files.list(d)).find((e) => e.name === 'meta.txt')
  assert.deepEqual(listed.metadata, { owner: 'alice', 'k-2': 'v 2' })
  // stored as user.e2b.* xattrs
  const x = await sbx.commands.run(`python3 -c 'import os; print(os.getxattr("${d}/meta.txt", "user.e2b.owner").decode())'`)
  assert.equal(x.stdout, 'alice\n')
  // a new upload replaces all metadata
  await sbx.files.write(`${d}/meta.txt`, 'm2', { metadata: { only: 'this' } })
  assert.deepEqual((await sbx.files.getInfo(`${d}/meta.txt`)).metadata, { only: 'this' })
  await sbx.files.write(`${d}/meta.txt`, 'm3')
  assert.equal((await sbx.files.getInfo(`${d}/meta.txt`)).metadata, undefined)
  // files without metadata have none
  await sbx.files.write(`${d}/plain.txt`, 'p')
  assert.equal((await sbx.files.getInfo(`${d}/plain.txt`)).metadata, undefined)
})

test('gzip upload and download', async () => {
  const sbx = await sandbox()
  const d = dir()
  const text = 'compressible line of text\n'.repeat(20_000)
  const w = await sbx.files.write(`${d}/gz.txt`, text, { gzip: true })
  assert.equal(w.path, `${d}/gz.txt`)
  assert.equal(await sbx.files.read(`${d}/gz.txt`), text, 'gzip upload must be stored decompressed')
  assert.equal((await sbx.commands.run(`wc -c < ${d}/gz.txt`)).stdout.trim(), String(text.length))
  assert.equal(await sbx.files.read(`${d}/gz.txt`, { gzip: true }), text)
  const bytes = await sbx.files.read(`${d}/gz.txt`, { gzip: true, format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), text)
})

test('signed uploadUrl/downloadUrl work with plain fetch', async (t) => {
  const sbx = await createSandbox(t)
  const p = '/tmp/signed.txt'

  const up = await sbx.uploadUrl(p)
  assert.match(up, /signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['signed upload']), 'signed.txt')
  const r1 = await fetch(up, { method: 'POST', body: form })
  assert.equal(r1.status, 200, await r1.clone().text())
  const body1 = await r1.json()
  assert.equal(body1[0].path, p)
  assert.equal(await sbx.files.read(p), 'signed upload')
  assert.equal((await sbx.files.getInfo(p)).owner, 'user')

  const down = await sbx.downloadUrl(p)
  const r2 = await fetch(down)
  assert.equal(r2.status, 200)
  assert.equal(await r2.text(), 'signed upload')

  // with an expiration in the future
  const downExp = await sbx.downloadUrl(p, { useSignatureExpiration: 60 })
  assert.match(downExp, /signature_expiration=\d+/)
  const r3 = await fetch(downExp)
  assert.equal(r3.status, 200)
  assert.equal(await r3.text(), 'signed upload')
  const upExp = await sbx.uploadUrl('/tmp/signed2.txt', { useSignatureExpiration: 60 })
  const form2 = new FormData()
  form2.append('file', 'text without filename') // what third parties send
  const r4 = await fetch(upExp, { method: 'POST', body: form2 })
  assert.equal(r4.status, 200, await r4.clone().text())
  await r4.arrayBuffer()
  assert.equal(await sbx.files.read('/tmp/signed2.txt'), 'text without filename')

  // as root
  await sbx.files.write('/tmp/rootfile', 'root only', { user: 'root' })
  await sbx.commands.run('chmod 600 /tmp/rootfile', { user: 'root' })
  const rootDown = await sbx.downloadUrl('/tmp/rootfile', { user: 'root' })
  const r5 = await fetch(rootDown)
  assert.equal(r5.status, 200)
  assert.equal(await r5.text(), 'root only')
  const rootUp = await sbx.uploadUrl('/tmp/by-root.txt', { user: 'root' })
  const form3 = new FormData()
  form3.append('file', new Blob(['r']), 'by-root.txt')
  const r6 = await fetch(rootUp, { method: 'POST', body: form3 })
  assert.equal(r6.status, 200)
  await r6.arrayBuffer()
  assert.equal((await sbx.files.getInfo('/tmp/by-root.txt')).owner, 'root')

  // a relative path is resolved in the user's home
  const relUp = await sbx.uploadUrl('rel-signed.txt')
  const form4 = new FormData()
  form4.append('file', new Blob(['rel']), 'rel-signed.txt')
  const r7 = await fetch(relUp, { method: 'POST', body: form4 })
  assert.equal(r7.status, 200)
  await r7.arrayBuffer()
  assert.equal(await sbx.files.read('/home/user/rel-signed.txt'), 'rel')
})

// fetch -> [status, body]; a connection the server drops before answering
// becomes a readable status instead of an exception
async function fetchStatus(url, init) {
  try {
    const r = await fetch(url, init)
    return [r.status, await r.text()]
  } catch (e) {
    return [`network error (${e.cause?.code ?? e.cause?.message ?? e.message})`, '']
  }
}

test('signed URLs: tampered, expired, wrong operation or wrong user -> 401', async (t) => {
  const sbx = await createSandbox(t)
  const p = '/tmp/guarded.txt'
  await sbx.files.write(p, 'secret')
  const down = new URL(await sbx.downloadUrl(p))
  const sig = down.searchParams.get('signature')
  const uploadForm = () => {
    const form = new FormData()
    form.append('file', new Blob(['overwrite']), 'guarded.txt')
    return form
  }
  const failures = []
  const expect401 = async (what, url, init) => {
    const [status, body] = await fetchStatus(url, init)
    if (status !== 401) failures.push(`${what}: expected 401, got ${status} ${body.slice(0, 100)}`)
    if (body.includes('secret') && !body.includes('signature')) failures.push(`${what}: body leaks the file`)
    return body
  }

  const tampered = new URL(down)
  tampered.searchParams.set('signature', sig.slice(0, -2) + (sig.endsWith('A') ? 'BB' : 'AA'))
  await expect401('tampered signature (GET)', tampered)

  const otherPath = new URL(down)
  otherPath.searchParams.set('path', '/etc/passwd')
  await expect401(`signature for ${p} reused for /etc/passwd`, otherPath)

  // expired: a correctly signed URL whose expiration is in the past
  const expired = new URL(await sbx.downloadUrl(p, { useSignatureExpiration: -30 }))
  assert.ok(Number(expired.searchParams.get('signature_expiration')) < Date.now() / 1000)
  const b3 = await expect401('expired signature (GET)', expired)
  if (!/expired/i.test(b3)) failures.push(`expired signature (GET): body does not say expired: ${b3}`)

  // moving the expiration forward invalidates the signature
  const bumped = new URL(expired)
  bumped.searchParams.set('signature_expiration', String(Math.floor(Date.now() / 1000) + 3600))
  await expect401('expiration moved forward', bumped)

  // uploads with a bad signature: 401, not a dropped connection
  await expect401('read signature used for an upload (multipart, chunked)', down, { method: 'POST', body: uploadForm() })
  const upExpired = await sbx.uploadUrl(p, { useSignatureExpiration: -30 })
  await expect401('expired upload signature (multipart, chunked)', upExpired, { method: 'POST', body: uploadForm() })
  await expect401('read signature used for an upload (octet-stream, content-length)', down,
    { method: 'POST', body: 'overwrite', headers: { 'Content-Type': 'application/octet-stream' } })
  assert.equal(await sbx.files.read(p), 'secret', 'a refused upload changed the file')

  // a signature for user "user" with username=root swapped in
  const asRoot = new URL(down)
  asRoot.searchParams.set('username', 'root')
  await expect401('username swapped to root', asRoot)

  // no signature at all
  const unsigned = new URL(down)
  unsigned.searchParams.delete('signature')
  const [s7, b7] = await fetchStatus(unsigned)
  if (!(typeof s7 === 'number' && s7 >= 400 && s7 < 500)) failures.push(`unsigned GET /files: expected 4xx, got ${s7}`)
  if (b7.includes('secret')) failures.push('unsigned GET /files leaks the file')

  // a signature computed with the SDK helper and the right token works (sanity)
  const { signature } = await getSignature({ path: p, operation: 'read', user: undefined, envdAccessToken: sbx.envdAccessToken })
  const manual = new URL(down)
  manual.searchParams.set('signature', signature)
  const [s8, b8] = await fetchStatus(manual)
  assert.equal(s8, 200)
  assert.equal(b8, 'secret')

  // after the sandbox is killed its URLs stop working
  await sbx.kill()
  const [s9] = await fetchStatus(down)
  if (s9 === 200) failures.push('download URL still works after kill')

  assert.deepEqual(failures, [])
})

test('20 MB file round trip keeps its sha256', async () => {
  const sbx = await sandbox()
  const d = dir()
  const data = randomBytes(20 * 1024 * 1024)
  const digest = sha256(data)
  await sbx.files.write(`${d}/big.bin`, new Uint8Array(data), { requestTimeoutMs: 120_000 })
  assert.equal((await sbx.commands.run(`sha256sum ${d}/big.bin | cut -d' ' -f1`)).stdout.trim(), digest)
  const back = await sbx.files.read(`${d}/big.bin`, { format: 'bytes', requestTimeoutMs: 120_000 })
  assert.equal(back.length, data.length)
  assert.equal(sha256(back), digest)
  // and as a stream
  const s = await sbx.files.read(`${d}/big.bin`, { format: 'stream' })
  assert.equal(sha256(await readAll(s)), digest)
  // gzip both ways on incompressible data
  await sbx.files.write(`${d}/big2.bin`, new Uint8Array(data), { gzip: true, requestTimeoutMs: 120_000 })
  assert.equal(sha256(await sbx.files.read(`${d}/big2.bin`, { format: 'bytes', gzip: true })), digest)
  await sbx.files.remove(d)
})

test('a full writable layer: files.write -> NotEnoughSpaceError, recovers after cleanup', async (t) => {
  const sbx = await createSandbox(t)
  // How big is the writable layer as the sandbox sees it? Refuse to fill
  // anything that is not a small per-sandbox layer (never the host disk).
  const df = await sbx.commands.run('df -B1 --output=size,avail /home/user | tail -n 1')
  const [size, avail] = df.stdout.trim().split(/\s+/).map(Number)
  assert.ok(size > 0 && avail > 0, `df: ${df.stdout}`)
  assert.ok(size <= 8 * 1024 ** 3, `/home/user is on a ${size}-byte filesystem: the writable layer is not limited (expected ~1 GiB)`)
  // fill it (fallocate is instant; dd as a fallback)
  await sbx.commands.run(`fallocate -l ${avail} /home/user/fill 2>/dev/null || fallocate -l ${avail - 1024 * 1024} /home/user/fill 2>/dev/null || dd if=/dev/zero of=/home/user/fill bs=1M 2>/dev/null; true`, { timeoutMs: 120_000 })
  // top off whatever is left
  await sbx.commands.run('dd if=/dev/zero of=/home/user/fill2 bs=64K 2>/dev/null; true', { timeoutMs: 60_000 })
  const left = Number((await sbx.commands.run('df -B1 --output=avail /home/user | tail -n 1')).stdout.trim())
  assert.ok(left < 1024 * 1024, `could not fill the layer, ${left} bytes left`)

  // small (fits the daemon's buffers) and larger (streamed) uploads, both forms
  const failures = []
  for (const [what, write] of [
    ['1 KB multipart', () => sbx.files.write('/home/user/more.bin', new Uint8Array(1000))],
    ['4 MiB multipart', () => sbx.files.write('/home/user/more.bin', new Uint8Array(4 * 1024 * 1024))],
    ['4 MiB octet-stream', () => sbx.files.write('/home/user/more.bin', new Uint8Array(4 * 1024 * 1024), { useOctetStream: true })],
  ]) {
    try {
      await write()
      failures.push(`${what}: write succeeded on a full layer`)
    } catch (e) {
      if (!(e instanceof NotEnoughSpaceError)) failures.push(`${what}: expected NotEnoughSpaceError (HTTP 507), got ${errName(e)}`)
    }
  }
  assert.deepEqual(failures, [])
  // the sandbox still works and recovers
  await sbx.commands.run('rm -f /home/user/fill /home/user/fill2')
  await sbx.files.write('/home/user/more.bin', new Uint8Array(4 * 1024 * 1024))
  assert.equal((await sbx.files.getInfo('/home/user/more.bin')).size, 4 * 1024 * 1024)
})
