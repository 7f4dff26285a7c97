#!/usr/bin/env bash
# Install the Debian packages hutch needs, and only the missing ones.
#
#   scripts/deps.sh build   # compilers, meson, libraries, runtime tools
#   scripts/deps.sh test    # build + test and benchmark extras (+ interp)
#   scripts/deps.sh interp  # the code interpreter's kernels (docs/interpreter.md)
#
# Idempotent and quick: when dpkg already has every package installed, apt is
# never touched (no `apt-get update`, no network) and it prints one line;
# otherwise it shows apt's progress as it goes, and the reason on failure.
set -euo pipefail

set_name=${1:-build}

build_pkgs=(
        gcc clang meson ninja-build pkg-config
        libseccomp-dev musl-tools e2fsprogs
        libjansson-dev libmicrohttpd-dev libgnutls28-dev libsqlite3-dev libssl-dev
        libzstd-dev libarchive-dev # hutch template pull/import: layer tarballs
        libcurl4-openssl-dev # hutch template pull: the registry client (HTTPS, parallel downloads)
        libzmq3-dev # hutch-interp speaks ZeroMQ to the Jupyter kernels
        iproute2 ca-certificates python3
        mmdebstrap # hutch template base (and so `make run`): the base template from Debian packages
)
# The code-interpreter template's languages, from the host's /usr
# (docs/interpreter.md): about 640 MB and a minute of apt on a fresh machine.
interp_pkgs=(
        python3-ipykernel python3-jupyter-client # the python kernel, and the bench's direct client
        python3-numpy python3-pandas python3-matplotlib python3-scipy python3-sklearn
        python3-seaborn python3-pil python3-plotly
        r-cran-irkernel # R
        node-typescript # TypeScript, transpiled for the node kernel
        openjdk-17-jdk-headless # jshell, for the Java kernel
)
test_pkgs=(
        python3-pytest
        libclang-rt-14-dev # sanitizer and libFuzzer runtimes for clang 14
        clang-format
        valgrind
        bubblewrap crun runc runsc hyperfine
        sudo # the integration tests check sudo inside a sandbox (sandbox root only)
        sqlite3 # bench/sdk.sh reads the daemon's database
        curl openssl # the egress tests: clients inside sandboxes, the test CA
        docker-registry skopeo umoci # the registry tests and bench/pull.sh: a real registry, images built and pushed
        apache2-utils python3-cryptography # the registry tests: htpasswd (bcrypt) for basic auth, ES256 tokens for auth.token
        python3-yaml python3-jsonschema # deploy/kubernetes/validate.py: the manifests checked offline
        man-db systemd # the install test: man -l of the man page, systemd-analyze verify of the unit
        busybox-static # tests/integration/test_images.py: a static shell for the images the tests build
        umoci # image tooling for checking the layouts the tests write by hand (docs/templates.md)
        zstd # tests/helpers/ociimage.py compresses zstd layers with it
        prometheus # tests/integration/test_metrics.py scrapes the daemon's /metrics with it
        python3-h2 # tests/integration/test_ingress_h2.py: the HTTP/2 server in a sandbox, HPACK for hand-made frames (curl is the client)
)

case "$set_name" in
build) want=("${build_pkgs[@]}") ;;
test) want=("${build_pkgs[@]}" "${test_pkgs[@]}" "${interp_pkgs[@]}") ;;
interp) want=("${interp_pkgs[@]}") ;;
*)
        echo "usage: $0 build|test|interp" >&2
        exit 2
        ;;
esac

# node and npm may come from elsewhere (e.g. NodeSource, which also names its
# package "nodejs" but ships npm inside it): ask only for what is missing.
if [[ $set_name == test || $set_name == interp ]]; then
        command -v node >/dev/null 2>&1 || want+=(nodejs)
        command -v npm >/dev/null 2>&1 || want+=(npm)
fi

# One dpkg-query for all packages; a package counts as present only when its
# status is "install ok installed" (abbreviated "ii").
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${want[@]}" 2>/dev/null | awk '$2 == "ii" { print $1 }' || true)
missing=()
for p in "${want[@]}"; do
        grep -qxF -- "$p" <<<"$installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
        echo "deps($set_name): all ${#want[@]} packages already installed"
        exit 0
fi

sudo=()
if ((EUID != 0)); then
        if command -v sudo >/dev/null 2>&1; then
                sudo=(sudo)
        else
                echo "deps($set_name): missing ${missing[*]}, and not root (no sudo) to install them" >&2
                exit 1
        fi
fi

# Show what apt does (a fresh machine spends minutes here): one line per
# step, apt's own progress lines as they come; the full log is kept for the
# error message. -o APT::Status-Fd would be machine-readable; these lines are
# for the person waiting.
log=$(mktemp /tmp/hutch-deps.XXXXXX)
trap 'rm -f "$log"' EXIT
step() { printf 'deps(%s): %s\n' "$set_name" "$*"; }
# apt's lines that say something to a person: fetches, unpacking, setting up
progress() { grep --line-buffered -E '^(Get:|Hit:|Fetched|Unpacking|Setting up|Reading package lists|E:|W:)' || true; }
step "installing ${#missing[@]} Debian package(s): ${missing[*]}"
step "apt-get update"
# (pipefail: a failed apt fails the pipeline; progress never does)
if ! "${sudo[@]}" apt-get update 2>&1 | tee -a "$log" | progress; then
        tail -n 30 "$log" >&2
        echo "deps($set_name): apt-get update failed (the log above); check the network and /etc/apt/sources.list" >&2
        exit 1
fi
step "apt-get install"
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}" 2>&1 | tee -a "$log" | progress; then
        tail -n 30 "$log" >&2
        echo "deps($set_name): apt-get failed installing: ${missing[*]} (the log above)" >&2
        exit 1
fi
step "installed ${missing[*]}"
