#!/usr/bin/env bash
# Runs the code-interpreter repository's own JS SDK tests (js/tests, vitest)
# against `hutch serve`, with the npm package @e2b/code-interpreter 2.8.0 (the
# version tests/e2b pins) in place of the SDK's source. Not part of
# `make test`: it needs a copy of github.com/e2b-dev/code-interpreter, which
# this script never fetches (CI has no GitHub), and the npm registry.
#
#   HUTCH_BIN=build-test/hutch tests/e2b/upstream/run-upstream-interp.sh REPO [FILE ...]
#
# REPO: a code-interpreter checkout (a directory holding js/tests) or a bare
# git dir of it (HEAD is exported). FILE: test files relative to js/
# (default: every file under js/tests but tests/runtimes, which need bun and
# deno, as upstream's own vitest config leaves them out). The scratch copy
# goes to HUTCH_UPSTREAM_WORK (default a new tmp dir); the reports to
# HUTCH_UPSTREAM_OUT (default WORK/results), as run-upstream.sh writes them.
# Only the environment is adapted, never a test body: the tests import
# '../src' (and '../../src', '../../../src'), which becomes a one-line module
# re-exporting the npm package. The template is E2B's own default name,
# `code-interpreter-v1`, unless E2B_TESTS_TEMPLATE says otherwise.
# docs/conformance.md has the results.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${1:?usage: run-upstream-interp.sh CODE-INTERPRETER-CHECKOUT-OR-GIT-DIR [FILE ...]}"
shift
work="${HUTCH_UPSTREAM_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/e2b-interp-upstream.XXXXXX")}"
mkdir -p "$work"
js="$work/js"

if [[ ! -d "$js/tests" ]]; then
	if [[ -d "$src/js/tests" ]]; then
		mkdir -p "$js"
		cp -r "$src/js/tests" "$js/"
	elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null; then
		git --git-dir="$src" archive HEAD js/tests | tar -x -C "$work"
		git --git-dir="$src" rev-parse HEAD >"$work/upstream-commit"
	else
		echo "run-upstream-interp.sh: $src is neither a code-interpreter checkout nor its git dir" >&2
		exit 2
	fi
	# the SDK under test is the npm package, not the repository's source
	mkdir -p "$js/src"
	echo "export * from '@e2b/code-interpreter'" >"$js/src/index.ts"
	cat >"$js/package.json" <<'JSON'
{ "name": "e2b-code-interpreter-upstream-harness", "private": true, "type": "module",
  "dependencies": { "@e2b/code-interpreter": "2.8.0", "e2b": "2.51.0", "vitest": "4.1.12", "dotenv": "16.6.1" } }
JSON
	(cd "$js" && npm install --no-audit --no-fund)
fi
cp "$here/vitest.config.mts" "$js/hutch.vitest.config.mts"

if (($# == 0)); then
	files="$(cd "$js" && find tests -name '*.test.ts' -not -path 'tests/runtimes/*' | sort | tr '\n' ' ')"
else
	files="$*"
fi

export HUTCH_UPSTREAM_DIR="$js" HUTCH_UPSTREAM_FILES="$files"
export HUTCH_UPSTREAM_OUT="${HUTCH_UPSTREAM_OUT:-$work/results}"
echo "run-upstream-interp.sh: scratch copy $js, reports in $HUTCH_UPSTREAM_OUT" >&2
# HTTPS as on E2B (sandboxUrl.test.ts fetches https://<getHost(port)>), and
# *.localhost resolved to 127.0.0.1 in the tests' processes (wildcard DNS);
# HUTCH_E2B_TLS=0 serves plain HTTP instead.
export HUTCH_E2B_TLS="${HUTCH_E2B_TLS:-1}"
export NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--import=$here/resolve-localhost.mjs"
HUTCH_E2B_TEST_TIMEOUT=$((4 * 3600 * 1000)) "$here/../run.sh" "$here/vitest-driver.test.mjs"
