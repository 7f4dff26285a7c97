/* SPDX-License-Identifier: Apache-2.0 */
/* Image references and the operator's registry list (lib/image/reference.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/reference.h"
#include "util/error.h"
#include "util/fdutil.h"

#define DOCKER_HUB "docker.io"
#define DOCKER_HUB_HOST "registry-1.docker.io"

static bool is_lower_alnum(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
static bool is_alnum(char c) {
        return is_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}
static bool is_hex_lower(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* A path component: [a-z0-9]+ ((\.|_|__|-+)[a-z0-9]+)* */
static bool component_valid(const char *s, size_t n) {
        if (n == 0 || !is_lower_alnum(s[0]) || !is_lower_alnum(s[n - 1]))
                return false;
        for (size_t i = 0; i < n;) {
                if (is_lower_alnum(s[i])) {
                        i++;
                        continue;
                }
                size_t j = i;
                if (s[i] == '.')
                        j++;
                else if (s[i] == '_')
                        j += (i + 1 < n && s[i + 1] == '_') ? 2 : 1;
                else if (s[i] == '-')
                        while (j < n && s[j] == '-')
                                j++;
                else
                        return false;
                if (j >= n || !is_lower_alnum(s[j]))
                        return false;
                i = j;
        }
        return true;
}

/* A host label: [A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])? */
static bool label_valid(const char *s, size_t n) {
        if (n == 0 || n > 63 || !is_alnum(s[0]) || !is_alnum(s[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!is_alnum(s[i]) && s[i] != '-')
                        return false;
        return true;
}

bool image_registry_host_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > REFERENCE_NAME_MAX)
                return false;
        const char *port = NULL;
        size_t hn;
        if (s[0] == '[') {
                const char *close = strchr(s, ']');
                if (!close || close == s + 1)
                        return false;
                for (const char *p = s + 1; p < close; p++)
                        if (!isxdigit((unsigned char) *p) && *p != ':' && *p != '.')
                                return false;
                if (close[1] != '\0' && close[1] != ':')
                        return false;
                port = close[1] == ':' ? close + 2 : NULL;
                if (close[1] == ':' && close[2] == '\0')
                        return false;
                goto check_port;
        }
        const char *colon = strchr(s, ':');
        hn = colon ? (size_t) (colon - s) : n;
        if (hn == 0)
                return false;
        if (colon) {
                port = colon + 1;
                if (*port == '\0')
                        return false;
        }
        for (size_t i = 0; i < hn;) {
                size_t j = i;
                while (j < hn && s[j] != '.')
                        j++;
                if (!label_valid(s + i, j - i))
                        return false;
                i = j + 1;
                if (j + 1 == hn) /* trailing dot */
                        return false;
        }
check_port:
        if (port) {
                size_t pl = strlen(port);
                if (pl > 5)
                        return false;
                for (size_t i = 0; i < pl; i++)
                        if (port[i] < '0' || port[i] > '9')
                                return false;
                if (atoi(port) < 1 || atoi(port) > 65535)
                        return false;
        }
        return true;
}

static bool tag_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > REFERENCE_TAG_MAX)
                return false;
        if (!is_alnum(s[0]) && s[0] != '_')
                return false;
        for (size_t i = 1; i < n; i++)
                if (!is_alnum(s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
                        return false;
        return true;
}

static bool digest_valid(const char *s) {
        if (!startswith(s, "sha256:") || strlen(s) != 7 + 64)
                return false;
        for (size_t i = 7; i < 7 + 64; i++)
                if (!is_hex_lower(s[i]))
                        return false;
        return true;
}

void image_reference_clear(image_reference *r) {
        if (!r)
                return;
        free(r->registry);
        free(r->repository);
        free(r->tag);
        free(r->digest);
        *r = (image_reference) { 0 };
}

int image_reference_parse(const char *s, image_reference *ret, hutch_error *err) {
        if (!s || !*s)
                return hutch_error_set(err, -EINVAL, "empty image reference");
        size_t len = strlen(s);
        if (len > REFERENCE_NAME_MAX + 1 + REFERENCE_TAG_MAX + 1 + 71)
                return hutch_error_set(err, -EINVAL, "image reference longer than %d bytes",
                                       REFERENCE_NAME_MAX + 1 + REFERENCE_TAG_MAX + 1 + 71);
        for (size_t i = 0; i < len; i++)
                if ((unsigned char) s[i] <= ' ' || (unsigned char) s[i] >= 0x7f)
                        return hutch_error_set(
                                err, -EINVAL,
                                "image reference has a space or a control or non-ASCII byte");
        _cleanup_free_ char *buf = strdup(s);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        image_reference r = { 0 };
        int rc = -EINVAL;

        char *at = strchr(buf, '@');
        if (at) {
                *at = '\0';
                if (!digest_valid(at + 1)) {
                        hutch_error_set(err, -EINVAL,
                                        "invalid digest '%s' in image reference (want sha256: and 64 "
                                        "lower-case hex digits)",
                                        at + 1);
                        goto fail;
                }
                r.digest = strdup(at + 1);
                if (!r.digest)
                        goto oom;
        }
        /* A tag follows the last ':' after the last '/' (a ':' before a '/'
         * is a registry's port). */
        char *slash = strrchr(buf, '/');
        char *colon = strrchr(slash ? slash : buf, ':');
        if (colon) {
                *colon = '\0';
                if (!tag_valid(colon + 1)) {
                        hutch_error_set(err, -EINVAL,
                                        "invalid tag '%s' in image reference (1-%d of A-Z a-z 0-9 _ . -, "
                                        "not starting with . or -)",
                                        colon + 1, REFERENCE_TAG_MAX);
                        goto fail;
                }
                r.tag = strdup(colon + 1);
                if (!r.tag)
                        goto oom;
        }
        char *name = buf;
        if (!*name) {
                hutch_error_set(err, -EINVAL, "image reference '%s' has no name", s);
                goto fail;
        }
        if (strlen(name) > REFERENCE_NAME_MAX) {
                hutch_error_set(err, -EINVAL, "image name longer than %d bytes", REFERENCE_NAME_MAX);
                goto fail;
        }
        char *first = strchr(name, '/');
        char *path = name;
        if (first) {
                size_t fl = (size_t) (first - name);
                bool upper = false;
                for (size_t i = 0; i < fl; i++)
                        upper |= (name[i] >= 'A' && name[i] <= 'Z');
                bool is_reg = memchr(name, '.', fl) || memchr(name, ':', fl) ||
                        (fl == 9 && strncmp(name, "localhost", 9) == 0) || upper;
                if (is_reg) {
                        *first = '\0';
                        if (!image_registry_host_valid(name)) {
                                hutch_error_set(err, -EINVAL,
                                                "invalid registry '%s' in image reference", name);
                                goto fail;
                        }
                        /* Docker's own spellings of Docker Hub */
                        const char *reg = streq(name, "index.docker.io") ? DOCKER_HUB : name;
                        r.registry = strdup(reg);
                        if (!r.registry)
                                goto oom;
                        path = first + 1;
                }
        }
        /* the path: components separated by single '/' */
        for (char *p = path;;) {
                char *e = strchr(p, '/');
                size_t n = e ? (size_t) (e - p) : strlen(p);
                if (!component_valid(p, n)) {
                        bool upper = false;
                        for (size_t i = 0; i < n; i++)
                                upper |= (p[i] >= 'A' && p[i] <= 'Z');
                        hutch_error_set(err, -EINVAL,
                                        upper ? "invalid repository name '%s': it must be lower case"
                                              : "invalid repository name '%s' (components of a-z 0-9 "
                                                "separated by '.', '_', '__' or '-', joined by '/')",
                                        path);
                        goto fail;
                }
                if (!e)
                        break;
                p = e + 1;
        }
        /* Docker's bound is on the normalized name: docker.io/library/NAME
         * for a short one-component name */
        size_t full = (r.registry ? strlen(r.registry) + 1
                                  : strlen(DOCKER_HUB "/") + (strchr(path, '/') ? 0 : 8)) +
                strlen(path);
        if (full > REFERENCE_NAME_MAX) {
                hutch_error_set(err, -EINVAL, "image name longer than %d bytes (with its registry)",
                                REFERENCE_NAME_MAX);
                goto fail;
        }
        r.repository = strdup(path);
        if (!r.repository)
                goto oom;
        if (!r.tag && !r.digest) {
                r.tag = strdup("latest");
                if (!r.tag)
                        goto oom;
        }
        *ret = r;
        return 0;
oom:
        rc = hutch_error_set(err, -ENOMEM, "out of memory");
fail:
        image_reference_clear(&r);
        return rc;
}

static bool is_hub(const char *reg) {
        return streq(reg, DOCKER_HUB) || streq(reg, "index.docker.io") || streq(reg, DOCKER_HUB_HOST);
}

int image_reference_repository_on(const image_reference *r, const char *reg, char **ret) {
        char *s;
        if (is_hub(reg) && !strchr(r->repository, '/')) {
                if (asprintf(&s, "library/%s", r->repository) < 0)
                        return -ENOMEM;
        } else if (!(s = strdup(r->repository)))
                return -ENOMEM;
        *ret = s;
        return 0;
}

char *image_reference_format(const char *registry, const char *repository, const char *tag,
                             const char *digest) {
        char *s;
        if (asprintf(&s, "%s/%s%s%s%s%s", registry, repository, tag ? ":" : "", tag ? tag : "",
                     digest ? "@" : "", digest ? digest : "") < 0)
                return NULL;
        return s;
}

int image_reference_template_name(const image_reference *r, char **ret) {
        const char *base = strrchr(r->repository, '/');
        base = base ? base + 1 : r->repository;
        char suffix[REFERENCE_TAG_MAX + 1];
        if (r->tag)
                snprintf(suffix, sizeof suffix, "%s", r->tag);
        else
                snprintf(suffix, sizeof suffix, "%.12s", r->digest + 7);
        char name[64];
        snprintf(name, sizeof name, "%s-%s", base, suffix);
        /* lower case; anything the template rules refuse becomes '-' */
        for (char *p = name; *p; p++) {
                if (*p >= 'A' && *p <= 'Z')
                        *p = (char) (*p - 'A' + 'a');
                else if (!is_lower_alnum(*p) && *p != '-' && *p != '_' && *p != '.')
                        *p = '-';
        }
        char *s = strdup(name);
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

/* ------------------------------------------------------------ registries.conf */

void registries_conf_clear(registries_conf *c) {
        if (!c)
                return;
        for (size_t i = 0; i < c->n_search; i++)
                free(c->search[i]);
        for (size_t i = 0; i < c->n_mirror; i++) {
                free(c->mirror[i].registry);
                free(c->mirror[i].host);
        }
        for (size_t i = 0; i < c->n_insecure; i++)
                free(c->insecure[i]);
        for (size_t i = 0; i < c->n_allow; i++)
                free(c->allow[i]);
        for (size_t i = 0; i < c->n_ca; i++) {
                free(c->ca[i].host);
                free(c->ca[i].file);
        }
        *c = (registries_conf) { 0 };
}

static int conf_word(char **p, char **ret) {
        char *s = *p;
        while (*s == ' ' || *s == '\t')
                s++;
        if (!*s)
                return 0;
        char *e = s;
        while (*e && *e != ' ' && *e != '\t')
                e++;
        if (*e)
                *e++ = '\0';
        *p = e;
        *ret = s;
        return 1;
}

static int conf_push(char **v, size_t *n, const char *s, unsigned line, hutch_error *err) {
        if (*n >= REFERENCES_MAX_ENTRIES)
                return hutch_error_set(err, -EINVAL, "line %u: more than %d entries of this kind",
                                       line, REFERENCES_MAX_ENTRIES);
        if (!(v[*n] = strdup(s)))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        (*n)++;
        return 0;
}

int registries_conf_parse(const char *text, size_t len, registries_conf *ret, hutch_error *err) {
        if (len > REFERENCES_CONF_MAX)
                return hutch_error_set(err, -EFBIG, "registries.conf larger than %u bytes",
                                       REFERENCES_CONF_MAX);
        if (memchr(text, '\0', len))
                return hutch_error_set(err, -EINVAL, "registries.conf has a NUL byte");
        _cleanup_free_ char *buf = strndup(text, len);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        registries_conf c = { 0 };
        unsigned line = 0;
        int r = 0;
        bool search_seen = false;
        for (char *save = NULL, *l = buf; l; l = save) {
                line++;
                char *nl = strchr(l, '\n');
                save = nl ? nl + 1 : NULL;
                if (nl)
                        *nl = '\0';
                char *hash = strchr(l, '#');
                if (hash)
                        *hash = '\0';
                size_t ll = strlen(l);
                if (ll && l[ll - 1] == '\r')
                        l[ll - 1] = '\0';
                char *p = l, *kw, *a = NULL, *b = NULL, *extra = NULL;
                if (!conf_word(&p, &kw))
                        continue;
                if (streq(kw, "search")) {
                        if (search_seen) {
                                r = hutch_error_set(err, -EINVAL, "line %u: a second search line",
                                                    line);
                                goto fail;
                        }
                        search_seen = true;
                        while (conf_word(&p, &a)) {
                                if (!image_registry_host_valid(a)) {
                                        r = hutch_error_set(err, -EINVAL,
                                                            "line %u: invalid registry '%s'", line,
                                                            a);
                                        goto fail;
                                }
                                if ((r = conf_push(c.search, &c.n_search, a, line, err)) < 0)
                                        goto fail;
                        }
                        if (c.n_search == 0) {
                                r = hutch_error_set(err, -EINVAL,
                                                    "line %u: usage: search REGISTRY...", line);
                                goto fail;
                        }
                } else if (streq(kw, "mirror") || streq(kw, "ca")) {
                        bool ca = streq(kw, "ca");
                        if (!conf_word(&p, &a) || !conf_word(&p, &b) || conf_word(&p, &extra)) {
                                r = hutch_error_set(err, -EINVAL, "line %u: usage: %s", line,
                                                    ca ? "ca HOST[:PORT] FILE"
                                                       : "mirror REGISTRY HOST[:PORT]");
                                goto fail;
                        }
                        if (!image_registry_host_valid(a) || (!ca && !image_registry_host_valid(b))) {
                                r = hutch_error_set(err, -EINVAL, "line %u: invalid registry '%s'",
                                                    line, image_registry_host_valid(a) ? b : a);
                                goto fail;
                        }
                        if (ca && b[0] != '/') {
                                r = hutch_error_set(err, -EINVAL,
                                                    "line %u: the CA file must be an absolute path",
                                                    line);
                                goto fail;
                        }
                        size_t *n = ca ? &c.n_ca : &c.n_mirror;
                        if (*n >= REFERENCES_MAX_ENTRIES) {
                                r = hutch_error_set(err, -EINVAL, "line %u: more than %d %s lines",
                                                    line, REFERENCES_MAX_ENTRIES, kw);
                                goto fail;
                        }
                        char *x = strdup(a), *y = strdup(b);
                        if (!x || !y) {
                                free(x);
                                free(y);
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                goto fail;
                        }
                        if (ca) {
                                c.ca[*n].host = x;
                                c.ca[*n].file = y;
                        } else {
                                c.mirror[*n].registry = x;
                                c.mirror[*n].host = y;
                        }
                        (*n)++;
                } else if (streq(kw, "insecure") || streq(kw, "allow")) {
                        bool allow = streq(kw, "allow");
                        if (!conf_word(&p, &a)) {
                                r = hutch_error_set(err, -EINVAL,
                                                    "line %u: usage: %s HOST[:PORT]...", line, kw);
                                goto fail;
                        }
                        do {
                                if (!image_registry_host_valid(a)) {
                                        r = hutch_error_set(err, -EINVAL,
                                                            "line %u: invalid registry '%s'", line,
                                                            a);
                                        goto fail;
                                }
                                if ((r = allow ? conf_push(c.allow, &c.n_allow, a, line, err)
                                               : conf_push(c.insecure, &c.n_insecure, a, line, err)) <
                                    0)
                                        goto fail;
                        } while (conf_word(&p, &a));
                } else {
                        r = hutch_error_set(
                                err, -EINVAL,
                                "line %u: unknown directive '%.40s' (search, mirror, insecure, ca, allow)",
                                line, kw);
                        goto fail;
                }
        }
        if (!search_seen && (r = conf_push(c.search, &c.n_search, DOCKER_HUB, line, err)) < 0)
                goto fail;
        *ret = c;
        return 0;
fail:
        registries_conf_clear(&c);
        return r;
}

int registries_conf_load(const char *path, registries_conf *ret, hutch_error *err) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                if (errno == ENOENT)
                        return registries_conf_parse("", 0, ret, err);
                return hutch_error_set(err, -errno, "opening %s: %m", path);
        }
        struct stat st;
        if (fstat(fd, &st) < 0)
                return hutch_error_set(err, -errno, "reading %s: %m", path);
        if (!S_ISREG(st.st_mode))
                return hutch_error_set(err, -EINVAL, "%s is not a regular file", path);
        if (st.st_size > REFERENCES_CONF_MAX)
                return hutch_error_set(err, -EFBIG, "%s is larger than %u bytes", path,
                                       REFERENCES_CONF_MAX);
        char buf[REFERENCES_CONF_MAX];
        size_t n = 0;
        for (;;) {
                ssize_t k = read(fd, buf + n, sizeof buf - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return hutch_error_set(err, -errno, "reading %s: %m", path);
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (n == sizeof buf)
                        return hutch_error_set(err, -EFBIG, "%s is larger than %u bytes", path,
                                               REFERENCES_CONF_MAX);
        }
        int r = registries_conf_parse(buf, n, ret, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "%s", path);
        return 0;
}

void registries_conf_path(const char *data_dir, const char *path, char *buf, size_t n) {
        const char *cp = path ? path : getenv("HUTCH_REGISTRIES_CONF");
        if (cp && *cp)
                snprintf(buf, n, "%s", cp);
        else
                snprintf(buf, n, "%s/registries.conf", data_dir);
}

bool registries_conf_names(const registries_conf *c, const char *host) {
        bool hub = is_hub(host);
        for (size_t i = 0; c && i < c->n_search; i++)
                if (streq(c->search[i], host) || (hub && is_hub(c->search[i])))
                        return true;
        for (size_t i = 0; c && i < c->n_mirror; i++)
                if (streq(c->mirror[i].host, host))
                        return true;
        for (size_t i = 0; c && i < c->n_allow; i++)
                if (streq(c->allow[i], host) || (hub && is_hub(c->allow[i])))
                        return true;
        return false;
}

bool registries_conf_insecure(const registries_conf *c, const char *host) {
        for (size_t i = 0; c && i < c->n_insecure; i++)
                if (streq(c->insecure[i], host))
                        return true;
        return false;
}

const char *registries_conf_ca(const registries_conf *c, const char *host) {
        for (size_t i = 0; c && i < c->n_ca; i++)
                if (streq(c->ca[i].host, host))
                        return c->ca[i].file;
        return NULL;
}

void image_candidates_free(image_candidate *v, size_t n) {
        for (size_t i = 0; v && i < n; i++) {
                free(v[i].host);
                free(v[i].registry);
                free(v[i].repository);
        }
        free(v);
}

static int candidate_add(image_candidate **v, size_t *n, const image_reference *r,
                         const char *registry, const char *host, bool mirror) {
        image_candidate *nv = realloc(*v, (*n + 1) * sizeof **v);
        if (!nv)
                return -ENOMEM;
        *v = nv;
        image_candidate *c = &nv[*n];
        *c = (image_candidate) { .mirror = mirror };
        c->host = strdup(is_hub(host) ? DOCKER_HUB_HOST : host);
        c->registry = strdup(registry);
        int k = image_reference_repository_on(r, registry, &c->repository);
        if (!c->host || !c->registry || k < 0) {
                free(c->host);
                free(c->registry);
                return -ENOMEM;
        }
        (*n)++;
        return 0;
}

int image_reference_candidates(const image_reference *r, const registries_conf *c,
                               image_candidate **ret, size_t *ret_n, hutch_error *err) {
        static const char *const hub[] = { DOCKER_HUB };
        const char *const *regs = r->registry
                ? (const char *const *) &r->registry
                : (c && c->n_search ? (const char *const *) c->search : hub);
        size_t n_regs = r->registry ? 1 : (c && c->n_search ? c->n_search : 1);
        image_candidate *v = NULL;
        size_t n = 0;
        for (size_t i = 0; i < n_regs; i++) {
                for (size_t m = 0; c && m < c->n_mirror; m++) {
                        bool same = streq(c->mirror[m].registry, regs[i]) ||
                                (is_hub(regs[i]) && is_hub(c->mirror[m].registry));
                        if (same && candidate_add(&v, &n, r, regs[i], c->mirror[m].host, true) < 0)
                                goto oom;
                }
                if (candidate_add(&v, &n, r, regs[i], regs[i], false) < 0)
                        goto oom;
        }
        *ret = v;
        *ret_n = n;
        return 0;
oom:
        image_candidates_free(v, n);
        return hutch_error_set(err, -ENOMEM, "out of memory");
}
