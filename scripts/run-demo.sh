#!/usr/bin/env bash
# A tour of the CLI alone, without the daemon: `hutch doctor`, `hutch run`
# with limits and no network, `hutch ps`. (`make run` starts the daemon, the
# E2B API; docs/design.md §1.) Usage: scripts/run-demo.sh [BUILD_DIR]
#
# The first steps must work (exit 1 otherwise); the later ones show
# isolation and print their exit status whatever it is.
set -uo pipefail

build=${1:-build}
hutch=$build/hutch
[[ -x $hutch ]] || hutch=$build/cli/hutch
if [[ ! -x $hutch ]]; then
        echo "run-demo: $build/hutch is not built (run make)" >&2
        exit 1
fi

bold=$'\e[1m' dim=$'\e[2m' off=$'\e[0m'
[[ -t 1 ]] || bold= dim= off=

# Quote an argument only when the shell would need it.
shown() {
        local a out=
        for a in "$@"; do
                if [[ $a =~ ^[A-Za-z0-9_./=:+,@%-]+$ ]]; then
                        out+=" $a"
                elif [[ $a != *"'"* && $a != *$'\n'* ]]; then
                        out+=" '$a'"
                else
                        out+=" ${a@Q}"
                fi
        done
        printf '%s' "${out# }"
}

# step must|show CMD...: print the command as typed, run it, report.
step() {
        local kind=$1 rc=0
        shift
        printf '\n%s$ %s%s\n' "$bold" "$(shown "$@")" "$off"
        "$@" || rc=$?
        if ((rc != 0)); then
                printf '%s(exit %d)%s\n' "$dim" "$rc" "$off"
                if [[ $kind == must ]]; then
                        echo "run-demo: that step has to work; stopping" >&2
                        exit 1
                fi
        fi
        return 0
}

step must "$hutch" doctor
step must "$hutch" run -- /bin/sh -c \
        'echo hello from $(hostname) as $(id -un) in $(pwd); python3 -c "print(1+1)"'
step show "$hutch" run --memory 256M --net deny -- python3 -c 'print(1 + 1)'
# The sandbox sees a synthesized /etc, its own pid 1, and no network but loopback.
step show "$hutch" run -- /bin/sh -c 'head -n 3 /etc/passwd; echo "pid 1 is $(cat /proc/1/comm)"; ls /sys/class/net'
# Only loopback exists: no interface but lo, so nothing can leave. (No
# connection attempt is made: demo traffic never goes anywhere.)
step show "$hutch" run -- /bin/sh -c 'echo "interfaces: $(ls /sys/class/net 2>/dev/null || cut -d: -f1 /proc/net/dev | tail -n +3)"'
# Touches up to 256 MiB, 16 at a time, under a 64 MiB limit: expect the
# kernel's OOM killer to end it (exit 137) before the last line prints.
step show "$hutch" run --memory 64M -- python3 -c '
b = []
for i in range(16):
    b.append(b"x" * (16 << 20))
print("allocated 256 MiB: no memory limit (unexpected)")'
step show "$hutch" ps

printf '\n%sdone.%s For the E2B API, `make run` starts the daemon (`hutch serve`, docs/design.md §1).\n' "$bold" "$off"
