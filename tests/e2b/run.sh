#!/usr/bin/env bash
# E2B SDK conformance suite for `hutch serve`.
#
#   HUTCH_BIN=build/hutch tests/e2b/run.sh [node --test options] [FILE.test.mjs ...]
#
# Starts a private daemon on a free port with its own data and run dirs, runs the
# node:test files against it with the stock `e2b` npm SDK, then stops it.
# Extra arguments ending in .test.mjs replace the file list; the others are
# passed to `node --test` (e.g. --test-name-pattern='pty').
# Env: HUTCH_BIN (default: build/hutch of this checkout), HUTCH_E2B_KEEP=1 keeps
# the tmp dir, HUTCH_E2B_TEST_TIMEOUT (ms per test, default 180000),
# HUTCH_E2B_ROUTER=N runs the files through `hutch router` in front of N daemons
# (default files: HUTCH_E2B_ROUTER_FILES, see below); with HUTCH_E2B_ROUTER_TLS=1
# the daemons serve TLS (a CA and certificate made here) and the router
# verifies them (--node-tls-ca); it is mutual (the nodes' --tls-client-ca,
# the router's --node-tls-cert). HUTCH_E2B_TLS=1 (one daemon): it serves HTTPS
# with a certificate made here for 127.0.0.1 and *.<sandbox domain>, and
# E2B_API_URL/E2B_SANDBOX_URL are https (upstream/run-upstream.sh uses it).
# HUTCH_E2B_DATA_DIR=DIR serves from that data
# dir (kept afterwards) instead of a fresh one: e.g. one where `hutch template
# base` built the base template, to run the suite on it.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

# --- the daemon binary (relative paths: to the caller's cwd, then the checkout)
bin="${HUTCH_BIN:-$root/build/hutch}"
if [[ "$bin" != /* ]]; then
	if [[ -x "$PWD/$bin" ]]; then bin="$PWD/$bin"; else bin="$root/$bin"; fi
fi
if [[ ! -x "$bin" ]]; then
	echo "run.sh: HUTCH_BIN '$bin' is not an executable" >&2
	exit 2
fi
export HUTCH_BIN="$bin"

# --- node and the pinned SDKs
if ! command -v node >/dev/null 2>&1; then
	echo "run.sh: node is required (node 20 or later)" >&2
	exit 2
fi
if [[ ! -d "$here/node_modules/e2b" || ! -d "$here/node_modules/e2b-245" ||
	"$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]]; then
	(cd "$here" && npm ci --no-audit --no-fund) || {
		echo "run.sh: npm ci failed" >&2
		exit 2
	}
fi

# --- arguments: test files vs node options
files=()
node_args=()
for a in "$@"; do
	if [[ "$a" == *.test.mjs ]]; then
		if [[ "$a" != /* && -e "$PWD/$a" ]]; then a="$PWD/$a"; elif [[ "$a" != /* ]]; then a="$here/$(basename "$a")"; fi
		files+=("$a")
	else
		node_args+=("$a")
	fi
done
files_given=${#files[@]}
node_urls=()
if ((${#files[@]} == 0)); then
	files=("$here"/*.test.mjs)
fi
extra_pids=()

# --- private state
tmp="$(mktemp -d "${TMPDIR:-/tmp}/hutch-e2b.XXXXXX")"
# mktemp makes it 0700; the sandboxes' unprivileged host uids must be able to
# reach their roots and layers under the data dir
chmod 0755 "$tmp"
data="$tmp/data"
if [[ -n "${HUTCH_E2B_DATA_DIR:-}" ]]; then
	mkdir -p "$HUTCH_E2B_DATA_DIR"
	data="$(realpath "$HUTCH_E2B_DATA_DIR")" # the daemon opens no path through a symlink
fi
log="$tmp/serve.log"
pidfile="$tmp/serve.pid"
: >"$log"
status=1
first_pid=""

port="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
listen="127.0.0.1:$port"

# Kill the team's leftover sandboxes (a failed test may leave some), for every
# key the tests used, so that no sandbox outlives the run.
kill_leftovers() {
	local keys=("${E2B_API_KEY:-}") extra=()
	if [[ -f "$tmp/extra-keys" ]]; then
		mapfile -t extra <"$tmp/extra-keys"
		keys+=("${extra[@]}")
	fi
	# behind the router, each node is asked too: a test may have killed the router
	# (https nodes with HUTCH_E2B_ROUTER_TLS=1 want the router's client certificate)
	E2B_LEFTOVER_URLS="$E2B_API_URL ${node_urls[*]:-}" E2B_LEFTOVER_KEYS="${keys[*]}" \
		E2B_LEFTOVER_TLS="${router_tls:+$tmp}" timeout 60 node --input-type=module -e '
		import { readFileSync } from "node:fs"
		import http from "node:http"
		import https from "node:https"
		const dir = process.env.E2B_LEFTOVER_TLS
		const tls = dir ? { ca: readFileSync(`${dir}/ca.pem`), cert: readFileSync(`${dir}/router.pem`),
			key: readFileSync(`${dir}/router.key`) } : {}
		const call = (url, method, key) => new Promise((resolve, reject) => {
			const u = new URL(url)
			const req = (u.protocol === "https:" ? https : http).request(u, { method, headers: { "X-API-KEY": key },
				...(u.protocol === "https:" ? tls : {}) }, (res) => {
				const parts = []
				res.on("data", (d) => parts.push(d))
				res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString() }))
			})
			req.on("error", reject)
			req.end()
		})
		for (const url of process.env.E2B_LEFTOVER_URLS.split(" ").filter(Boolean))
		for (const key of process.env.E2B_LEFTOVER_KEYS.split(" ").filter(Boolean)) {
			try {
				const res = await call(`${url}/v2/sandboxes?state=running,paused&limit=100`, "GET", key)
				if (res.status !== 200) continue
				for (const s of JSON.parse(res.body)) {
					const d = await call(`${url}/sandboxes/${s.sandboxID}`, "DELETE", key)
					console.error(`run.sh: killed leftover sandbox ${s.sandboxID}: HTTP ${d.status}`)
				}
			} catch (e) { console.error(`run.sh: leftover cleanup: ${e.message}`) }
		}' || true
}

stop_pid() {
	local pid="$1"
	[[ -n "$pid" ]] || return 0
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		# a zombie child of ours counts as gone
		[[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]] && return 0
		sleep 0.1
	done
	echo "run.sh: hutch serve ($pid) ignored SIGTERM for 10 s, sending SIGKILL" >&2
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	trap - EXIT INT TERM
	if [[ -n "${E2B_API_URL:-}" ]]; then
		kill_leftovers
	fi
	local cur=""
	[[ -f "$pidfile" ]] && cur="$(cat "$pidfile" 2>/dev/null)"
	stop_pid "$cur"
	[[ "$cur" != "$first_pid" ]] && stop_pid "$first_pid"
	for p in "${extra_pids[@]}"; do stop_pid "$p"; done
	wait 2>/dev/null
	if ((status != 0)); then
		echo "----- tail of $log -----" >&2
		tail -n 150 "$log" >&2
		for f in "$tmp"/serve[0-9]*.log; do [[ -f "$f" ]] && { echo "----- tail of $f -----" >&2; tail -n 60 "$f" >&2; }; done
		echo "----- end of serve log -----" >&2
		# the failures again, after the logs, where a reader of the output's
		# tail (a CI summary) sees them
		if [[ -f "$tmp/node.out" ]] && grep -q '^✖ failing tests:' "$tmp/node.out"; then
			echo "----- the failing tests again -----" >&2
			sed -n '/^✖ failing tests:/,$p' "$tmp/node.out" | head -n 120 >&2
		fi
	fi
	# Never delete a tree with a mount point under it (a sandbox root may have
	# host directories bind-mounted into it).
	if [[ "${HUTCH_E2B_KEEP:-0}" != 1 ]] && ! awk '{print $5}' /proc/self/mountinfo | grep -q "^$tmp/"; then
		rm -rf --one-file-system "$tmp"
	else
		echo "run.sh: kept $tmp" >&2
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM

# --- start the daemon
# HUTCH_E2B_BACKEND=gvisor runs the whole suite against sandboxes on gVisor
# (the daemon's default backend; the tests themselves do not change).
export HUTCH_E2B_BACKEND="${HUTCH_E2B_BACKEND:-ns}"
# On gvisor the writable layer lives in the sandbox's memory (docs/gvisor.md):
# a layer smaller than the default 512 MiB of memory, so that a test can fill
# it and meet ENOSPC rather than the memory limit.
if [[ -z "${HUTCH_E2B_DISK:-}" && "$HUTCH_E2B_BACKEND" == gvisor ]]; then
	export HUTCH_E2B_DISK=256M
fi
disk_args=()
[[ -n "${HUTCH_E2B_DISK:-}" ]] && disk_args=(--disk "$HUTCH_E2B_DISK")
# volumes made by POST /volumes: small, so that a test fills one in a moment
export HUTCH_E2B_VOLUME_SIZE="${HUTCH_E2B_VOLUME_SIZE:-32M}"
# The sandbox domain: getHost(port) is "<port>-<id>.sandbox.localhost:<daemon
# port>", which ingress.test.mjs resolves to 127.0.0.1 as wildcard DNS would.
export HUTCH_E2B_SANDBOX_DOMAIN="sandbox.localhost:$port"
# HUTCH_E2B_ROUTER=N: N daemons (each its own data dir, run dir, port and
# node id, all with one keys-file) behind one `hutch router`; the SDK talks to
# the router only. Tests that restart the daemon or run `hutch key` on its data
# dir do not apply (the default file list then leaves them out).
router_n="${HUTCH_E2B_ROUTER:-0}"
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
if ((router_n > 0)); then
	key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
	echo "default $key" >"$tmp/keys"
	export HUTCH_E2B_KEYS_FILE="$tmp/keys"
	scheme=http
	tls_args=()
	router_tls=()
	if [[ "${HUTCH_E2B_ROUTER_TLS:-0}" == 1 ]]; then
		# one CA, one node certificate for 127.0.0.1 (every node's address
		# here), and the router's client certificate: mutual TLS
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/ca.key" \
			-out "$tmp/ca.pem" -days 2 -subj /CN=hutch-e2b-ca >/dev/null 2>&1 &&
			openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/node.key" \
				-subj /CN=hutch-e2b-node -addext subjectAltName=IP:127.0.0.1 \
				-addext basicConstraints=critical,CA:FALSE -x509 -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
				-days 2 -out "$tmp/node.pem" >/dev/null 2>&1 &&
			openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/router.key" \
				-subj /CN=hutch-e2b-router -addext extendedKeyUsage=clientAuth \
				-addext basicConstraints=critical,CA:FALSE -x509 -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
				-days 2 -out "$tmp/router.pem" >/dev/null 2>&1 || { echo "run.sh: openssl failed" >&2; exit 2; }
		scheme=https
		# kill_leftovers asks each node too
		export NODE_EXTRA_CA_CERTS="$tmp/ca.pem"
		tls_args=(--tls-cert "$tmp/node.pem" --tls-key "$tmp/node.key" --tls-client-ca "$tmp/ca.pem")
		router_tls=(--node-tls-ca "$tmp/ca.pem" --node-tls-cert "$tmp/router.pem" --node-tls-key "$tmp/router.key")
	fi
	for i in $(seq 1 "$router_n"); do
		np="$(free_port)"
		"$bin" serve --listen "127.0.0.1:$np" --data-dir "$tmp/data$i" --run-dir "$tmp/run$i" \
			--backend "$HUTCH_E2B_BACKEND" --keys-file "$tmp/keys" --node-id "$(printf 'nd%02d' "$i")" \
			"${disk_args[@]}" "${tls_args[@]}" >>"$tmp/serve$i.log" 2>&1 &
		extra_pids+=($!)
		node_urls+=("$scheme://127.0.0.1:$np")
	done
	for u in "${node_urls[@]}"; do
		for _ in $(seq 1 300); do
			curl -sf ${router_tls:+--cacert "$tmp/ca.pem"} "$u/health" >/dev/null 2>&1 && break
			sleep 0.1
		done
	done
	router_args=(router --listen "$listen" --nodes "$(IFS=,; echo "${node_urls[*]}")" --key-file "$tmp/keys"
		"${router_tls[@]}")
	HUTCH_E2B_ROUTER_ARGS="$(node -e 'console.log(JSON.stringify(process.argv.slice(1)))' -- "${router_args[@]}")"
	export HUTCH_E2B_ROUTER_ARGS
	"$bin" "${router_args[@]}" >>"$log" 2>&1 &
	first_pid=$!
	echo "$first_pid" >"$pidfile"
	ln -sfn data1 "$tmp/data"
	ln -sfn run1 "$tmp/run"
	if ((files_given == 0)); then
		files=()
		for f in ${HUTCH_E2B_ROUTER_FILES:-commands files pty watch upstream-api upstream-commands upstream-files v1 lifecycle egress}; do
			files+=("$here/$f.test.mjs")
		done
	fi
else
# HUTCH_E2B_TLS=1: the daemon serves HTTPS with a certificate (made here, its
# CA in NODE_EXTRA_CA_CERTS) for 127.0.0.1 and *.<sandbox domain>, so that a
# test may fetch https://<getHost(port)> as on E2B (the name itself resolves
# only where something maps *.localhost to 127.0.0.1: the caller's business).
serve_tls=()
if [[ "${HUTCH_E2B_TLS:-0}" == 1 ]]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/ca.key" \
		-out "$tmp/ca.pem" -days 2 -subj /CN=hutch-e2b-ca >/dev/null 2>&1 &&
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/node.key" \
			-subj /CN=hutch-e2b-serve -addext "subjectAltName=IP:127.0.0.1,DNS:*.${HUTCH_E2B_SANDBOX_DOMAIN%:*}" \
			-addext basicConstraints=critical,CA:FALSE -x509 -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
			-days 2 -out "$tmp/node.pem" >/dev/null 2>&1 || { echo "run.sh: openssl failed" >&2; exit 2; }
	export NODE_EXTRA_CA_CERTS="$tmp/ca.pem"
	serve_tls=(--tls-cert "$tmp/node.pem" --tls-key "$tmp/node.key")
fi
"$bin" serve --listen "$listen" --data-dir "$data" --run-dir "$tmp/run" --backend "$HUTCH_E2B_BACKEND" \
	--volume-size "$HUTCH_E2B_VOLUME_SIZE" --sandbox-domain "$HUTCH_E2B_SANDBOX_DOMAIN" "${disk_args[@]}" \
	"${serve_tls[@]}" >>"$log" 2>&1 &
first_pid=$!
echo "$first_pid" >"$pidfile"

# first start writes DATA/api-key
for _ in $(seq 1 300); do
	[[ -s "$data/api-key" ]] && break
	if ! kill -0 "$first_pid" 2>/dev/null; then break; fi
	sleep 0.1
done
key=""
[[ -s "$data/api-key" ]] && key="$(tr -d ' \n\r' <"$data/api-key")"
if [[ -z "$key" ]]; then
	key="$(sed -n 's/^\(export \)\{0,1\}E2B_API_KEY=["'\'']\{0,1\}\(e2b_[0-9a-f]*\).*/\2/p' "$log" | tail -n 1)"
fi
fi
if [[ -z "$key" ]]; then
	echo "run.sh: hutch serve wrote no API key (no $tmp/data/api-key, none on stderr)" >&2
	status=2
	exit
fi

api_scheme=http
[[ "${HUTCH_E2B_TLS:-0}" == 1 && "$router_n" == 0 ]] && api_scheme=https
export E2B_API_URL="$api_scheme://$listen"
export E2B_SANDBOX_URL="$api_scheme://$listen"
# the SDK sends volume content requests (/volumecontent/...) here, not to E2B_API_URL
export E2B_VOLUME_API_URL="$api_scheme://$listen"
export E2B_API_KEY="$key"
unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN E2B_VALIDATE_API_KEY
export HUTCH_DATA_DIR="$data" HUTCH_RUN_DIR="$tmp/run" HUTCH_SERVE_PID="$first_pid"
export HUTCH_SERVE_PIDFILE="$pidfile" HUTCH_SERVE_LOG="$log" HUTCH_LISTEN="$listen" HUTCH_E2B_TMP="$tmp"

if ! timeout 60 node --input-type=module -e '
	const pid = Number(process.env.HUTCH_SERVE_PID)
	const deadline = Date.now() + 30000
	for (;;) {
		try { process.kill(pid, 0) } catch { console.error("run.sh: hutch serve exited during start-up"); process.exit(1) }
		try {
			const r = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`, { headers: { "X-API-KEY": process.env.E2B_API_KEY } })
			await r.arrayBuffer()
			if (r.status === 200) process.exit(0)
			if (Date.now() > deadline) { console.error(`run.sh: GET /v2/sandboxes answers ${r.status}`); process.exit(1) }
		} catch (e) {
			if (Date.now() > deadline) { console.error(`run.sh: daemon not reachable: ${e.cause?.message ?? e.message}`); process.exit(1) }
		}
		await new Promise((r) => setTimeout(r, 100))
	}'; then
	status=2
	exit
fi
if ((router_n > 0)); then
	echo "run.sh: hutch router ($first_pid) in front of $router_n nodes ready on $listen, data in $tmp" >&2
else
	echo "run.sh: hutch serve ($first_pid) ready on $listen, data in $tmp" >&2
fi

reporter=(--test-reporter=spec)
for a in "${node_args[@]}"; do [[ "$a" == --test-reporter* ]] && reporter=(); done

cd "$here" || exit 2
node --test "${reporter[@]}" --test-concurrency=1 --test-force-exit \
	--test-timeout="${HUTCH_E2B_TEST_TIMEOUT:-180000}" \
	"${node_args[@]}" "${files[@]}" 2>&1 | tee "$tmp/node.out"
status=${PIPESTATUS[0]}
exit
