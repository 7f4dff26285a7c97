#!/usr/bin/env bash
# Runs the E2B repository's own JS SDK tests (packages/js-sdk/tests, vitest)
# against `hutch serve`, with the npm package e2b 2.51.0 in place of the SDK's
# source. Not part of `make test`: it needs a copy of the E2B repository, which
# this script never fetches (CI has no GitHub), and the npm registry.
#
#   HUTCH_BIN=build-test/hutch tests/e2b/upstream/run-upstream.sh E2B [FILE ...]
#
# E2B: an E2B checkout (a directory holding packages/js-sdk) or a bare git dir
# of it (HEAD is exported). FILE: test files relative to packages/js-sdk
# (default: the files that talk to a server, see DEFAULT_FILES below).
# The scratch copy goes to HUTCH_UPSTREAM_WORK (default a new tmp dir); the
# reports (FILE.json from vitest, FILE.log, summary.json) to
# HUTCH_UPSTREAM_OUT (default WORK/results). The daemon is started, and the
# sandboxes and daemon stopped, by ../run.sh, as for hutch's own tests.
# Only the environment is adapted, never a test body: tests import '../src',
# which becomes three one-line modules re-exporting the `e2b` package, and
# vitest runs with hutch.vitest.config.mts (no browser project, no module
# mock of the SDK's private undici module). docs/conformance.md has the
# results and why each remaining failure fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${1:?usage: run-upstream.sh E2B-CHECKOUT-OR-GIT-DIR [FILE ...]}"
shift
work="${HUTCH_UPSTREAM_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/e2b-upstream.XXXXXX")}"
mkdir -p "$work"
sdk="$work/packages/js-sdk"

if [[ ! -d "$sdk/tests" ]]; then
	if [[ -d "$src/packages/js-sdk/tests" ]]; then
		mkdir -p "$sdk"
		cp -r "$src/packages/js-sdk/tests" "$sdk/"
	elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null; then
		git --git-dir="$src" archive HEAD packages/js-sdk/tests | tar -x -C "$work"
		git --git-dir="$src" rev-parse HEAD >"$work/upstream-commit"
	else
		echo "run-upstream.sh: $src is neither an E2B checkout nor its git dir" >&2
		exit 2
	fi
	# the SDK under test is the npm package, not the repository's source
	mkdir -p "$sdk/src/sandbox/filesystem"
	for f in index.ts errors.ts sandbox/filesystem/index.ts; do
		echo "export * from 'e2b'" >"$sdk/src/$f"
	done
	cat >"$sdk/package.json" <<'JSON'
{ "name": "e2b-upstream-harness", "private": true, "type": "module",
  "dependencies": { "e2b": "2.51.0", "vitest": "4.1.12", "msw": "2.15.0", "dotenv": "16.6.1" } }
JSON
	(cd "$sdk" && npm install --no-audit --no-fund)
fi
cp "$here/vitest.config.mts" "$sdk/hutch.vitest.config.mts"

# The files whose tests talk to a sandbox, the API or a volume. The others are
# unit tests of the SDK's internals (they import modules the npm package does
# not export) or need a browser, Cloudflare or E2B's template builder.
DEFAULT_FILES="$(cd "$sdk" && ls tests/sandbox/*.test.ts tests/sandbox/commands/*.test.ts \
	tests/sandbox/files/*.test.ts tests/sandbox/pty/*.test.ts tests/sandbox/git/*.test.ts \
	tests/api/{info,kill,list,snapshot}.test.ts tests/volume/*.test.ts \
	tests/template/{build,exists,tags,backgroundBuild}.test.ts tests/template/methods/*.test.ts 2>/dev/null)"
# Left out as well: files that mock the API with msw (they assert against
# https://api.e2b.app handlers, never a server), files that vi.mock modules
# of the SDK's source (a mock cannot reach into the bundled npm package) and
# files that import SDK internals beyond the three modules above.
if (($# == 0)); then
	files=""
	for f in $DEFAULT_FILES; do
		if grep -qE "from 'msw|vi\.mock\('" "$sdk/$f" ||
			grep -E "from '(\.\./)+src/" "$sdk/$f" | grep -qvE "src/(index|errors)(\.js)?'|src/sandbox/filesystem'"; then
			continue
		fi
		files+="$f "
	done
else
	files="$*"
fi

export HUTCH_UPSTREAM_DIR="$sdk" HUTCH_UPSTREAM_FILES="$files"
export HUTCH_UPSTREAM_OUT="${HUTCH_UPSTREAM_OUT:-$work/results}"
echo "run-upstream.sh: scratch copy $sdk, reports in $HUTCH_UPSTREAM_OUT" >&2
# HTTPS as on E2B (the tests fetch https://<getHost(port)>), and *.localhost
# resolved to 127.0.0.1 in the tests' processes (wildcard DNS);
# HUTCH_E2B_TLS=0 serves plain HTTP instead.
export HUTCH_E2B_TLS="${HUTCH_E2B_TLS:-1}"
export NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--import=$here/resolve-localhost.mjs"
HUTCH_E2B_TEST_TIMEOUT=$((4 * 3600 * 1000)) "$here/../run.sh" "$here/vitest-driver.test.mjs"
