/* SPDX-License-Identifier: Apache-2.0 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "util/fdutil.h"
#include "util/macro.h"

int fd_write_all(int fd, const void *buf, size_t len) {
        const char *p = buf;
        while (len > 0) {
                ssize_t n = write(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

ssize_t fd_read_full(int fd, void *buf, size_t len) {
        char *p = buf;
        size_t got = 0;
        while (got < len) {
                ssize_t n = read(fd, p + got, len - got);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                got += (size_t) n;
        }
        return (ssize_t) got;
}

int fd_set_nonblock(int fd, bool nonblock) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0)
                return -errno;
        int nfl = nonblock ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
        if (nfl != fl && fcntl(fd, F_SETFL, nfl) < 0)
                return -errno;
        return 0;
}

int fd_set_cloexec(int fd, bool cloexec) {
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0)
                return -errno;
        int nfl = cloexec ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC);
        if (nfl != fl && fcntl(fd, F_SETFD, nfl) < 0)
                return -errno;
        return 0;
}

int fd_send_with_fds(int sock, const void *buf, size_t len, const int *fds, size_t nfds) {
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * 8)];
        } control;
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

        if (nfds > 8)
                return -EINVAL;
        if (nfds > 0) {
                memset(&control, 0, sizeof control);
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
        }
        for (;;) {
                ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if ((size_t) n != len)
                        return -EMSGSIZE;
                return 0;
        }
}

ssize_t fd_recv_with_fds(int sock, void *buf, size_t len, int *fds, size_t max_fds, size_t *ret_nfds,
                         int flags) {
        union {
                struct cmsghdr align;
                /* room for SCM_MAX_FD: never let the kernel drop (and close,
                 * possibly slowly) descriptors it could not deliver */
                char buf[CMSG_SPACE(sizeof(int) * 253)];
        } control;
        struct iovec iov = { .iov_base = buf, .iov_len = len };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof control.buf,
        };
        ssize_t n;
        size_t got = 0;

        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k; i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                        if (got < max_fds)
                                fds[got++] = fd;
                        else
                                close_untrusted(fd);
                }
        }
        if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                for (size_t i = 0; i < got; i++)
                        close_untrusted(fds[i]);
                return -EMSGSIZE;
        }
        if (ret_nfds)
                *ret_nfds = got;
        else
                for (size_t i = 0; i < got; i++)
                        close_untrusted(fds[i]);
        return n;
}

void close_untrusted(int fd) {
        struct stat st;
        if (fd < 0)
                return;
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
                struct linger l = { .l_onoff = 1, .l_linger = 0 };
                (void) setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        close(fd);
}

int read_file_at(int dirfd, const char *path, size_t max, char **ret) {
        _cleanup_close_ int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        _cleanup_free_ char *buf = malloc(max + 1);
        if (!buf)
                return -ENOMEM;
        ssize_t n = fd_read_full(fd, buf, max);
        if (n < 0)
                return (int) n;
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        return (int) n;
}

int write_file_at(int dirfd, const char *path, const char *s) {
        _cleanup_close_ int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        return fd_write_all(fd, s, strlen(s));
}

int idmap_write(pid_t pid, const char *file, unsigned base, unsigned count) {
        char path[64], line[64];
        snprintf(path, sizeof path, "/proc/%d/%s", (int) pid, file);
        snprintf(line, sizeof line, "0 %u %u\n", base, count);
        return write_file_at(AT_FDCWD, path, line);
}
