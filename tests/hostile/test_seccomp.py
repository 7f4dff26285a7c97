"""docs/security.md promise 3: dangerous syscalls never reach the kernel.

Each probe (tests/helpers/probe.c) makes one attempt inside a sandbox; its
exit status is the errno it got. Refusals by the filter must carry the test
build's distinctive deny errno: the kernel never answers it by itself, so a
pass cannot come from a kernel that lacks the feature. Without the filter,
most of these calls SUCCEED for sandbox root (it owns its user namespace);
docs/security.md has the table.

The tables run twice in one sandbox each (as root and as `user`, plus root
with --no-new-privs); the headline cases also run alone in a fresh sandbox.
"""

import errno

import pytest

import hutchtest

# Refused by the filter: the probe must exit with the deny errno.
FILTER_REFUSED = [
    # namespaces (clone is checked with a mask over every CLONE_NEW* flag)
    "unshare-user", "unshare-net", "unshare-mount", "unshare-pid", "unshare-ipc",
    "unshare-uts", "unshare-cgroup", "unshare-time", "unshare-files",
    "clone-newuser", "clone-newnet", "clone-newmount", "clone-newpid", "clone-newipc",
    "clone-newuts", "clone-newcgroup", "clone-newuser-highbits",
    "setns-net", "setns-user",
    # mounts, old and new API
    "mount-tmpfs", "mount-bind", "mount-cgroup", "mount-cgroup2", "umount", "pivot-root",
    "open-tree", "move-mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount-setattr",
    # kernel attack surface
    "keyctl", "add-key", "request-key", "bpf", "perf-event-open", "userfaultfd",
    "io-uring-setup", "io-uring-enter", "io-uring-register", "fanotify-init",
    "lsm-list-modules", "lookup-dcookie", "modify-ldt",
    # kernel image, modules, hardware, time, logs, power
    "kexec-load", "kexec-file-load", "init-module", "finit-module", "delete-module",
    "iopl", "ioperm", "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl",
    "vhangup", "sethostname", "clock-settime", "settimeofday", "clock-adjtime", "adjtimex",
    "personality", "personality-addr-no-randomize",
    # file handles (CVE-2014-3519)
    "open-by-handle-at", "name-to-handle-at",
    # NUMA policy
    "set-mempolicy", "mbind", "migrate-pages", "move-pages",
    # terminals: compared on the low 32 bits, so high bits cannot slip past
    "tiocsti", "tiocsti-highbits", "tioclinux", "tioclinux-highbits",
    # socket families
    "socket-vsock", "socket-vsock-highbits", "socket-alg", "socket-packet", "socket-tipc",
    "socketpair-tipc",
]

# Refused with ENOSYS so that libc and tools fall back (clone3 -> clone,
# whose flags the filter can read); numbers newer than the filter likewise.
ENOSYS_REFUSED = [
    "clone3", "clone3-newuser", "statmount", "listmount", "listns", "unknown-syscall",
]

# Controls: what the filter allows must keep working, or a refusal above
# could be a broken probe rather than the filter.
ALLOWED_FOR_ANY = [
    "getpid", "clone-plain", "fchmodat2", "seccomp-nested", "seccomp-status",
    "personality-query", "tiocgwinsz", "tiocgwinsz-highbits", "socket-unix", "socket-inet",
    "socket-netlink", "socketpair-unix", "pidfd-getfd", "kcmp", "process-vm-readv",
    "mknod-fifo",
]
ALLOWED_FOR_ROOT = ["chroot"]  # CAP_SYS_CHROOT is in sandbox root's bounding set

ALL = FILTER_REFUSED + ENOSYS_REFUSED + ALLOWED_FOR_ANY + ALLOWED_FOR_ROOT

# The examples docs/security.md names (promise 3), each also alone in a fresh sandbox.
HEADLINE = ["unshare-user", "clone-newuser", "mount-cgroup", "keyctl", "bpf",
            "io-uring-setup", "userfaultfd", "perf-event-open", "open-by-handle-at",
            "socket-vsock", "socket-alg", "tiocsti", "tiocsti-highbits", "tioclinux"]

VARIANTS = [
    pytest.param("root", (), id="root"),
    pytest.param("user", (), id="user"),
    pytest.param("root", ("--no-new-privs",), id="root-nnp"),
]


@pytest.mark.parametrize("user,run_args", VARIANTS)
@pytest.mark.parametrize("name", FILTER_REFUSED)
def test_filter_refuses(probe_batch, distinctive_errno, name, user, run_args):
    got = probe_batch(ALL, user=user, run_args=run_args)[name]
    assert got == distinctive_errno, (
        f"{name} as {user}: expected the filter's errno {distinctive_errno}, got {got}"
        f"{' (the call SUCCEEDED)' if got == 0 else ''}")


@pytest.mark.parametrize("user,run_args", VARIANTS)
@pytest.mark.parametrize("name", ENOSYS_REFUSED)
def test_filter_answers_enosys(probe_batch, name, user, run_args):
    got = probe_batch(ALL, user=user, run_args=run_args)[name]
    assert got == errno.ENOSYS, f"{name} as {user}: expected ENOSYS, got {got}"


@pytest.mark.parametrize("user,run_args", VARIANTS)
@pytest.mark.parametrize("name", ALLOWED_FOR_ANY)
def test_filter_allows(probe_batch, name, user, run_args):
    got = probe_batch(ALL, user=user, run_args=run_args)[name]
    assert got == 0, f"{name} as {user}: an allowed call failed with errno {got}"


@pytest.mark.parametrize("name", ALLOWED_FOR_ROOT)
def test_filter_allows_root(probe_batch, name):
    got = probe_batch(ALL, user="root")[name]
    assert got == 0, f"{name} as root: an allowed call failed with errno {got}"


def test_landlock_is_allowed(probe):
    # EOPNOTSUPP: landlock compiled in but not enabled at boot (still not the filter).
    r = probe("landlock")
    assert r.rc in (0, errno.EOPNOTSUPP), r


@pytest.mark.parametrize("name", HEADLINE)
def test_headline_refusal_in_fresh_sandbox(probe, distinctive_errno, name):
    r = probe(name)
    assert r.rc == distinctive_errno, r
    assert f"{name}: errno {distinctive_errno} ".encode() in r.stdout, r


def test_threads_and_spawn_work_without_clone3(warm):
    # glibc >= 2.34 tries clone3 first for threads and posix_spawn; the ENOSYS
    # answer must send it back to clone, which the filter can inspect.
    code = ("import subprocess, threading\n"
            "t = threading.Thread(target=print, args=('thread ok',))\n"
            "t.start(); t.join()\n"
            "print(subprocess.run(['echo', 'spawn ok'], capture_output=True, text=True).stdout, end='')\n")
    cp = hutchtest.run_sandbox([], ["python3", "-c", code])
    assert (cp.returncode, cp.stdout) == (0, b"thread ok\nspawn ok\n"), cp.stderr
