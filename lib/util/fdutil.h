/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Write all of buf, retrying on EINTR and short writes. -errno on failure. */
int fd_write_all(int fd, const void *buf, size_t len);
/* Read up to len bytes, until EOF. Returns the count or -errno. */
ssize_t fd_read_full(int fd, void *buf, size_t len);
int fd_set_nonblock(int fd, bool nonblock);
int fd_set_cloexec(int fd, bool cloexec);

/* One packet with up to nfds descriptors (SCM_RIGHTS). */
int fd_send_with_fds(int sock, const void *buf, size_t len, const int *fds, size_t nfds);
/* Receive one packet and up to max_fds descriptors (MSG_CMSG_CLOEXEC).
 * Extra descriptors beyond max_fds are closed, *ret_nfds set. A truncated
 * packet (MSG_TRUNC / MSG_CTRUNC) fails with -EMSGSIZE, closing any fds.
 * Returns the packet length (0 = peer closed) or -errno. */
ssize_t fd_recv_with_fds(int sock, void *buf, size_t len, int *fds, size_t max_fds, size_t *ret_nfds,
                         int flags);

/* Close a descriptor that came from an untrusted peer. A socket is reset
 * first (SO_LINGER 0): a peer could have set a long linger on a socket with
 * unsent data, making a plain close() block for that long. */
void close_untrusted(int fd);

/* Read a small file (<= max bytes) into a NUL-terminated malloc'd string. */
int read_file_at(int dirfd, const char *path, size_t max, char **ret);
/* Write a string to an existing file (cgroupfs, /proc). */
int write_file_at(int dirfd, const char *path, const char *s);
/* /proc/PID/FILE (uid_map or gid_map): ids 0..count-1 of the process's user
 * namespace are host ids base.. (one line, written once). */
int idmap_write(pid_t pid, const char *file, unsigned base, unsigned count);
