#!/usr/bin/env bash
# Install the Debian packages hutch needs, and only the missing ones.
#
#   scripts/deps.sh build   # compilers, meson, libraries, runtime tools
#   scripts/deps.sh test    # build + test and benchmark extras
#
# Idempotent and quick: when dpkg already has every package installed, apt is
# never touched (no `apt-get update`, no network). Prints one line.
set -euo pipefail

set_name=${1:-build}

build_pkgs=(
        gcc clang meson ninja-build pkg-config
        libseccomp-dev musl-tools e2fsprogs
        libjansson-dev libmicrohttpd-dev libsqlite3-dev libssl-dev
        libzstd-dev libarchive-dev libcap-dev
        iproute2 ca-certificates python3
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
        man-db systemd # the install test: man -l of the man page, systemd-analyze verify of the unit
)

case "$set_name" in
build) want=("${build_pkgs[@]}") ;;
test) want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
*)
        echo "usage: $0 build|test" >&2
        exit 2
        ;;
esac

# node and npm may come from elsewhere (e.g. NodeSource, which also names its
# package "nodejs" but ships npm inside it): ask only for what is missing.
if [[ $set_name == test ]]; then
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

log=$(mktemp /tmp/hutch-deps.XXXXXX)
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" apt-get update -q &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "deps($set_name): apt-get failed installing: ${missing[*]}" >&2
        exit 1
fi
echo "deps($set_name): installed ${missing[*]}"
