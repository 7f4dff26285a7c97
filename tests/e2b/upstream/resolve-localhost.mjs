// Preloaded (node --import) into the upstream tests' processes by
// run-upstream.sh: every name under .localhost resolves to 127.0.0.1, as the
// wildcard DNS record of a deployment's sandbox domain would, so that a test's
// fetch of https://<port>-<id>.sandbox.localhost:PORT reaches the daemon.
import dns from 'node:dns'

const lookup = dns.lookup
dns.lookup = function (name, opts, cb) {
  if (typeof opts === 'function') {
    cb = opts
    opts = {}
  }
  if (typeof opts === 'number') opts = { family: opts }
  if (typeof name === 'string' && /(^|\.)localhost$/i.test(name)) {
    process.nextTick(() =>
      opts?.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)
    )
    return
  }
  return lookup.call(this, name, opts, cb)
}
