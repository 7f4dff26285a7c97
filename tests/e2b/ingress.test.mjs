// Ingress: ports of a sandbox reached from outside through the daemon's one
// port, with the stock SDK: getHost() (Host routing under the daemon's
// --sandbox-domain, which run.sh sets) and the E2b-Sandbox-* headers, keep-alive,
// large streamed bodies both ways, server-sent events, a WebSocket, E2B's 502
// for a closed port, allowPublicTraffic:false and its traffic token,
// maskRequestHost, autoResume on traffic, and a kill that ends a stream.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import { Sandbox } from 'e2b'
import { backend, createSandbox, env, waitFor } from './helpers.mjs'

const SERVER = readFileSync(new URL('./fixtures/ingress_server.py', import.meta.url), 'utf8')
const PORT = 8000
const daemon = new URL(env.sandboxUrl)

/** Start the fixture server on PORT in the sandbox and wait until it answers. */
async function startServer(sbx) {
  await sbx.files.write('/tmp/ingress_server.py', SERVER)
  await sbx.commands.run(`python3 /tmp/ingress_server.py ${PORT}`, { background: true })
  await waitFor(async () => (await portFetch(sbx, '/')).status === 200, { timeoutMs: 15_000, what: 'the server in the sandbox' })
}

/** fetch() of a sandbox port the way E2B_SANDBOX_URL users do: the routing headers. */
function portFetch(sbx, path, init = {}, port = PORT) {
  const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': String(port), ...(init.headers || {}) }
  if (sbx.trafficAccessToken && !('e2b-traffic-access-token' in headers)) headers['e2b-traffic-access-token'] = sbx.trafficAccessToken
  return fetch(`${env.sandboxUrl}${path}`, { ...init, headers })
}

/**
 * A request to `http://${sbx.getHost(port)}${path}` as a user whose wildcard
 * DNS points *.<sandbox-domain> at hutch would make it; here the lookup is
 * that DNS (127.0.0.1). Resolves { status, headers, body, res }.
 */
function hostGet(host, path, { agent, headers = {}, method = 'GET' } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(`http://${host}${path}`, {
      method, agent, headers,
      lookup: (name, opts, cb) => (opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)),
    }, (res) => {
      const parts = []
      res.on('data', (d) => parts.push(d))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts), reused: req.reusedSocket }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

function pattern(n) {
  const block = Buffer.alloc(65536)
  for (let i = 0; i < block.length; i++) block[i] = i & 255
  const h = createHash('sha256')
  for (let left = n; left > 0; left -= block.length) h.update(left >= block.length ? block : block.subarray(0, left))
  return h.digest('hex')
}

test('getHost(port) names the port under the daemon\'s domain; Host and header routing both reach it, keep-alive included', async (t) => {
  const sbx = await createSandbox(t)
  await startServer(sbx)
  const host = sbx.getHost(PORT)
  assert.equal(host, `${PORT}-${sbx.sandboxId}.${sbx.sandboxDomain}`)
  assert.ok(sbx.sandboxDomain.endsWith(`:${daemon.port}`), `the daemon's domain ${sbx.sandboxDomain} carries its port`)

  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  t.after(() => agent.destroy())
  const a = await hostGet(host, '/', { agent })
  assert.equal(a.status, 200)
  assert.equal(a.body.toString(), 'hello from the sandbox\n')
  const b = await hostGet(host, '/host', { agent })
  assert.equal(b.status, 200)
  assert.equal(b.body.toString(), host, 'the server sees the Host the client sent')
  assert.equal(b.reused, true, 'the second request went over the same connection')
  const h = await hostGet(host, '/', { agent, method: 'HEAD' })
  assert.equal(h.status, 200)
  assert.equal(h.headers['content-length'], '12345', 'a HEAD keeps the length the server gave')

  const r = await portFetch(sbx, '/headers', { headers: { 'X-Custom': 'yes', 'E2b-Traffic-Access-Token': 'x' } })
  assert.equal(r.status, 200)
  const names = (await r.text()).split('\n')
  assert.ok(names.includes('x-custom'))
  for (const hop of ['e2b-sandbox-id', 'e2b-sandbox-port', 'e2b-traffic-access-token', 'keep-alive'])
    assert.ok(!names.includes(hop), `${hop} is not forwarded: ${names}`)
})

// gvisor's mux streams carry ~10 MB/s here: a smaller body there, same paths
const BIG_MB = backend === 'gvisor' ? 12 : 50

test(`${BIG_MB} MB up and down stream through the proxy; chunked bodies are re-framed`, async (t) => {
  const sbx = await createSandbox(t)
  await startServer(sbx)
  const N = BIG_MB * 1024 * 1024
  const want = pattern(N)

  // upload: a streamed body with a length, produced as it is sent
  const block = Buffer.alloc(65536)
  for (let i = 0; i < block.length; i++) block[i] = i & 255
  async function* gen() { for (let left = N; left > 0; left -= block.length) yield left >= block.length ? block : block.subarray(0, left) }
  const up = await portFetch(sbx, '/upload', { method: 'POST', body: gen(), duplex: 'half', headers: { 'Content-Length': String(N) } })
  assert.equal(up.status, 200)
  assert.equal(await up.text(), `${N} ${want}`)

  // and without a length: chunked, re-chunked by the daemon
  const up2 = await portFetch(sbx, '/upload', { method: 'POST', body: gen(), duplex: 'half' })
  assert.equal(await up2.text(), `${N} ${want}`)

  for (const path of [`/download?n=${N}`, `/chunked?n=${N}`]) {
    const res = await portFetch(sbx, path)
    assert.equal(res.status, 200)
    const h = createHash('sha256')
    let got = 0
    for await (const chunk of res.body) { h.update(chunk); got += chunk.length }
    assert.equal(got, N, path)
    assert.equal(h.digest('hex'), want, path)
  }
})

test('server-sent events arrive as they are sent', async (t) => {
  const sbx = await createSandbox(t)
  await startServer(sbx)
  const t0 = Date.now()
  const res = await portFetch(sbx, '/sse')
  assert.equal(res.status, 200)
  assert.equal(res.headers.get('content-type'), 'text/event-stream')
  const reader = res.body.getReader()
  const first = await reader.read()
  const firstMs = Date.now() - t0
  assert.match(Buffer.from(first.value).toString(), /^data: event 0\n\n/)
  let rest = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    rest += Buffer.from(value).toString()
  }
  const allMs = Date.now() - t0
  assert.match(rest, /data: event 1\n\n[^]*data: event 2\n\n/)
  assert.ok(allMs - firstMs >= 800, `the first event came ${firstMs} ms in, the end ${allMs} ms: not held back`)
})

/** A WebSocket client written out over net (node 20 has no WebSocket). */
function wsConnect(sbx) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(daemon.port), daemon.hostname)
    const key = randomBytes(16).toString('base64')
    let buf = Buffer.alloc(0)
    sock.on('error', reject)
    sock.on('connect', () => {
      sock.write(`GET /ws HTTP/1.1\r\nHost: ${daemon.host}\r\nE2b-Sandbox-Id: ${sbx.sandboxId}\r\nE2b-Sandbox-Port: ${PORT}\r\n` +
        `Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n`)
    })
    const onData = (d) => {
      buf = Buffer.concat([buf, d])
      const end = buf.indexOf('\r\n\r\n')
      if (end < 0) return
      sock.off('data', onData)
      const head = buf.subarray(0, end).toString()
      const accept = createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
      resolve({ sock, head, accept, rest: buf.subarray(end + 4) })
    }
    sock.on('data', onData)
  })
}

function wsFrame(op, payload) {
  const mask = randomBytes(4)
  const n = payload.length
  const hdr = n < 126 ? Buffer.from([0x80 | op, 0x80 | n])
    : n < 65536 ? Buffer.from([0x80 | op, 0x80 | 126, n >> 8, n & 255])
    : Buffer.concat([Buffer.from([0x80 | op, 0x80 | 127]), (() => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(n)); return b })()])
  const body = Buffer.from(payload)
  for (let i = 0; i < body.length; i++) body[i] ^= mask[i & 3]
  return Buffer.concat([hdr, mask, body])
}

/** Read frames from sock (after `rest`) until `count` are complete. */
function wsRead(sock, rest, count) {
  return new Promise((resolve, reject) => {
    let buf = rest
    const frames = []
    const parse = () => {
      for (;;) {
        if (buf.length < 2) return
        let n = buf[1] & 0x7f, off = 2
        if (n === 126) { if (buf.length < 4) return; n = buf.readUInt16BE(2); off = 4 }
        else if (n === 127) { if (buf.length < 10) return; n = Number(buf.readBigUInt64BE(2)); off = 10 }
        if (buf.length < off + n) return
        frames.push({ op: buf[0] & 0x0f, data: buf.subarray(off, off + n) })
        buf = buf.subarray(off + n)
        if (frames.length === count) { sock.off('data', onData); resolve(frames); return }
      }
    }
    const onData = (d) => { buf = Buffer.concat([buf, d]); parse() }
    sock.on('data', onData)
    sock.on('error', reject)
    parse()
  })
}

test('a WebSocket to a server in the sandbox: handshake passed through, frames echoed both ways', async (t) => {
  const sbx = await createSandbox(t)
  await startServer(sbx)
  const { sock, head, accept, rest } = await wsConnect(sbx)
  t.after(() => sock.destroy())
  assert.match(head, /^HTTP\/1\.1 101 /)
  assert.match(head, new RegExp(`\r\nsec-websocket-accept: ${accept.replace(/[+/=]/g, '\\$&')}`, 'i'))
  assert.match(head, /\r\nupgrade: websocket/i)
  const big = randomBytes(300 * 1024)
  sock.write(Buffer.concat([wsFrame(1, Buffer.from('hello ws')), wsFrame(2, big), wsFrame(9, Buffer.from('p'))]))
  const frames = await wsRead(sock, rest, 3)
  assert.equal(frames[0].op, 1)
  assert.equal(frames[0].data.toString(), 'hello ws')
  assert.equal(frames[1].op, 2)
  assert.ok(frames[1].data.equals(big), 'the 300 KiB binary frame came back whole')
  assert.equal(frames[2].op, 10, 'pong')
  sock.write(wsFrame(8, Buffer.alloc(0)))
  const [close] = await wsRead(sock, Buffer.alloc(0), 1)
  assert.equal(close.op, 8)
  await new Promise((resolve) => { sock.on('close', resolve); sock.end() })
})

test('a closed port answers E2B\'s 502, JSON or the HTML page for browsers; bad ports and unknown ids are refused', async (t) => {
  const sbx = await createSandbox(t)
  const res = await portFetch(sbx, '/', {}, 3000)
  assert.equal(res.status, 502)
  const body = await res.json()
  assert.deepEqual(body, { sandboxId: sbx.sandboxId, message: 'The sandbox is running but port is not open', port: 3000, code: 502 })
  const html = await portFetch(sbx, '/', { headers: { 'User-Agent': 'Mozilla/5.0 (X11; Linux x86_64) Chrome/120' } }, 3000)
  assert.equal(html.status, 502)
  assert.ok((await html.text()).includes('<title>Closed Port Error</title>'))
  for (const bad of ['0', '65536', '80x', '-1', ''])
    assert.equal((await portFetch(sbx, '/', {}, bad)).status, 400, `port '${bad}'`)
  const unknown = await fetch(`${env.sandboxUrl}/`, { headers: { 'E2b-Sandbox-Id': 'a'.repeat(20), 'E2b-Sandbox-Port': '8000' } })
  assert.equal(unknown.status, 502)
  assert.deepEqual(await unknown.json(), { sandboxId: 'a'.repeat(20), message: 'The sandbox was not found', code: 502 })
})

test('allowPublicTraffic:false: the traffic token from create is required, and getInfo says so', async (t) => {
  const sbx = await createSandbox(t, { network: { allowPublicTraffic: false } })
  assert.match(sbx.trafficAccessToken ?? '', /^[0-9a-f]{40}$/)
  await startServer(sbx)
  const none = await fetch(`${env.sandboxUrl}/`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': String(PORT) } })
  assert.equal(none.status, 403)
  assert.equal((await none.json()).code, 403)
  const wrong = await portFetch(sbx, '/', { headers: { 'e2b-traffic-access-token': '0'.repeat(40) } })
  assert.equal(wrong.status, 403)
  const right = await portFetch(sbx, '/')
  assert.equal(right.status, 200)
  assert.equal(await right.text(), 'hello from the sandbox\n')
  // envd's own port keeps its own token (the SDK works as before)
  assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')
  const info = await sbx.getInfo()
  assert.equal(info.network?.allowPublicTraffic, false)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(again.trafficAccessToken, sbx.trafficAccessToken, 'connect returns the same token')
  // a public sandbox has none
  const pub = await createSandbox(t)
  assert.equal(pub.trafficAccessToken, undefined)
})

test('maskRequestHost: the server sees the mask, ${PORT} replaced', async (t) => {
  const sbx = await createSandbox(t, { network: { maskRequestHost: 'preview-${PORT}.example.test' } })
  await startServer(sbx)
  const res = await portFetch(sbx, '/host')
  assert.equal(await res.text(), `preview-${PORT}.example.test`)
  assert.equal((await sbx.getInfo()).network?.maskRequestHost, 'preview-${PORT}.example.test')
})

test('autoResume: a request to a paused sandbox resumes it and is answered', async (t) => {
  const sbx = await createSandbox(t, { timeoutMs: 600_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  await startServer(sbx)
  await sbx.setTimeout(60_000)
  await sbx.pause()
  assert.equal((await sbx.getInfo()).state, 'paused')
  const res = await portFetch(sbx, '/')
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello from the sandbox\n')
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  // E2B: a fresh timeout from the resume, the one create gave (10 min here)
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 570_000 && left <= 600_000, `the resumed sandbox has ${left} ms left`)
  // without autoResume a paused sandbox answers 502 and stays paused
  const other = await createSandbox(t)
  await startServer(other)
  await other.pause()
  assert.equal((await portFetch(other, '/')).status, 502)
  assert.equal((await other.getInfo()).state, 'paused')
})

test('killing the sandbox ends a streaming response at once', async (t) => {
  const sbx = await createSandbox(t)
  await startServer(sbx)
  const res = await portFetch(sbx, '/forever')
  const reader = res.body.getReader()
  const first = await reader.read()
  assert.match(Buffer.from(first.value).toString(), /tick/)
  const t0 = Date.now()
  await sbx.kill()
  await assert.rejects(async () => { for (;;) { const { done } = await reader.read(); if (done) break } }, /terminated|other side closed|aborted/i)
  assert.ok(Date.now() - t0 < 3000, `the stream ended ${Date.now() - t0} ms after the kill`)
  assert.equal((await portFetch(sbx, '/')).status, 502)
})
