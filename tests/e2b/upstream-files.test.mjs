// Filesystem behaviours the upstream E2B JS SDK suite relies on
// (tests/sandbox/files/*), in our own words: gzip, exists, getInfo of
// files/dirs/symlinks, list ordering and entry details, makeDir, metadata,
// read formats, remove, rename, signed URLs in a secure sandbox (exact bodies),
// watch, and the write/writeFiles variants.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { basename } from 'node:path'
import {
  Sandbox,
  FileNotFoundError,
  FilesystemEventType,
  FileType,
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
} from 'e2b'
import { createSandbox, errName, readAll, uniqueTag } from './helpers.mjs'

// A fresh sandbox per test would be closest to upstream; hutch creates them in
// milliseconds, so do that (names are reused across tests as upstream does).
const fresh = (t, opts) => createSandbox(t, opts)

function rejectsWith(promise, Cls) {
  return assert.rejects(promise, (e) => {
    assert.ok(e instanceof Cls, `expected ${Cls.name}, got ${errName(e)}`)
    return true
  })
}

function waitEvent(timeoutMs = 10_000) {
  let resolve
  const p = new Promise((r) => { resolve = r })
  let timer
  const timed = Promise.race([p, new Promise((_, rej) => { timer = setTimeout(() => rej(new Error('no matching watch event within 10 s')), timeoutMs) })])
  return { resolve, promise: timed.finally(() => clearTimeout(timer)) }
}

// ---------------------------------------------------------------- contentEncoding

test('gzip write returns name/type/path; gzip read returns the text', async (t) => {
  const sbx = await fresh(t)
  const info = await sbx.files.write('test_gzip_write.txt', 'gzip body', { gzip: true })
  assert.equal(info.name, 'test_gzip_write.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.path, '/home/user/test_gzip_write.txt')
  assert.equal(await sbx.files.read('test_gzip_write.txt', { gzip: true }), 'gzip body')
  assert.equal(await sbx.files.read('test_gzip_write.txt'), 'gzip body')
})

test('writeFiles with gzip; read as bytes with gzip', async (t) => {
  const sbx = await fresh(t)
  const files = [1, 2, 3].map((i) => ({ path: `gzip_multi_${i}.txt`, data: `File ${i} content` }))
  const infos = await sbx.files.writeFiles(files, { gzip: true })
  assert.equal(infos.length, 3)
  for (const f of files) assert.equal(await sbx.files.read(f.path), f.data)
  const bytes = await sbx.files.read(files[0].path, { format: 'bytes', gzip: true })
  assert.ok(bytes instanceof Uint8Array)
  assert.equal(new TextDecoder().decode(bytes), files[0].data)
})

// ---------------------------------------------------------------- exists, makeDir, remove

test('exists: true after write, false for a missing name', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_exists.txt', 'test')
  assert.equal(await sbx.files.exists('test_exists.txt'), true)
  assert.equal(await sbx.files.exists('test_does_not_exist.txt'), false)
})

test('makeDir: new → exists, existing → false, nested → exists', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test_directory1')
  assert.equal(await sbx.files.exists('test_directory1'), true)
  assert.equal(await sbx.files.makeDir('test_directory1'), false)
  await sbx.files.makeDir('test_directory3/nested_directory')
  assert.equal(await sbx.files.exists('test_directory3/nested_directory'), true)
})

test('remove a file; removing a missing file does not throw', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_remove.txt', 'x')
  await sbx.files.remove('test_remove.txt')
  assert.equal(await sbx.files.exists('test_remove.txt'), false)
  await sbx.files.remove('non_existing_file.txt')
})

// ---------------------------------------------------------------- getInfo

test('getInfo of a file: name, type, absolute path, size, mode, permissions, owner, group, modifiedTime', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_file.txt', 'test')
  const info = await sbx.files.getInfo('test_file.txt')
  const cwd = (await sbx.commands.run('pwd')).stdout.trim()
  assert.equal(info.name, 'test_file.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.path, `${cwd}/test_file.txt`)
  assert.equal(info.size, 4)
  assert.equal(info.mode, 0o644)
  assert.equal(info.permissions, '-rw-r--r--')
  assert.equal(info.owner, 'user')
  assert.equal(info.group, 'user')
  assert.ok('modifiedTime' in info)
})

test('getInfo of a directory: size > 0, 0755, drwxr-xr-x, user:user', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test_dir')
  const info = await sbx.files.getInfo('test_dir')
  const cwd = (await sbx.commands.run('pwd')).stdout.trim()
  assert.equal(info.name, 'test_dir')
  assert.equal(info.type, 'dir')
  assert.equal(info.path, `${cwd}/test_dir`)
  assert.ok(info.size > 0, `dir size ${info.size}`)
  assert.equal(info.mode, 0o755)
  assert.equal(info.permissions, 'drwxr-xr-x')
  assert.equal(info.owner, 'user')
  assert.equal(info.group, 'user')
  assert.ok('modifiedTime' in info)
})

test('getInfo of missing file and missing dir: FileNotFoundError', async (t) => {
  const sbx = await fresh(t)
  await rejectsWith(sbx.files.getInfo('test_does_not_exist.txt'), FileNotFoundError)
  await rejectsWith(sbx.files.getInfo('test_does_not_exist_dir'), FileNotFoundError)
})

test('getInfo of a relative symlink reports the absolute target path', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_file.txt', 'test')
  await sbx.commands.run('ln -s test_file.txt test_symlink.txt')
  const info = await sbx.files.getInfo('test_symlink.txt')
  const cwd = (await sbx.commands.run('pwd')).stdout.trim()
  assert.equal(info.name, 'test_symlink.txt')
  assert.equal(info.symlinkTarget, `${cwd}/test_file.txt`)
})

// ---------------------------------------------------------------- list

test('list depth 1/2/3: entries sorted by path, names/types/paths exact', async (t) => {
  const sbx = await fresh(t)
  const P = 'test_directory'
  for (const d of ['', '/subdir1', '/subdir2', '/subdir1/subdir1_1', '/subdir1/subdir1_2', '/subdir2/subdir2_1', '/subdir2/subdir2_2']) {
    await sbx.files.makeDir(P + d)
  }
  await sbx.files.write(`${P}/file1.txt`, 'Hello, world!')
  const base = `/home/user/${P}`
  const shallow = [['file1.txt', 'file', `${base}/file1.txt`], ['subdir1', 'dir', `${base}/subdir1`], ['subdir2', 'dir', `${base}/subdir2`]]
  const deep = [
    ['file1.txt', 'file', `${base}/file1.txt`],
    ['subdir1', 'dir', `${base}/subdir1`],
    ['subdir1_1', 'dir', `${base}/subdir1/subdir1_1`],
    ['subdir1_2', 'dir', `${base}/subdir1/subdir1_2`],
    ['subdir2', 'dir', `${base}/subdir2`],
    ['subdir2_1', 'dir', `${base}/subdir2/subdir2_1`],
    ['subdir2_2', 'dir', `${base}/subdir2/subdir2_2`],
  ]
  const shape = (es) => es.map((e) => [e.name, e.type, e.path])
  assert.deepEqual(shape(await sbx.files.list(P)), shallow, 'default depth')
  assert.deepEqual(shape(await sbx.files.list(P, { depth: 1 })), shallow, 'depth 1')
  assert.deepEqual(shape(await sbx.files.list(P, { depth: 2 })), deep, 'depth 2')
  assert.deepEqual(shape(await sbx.files.list(P, { depth: 3 })), deep, 'depth 3')
})

test('list depth -1: error mentions "depth should be at least one"', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test_directory')
  await assert.rejects(sbx.files.list('test_directory', { depth: -1 }), (e) => {
    assert.ok(e.message.includes('depth should be at least one'), e.message)
    return true
  })
})

test('list entry details for a file and a dir (mode, permissions, owner, size, no symlinkTarget)', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test-mixed-entries/subdir')
  await sbx.files.write('test-mixed-entries/test.txt', 'Hello, World!')
  const es = await sbx.files.list('test-mixed-entries', { depth: 1 })
  assert.equal(es.length, 2)
  const by = new Map(es.map((e) => [e.name, e]))
  const d = by.get('subdir')
  assert.equal(d.path, '/home/user/test-mixed-entries/subdir')
  assert.equal(d.type, 'dir')
  assert.equal(d.mode, 0o755)
  assert.equal(d.permissions, 'drwxr-xr-x')
  assert.equal(d.owner, 'user')
  assert.equal(d.group, 'user')
  assert.ok(d.modifiedTime)
  const f = by.get('test.txt')
  assert.equal(f.path, '/home/user/test-mixed-entries/test.txt')
  assert.equal(f.type, 'file')
  assert.equal(f.mode, 0o644)
  assert.equal(f.permissions, '-rw-r--r--')
  assert.equal(f.owner, 'user')
  assert.equal(f.group, 'user')
  assert.equal(f.size, 'Hello, World!'.length)
  assert.ok(f.modifiedTime)
  assert.equal(f.symlinkTarget, undefined)
})

// ---------------------------------------------------------------- metadata

const META = { author: 'mish', purpose: 'upload' }

test('write with metadata (multipart and octet-stream): returned and persisted', async (t) => {
  const sbx = await fresh(t)
  const a = await sbx.files.write('test_metadata.txt', 'body', { metadata: META })
  assert.equal(Array.isArray(a), false)
  assert.deepEqual(a.metadata, META)
  assert.deepEqual((await sbx.files.getInfo('test_metadata.txt')).metadata, META)
  const b = await sbx.files.write('test_metadata_octet.txt', 'body', { metadata: META, useOctetStream: true })
  assert.deepEqual(b.metadata, META)
  assert.deepEqual((await sbx.files.getInfo('test_metadata_octet.txt')).metadata, META)
})

test('write without metadata: metadata undefined in the result and getInfo', async (t) => {
  const sbx = await fresh(t)
  const info = await sbx.files.write('test_no_metadata.txt', 'no metadata here')
  assert.equal(info.metadata, undefined)
  assert.equal((await sbx.files.getInfo('test_no_metadata.txt')).metadata, undefined)
})

test('writeFiles applies metadata to each file', async (t) => {
  const sbx = await fresh(t)
  const md = { source: 'test-suite' }
  const infos = await sbx.files.writeFiles([{ path: 'metadata_multi_1.txt', data: 'File 1' }, { path: 'metadata_multi_2.txt', data: 'File 2' }], { metadata: md })
  assert.equal(infos.length, 2)
  for (const i of infos) {
    assert.deepEqual(i.metadata, md)
    assert.deepEqual((await sbx.files.getInfo(i.path)).metadata, md)
  }
})

test('metadata shows in list and after rename; overwrite without metadata clears it', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('metadata_list_dir')
  await sbx.files.write('metadata_list_dir/listed.txt', 'content', { metadata: { tag: 'listed' } })
  const e = (await sbx.files.list('metadata_list_dir')).find((x) => x.name === 'listed.txt')
  assert.deepEqual(e?.metadata, { tag: 'listed' })

  await sbx.files.write('metadata_rename_old.txt', 'content', { metadata: { stage: 'renamed' } })
  const r = await sbx.files.rename('metadata_rename_old.txt', 'metadata_rename_new.txt')
  assert.deepEqual(r.metadata, { stage: 'renamed' })

  await sbx.files.write('metadata_overwrite.txt', 'first', { metadata: { author: 'mish' } })
  const o = await sbx.files.write('metadata_overwrite.txt', 'second')
  assert.equal(o.metadata, undefined)
  assert.equal((await sbx.files.getInfo('metadata_overwrite.txt')).metadata, undefined)
})

test('an out-of-band user.e2b.* xattr shows as metadata in getInfo', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('metadata_xattr.txt', 'content')
  const p = (await sbx.commands.run('realpath metadata_xattr.txt')).stdout.trim()
  await sbx.commands.run(`python3 -c "import os; os.setxattr('${p}', 'user.e2b.author', b'mish')"`)
  assert.deepEqual((await sbx.files.getInfo('metadata_xattr.txt')).metadata, { author: 'mish' })
})

test('invalid metadata keys/values are rejected and nothing is written', async (t) => {
  const sbx = await fresh(t)
  for (const md of [{ 'bad key': 'v' }, { '': 'v' }, { good: 'bad\nvalue' }, { good: 'value\n' }, { 'key\n': 'v' }]) {
    await rejectsWith(sbx.files.write('invalid_metadata.txt', 'x', { metadata: md }), InvalidArgumentError)
  }
  assert.equal(await sbx.files.exists('invalid_metadata.txt'), false)
})

// ---------------------------------------------------------------- read

test('read: text; missing → FileNotFoundError (also a NotFoundError); stream of 230 kB; missing stream → FileNotFoundError', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_read.txt', 'Hello, world!')
  assert.equal(await sbx.files.read('test_read.txt'), 'Hello, world!')
  await rejectsWith(sbx.files.read('non_existing_file.txt'), FileNotFoundError)
  await rejectsWith(sbx.files.read('non_existing_file.txt'), NotFoundError)
  const big = 'Streamed read content. '.repeat(10_000)
  await sbx.files.write('test_read_stream.txt', big)
  const s = await sbx.files.read('test_read_stream.txt', { format: 'stream' })
  assert.equal((await readAll(s)).toString('utf8'), big)
  await rejectsWith(sbx.files.read('non_existing_file.txt', { format: 'stream' }), FileNotFoundError)
})

test('read an empty file (made by touch) in text/bytes/blob/stream', async (t) => {
  const sbx = await fresh(t)
  await sbx.commands.run('touch empty-file-formats.txt')
  assert.equal(await sbx.files.read('empty-file-formats.txt', { format: 'text' }), '')
  const b = await sbx.files.read('empty-file-formats.txt', { format: 'bytes' })
  assert.ok(b instanceof Uint8Array)
  assert.equal(b.length, 0)
  const bl = await sbx.files.read('empty-file-formats.txt', { format: 'blob' })
  assert.ok(bl instanceof Blob)
  assert.equal(bl.size, 0)
  const s = await sbx.files.read('empty-file-formats.txt', { format: 'stream' })
  assert.ok(s instanceof ReadableStream)
  assert.equal((await readAll(s)).length, 0)
})

// ---------------------------------------------------------------- rename

test('rename returns the new entry; old gone, new has the content; missing → FileNotFoundError', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_rename_old.txt', 'This file will be renamed.')
  const info = await sbx.files.rename('test_rename_old.txt', 'test_rename_new.txt')
  assert.equal(info.name, 'test_rename_new.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.path, '/home/user/test_rename_new.txt')
  assert.equal(await sbx.files.exists('test_rename_old.txt'), false)
  assert.equal(await sbx.files.exists('test_rename_new.txt'), true)
  assert.equal(await sbx.files.read('test_rename_new.txt'), 'This file will be renamed.')
  await rejectsWith(sbx.files.rename('non_existing_file.txt', 'new_non_existing_file.txt'), FileNotFoundError)
})

// ---------------------------------------------------------------- signing (secure: true)

test('secure sandbox: expired download URL → 401 with the exact JSON body', async (t) => {
  const sbx = await fresh(t, { secure: true })
  await sbx.files.write('hello.txt', 'hello world')
  const res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 }))
  const body = await res.text()
  assert.equal(res.status, 401)
  assert.deepEqual(JSON.parse(body), { code: 401, message: 'signature is already expired' })
})

test('secure sandbox: valid download URL (user, root) → 200 with the content', async (t) => {
  const sbx = await fresh(t, { secure: true })
  await sbx.files.write('hello.txt', 'hello world')
  let res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello world')
  await sbx.files.write('hello.txt', 'hello root', { user: 'root' })
  res = await fetch(await sbx.downloadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10_000 }))
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello root')
})

async function postForm(url) {
  const form = new FormData()
  form.append('file', 'file content')
  const res = await fetch(url, { method: 'POST', body: form })
  return { status: res.status, body: await res.text() }
}

test('secure sandbox: valid upload URL → 200 with exactly [{name, path, type}]', async (t) => {
  const sbx = await fresh(t, { secure: true })
  const r = await postForm(await sbx.uploadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
  assert.equal(r.status, 200, r.body)
  assert.deepEqual(JSON.parse(r.body), [{ name: 'hello.txt', path: '/home/user/hello.txt', type: 'file' }])
  const r2 = await postForm(await sbx.uploadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10_000 }))
  assert.equal(r2.status, 200, r2.body)
  assert.deepEqual(JSON.parse(r2.body), [{ name: 'hello.txt', path: '/root/hello.txt', type: 'file' }])
})

test('secure sandbox: expired upload URL → 401 with the exact JSON body; commands still run', async (t) => {
  const sbx = await fresh(t, { secure: true })
  const r = await postForm(await sbx.uploadUrl('hello.txt', { useSignatureExpiration: -100_000 }))
  assert.equal(r.status, 401)
  assert.deepEqual(JSON.parse(r.body), { code: 401, message: 'signature is already expired' })
  assert.equal((await sbx.commands.run('echo Hello World!')).stdout, 'Hello World!\n')
})

// ---------------------------------------------------------------- watch

test('watchDir: rewriting a file gives a WRITE event with its name', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test_watch_dir')
  await sbx.files.write('test_watch_dir/test_watch.txt', 'one')
  const ev = waitEvent()
  const h = await sbx.files.watchDir('test_watch_dir', (e) => {
    if (e.type === FilesystemEventType.WRITE && e.name === 'test_watch.txt') ev.resolve()
  })
  await sbx.files.write('test_watch_dir/test_watch.txt', 'two')
  await ev.promise
  await h.stop()
})

test('watchDir recursive: WRITE in a nested dir is named nested/file', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('rw/nested')
  await sbx.files.write('rw/nested/test_watch.txt', 'one')
  const ev = waitEvent()
  const h = await sbx.files.watchDir('rw', (e) => {
    if (e.type === FilesystemEventType.WRITE && e.name === 'nested/test_watch.txt') ev.resolve()
  }, { recursive: true })
  await sbx.files.write('rw/nested/test_watch.txt', 'two')
  await ev.promise
  await h.stop()
})

test('watchDir recursive: CREATE for a new dir, then WRITE inside it', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('rwa')
  const dirEv = waitEvent()
  const fileEv = waitEvent()
  const h = await sbx.files.watchDir('rwa', (e) => {
    if (e.type === FilesystemEventType.WRITE && e.name === 'nested/test_watch.txt') fileEv.resolve()
    else if (e.type === FilesystemEventType.CREATE && e.name === 'nested') dirEv.resolve()
  }, { recursive: true })
  await sbx.files.makeDir('rwa/nested')
  await dirEv.promise
  await sbx.files.write('rwa/nested/test_watch.txt', 'content')
  await fileEv.promise
  await h.stop()
})

test('watchDir includeEntry: the WRITE event carries the entry (name, absolute path, file)', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('test_watch_dir_entry')
  await sbx.files.write('test_watch_dir_entry/test_watch.txt', 'one')
  const ev = waitEvent()
  const h = await sbx.files.watchDir('test_watch_dir_entry', (e) => {
    if (e.type === FilesystemEventType.WRITE && e.name === 'test_watch.txt') ev.resolve(e)
  }, { includeEntry: true })
  await sbx.files.write('test_watch_dir_entry/test_watch.txt', 'two')
  const e = await ev.promise
  assert.ok(e.entry, 'event.entry missing')
  assert.equal(e.entry.name, 'test_watch.txt')
  assert.equal(e.entry.path, '/home/user/test_watch_dir_entry/test_watch.txt')
  assert.equal(e.entry.type, FileType.FILE)
  await h.stop()
})

test('watchDir allowNetworkMounts on a normal dir still reports WRITE', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.makeDir('wnm')
  await sbx.files.write('wnm/test_watch.txt', 'one')
  const ev = waitEvent()
  const h = await sbx.files.watchDir('wnm', (e) => {
    if (e.type === FilesystemEventType.WRITE && e.name === 'test_watch.txt') ev.resolve()
  }, { allowNetworkMounts: true })
  await sbx.files.write('wnm/test_watch.txt', 'two')
  await ev.promise
  await h.stop()
})

test('watchDir of a missing dir → FileNotFoundError; of a file → SandboxError', async (t) => {
  const sbx = await fresh(t)
  await rejectsWith(sbx.files.watchDir('non_existing_watch_dir', () => {}), FileNotFoundError)
  await sbx.files.write('test_watch.txt', 'x')
  await rejectsWith(sbx.files.watchDir('test_watch.txt', () => {}), SandboxError)
})

// ---------------------------------------------------------------- write

test('write: single file info, existence, content; bad argument combinations', async (t) => {
  const sbx = await fresh(t)
  await assert.rejects(sbx.files.write(undefined, 'x'), (e) => e.message.includes('Path or files are required'))
  const info = await sbx.files.write('test_write.txt', 'This is a test file.')
  assert.equal(Array.isArray(info), false)
  assert.equal(info.name, 'test_write.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.path, '/home/user/test_write.txt')
  assert.equal(await sbx.files.exists('test_write.txt'), true)
  assert.equal(await sbx.files.read('test_write.txt'), 'This is a test file.')

  const empty = await sbx.files.write([])
  assert.deepEqual(empty, [])
  await assert.rejects(sbx.files.write('/path/to/file', [{ path: 'x.txt', data: 'x' }]),
    (e) => e.message.includes('Cannot specify both path and array of files'))
  const one = await sbx.files.write([{ path: 'one_test_file.txt', data: 'This is a test file.' }])
  assert.ok(Array.isArray(one))
  assert.equal(one[0].name, 'one_test_file.txt')
  assert.equal(one[0].type, 'file')
  assert.equal(one[0].path, '/home/user/one_test_file.txt')
})

test('write an array as the default user, including new top-level dirs such as /0/…', async (t) => {
  const sbx = await fresh(t)
  const files = []
  for (let i = 0; i < 10; i++) {
    files.push({ path: i % 2 === 0 ? `/${i}/multi_test_file${i}.txt` : `/home/user/multi_test_file${i}.txt`, data: `This is a test file ${i}.` })
  }
  const infos = await sbx.files.write(files)
  assert.equal(infos.length, files.length)
  for (let i = 0; i < files.length; i++) {
    assert.equal(infos[i].name, basename(files[i].path))
    assert.equal(infos[i].path, files[i].path)
    assert.equal(infos[i].type, 'file')
    assert.equal(await sbx.files.exists(files[i].path), true)
    assert.equal(await sbx.files.read(files[i].path), files[i].data)
  }
})

test('write: overwrite, and into a directory that does not exist yet', async (t) => {
  const sbx = await fresh(t)
  await sbx.files.write('test_overwrite.txt', 'Initial content.')
  await sbx.files.write('test_overwrite.txt', 'New content.')
  assert.equal(await sbx.files.read('test_overwrite.txt'), 'New content.')
  await sbx.files.write('non_existing_dir/test_write.txt', 'This should succeed too.')
  assert.equal(await sbx.files.exists('non_existing_dir/test_write.txt'), true)
  assert.equal(await sbx.files.read('non_existing_dir/test_write.txt'), 'This should succeed too.')
})

test('writeFiles: empty, ten files, mixed data types, nested parents, overwrite', async (t) => {
  const sbx = await fresh(t)
  assert.deepEqual(await sbx.files.writeFiles([]), [])
  const files = Array.from({ length: 10 }, (_, i) => ({ path: `writefiles_test_${i}.txt`, data: `This is a test file ${i}.` }))
  const infos = await sbx.files.writeFiles(files)
  assert.equal(infos.length, 10)
  for (let i = 0; i < 10; i++) {
    assert.equal(infos[i].name, files[i].path)
    assert.equal(infos[i].path, `/home/user/${files[i].path}`)
    assert.equal(infos[i].type, 'file')
    assert.equal(await sbx.files.read(infos[i].path), files[i].data)
  }
  const enc = new TextEncoder()
  const mixed = await sbx.files.writeFiles([
    { path: 'writefiles_text.txt', data: 'Text string data' },
    { path: 'writefiles_arraybuffer.txt', data: enc.encode('ArrayBuffer data').buffer },
    { path: 'writefiles_blob.txt', data: new Blob(['Blob data'], { type: 'text/plain' }) },
    { path: 'writefiles_stream.txt', data: new ReadableStream({ start(c) { c.enqueue(enc.encode('ReadableStream data')); c.close() } }) },
  ])
  assert.equal(mixed.length, 4)
  assert.equal(await sbx.files.read('writefiles_text.txt'), 'Text string data')
  assert.equal(await sbx.files.read('writefiles_arraybuffer.txt'), 'ArrayBuffer data')
  assert.equal(await sbx.files.read('writefiles_blob.txt'), 'Blob data')
  assert.equal(await sbx.files.read('writefiles_stream.txt'), 'ReadableStream data')
  const nested = await sbx.files.writeFiles([{ path: 'writefiles_nested_dir/nested/file1.txt', data: 'Content in nested directory' }])
  assert.equal(nested[0].path, '/home/user/writefiles_nested_dir/nested/file1.txt')
  assert.equal(await sbx.files.read(nested[0].path), 'Content in nested directory')
  await sbx.files.writeFiles([{ path: 'writefiles_overwrite.txt', data: 'Initial content' }])
  await sbx.files.writeFiles([{ path: 'writefiles_overwrite.txt', data: 'New content' }])
  assert.equal(await sbx.files.read('writefiles_overwrite.txt'), 'New content')
})

test('write a ReadableStream as octet-stream, plain and gzip', async (t) => {
  const sbx = await fresh(t)
  const a = 'Streamed octet-stream upload. '.repeat(10_000)
  const i1 = await sbx.files.write('test_write_octet_stream.bin', new Blob([a]).stream(), { useOctetStream: true })
  assert.equal(i1.path, '/home/user/test_write_octet_stream.bin')
  assert.equal(await sbx.files.read('test_write_octet_stream.bin'), a)
  const b = 'Streamed gzipped octet-stream upload. '.repeat(10_000)
  const i2 = await sbx.files.write('test_write_octet_stream_gzip.bin', new Blob([b]).stream(), { useOctetStream: true, gzip: true })
  assert.equal(i2.path, '/home/user/test_write_octet_stream_gzip.bin')
  assert.equal(await sbx.files.read('test_write_octet_stream_gzip.bin'), b)
})
