// SPDX-License-Identifier: Apache-2.0
// The JavaScript and TypeScript child of hutch_kernels.py: one cell per
// stdin line ({"code": ...}), run in this process's global context so that
// declarations persist between cells; the answer is one JSON line on fd 3.
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const readline = require('readline');
const Module = require('module');

const kind = process.argv[2] || 'javascript';
const ctlFd = Number(process.env.HUTCH_CTL_FD || 3);
delete process.env.HUTCH_CTL_FD;
let ts = null;
if (kind === 'typescript') {
  for (const p of ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/nodejs/typescript']) {
    try { ts = require(p); break; } catch (e) { /* next */ }
  }
}

// require() as a module in the cwd would see it
const req = Module.createRequire(process.cwd() + '/');
globalThis.require = req;
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;

function answer(obj) {
  fs.writeSync(ctlFd, JSON.stringify(obj) + '\n');
}

function fail(err) {
  const e = err instanceof Error ? err : new Error(String(err));
  answer({ status: 'error', ename: e.name || 'Error', evalue: e.message || String(err),
           traceback: String(e.stack || e).split('\n') });
}

function show(v) {
  if (v === undefined) return null;
  return { 'text/plain': typeof v === 'string' ? util.inspect(v) : util.inspect(v, { depth: 4 }) };
}

let queue = Promise.resolve();
const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  queue = queue.then(() => run(line));
});
rl.on('close', () => process.exit(0));

async function run(line) {
  let code;
  try {
    code = JSON.parse(line).code;
  } catch (e) {
    return fail(e);
  }
  try {
    if (ts) {
      code = ts.transpile(code, { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS,
                                  esModuleInterop: true });
      code = code.replace(/^"use strict";\s*/, '').replace(/^Object\.defineProperty\(exports, "__esModule".*\n/m, '');
    }
    let v;
    const script = new vm.Script(code, { filename: 'cell' });
    v = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (v && typeof v.then === 'function')
      v = await v;
    answer({ status: 'ok', data: show(v) });
  } catch (e) {
    if (e && typeof e.message === 'string' && e.message.includes('Script execution was interrupted'))
      e.name = 'KeyboardInterrupt';
    fail(e);
  }
}
