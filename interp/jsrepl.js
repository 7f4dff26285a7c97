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
// TypeScript's compiler: the TypeScript kernel's transpiler, and both
// kernels' parser for cells with import statements or top-level await
// (loaded when first needed: it takes a few hundred ms)
let ts;
function loadTs() {
  if (ts === undefined) {
    ts = null;
    for (const p of ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/nodejs/typescript']) {
      try { ts = require(p); break; } catch (e) { /* next */ }
    }
  }
  return ts;
}
if (kind === 'typescript')
  loadTs();

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

// A cell as a script of this context, as E2B's JavaScript kernel takes it:
// `import` statements become require() calls (the module's exports object
// is the default import, as Node gives it to ES modules), `export` is
// dropped, and a cell with a top-level `await` runs as an async function
// whose declarations are hoisted as `var`s, so that they outlive the cell,
// and whose last expression is its value.
function isAwaitAt(node) {
  let found = false;
  (function walk(n) {
    if (found)
      return;
    if (ts.isFunctionLike(n) || ts.isClassLike(n))
      return; /* its own scope: an await there is not the cell's */
    if (ts.isAwaitExpression(n) || (ts.isForOfStatement(n) && n.awaitModifier)) {
      found = true;
      return;
    }
    ts.forEachChild(n, walk);
  })(node);
  return found;
}

function bindingNames(name, out) {
  if (ts.isIdentifier(name))
    out.push(name.text);
  else
    for (const el of name.elements)
      if (!ts.isOmittedExpression(el))
        bindingNames(el.name, out);
  return out;
}

function hasModifier(st, k) {
  const mods = ts.canHaveModifiers && ts.canHaveModifiers(st) ? ts.getModifiers(st) : st.modifiers;
  return !!(mods && mods.some((m) => m.kind === k));
}

function withoutExport(sf, st) {
  const text = st.getText(sf);
  if (!hasModifier(st, ts.SyntaxKind.ExportKeyword))
    return text;
  return text.replace(/^export\s+(default\s+)?/, '');
}

// One statement of the cell: [text at the top level, names it declares,
// text inside the async function (assignments in place of declarations)].
function statementParts(sf, st) {
  if (ts.isImportDeclaration(st)) {
    const spec = st.moduleSpecifier.getText(sf);
    const cl = st.importClause;
    if (!cl)
      return [`require(${spec});`, [], `require(${spec});`];
    if (cl.isTypeOnly)
      return ['', [], ''];
    const binds = [];
    if (cl.name)
      binds.push([cl.name.text, `require(${spec})`]);
    const nb = cl.namedBindings;
    if (nb && ts.isNamespaceImport(nb))
      binds.push([nb.name.text, `require(${spec})`]);
    else if (nb && nb.elements.length) {
      const props = nb.elements.filter((e) => !e.isTypeOnly)
        .map((e) => (e.propertyName ? `${e.propertyName.text}: ${e.name.text}` : e.name.text));
      if (props.length)
        binds.push([`{ ${props.join(', ')} }`, `require(${spec})`]);
    }
    const names = [];
    if (cl.name)
      names.push(cl.name.text);
    if (nb && ts.isNamespaceImport(nb))
      names.push(nb.name.text);
    else if (nb)
      for (const e of nb.elements)
        if (!e.isTypeOnly)
          names.push(e.name.text);
    return [binds.map(([l, r]) => `var ${l} = ${r};`).join(' '), names,
            binds.map(([l, r]) => `(${l} = ${r});`).join(' ')];
  }
  if (ts.isExportDeclaration(st) || ts.isExportAssignment(st) && !st.expression)
    return ['', [], ''];
  if (ts.isExportAssignment(st)) { /* export default EXPR */
    const e = st.expression.getText(sf);
    return [`${e};`, [], `${e};`];
  }
  const text = withoutExport(sf, st);
  if (ts.isVariableStatement(st)) {
    const names = [];
    const assigns = [];
    for (const d of st.declarationList.declarations) {
      bindingNames(d.name, names);
      if (d.initializer)
        assigns.push(`(${d.name.getText(sf)} = ${d.initializer.getText(sf)});`);
    }
    return [text, names, assigns.join(' ')];
  }
  if ((ts.isFunctionDeclaration(st) || ts.isClassDeclaration(st)) && st.name)
    return [text, [st.name.text], `${st.name.text} = ${text};`];
  return [text, [], text];
}

// The value of a cell whose last statement is this: an expression, not an
// assignment.
function isValue(st) {
  if (!ts.isExpressionStatement(st))
    return false;
  const e = st.expression;
  return !(ts.isBinaryExpression(e) && e.operatorToken.kind >= ts.SyntaxKind.FirstAssignment &&
           e.operatorToken.kind <= ts.SyntaxKind.LastAssignment);
}

function cellScript(code) {
  if (!/\b(import|export|await)\b/.test(code) || !loadTs())
    return code;
  const sf = ts.createSourceFile('cell.js', code, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  const sts = sf.statements;
  const first = sts.findIndex((st) => isAwaitAt(st));
  const needed = first >= 0 || sts.some((st) => ts.isImportDeclaration(st) || ts.isExportDeclaration(st) ||
                                              ts.isExportAssignment(st) || hasModifier(st, ts.SyntaxKind.ExportKeyword));
  if (!needed)
    return code;
  let out = '';
  let pos = 0;
  const hoisted = [];
  const body = [];
  sts.forEach((st, i) => {
    const gap = code.slice(pos, st.getStart(sf));
    pos = st.end;
    const [top, names, inner] = statementParts(sf, st);
    if (first < 0 || i < first) {
      out += gap + top;
      return;
    }
    hoisted.push(...names);
    body.push(gap + (i === sts.length - 1 && isValue(st) ? `return (${st.expression.getText(sf)});` : inner));
  });
  if (first < 0)
    return out + code.slice(pos);
  const names = [...new Set(hoisted)];
  return out + (names.length ? `\nvar ${names.join(', ')};\n` : '\n') +
    `(async () => {${body.join('')}\n})()` + code.slice(pos);
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
    if (kind === 'typescript' && ts) {
      // types off, imports kept as they are (cellScript makes them require()s
      // whose names outlive the cell, which CommonJS output would not)
      code = ts.transpile(code, { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext,
                                  preserveValueImports: true, isolatedModules: true });
      code = code.replace(/^"use strict";\s*/, '').replace(/\nexport \{\};\s*$/, '\n');
    }
    code = cellScript(code);
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
