/* SPDX-License-Identifier: Apache-2.0 */
/* image_pull: a registry's image into a template (lib/image/pull.h). */
#include <errno.h>
#include <openssl/evp.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "image/image.h"
#include "image/layer.h"
#include "image/pull.h"
#include "image/reference.h"
#include "image/registry.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"

void image_pull_result_clear(image_pull_result *r) {
        if (!r)
                return;
        free(r->name);
        free(r->source);
        free(r->host);
        *r = (image_pull_result) { 0 };
}

int image_blob_dir(const char *data_dir, char *buf, size_t n) {
        if ((size_t) snprintf(buf, n, "%s/images/blobs/sha256", data_dir) >= n)
                return -ENAMETOOLONG;
        return 0;
}

int image_pull_gc(const char *data_dir, hutch_error *err) {
        char dir[4096];
        if (image_blob_dir(data_dir, dir, sizeof dir) < 0)
                return hutch_error_set(err, -ENAMETOOLONG, "data dir path too long");
        return registry_cache_gc(dir, err);
}

typedef struct pull_ctx {
        const char *data_dir;
        registry_client *client;
        const image_manifest *m;
        char blob_dir[4096];
        const image_progress *p;
        unsigned n_downloaded;
        uint64_t bytes;
        /* the downloader child (see dl_start) */
        pid_t dl_pid;
        int dl_fd;
        bool dl_ended;
        int dl_r;
        char dl_msg[sizeof((hutch_error *) 0)->msg];
        /* the layers unpack_all put into the store (image_install then finds them) */
        const image_config *cfg;
        bool *unpacked;
        /* layers the store has but this pull must prove it has too (another
         * team's private ones: layer_private_allows), and for whom */
        bool *verify;
        int64_t team;
} pull_ctx;

/* What the downloader child tells the pull: progress (dropped when the pipe
 * is full: the parent may be busy unpacking), then one end record. Each
 * fits PIPE_BUF, so a write is atomic. */
typedef struct dl_record {
        int32_t end, r;
        uint64_t done, total, bytes;
        uint32_t blobs_done, n_blobs;
        char msg[sizeof((hutch_error *) 0)->msg];
} dl_record;

static void sha256_digest(const uint8_t *buf, size_t len, char out[72]) {
        unsigned char md[32];
        unsigned int ml = 0;
        EVP_Digest(buf, len, md, &ml, EVP_sha256(), NULL);
        strcpy(out, "sha256:");
        for (int i = 0; i < 32; i++)
                sprintf(out + 7 + 2 * i, "%02x", md[i]);
}

static void client_freep(registry_client **c) {
        registry_client_free(*c);
}

static bool foreign(const char *media_type) {
        return media_type &&
                (strstr(media_type, "foreign") || strstr(media_type, "nondistributable"));
}

/* The blob's cached copy, opened; downloaded first when the cache has
 * none. Another pull of an image with the same layer may, between our
 * download (or our wait for its download) and our open, unpack the blob
 * and delete it (a layer's compressed copy goes once it is unpacked): then
 * it is downloaded again, a few times at most. */
static int cache_open(pull_ctx *x, const char *digest, int64_t size, int *ret_fd, hutch_error *err) {
        char path[4096];
        for (int attempt = 0;; attempt++) {
                int r = registry_cache_path(x->blob_dir, digest, path, sizeof path);
                if (r < 0)
                        return hutch_error_set(err, r, "invalid digest %.80s", digest);
                if (path[0]) {
                        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                        if (fd >= 0) {
                                *ret_fd = fd;
                                return 0;
                        }
                        if (errno != ENOENT)
                                return hutch_error_set(err, -errno, "opening %s: %m", path);
                }
                if (attempt == 3)
                        return hutch_error_set(err, -EIO, "blob %s vanished from the cache %d times", digest,
                                               attempt);
                registry_blob b = { .digest = digest, .size = size };
                uint64_t got = 0;
                unsigned nb = 0;
                r = registry_fetch_blobs(x->client, &b, 1, NULL, NULL, &got, &nb, err);
                if (r < 0)
                        return r;
                x->bytes += got;
                x->n_downloaded += nb;
        }
}

static void dl_forward(pull_ctx *x, const dl_record *rec) {
        if (rec->end) {
                x->dl_ended = true;
                x->dl_r = rec->r;
                snprintf(x->dl_msg, sizeof x->dl_msg, "%s", rec->msg);
                x->bytes += rec->bytes;
                x->n_downloaded += rec->n_blobs;
                return;
        }
        if (x->p && x->p->fn) {
                image_progress_event ev = { .phase = "download",
                                            .done = rec->done,
                                            .total = rec->total,
                                            .layer = rec->blobs_done,
                                            .n_layers = rec->n_blobs };
                x->p->fn(x->p->arg, &ev);
        }
}

/* One record from the downloader (blocking); false at EOF. */
static bool dl_read(pull_ctx *x) {
        dl_record rec;
        for (;;) {
                ssize_t k = read(x->dl_fd, &rec, sizeof rec);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k != (ssize_t) sizeof rec) {
                        if (!x->dl_ended) {
                                x->dl_ended = true;
                                x->dl_r = -EIO;
                                snprintf(x->dl_msg, sizeof x->dl_msg, "the downloader died");
                        }
                        return false;
                }
                dl_forward(x, &rec);
                return true;
        }
}

/* Until the downloader has put digest into the cache, or ended. */
static int dl_wait_for(pull_ctx *x, const char *digest, hutch_error *err) {
        char path[4096];
        for (;;) {
                if (registry_cache_path(x->blob_dir, digest, path, sizeof path) == 0 && path[0])
                        return 0;
                if (x->dl_fd < 0 || x->dl_ended) {
                        if (x->dl_ended && x->dl_r < 0)
                                return hutch_error_set(err, x->dl_r, "%s", x->dl_msg);
                        return 0; /* cache_open downloads it */
                }
                if (!dl_read(x) && x->dl_r < 0)
                        return hutch_error_set(err, x->dl_r, "%s", x->dl_msg);
        }
}

static void dl_send(int fd, const dl_record *rec, bool must) {
        for (;;) {
                ssize_t k = write(fd, rec, sizeof *rec);
                if (k >= 0 || !must)
                        return;
                if (errno == EAGAIN) {
                        struct pollfd pfd = { .fd = fd, .events = POLLOUT };
                        poll(&pfd, 1, 1000);
                } else if (errno != EINTR)
                        return;
        }
}

typedef struct dl_child {
        int fd;
        uint64_t last_ms;
        unsigned last_blobs;
} dl_child;

static void dl_child_progress(void *arg, uint64_t done, uint64_t total, unsigned blobs_done,
                              unsigned n_blobs) {
        dl_child *c = arg;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t now = (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
        if (blobs_done == c->last_blobs && now - c->last_ms < 50)
                return;
        c->last_ms = now;
        c->last_blobs = blobs_done;
        dl_record rec = { .done = done, .total = total, .blobs_done = blobs_done, .n_blobs = n_blobs };
        dl_send(c->fd, &rec, false);
}

/* Download the blobs in a child process while this one installs: image_install
 * unpacks layer i while layers i+1... arrive (a pull costs about the longer of
 * the download and the unpack, not their sum). A process, not a thread: the
 * unpacker forks, and a fork must not copy a thread's held locks. The child
 * dies with the pull (PR_SET_PDEATHSIG), leaving its .partial files to a
 * resume or to gc. */
static int dl_start(pull_ctx *x, const registry_blob *want, size_t n_want, hutch_error *err) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return hutch_error_set(err, -errno, "pipe: %m");
        pid_t parent = getpid();
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
                close(p[0]);
                close(p[1]);
                return hutch_error_set(err, -errno, "fork: %m");
        }
        if (pid == 0) {
                close(p[0]);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(1);
                fcntl(p[1], F_SETFL, O_NONBLOCK);
                dl_child c = { .fd = p[1] };
                hutch_error e = { 0 };
                uint64_t bytes = 0;
                unsigned nb = 0;
                int r = registry_fetch_blobs(x->client, want, n_want, dl_child_progress, &c, &bytes,
                                             &nb, &e);
                dl_record rec = { .end = 1, .r = r < 0 ? r : 0, .bytes = bytes, .n_blobs = nb };
                snprintf(rec.msg, sizeof rec.msg, "%s", e.msg);
                dl_send(p[1], &rec, true);
                _exit(r < 0 ? 1 : 0);
        }
        close(p[1]);
        x->dl_pid = pid;
        x->dl_fd = p[0];
        return 0;
}

/* Reap the downloader: drain what it says, or kill it when the pull ended
 * without it (failed, or needed nothing more). */
static void dl_finish(pull_ctx *x, bool kill_it) {
        if (x->dl_pid <= 0)
                return;
        if (kill_it && !x->dl_ended)
                kill(x->dl_pid, SIGKILL);
        else
                while (!x->dl_ended && dl_read(x))
                        ;
        while (waitpid(x->dl_pid, NULL, 0) < 0 && errno == EINTR)
                ;
        x->dl_pid = 0;
        x->dl_fd = safe_close(x->dl_fd);
}

typedef struct unpack_job {
        pid_t pid;
        int fd; /* the result: int32 code, then the message */
        size_t layer;
} unpack_job;

static void progress_emit(pull_ctx *x, const char *phase, const char *digest, uint64_t done,
                          uint64_t total, unsigned layer, unsigned n) {
        if (!x->p || !x->p->fn)
                return;
        image_progress_event ev = { phase, digest, done, total, layer, n };
        x->p->fn(x->p->arg, &ev);
}

static int unpack_start(pull_ctx *x, const image_manifest *m, const image_config *cfg, size_t i,
                        unpack_job *job, hutch_error *err) {
        int blob = -1;
        int r = cache_open(x, m->layers[i].digest, m->layers[i].size, &blob, err);
        if (r < 0)
                return r;
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
                close(blob);
                return hutch_error_set(err, -errno, "pipe: %m");
        }
        pid_t parent = getpid();
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
                close(blob);
                close(p[0]);
                close(p[1]);
                return hutch_error_set(err, -errno, "fork: %m");
        }
        if (pid == 0) {
                close(p[0]);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(1);
                hutch_error e = { 0 };
                /* The blob's digest was checked as it arrived (registry.c), so
                 * the unpacker's own pass over the compressed bytes is skipped
                 * (NULL): it still checks the uncompressed stream against the
                 * config's diff_id, which the config's checked digest binds, so
                 * a blob a crash damaged in the (unsynced) cache fails there. */
                int k = x->verify && x->verify[i]
                        ? layer_verify(blob, cfg->diff_ids[i], &e)
                        : layer_unpack(x->data_dir, blob, NULL, cfg->diff_ids[i],
                                       (uint64_t) m->layers[i].size, &e);
                int32_t code = k < 0 ? k : 0;
                struct iovec iov[2] = { { &code, sizeof code }, { e.msg, strlen(e.msg) } };
                ssize_t wr = writev(p[1], iov, 2);
                (void) wr;
                _exit(k < 0 ? 1 : 0);
        }
        close(blob);
        close(p[1]);
        *job = (unpack_job) { .pid = pid, .fd = p[0], .layer = i };
        progress_emit(x, "layer", cfg->diff_ids[i], 0, (uint64_t) m->layers[i].size,
                      (unsigned) i + 1, (unsigned) m->n_layers);
        return 0;
}

static int unpack_reap(pull_ctx *x, const image_manifest *m, const image_config *cfg,
                       unpack_job *job, hutch_error *err) {
        int32_t code = -EIO;
        char msg[sizeof err->msg];
        ssize_t k = read(job->fd, &code, sizeof code);
        ssize_t ml = k == (ssize_t) sizeof code ? read(job->fd, msg, sizeof msg - 1) : 0;
        msg[ml > 0 ? ml : 0] = '\0';
        job->fd = safe_close(job->fd);
        while (waitpid(job->pid, NULL, 0) < 0 && errno == EINTR)
                ;
        job->pid = 0;
        if (k != (ssize_t) sizeof code)
                return hutch_error_set(err, -EIO, "unpacking layer %s: the unpacker died",
                                       cfg->diff_ids[job->layer]);
        if (code < 0)
                return hutch_error_set(err, code, "%s", msg);
        x->unpacked[job->layer] = true;
        if (x->verify && x->verify[job->layer] &&
            (code = layer_private_grant(x->data_dir, cfg->diff_ids[job->layer], x->team)) < 0)
                return hutch_error_set(err, code, "layer %s: recording who has it: %s", cfg->diff_ids[job->layer],
                                       strerror(-code));
        /* its compressed copy is not needed any more: gone now, while other
         * layers still unpack, rather than all at the end */
        char path[4096];
        if (registry_cache_path(x->blob_dir, m->layers[job->layer].digest, path, sizeof path) == 0 &&
            path[0])
                unlink(path);
        progress_emit(x, "layer-done", cfg->diff_ids[job->layer],
                      (uint64_t) m->layers[job->layer].size, (uint64_t) m->layers[job->layer].size,
                      (unsigned) job->layer + 1, (unsigned) m->n_layers);
        return 0;
}

/* Unpack the downloaded layers into the store, several at once, each as soon
 * as its blob is verified in the cache: decompression is most of a pull's
 * CPU, and layers are independent (each is its own directory in the store).
 * image_install then finds them all there and writes the template. */
static int unpack_all(pull_ctx *x, const image_manifest *m, const image_config *cfg,
                      const size_t *need, size_t n, hutch_error *err) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        size_t workers = ncpu < 1 ? 1 : ncpu > 4 ? 4 : (size_t) ncpu;
        unpack_job jobs[4] = { 0 };
        if (!(x->unpacked = calloc(m->n_layers, sizeof *x->unpacked)))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        _cleanup_free_ bool *started = calloc(n ? n : 1, sizeof *started);
        if (!started)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t n_started = 0, active = 0;
        int r = 0;
        while (r >= 0 && (n_started < n || active > 0)) {
                /* Start any layer whose blob is in the cache, in the order the
                 * downloads finish (not the manifest's: 4 parallel downloads
                 * finish out of order, and an idle worker should not wait
                 * for layer 1 while layer 3 is there). Once the downloader
                 * ended well, the rest start anyway (cache_open fetches what
                 * it lacks). */
                if (x->dl_ended && x->dl_r < 0) {
                        r = hutch_error_set(err, x->dl_r, "%s", x->dl_msg);
                        break;
                }
                while (r >= 0 && active < workers && n_started < n) {
                        size_t pick = n;
                        for (size_t k = 0; k < n && pick == n; k++) {
                                char path[4096];
                                if (started[k])
                                        continue;
                                if (x->dl_ended ||
                                    (registry_cache_path(x->blob_dir, m->layers[need[k]].digest,
                                                         path, sizeof path) == 0 &&
                                     path[0]))
                                        pick = k;
                        }
                        if (pick == n)
                                break;
                        size_t slot = 0;
                        while (jobs[slot].pid)
                                slot++;
                        if ((r = unpack_start(x, m, cfg, need[pick], &jobs[slot], err)) < 0)
                                break;
                        started[pick] = true;
                        n_started++;
                        active++;
                }
                if (r < 0 || (n_started == n && active == 0))
                        break;
                /* wait for a worker to finish or the downloader to say something */
                struct pollfd pfd[5];
                size_t map[5], np = 0;
                for (size_t s2 = 0; s2 < workers; s2++)
                        if (jobs[s2].pid) {
                                pfd[np] = (struct pollfd) { .fd = jobs[s2].fd, .events = POLLIN };
                                map[np++] = s2;
                        }
                bool dl_polled = !x->dl_ended && x->dl_fd >= 0;
                if (dl_polled)
                        pfd[np++] = (struct pollfd) { .fd = x->dl_fd, .events = POLLIN };
                if (np == 0) {
                        r = hutch_error_set(err, -EIO, "pull: nothing to wait for"); /* cannot happen */
                        break;
                }
                if (poll(pfd, np, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = hutch_error_set(err, -errno, "poll: %m");
                        break;
                }
                size_t nw = dl_polled ? np - 1 : np;
                for (size_t q = 0; q < nw && r >= 0; q++)
                        if (pfd[q].revents) {
                                r = unpack_reap(x, m, cfg, &jobs[map[q]], err);
                                active--;
                        }
                if (r >= 0 && dl_polled && pfd[np - 1].revents)
                        dl_read(x);
        }
        for (size_t s2 = 0; s2 < workers; s2++)
                if (jobs[s2].pid) {
                        kill(jobs[s2].pid, SIGKILL);
                        while (waitpid(jobs[s2].pid, NULL, 0) < 0 && errno == EINTR)
                                ;
                        safe_close(jobs[s2].fd);
                }
        return r;
}

/* image_install's events, less its "exists" for the layers unpack_all did
 * (they were just unpacked, not found) and its resolve/config (done here) */
static void install_progress(void *arg, const image_progress_event *ev) {
        pull_ctx *x = arg;
        if (!x->p || !x->p->fn)
                return;
        if (streq(ev->phase, "resolve") || streq(ev->phase, "config"))
                return;
        if (streq(ev->phase, "exists") && x->unpacked && x->cfg && ev->layer >= 1 &&
            ev->layer <= x->cfg->n_diff_ids && x->unpacked[ev->layer - 1])
                return;
        x->p->fn(x->p->arg, ev);
}

/* image_install's blob source: the cache, downloading what it lacks. */
static int open_blob(void *arg, const char *digest, int *ret_fd, hutch_error *err) {
        pull_ctx *x = arg;
        const image_manifest *m = x->m;
        const image_descriptor *d = NULL;
        if (m->config.digest && streq(m->config.digest, digest))
                d = &m->config;
        for (size_t i = 0; !d && i < m->n_layers; i++)
                if (streq(m->layers[i].digest, digest))
                        d = &m->layers[i];
        if (!d)
                return hutch_error_set(err, -ENOENT, "the manifest names no blob %.80s", digest);
        if (foreign(d->media_type))
                return hutch_error_set(err, -EPERM,
                                       "layer %s is a foreign (non-distributable) layer: refused",
                                       digest);
        int r = dl_wait_for(x, digest, err);
        if (r < 0)
                return r;
        return cache_open(x, digest, d->size, ret_fd, err);
}

static int read_small(int fd, uint8_t **ret, size_t *ret_n, hutch_error *err) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return hutch_error_set(err, -errno, "reading the config: %m");
        if (st.st_size > IMAGE_MAX_MANIFEST)
                return hutch_error_set(err, -EFBIG, "the image config is larger than %u bytes",
                                       IMAGE_MAX_MANIFEST);
        uint8_t *buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t n = 0;
        while (n < (size_t) st.st_size) {
                ssize_t k = read(fd, buf + n, (size_t) st.st_size - n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        free(buf);
                        return hutch_error_set(err, -EIO, "reading the config: short read");
                }
                n += (size_t) k;
        }
        *ret = buf;
        *ret_n = n;
        return 0;
}

static bool retry_elsewhere(int r) {
        return r == -ENOENT || r == -EACCES || r == -EHOSTUNREACH || r == -ECONNREFUSED ||
                r == -ETIMEDOUT || r == -EIO || r == -EBUSY;
}

static void freep_secret(char **p) {
        if (*p) {
                explicit_bzero(*p, strlen(*p));
                free(*p);
        }
}

int image_pull(const char *data_dir, const char *ref, const char *name, const image_pull_opts *opts,
               const image_progress *p, image_pull_result *ret, hutch_error *err) {
        static const image_pull_opts no_opts = { 0 };
        if (!opts)
                opts = &no_opts;
        _cleanup_(image_reference_clear) image_reference rfv = { 0 };
        image_reference *rf = &rfv;
        int r = image_reference_parse(ref, rf, err);
        if (r < 0)
                return r;

        char conf_path[4096];
        registries_conf_path(data_dir, opts->conf_path, conf_path, sizeof conf_path);
        _cleanup_(registries_conf_clear) registries_conf confv = { 0 };
        registries_conf *conf = &confv;
        if ((r = registries_conf_load(conf_path, conf, err)) < 0)
                return r;

        _cleanup_free_ char *tname = NULL;
        if (name)
                tname = strdup(name);
        else if (image_reference_template_name(rf, &tname) < 0)
                tname = NULL;
        if (!tname)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        bool given = opts->user && opts->pass;
        if (given && !name) {
                /* the team's own template: another team's pull of the same
                 * reference never finds it, nor replaces it */
                char *t = NULL;
                if (asprintf(&t, "%.48s.team%lld", tname, (long long) opts->team) < 0)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                free(tname);
                tname = t;
        }
        if (template_validate_name(tname) < 0 || streq(tname, "host") || streq(tname, "base"))
                return hutch_error_set(
                        err, -EINVAL,
                        "invalid template name '%s' (1-63 of a-z 0-9 - _ ., starting with a letter or "
                        "digit; not host or base): give one with --name",
                        tname);

        image_candidate *cands = NULL;
        size_t n_cands = 0;
        if ((r = image_reference_candidates(rf, conf, &cands, &n_cands, err)) < 0)
                return r;

        if (opts->configured_only) {
                /* drop what the file does not name; none left: refused */
                size_t kept = 0;
                for (size_t i = 0; i < n_cands; i++) {
                        const char *h = cands[i].mirror ? cands[i].host : cands[i].registry;
                        if (registries_conf_names(conf, h)) {
                                image_candidate t = cands[kept];
                                cands[kept++] = cands[i];
                                cands[i] = t;
                        }
                }
                if (kept == 0) {
                        r = hutch_error_set(
                                err, -EPERM,
                                "%s names a registry %s does not list (search, mirror or allow lines): "
                                "refused",
                                ref, conf_path);
                        image_candidates_free(cands, n_cands);
                        return r;
                }
                for (size_t i = kept; i < n_cands; i++) {
                        free(cands[i].host);
                        free(cands[i].registry);
                        free(cands[i].repository);
                }
                n_cands = kept;
        }
        if (given) {
                /* a build's credentials go to one registry: the reference's
                 * (a short name's: the first search registry), never to a
                 * mirror, which would answer without asking for them */
                size_t kept = 0;
                for (size_t i = 0; i < n_cands; i++) {
                        bool keep = !cands[i].mirror &&
                                (kept == 0 || streq(cands[i].registry, cands[0].registry));
                        if (keep) {
                                image_candidate t = cands[kept];
                                cands[kept++] = cands[i];
                                cands[i] = t;
                        }
                }
                for (size_t i = kept; i < n_cands; i++) {
                        free(cands[i].host);
                        free(cands[i].registry);
                        free(cands[i].repository);
                }
                n_cands = kept;
                if (n_cands == 0) {
                        image_candidates_free(cands, n_cands);
                        return hutch_error_set(err, -EPERM,
                                               "%s: no registry to send the build's credentials to",
                                               ref);
                }
        }
        /* ECR: the access key goes to ECR's API in the registry's region,
         * and only for a registry that is ECR's there (after the checks
         * above: a restricted pull asks nothing of a host the operator did
         * not list) */
        _cleanup_free_ char *ecr_user = NULL;
        _cleanup_(freep_secret) char *ecr_pass = NULL;
        if (given && opts->aws_region) {
                if (!registry_ecr_host_valid(cands[0].host, opts->aws_region))
                        r = hutch_error_set(err, -EPERM,
                                            "%s is not an Amazon ECR registry of region %s "
                                            "(ACCOUNT.dkr.ecr.%s.amazonaws.com): the build's AWS "
                                            "credentials are not sent",
                                            cands[0].host, opts->aws_region, opts->aws_region);
                else
                        r = registry_ecr_login(opts->aws_region, opts->user, opts->pass,
                                               opts->ca_file, &ecr_user, &ecr_pass, err);
                if (r < 0) {
                        image_candidates_free(cands, n_cands);
                        return r;
                }
        }
        pull_ctx x = { .data_dir = data_dir, .p = p, .dl_fd = -1 };
        if (image_blob_dir(data_dir, x.blob_dir, sizeof x.blob_dir) < 0) {
                image_candidates_free(cands, n_cands);
                return hutch_error_set(err, -ENAMETOOLONG, "data dir path too long");
        }
        char auth_path[4096];
        registry_auth_path(data_dir, auth_path, sizeof auth_path);
        registry_client_opts co = {
                .conf = conf,
                .auth_path = auth_path,
                .ca_file = opts->ca_file,
                .blob_dir = x.blob_dir,
                .parallel = opts->parallel,
                .user = ecr_user ? ecr_user
                        : given  ? opts->user
                                 : NULL,
                .pass = ecr_pass ? ecr_pass
                        : given  ? opts->pass
                                 : NULL,
        };

        /* the manifest: the first candidate that has it */
        _cleanup_free_ uint8_t *mbuf = NULL;
        size_t mlen = 0;
        _cleanup_free_ char *mtype = NULL;
        char mdigest[72] = "";
        const image_candidate *got = NULL;
        char tried[sizeof err->msg] = "";
        int first_r = 0;
        for (size_t i = 0; i < n_cands; i++) {
                hutch_error e1 = { 0 };
                registry_client *c = NULL;
                int k = registry_client_new(cands[i].host, cands[i].repository, &co, &c, &e1);
                if (k >= 0)
                        k = registry_get_manifest(c, rf->digest ? rf->digest : rf->tag, &mbuf,
                                                  &mlen, &mtype, mdigest, &e1);
                if (k >= 0) {
                        x.client = c;
                        got = &cands[i];
                        break;
                }
                registry_client_free(c);
                if (!first_r || (first_r == -ENOENT && k != -ENOENT))
                        first_r = k;
                size_t tl = strlen(tried);
                snprintf(tried + tl, sizeof tried - tl, "%s%s", tl ? "; " : "", e1.msg);
                if (!retry_elsewhere(k) || i + 1 == n_cands) {
                        image_candidates_free(cands, n_cands);
                        return hutch_error_set(err, n_cands > 1 ? first_r : k, "%s", tried);
                }
        }
        _cleanup_(client_freep) registry_client *client = x.client;
        _cleanup_free_ char *source = image_reference_format(got->registry, got->repository,
                                                             rf->tag, mdigest);
        _cleanup_free_ char *host = strdup(got->host);
        image_candidates_free(cands, n_cands);
        if (!source || !host)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        if (p && p->fn) {
                image_progress_event ev = { .phase = "resolve", .digest = mdigest };
                p->fn(p->arg, &ev);
        }

        image_manifest m = { 0 };
        if ((r = image_manifest_parse(mbuf, mlen, mtype, &m, err)) < 0)
                return hutch_error_wrap(err, r, "the manifest of %s", source);
        if (m.is_index) {
                /* the host platform's manifest, by digest (verified) */
                _cleanup_free_ char *chosen = m.chosen.digest ? strdup(m.chosen.digest) : NULL;
                image_manifest_clear(&m);
                if (!chosen)
                        return hutch_error_set(err, -ENOENT,
                                               "%s has no manifest for this host's platform (%s)",
                                               source, image_host_arch());
                free(mbuf);
                mbuf = NULL;
                free(mtype);
                mtype = NULL;
                char d2[72];
                if ((r = registry_get_manifest(client, chosen, &mbuf, &mlen, &mtype, d2, err)) < 0)
                        return r;
                if ((r = image_manifest_parse(mbuf, mlen, mtype, &m, err)) < 0)
                        return hutch_error_wrap(err, r, "the manifest %s", chosen);
                if (m.is_index) {
                        image_manifest_clear(&m);
                        return hutch_error_set(err, -EINVAL,
                                               "%s: an index inside an index is not supported",
                                               chosen);
                }
        }
        x.m = &m;

        /* the config first (small): its diff_ids say which layers the store has */
        int cfd = -1;
        r = cache_open(&x, m.config.digest, m.config.size, &cfd, err);
        uint8_t *cbuf = NULL;
        size_t clen = 0;
        if (r >= 0) {
                r = read_small(cfd, &cbuf, &clen, err);
                close(cfd);
        }
        char cdigest[72];
        if (r >= 0 && (sha256_digest(cbuf, clen, cdigest), !streq(cdigest, m.config.digest))) {
                /* damaged in the cache (it is not fsync'd): gone, and the next pull fetches it */
                char path[4096];
                if (registry_cache_path(x.blob_dir, m.config.digest, path, sizeof path) == 0 &&
                    path[0])
                        unlink(path);
                r = hutch_error_set(err, -EBADMSG,
                                    "the cached config %s had digest %s: removed, pull again",
                                    m.config.digest, cdigest);
        }
        image_config cfg = { 0 };
        if (r >= 0 && (r = image_config_parse(cbuf, clen, &cfg, err)) < 0)
                hutch_error_wrap(err, r, "the config of %s", source);
        free(cbuf);
        if (r >= 0 && cfg.n_diff_ids != m.n_layers)
                r = hutch_error_set(err, -EBADMSG,
                                    "%s: the manifest has %zu layers, the config %zu diff_ids",
                                    source, m.n_layers, cfg.n_diff_ids);
        registry_blob *want = NULL;
        size_t n_want = 0;
        unsigned present = 0;
        /* from the presence checks until image_install names every layer in
         * template.json, a layer GC must not take the ones this pull found or
         * unpacked (layer_gc waits for no holder) */
        _cleanup_close_ int hold = r >= 0 ? layer_store_hold(data_dir, err) : -1;
        if (r >= 0 && hold < 0)
                r = hold;
        _cleanup_free_ size_t *need = calloc(m.n_layers + 1, sizeof *need);
        _cleanup_free_ bool *verify = calloc(m.n_layers + 1, sizeof *verify);
        x.verify = verify;
        x.team = given ? opts->team : 0;
        if (r >= 0 && (!(want = calloc(m.n_layers + 1, sizeof *want)) || !need || !verify))
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        for (size_t i = 0; r >= 0 && i < m.n_layers; i++) {
                char lp[4096];
                int k = layer_path(data_dir, cfg.diff_ids[i], lp, sizeof lp);
                if (k < 0) {
                        r = hutch_error_set(err, k, "%s: invalid diff_id %.80s", source,
                                            cfg.diff_ids[i]);
                        break;
                }
                if (lp[0]) {
                        k = layer_private_allows(data_dir, cfg.diff_ids[i], x.team);
                        if (k < 0) {
                                r = hutch_error_set(err, k, "layer %s: %s", cfg.diff_ids[i], strerror(-k));
                                break;
                        }
                        if (k == 1) {
                                present++;
                                continue;
                        }
                        /* private to other teams: downloaded and verified, never taken on trust */
                        x.verify[i] = true;
                } else if (x.team > 0 && (k = layer_private_grant(data_dir, cfg.diff_ids[i], x.team)) < 0) {
                        /* listed before it exists, so it is never public for a moment */
                        r = hutch_error_set(err, k, "layer %s: %s", cfg.diff_ids[i], strerror(-k));
                        break;
                }
                if (foreign(m.layers[i].media_type))
                        continue; /* image_install refuses it, with the reason */
                bool dup = false;
                for (size_t k2 = 0; k2 < n_want; k2++)
                        dup |= streq(cfg.diff_ids[need[k2]], cfg.diff_ids[i]);
                if (dup)
                        continue;
                need[n_want] = i;
                want[n_want++] = (registry_blob) { .digest = m.layers[i].digest,
                                                   .size = m.layers[i].size };
        }
        if (r >= 0 && n_want > 0)
                r = dl_start(&x, want, n_want, err);
        if (r >= 0 && n_want > 0)
                r = unpack_all(&x, &m, &cfg, need, n_want, err);
        image_progress filtered = { .fn = install_progress, .arg = &x };
        x.cfg = &cfg;
        if (r >= 0)
                r = image_install_team(data_dir, tname, given ? opts->team : 0, source, mbuf, mlen,
                                       mtype, open_blob, &x, p ? &filtered : NULL, err);
        dl_finish(&x, r < 0);
        image_config_clear(&cfg);
        if (r >= 0 && x.dl_ended && x.dl_r < 0)
                r = hutch_error_set(err, x.dl_r, "%s", x.dl_msg);
        /* the layers are unpacked in the store now: their compressed copies
         * go (configs stay); after a digest that did not match, every copy
         * goes, so that the next pull downloads them again */
        for (size_t i = 0; (r >= 0 || r == -EBADMSG) && i < m.n_layers; i++) {
                char path[4096];
                if (registry_cache_path(x.blob_dir, m.layers[i].digest, path, sizeof path) == 0 &&
                    path[0])
                        unlink(path);
        }
        if (given) {
                /* a config pulled with a build's credentials stays out of
                 * the cache: a pull without them, whose manifest named its
                 * digest, would otherwise read it without asking the registry */
                char path[4096];
                if (registry_cache_path(x.blob_dir, m.config.digest, path, sizeof path) == 0 &&
                    path[0])
                        unlink(path);
        }
        free(want);
        free(x.unpacked);
        if (r >= 0 && ret) {
                *ret = (image_pull_result) {
                        .name = TAKE_PTR(tname),
                        .source = TAKE_PTR(source),
                        .host = TAKE_PTR(host),
                        .bytes_downloaded = x.bytes,
                        .blobs_downloaded = x.n_downloaded,
                        .layers = (unsigned) m.n_layers,
                        .layers_present = present,
                };
        }
        image_manifest_clear(&m);
        return r < 0 ? r : 0;
}
