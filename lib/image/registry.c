/* SPDX-License-Identifier: Apache-2.0 */
/* The OCI distribution client (lib/image/registry.h). */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "image/image.h"
#include "image/registry.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"

#define MANIFEST_ACCEPT                                                                            \
        "Accept: " IMAGE_MEDIA_OCI_INDEX ", " IMAGE_MEDIA_OCI_MANIFEST                             \
        ", " IMAGE_MEDIA_DOCKER_LIST ", " IMAGE_MEDIA_DOCKER_MANIFEST
#define CAPATH_SYSTEM "/etc/ssl/certs"
#define USER_AGENT "hutch/" HUTCH_VERSION
#define MAX_HEADER_VALUE 4096u
#define MAX_ERROR_BODY 4096u
#define MAX_RETRIES 2
#define MAX_REAUTH 4

/* ------------------------------------------------------------ challenges */

void registry_challenge_clear(registry_challenge *c) {
        if (!c)
                return;
        free(c->realm);
        free(c->service);
        free(c->scope);
        *c = (registry_challenge) { 0 };
}

static bool is_tchar(char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* RFC 7235: challenge = auth-scheme [ 1*SP ( token68 / #auth-param ) ],
 * challenges separated by commas; auth-param = token BWS "=" BWS ( token /
 * quoted-string ). */
int registry_challenge_parse(const char *v, size_t len, registry_challenge *ret) {
        if (len > REGISTRY_MAX_CHALLENGE)
                return -EINVAL;
        registry_challenge cur = { 0 };
        bool in_bearer = false, have_basic = false;
        size_t i = 0;
        int r = -EINVAL;
        for (;;) {
                while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
                        i++;
                if (i >= len)
                        break;
                size_t ts = i;
                while (i < len && is_tchar(v[i]))
                        i++;
                size_t tl = i - ts;
                if (tl == 0) {
                        /* not a token (a token68's '/', stray bytes): skip to the next comma */
                        while (i < len && v[i] != ',')
                                i++;
                        continue;
                }
                size_t j = i;
                while (j < len && (v[j] == ' ' || v[j] == '\t'))
                        j++;
                if (j >= len || v[j] != '=') {
                        /* a new scheme; a finished Bearer challenge wins */
                        if (in_bearer && cur.realm)
                                break;
                        registry_challenge_clear(&cur);
                        in_bearer = tl == 6 && strncasecmp(v + ts, "bearer", 6) == 0;
                        have_basic |= tl == 5 && strncasecmp(v + ts, "basic", 5) == 0;
                        i = j;
                        continue;
                }
                /* auth-param: name = ( token / quoted-string ) */
                i = j + 1;
                while (i < len && (v[i] == ' ' || v[i] == '\t'))
                        i++;
                char val[REGISTRY_MAX_CHALLENGE + 1];
                size_t vl = 0;
                if (i < len && v[i] == '"') {
                        i++;
                        for (;;) {
                                if (i >= len)
                                        goto out; /* unterminated */
                                char ch = v[i++];
                                if (ch == '"')
                                        break;
                                if (ch == '\\') {
                                        if (i >= len)
                                                goto out;
                                        ch = v[i++];
                                }
                                if ((unsigned char) ch < 0x20 || ch == 0x7f)
                                        goto out;
                                val[vl++] = ch;
                        }
                } else {
                        while (i < len && v[i] != ',' && v[i] != ' ' && v[i] != '\t') {
                                if ((unsigned char) v[i] < 0x20 || v[i] == 0x7f || v[i] == '"')
                                        goto out;
                                val[vl++] = v[i++];
                        }
                }
                val[vl] = '\0';
                if (!in_bearer)
                        continue;
                char **slot = NULL;
                if (tl == 5 && strncasecmp(v + ts, "realm", 5) == 0)
                        slot = &cur.realm;
                else if (tl == 7 && strncasecmp(v + ts, "service", 7) == 0)
                        slot = &cur.service;
                else if (tl == 5 && strncasecmp(v + ts, "scope", 5) == 0)
                        slot = &cur.scope;
                if (slot) {
                        free(*slot);
                        if (!(*slot = strdup(val))) {
                                r = -ENOMEM;
                                goto out;
                        }
                }
        }
        if (in_bearer && cur.realm && *cur.realm) {
                cur.scheme = REGISTRY_AUTH_BEARER;
                *ret = cur;
                return 0;
        }
        if (have_basic) {
                *ret = (registry_challenge) { .scheme = REGISTRY_AUTH_BASIC };
                r = 0;
        }
out:
        registry_challenge_clear(&cur);
        return r;
}

/* ------------------------------------------------------------ credentials */

int registry_auth_path(const char *data_dir, char *buf, size_t n) {
        if ((size_t) snprintf(buf, n, "%s/registries.auth", data_dir) >= n)
                return -ENAMETOOLONG;
        return 0;
}

static int auth_load(const char *path, json_t **ret, hutch_error *err) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
        if (fd < 0) {
                if (errno == ENOENT) {
                        *ret = NULL;
                        return 0;
                }
                return hutch_error_set(err, -errno, "opening %s: %m", path);
        }
        struct stat st;
        if (fstat(fd, &st) < 0)
                return hutch_error_set(err, -errno, "reading %s: %m", path);
        if (!S_ISREG(st.st_mode) || st.st_size > (1 << 20))
                return hutch_error_set(err, -EINVAL, "%s is not a regular file of at most 1 MiB",
                                       path);
        if (st.st_mode & 077)
                return hutch_error_set(
                        err, -EPERM,
                        "%s is readable by others (mode %03o): chmod 600 it, and change the "
                        "passwords it holds",
                        path, (unsigned) (st.st_mode & 0777));
        if (st.st_uid != geteuid())
                return hutch_error_set(err, -EPERM, "%s is not owned by this user", path);
        json_error_t je;
        json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
        if (!j || !json_is_object(j)) {
                json_decref(j);
                return hutch_error_set(err, -EINVAL, "%s: not a JSON object (line %d)", path,
                                       je.line);
        }
        *ret = j;
        return 0;
}

int registry_auth_get(const char *auth_path, const char *host, char **ret_user, char **ret_pass,
                      hutch_error *err) {
        json_t *j = NULL;
        int r = auth_load(auth_path, &j, err);
        if (r < 0 || !j)
                return r;
        const char *b64 = json_string_value(
                json_object_get(json_object_get(json_object_get(j, "auths"), host), "auth"));
        if (!b64) {
                json_decref(j);
                return 0;
        }
        size_t bl = strlen(b64);
        _cleanup_free_ unsigned char *raw = malloc(bl / 4 * 3 + 4);
        int n = raw ? EVP_DecodeBlock(raw, (const unsigned char *) b64, (int) bl) : -1;
        /* EVP_DecodeBlock counts the padding as zero bytes */
        for (size_t k = bl; n > 0 && k > 0 && b64[k - 1] == '='; k--)
                n--;
        json_decref(j);
        if (n < 0)
                return hutch_error_set(err, -EINVAL, "%s: the credentials for %s are not base64",
                                       auth_path, host);
        raw[n] = '\0';
        char *colon = memchr(raw, ':', (size_t) n);
        if (!colon || memchr(raw, '\0', (size_t) n))
                return hutch_error_set(err, -EINVAL,
                                       "%s: the credentials for %s are not user:password",
                                       auth_path, host);
        *colon = '\0';
        char *u = strdup((char *) raw), *p = strdup(colon + 1);
        explicit_bzero(raw, (size_t) n);
        if (!u || !p) {
                free(u);
                free(p);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        *ret_user = u;
        *ret_pass = p;
        return 1;
}

int registry_auth_set(const char *auth_path, const char *host, const char *user, const char *pass,
                      hutch_error *err) {
        if (!image_registry_host_valid(host))
                return hutch_error_set(err, -EINVAL, "invalid registry '%s' (HOST[:PORT])", host);
        if (pass && (strchr(user, ':') || !*user))
                return hutch_error_set(err, -EINVAL, "a user name must be non-empty and have no ':'");
        json_t *j = NULL;
        int r = auth_load(auth_path, &j, err);
        if (r < 0)
                return r;
        if (!j && !(j = json_object()))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        json_t *auths = json_object_get(j, "auths");
        if (!json_is_object(auths)) {
                auths = json_object();
                json_object_set_new(j, "auths", auths);
        }
        if (pass) {
                _cleanup_free_ char *up = NULL;
                if (asprintf(&up, "%s:%s", user, pass) < 0) {
                        json_decref(j);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                size_t ul = strlen(up);
                _cleanup_free_ char *b64 = malloc((ul + 2) / 3 * 4 + 1);
                if (!b64) {
                        json_decref(j);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                EVP_EncodeBlock((unsigned char *) b64, (const unsigned char *) up, (int) ul);
                explicit_bzero(up, ul);
                json_object_set_new(auths, host, json_pack("{s:s}", "auth", b64));
                explicit_bzero(b64, strlen(b64));
        } else
                json_object_del(auths, host);
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(j);
        if (!text)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        /* born 0600 (O_EXCL on a fresh temp), never wider for a moment */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", auth_path, getpid());
        unlink(tmp);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        size_t tl = strlen(text);
        r = fd < 0 ? -errno : fd_write_all(fd, text, tl);
        if (r >= 0 && fchmod(fd, 0600) < 0)
                r = -errno;
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        explicit_bzero(text, tl);
        free(text);
        if (fd >= 0)
                close(fd);
        if (r >= 0 && rename(tmp, auth_path) < 0)
                r = -errno;
        if (r < 0) {
                unlink(tmp);
                return hutch_error_set(err, r, "writing %s: %s", auth_path, strerror(-r));
        }
        return 0;
}

/* ------------------------------------------------------------ the client */

struct registry_client {
        char *host, *repository;
        char base[512]; /* scheme://host */
        bool insecure;
        char *ca_file;
        char *blob_dir;
        unsigned parallel;
        char *user, *pass; /* credentials for host, or NULL */
        bool given;        /* they are a build's own, not `hutch template login`'s */
        bool push;         /* a push: tokens are asked for pull,push */
        char *authz;       /* "Authorization: ..." once a challenge was answered */
        bool sent_creds;   /* the current authz came from the credentials */
        char *last_challenge;
        unsigned auth_gen; /* bumped by each authenticate(): which token a transfer was sent with */
        uint64_t done_bytes;
};

static void free_secret(char *s) {
        if (s) {
                explicit_bzero(s, strlen(s));
                free(s);
        }
}

registry_client *registry_client_free(registry_client *c) {
        if (!c)
                return NULL;
        free(c->host);
        free(c->repository);
        free(c->ca_file);
        free(c->blob_dir);
        free_secret(c->user);
        free_secret(c->pass);
        free_secret(c->authz);
        free(c->last_challenge);
        free(c);
        return NULL;
}

static void registry_client_freep(registry_client **c) {
        registry_client_free(*c);
}

int registry_client_new(const char *host, const char *repository, const registry_client_opts *o,
                        registry_client **ret, hutch_error *err) {
        static bool curl_ready;
        if (!curl_ready) {
                if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                        return hutch_error_set(err, -EIO, "libcurl initialisation failed");
                curl_ready = true;
        }
        _cleanup_(registry_client_freep) registry_client *c = calloc(1, sizeof *c);
        if (!c)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        c->host = strdup(host);
        c->repository = strdup(repository);
        c->blob_dir = strdup(o->blob_dir);
        if (!c->host || !c->repository || !c->blob_dir)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        c->insecure = registries_conf_insecure(o->conf, host);
        const char *ca = registries_conf_ca(o->conf, host);
        if (!ca)
                ca = o->ca_file;
        if (ca && !(c->ca_file = strdup(ca)))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        c->push = o->push;
        c->parallel = o->parallel ? MIN(o->parallel, REGISTRY_MAX_PARALLEL)
                                  : REGISTRY_DEFAULT_PARALLEL;
        snprintf(c->base, sizeof c->base, "%s://%s", c->insecure ? "http" : "https", host);
        if (o->user && o->pass) {
                c->user = strdup(o->user);
                c->pass = strdup(o->pass);
                c->given = true;
                if (!c->user || !c->pass)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
        } else if (o->auth_path) {
                int r = registry_auth_get(o->auth_path, host, &c->user, &c->pass, err);
                /* Docker Hub's credentials are stored under the name users write */
                if (r == 0 && streq(host, "registry-1.docker.io"))
                        r = registry_auth_get(o->auth_path, "docker.io", &c->user, &c->pass, err);
                if (r < 0)
                        return r;
        }
        *ret = TAKE_PTR(c);
        return 0;
}

typedef struct http_resp {
        long code;
        uint8_t *body;
        size_t len, max;
        bool too_big;
        char content_type[256];
        char docker_digest[80];
        char *www_auth;
        char *location; /* a push's upload URL */
} http_resp;

static void http_resp_clear(http_resp *r) {
        free(r->body);
        free(r->www_auth);
        free(r->location);
        *r = (http_resp) { 0 };
}

static size_t resp_write(char *p, size_t sz, size_t nm, void *arg) {
        http_resp *r = arg;
        size_t n = sz * nm;
        if (r->len + n > r->max) {
                r->too_big = true;
                return 0;
        }
        uint8_t *nb = realloc(r->body, r->len + n + 1);
        if (!nb)
                return 0;
        r->body = nb;
        memcpy(r->body + r->len, p, n);
        r->len += n;
        r->body[r->len] = 0;
        return n;
}

/* "Name: value\r\n" -> value when the name matches (case-insensitive). */
static bool header_value(const char *p, size_t n, const char *name, const char **ret_v,
                         size_t *ret_n) {
        size_t nl = strlen(name);
        if (n < nl + 1 || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
                return false;
        const char *v = p + nl + 1, *e = p + n;
        while (v < e && (*v == ' ' || *v == '\t'))
                v++;
        while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t'))
                e--;
        *ret_v = v;
        *ret_n = (size_t) (e - v);
        return true;
}

static void copy_value(char *dst, size_t dn, const char *v, size_t vn) {
        if (vn >= dn)
                vn = dn - 1;
        memcpy(dst, v, vn);
        dst[vn] = '\0';
}

static size_t resp_header(char *p, size_t sz, size_t nm, void *arg) {
        http_resp *r = arg;
        size_t n = sz * nm;
        const char *v;
        size_t vn;
        if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
                /* a new response (after a redirect): forget the last one's */
                r->content_type[0] = r->docker_digest[0] = '\0';
                free(r->www_auth);
                r->www_auth = NULL;
                free(r->location);
                r->location = NULL;
        } else if (header_value(p, n, "Location", &v, &vn) && !r->location && vn <= MAX_HEADER_VALUE) {
                r->location = strndup(v, vn);
        } else if (header_value(p, n, "Content-Type", &v, &vn)) {
                const char *semi = memchr(v, ';', vn);
                copy_value(r->content_type, sizeof r->content_type, v,
                           semi ? (size_t) (semi - v) : vn);
        } else if (header_value(p, n, "Docker-Content-Digest", &v, &vn)) {
                copy_value(r->docker_digest, sizeof r->docker_digest, v, vn);
        } else if (header_value(p, n, "WWW-Authenticate", &v, &vn) && !r->www_auth &&
                   vn <= MAX_HEADER_VALUE) {
                r->www_auth = strndup(v, vn);
        }
        return n;
}

static void easy_common(registry_client *c, CURL *e, const char *url, bool allow_http) {
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_USERAGENT, USER_AGENT);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, allow_http ? "http,https" : "https");
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, allow_http ? "http,https" : "https");
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
        /* Credentials (our Authorization header, CURLOPT_USERNAME) go to the
         * first host only: curl drops them when a redirect changes host,
         * port or scheme unless CURLOPT_UNRESTRICTED_AUTH, which stays 0
         * (blob storage gets a pre-signed URL, never the registry token). */
        curl_easy_setopt(e, CURLOPT_UNRESTRICTED_AUTH, 0L);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 15000L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
        if (c->ca_file) {
                /* the operator's CAs and the system's (CAPATH with OpenSSL) */
                curl_easy_setopt(e, CURLOPT_CAINFO, c->ca_file);
                curl_easy_setopt(e, CURLOPT_CAPATH, CAPATH_SYSTEM);
        }
}

static int curl_fail(registry_client *c, CURLcode res, const char *what, const char *errbuf,
                     hutch_error *err) {
        const char *detail = errbuf && *errbuf ? errbuf : curl_easy_strerror(res);
        switch (res) {
        case CURLE_COULDNT_RESOLVE_HOST:
                return hutch_error_set(err, -EHOSTUNREACH, "%s: cannot resolve %s (%s)", what,
                                       c->host, detail);
        case CURLE_COULDNT_CONNECT:
                return hutch_error_set(
                        err, -ECONNREFUSED,
                        "%s: cannot connect to %s: network unreachable or connection refused (%s)",
                        what, c->host, detail);
        case CURLE_OPERATION_TIMEDOUT:
                return hutch_error_set(err, -ETIMEDOUT, "%s: %s timed out (%s)", what, c->host,
                                       detail);
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_SSL_CONNECT_ERROR:
                return hutch_error_set(
                        err, -EPROTO,
                        "%s: TLS with %s failed (%s); a private CA goes in registries.conf "
                        "(ca %s FILE) or --ca-file, plain HTTP needs `insecure %s` there",
                        what, c->host, detail, c->host, c->host);
        case CURLE_UNSUPPORTED_PROTOCOL:
                return hutch_error_set(err, -EPROTO, "%s: %s redirected to a scheme not allowed (%s)",
                                       what, c->host, detail);
        case CURLE_TOO_MANY_REDIRECTS:
                return hutch_error_set(err, -ELOOP, "%s: too many redirects from %s", what, c->host);
        default:
                return hutch_error_set(err, -EIO, "%s: %s: %s", what, c->host, detail);
        }
}

/* One GET with the registry's current Authorization, or, for a token
 * request, the stored basic credentials (to the realm only). */
static int http_get(registry_client *c, const char *url, const char *accept, bool token_request,
                    size_t max, http_resp *resp, hutch_error *err) {
        CURL *e = curl_easy_init();
        if (!e)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        struct curl_slist *h = NULL, *nh;
        if (accept && (nh = curl_slist_append(h, accept)))
                h = nh;
        if (!token_request && c->authz && (nh = curl_slist_append(h, c->authz)))
                h = nh;
        char errbuf[CURL_ERROR_SIZE] = "";
        resp->max = max;
        bool allow_http = c->insecure;
        easy_common(c, e, url, allow_http);
        if (token_request && c->user) {
                curl_easy_setopt(e, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC);
                curl_easy_setopt(e, CURLOPT_USERNAME, c->user);
                curl_easy_setopt(e, CURLOPT_PASSWORD, c->pass);
        }
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, resp_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, resp);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, resp_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, resp);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, 300L);
        CURLcode res = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp->code);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        if (res == CURLE_WRITE_ERROR && resp->too_big)
                return hutch_error_set(err, -EFBIG, "%s answered more than %zu bytes", c->host, max);
        if (res != CURLE_OK)
                return curl_fail(c, res, token_request ? "token request" : "request", errbuf, err);
        return 0;
}

static bool token_chars_ok(const char *t) {
        if (!*t || strlen(t) > 16384)
                return false;
        for (; *t; t++)
                if ((unsigned char) *t <= 0x20 || (unsigned char) *t >= 0x7f)
                        return false;
        return true;
}

static int url_append_param(char *buf, size_t n, const char *name, const char *value) {
        char *esc = curl_easy_escape(NULL, value, 0);
        if (!esc)
                return -ENOMEM;
        size_t l = strlen(buf);
        int k = snprintf(buf + l, n - l, "%s%s=%s", strchr(buf, '?') ? "&" : "?", name, esc);
        curl_free(esc);
        return k < 0 || (size_t) k >= n - l ? -ENAMETOOLONG : 0;
}

/* Answer a 401's challenge: a token from the realm, or basic credentials. */
static int authenticate(registry_client *c, const char *www_auth, hutch_error *err) {
        registry_challenge ch = { 0 };
        if (!www_auth || registry_challenge_parse(www_auth, strlen(www_auth), &ch) < 0)
                return hutch_error_set(
                        err, -EACCES,
                        "%s answered 401 without a Bearer or Basic challenge it could be asked",
                        c->host);
        free_secret(c->authz);
        c->authz = NULL;
        c->auth_gen++;
        free(c->last_challenge);
        c->last_challenge = strdup(www_auth);
        if (ch.scheme == REGISTRY_AUTH_BASIC) {
                registry_challenge_clear(&ch);
                if (!c->user)
                        return hutch_error_set(
                                err, -EACCES,
                                "%s needs credentials (HTTP 401): `hutch template login %s`",
                                c->host, c->host);
                _cleanup_free_ char *up = NULL;
                if (asprintf(&up, "%s:%s", c->user, c->pass) < 0)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                size_t ul = strlen(up);
                _cleanup_free_ char *hdr = malloc(sizeof "Authorization: Basic " +
                                                  (ul + 2) / 3 * 4 + 1);
                if (!hdr)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                strcpy(hdr, "Authorization: Basic ");
                EVP_EncodeBlock((unsigned char *) hdr + strlen(hdr), (const unsigned char *) up,
                                (int) ul);
                explicit_bzero(up, ul);
                c->authz = TAKE_PTR(hdr);
                c->sent_creds = true;
                return 0;
        }
        /* Bearer: the realm must not downgrade TLS */
        bool realm_https = strncasecmp(ch.realm, "https://", 8) == 0;
        bool realm_http = strncasecmp(ch.realm, "http://", 7) == 0;
        if (!realm_https && !(realm_http && c->insecure)) {
                int r = hutch_error_set(err, -EPROTO, "%s named a token realm that is not %s: %.200s",
                                        c->host, c->insecure ? "http(s)" : "https", ch.realm);
                registry_challenge_clear(&ch);
                return r;
        }
        char url[4096];
        _cleanup_free_ char *scope = NULL;
        if (ch.scope)
                scope = strdup(ch.scope);
        else if (asprintf(&scope, "repository:%s:%s", c->repository,
                          c->push ? "pull,push" : "pull") < 0)
                scope = NULL;
        int r = scope ? 0 : -ENOMEM;
        if (r == 0 && (size_t) snprintf(url, sizeof url, "%s", ch.realm) >= sizeof url)
                r = -ENAMETOOLONG;
        if (r == 0 && ch.service)
                r = url_append_param(url, sizeof url, "service", ch.service);
        if (r == 0)
                r = url_append_param(url, sizeof url, "scope", scope);
        registry_challenge_clear(&ch);
        if (r < 0)
                return hutch_error_set(err, r, "token request URL: %s", strerror(-r));
        http_resp resp = { 0 };
        r = http_get(c, url, "Accept: application/json", true, REGISTRY_MAX_TOKEN_RESPONSE, &resp,
                     err);
        if (r < 0) {
                http_resp_clear(&resp);
                return r;
        }
        if (resp.code != 200) {
                long code = resp.code;
                http_resp_clear(&resp);
                if ((code == 401 || code == 403) && c->given)
                        return hutch_error_set(err, -EACCES,
                                               "the token server of %s refused the build's "
                                               "credentials (HTTP %ld)",
                                               c->host, code);
                if ((code == 401 || code == 403) && c->user)
                        return hutch_error_set(
                                err, -EACCES,
                                "the token server of %s refused the credentials `hutch template "
                                "login %s` stored (HTTP %ld)",
                                c->host, c->host, code);
                if (code == 401 || code == 403)
                        return hutch_error_set(
                                err, -EACCES,
                                "the token server of %s refused anonymous access (HTTP %ld): "
                                "`hutch template login %s` if it is private",
                                c->host, code, c->host);
                return hutch_error_set(err, -EACCES, "the token server of %s answered HTTP %ld",
                                       c->host, code);
        }
        json_error_t je;
        json_t *j = json_loadb((const char *) resp.body, resp.len, 0, &je);
        http_resp_clear(&resp);
        const char *tok = json_string_value(json_object_get(j, "token"));
        if (!tok || !*tok)
                tok = json_string_value(json_object_get(j, "access_token"));
        if (!tok || !token_chars_ok(tok)) {
                json_decref(j);
                return hutch_error_set(err, -EPROTO, "the token server of %s sent no usable token",
                                       c->host);
        }
        if (asprintf(&c->authz, "Authorization: Bearer %s", tok) < 0)
                c->authz = NULL;
        json_decref(j);
        if (!c->authz)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        c->sent_creds = c->user != NULL;
        return 0;
}

static int access_denied(registry_client *c, long code, const char *what, hutch_error *err) {
        if (c->sent_creds && c->given)
                return hutch_error_set(err, -EACCES,
                                       "%s refused %s with the build's credentials (HTTP %ld)",
                                       c->host, what, code);
        if (c->sent_creds)
                return hutch_error_set(
                        err, -EACCES,
                        "%s refused %s with the credentials `hutch template login %s` stored (HTTP %ld)",
                        c->host, what, c->host, code);
        if (c->authz)
                return hutch_error_set(
                        err, -EACCES,
                        "%s refused %s to an anonymous token (HTTP %ld): the repository does not exist "
                        "or is private (`hutch template login %s`)",
                        c->host, what, code, c->host);
        return hutch_error_set(err, -EACCES,
                               "%s refused %s (HTTP %ld): `hutch template login %s` if it is private",
                               c->host, what, code, c->host);
}

static void sha256_hex(const uint8_t *buf, size_t len, char out[72]) {
        unsigned char md[32];
        unsigned int ml = 0;
        EVP_Digest(buf, len, md, &ml, EVP_sha256(), NULL);
        strcpy(out, "sha256:");
        for (int i = 0; i < 32; i++)
                sprintf(out + 7 + 2 * i, "%02x", md[i]);
}

int registry_get_manifest(registry_client *c, const char *ref, uint8_t **ret_buf, size_t *ret_len,
                          char **ret_media_type, char ret_digest[72], hutch_error *err) {
        char url[2048];
        if ((size_t) snprintf(url, sizeof url, "%s/v2/%s/manifests/%s", c->base, c->repository,
                              ref) >= sizeof url)
                return hutch_error_set(err, -ENAMETOOLONG, "manifest URL too long");
        http_resp resp = { 0 };
        for (int attempt = 0;; attempt++) {
                http_resp_clear(&resp);
                int r = http_get(c, url, MANIFEST_ACCEPT, false, IMAGE_MAX_MANIFEST, &resp, err);
                if (r == -EFBIG)
                        r = hutch_error_set(err, -EFBIG,
                                            "the manifest %s/%s:%s is larger than %u bytes",
                                            c->host, c->repository, ref, IMAGE_MAX_MANIFEST);
                if (r < 0) {
                        http_resp_clear(&resp);
                        return r;
                }
                if (resp.code == 401 && attempt == 0) {
                        r = authenticate(c, resp.www_auth, err);
                        if (r < 0) {
                                http_resp_clear(&resp);
                                return r;
                        }
                        continue;
                }
                break;
        }
        long code = resp.code;
        if (code != 200) {
                http_resp_clear(&resp);
                if (code == 404)
                        return hutch_error_set(
                                err, -ENOENT, "manifest unknown: %s has no %s%s%s (HTTP 404)",
                                c->host, c->repository, startswith(ref, "sha256:") ? "@" : ":", ref);
                if (code == 401 || code == 403)
                        return access_denied(c, code, "the manifest", err);
                if (code == 429)
                        return hutch_error_set(err, -EBUSY,
                                               "%s rate-limits pulls (HTTP 429); try again later",
                                               c->host);
                return hutch_error_set(err, -EIO, "%s answered HTTP %ld for the manifest %s:%s",
                                       c->host, code, c->repository, ref);
        }
        char digest[72];
        sha256_hex(resp.body ? resp.body : (const uint8_t *) "", resp.len, digest);
        if (startswith(ref, "sha256:") && !streq(ref, digest)) {
                http_resp_clear(&resp);
                return hutch_error_set(err, -EBADMSG,
                                       "digest mismatch: %s sent a manifest for %s whose digest is %s",
                                       c->host, ref, digest);
        }
        if (resp.docker_digest[0] && !streq(resp.docker_digest, digest)) {
                http_resp_clear(&resp);
                return hutch_error_set(
                        err, -EBADMSG,
                        "digest mismatch: %s says its manifest is %.80s, its bytes are %s", c->host,
                        resp.docker_digest, digest);
        }
        const char *mt = resp.content_type;
        bool known = streq(mt, IMAGE_MEDIA_OCI_INDEX) || streq(mt, IMAGE_MEDIA_OCI_MANIFEST) ||
                streq(mt, IMAGE_MEDIA_DOCKER_LIST) || streq(mt, IMAGE_MEDIA_DOCKER_MANIFEST);
        char *mtd = known ? strdup(mt) : NULL;
        if (known && !mtd) {
                http_resp_clear(&resp);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        if (!resp.body && !(resp.body = calloc(1, 1))) {
                free(mtd);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        *ret_buf = TAKE_PTR(resp.body);
        *ret_len = resp.len;
        *ret_media_type = mtd;
        strcpy(ret_digest, digest);
        http_resp_clear(&resp);
        return 0;
}

/* ------------------------------------------------------------ pushes */

int registry_error_summary(const uint8_t *buf, size_t len, char *out, size_t n) {
        if (n == 0)
                return -EINVAL;
        out[0] = '\0';
        if (!buf || len == 0 || len > MAX_ERROR_BODY)
                return -ENOENT;
        json_error_t je;
        json_t *j = json_loadb((const char *) buf, len, JSON_REJECT_DUPLICATES, &je);
        json_t *e0 = json_array_get(json_object_get(j, "errors"), 0);
        const char *code = json_string_value(json_object_get(e0, "code"));
        const char *msg = json_string_value(json_object_get(e0, "message"));
        if (!code && !msg) {
                json_decref(j);
                return -ENOENT;
        }
        snprintf(out, n, "%.40s%s%.200s", code ? code : "", code && msg ? ": " : "", msg ? msg : "");
        json_decref(j);
        /* the registry's words reach a terminal and a log: printable ASCII only */
        for (char *p = out; *p; p++)
                if ((unsigned char) *p < 0x20 || (unsigned char) *p >= 0x7f)
                        *p = '?';
        return 0;
}

typedef struct send_body {
        int fd; /* -1: buf */
        const uint8_t *buf;
        uint64_t size, off;
} send_body;

static size_t body_read(char *p, size_t sz, size_t nm, void *arg) {
        send_body *b = arg;
        size_t want = sz * nm;
        uint64_t left = b->size - b->off;
        if (want > left)
                want = (size_t) left;
        if (want == 0)
                return 0;
        if (b->fd < 0) {
                memcpy(p, b->buf + b->off, want);
                b->off += want;
                return want;
        }
        ssize_t k = pread(b->fd, p, want, (off_t) b->off);
        if (k <= 0)
                return CURL_READFUNC_ABORT;
        b->off += (uint64_t) k;
        return (size_t) k;
}

/* One request of a push: HEAD, POST (no body) or PUT (body). The
 * registry's Authorization goes to its own base URL only (an upload URL
 * elsewhere, a storage service's, gets none). */
static int http_send(registry_client *c, const char *method, const char *url, const char *ctype,
                     send_body *body, http_resp *resp, hutch_error *err) {
        CURL *e = curl_easy_init();
        if (!e)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        struct curl_slist *h = NULL, *nh;
        size_t bl = strlen(c->base);
        bool own = strncmp(url, c->base, bl) == 0 && url[bl] == '/';
        if (own && c->authz && (nh = curl_slist_append(h, c->authz)))
                h = nh;
        char ct[300];
        if (ctype) {
                snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
                if ((nh = curl_slist_append(h, ct)))
                        h = nh;
        }
        if ((nh = curl_slist_append(h, "Expect:"))) /* no 100-continue round trip */
                h = nh;
        char errbuf[CURL_ERROR_SIZE] = "";
        resp->max = MAX_ERROR_BODY;
        easy_common(c, e, url, c->insecure);
        /* a redirect of an upload is not followed: its body would not be sent again */
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, streq(method, "HEAD") ? 1L : 0L);
        if (streq(method, "HEAD")) {
                curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        } else if (streq(method, "POST")) {
                curl_easy_setopt(e, CURLOPT_POST, 1L);
                curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
                curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, 0L);
        } else {
                curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
                curl_easy_setopt(e, CURLOPT_READFUNCTION, body_read);
                curl_easy_setopt(e, CURLOPT_READDATA, body);
                curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t) body->size);
        }
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, resp_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, resp);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, resp_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, resp);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        if (!body)
                curl_easy_setopt(e, CURLOPT_TIMEOUT, 300L);
        CURLcode res = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp->code);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        if (res == CURLE_WRITE_ERROR && resp->too_big)
                res = CURLE_OK; /* an error page cut short: its code says enough */
        if (res != CURLE_OK)
                return curl_fail(c, res, method, errbuf, err);
        return 0;
}

/* http_send, answering the registry's challenges (a push's token has
 * push scope: a token for pull alone is asked again). */
static int push_request(registry_client *c, const char *method, const char *url, const char *ctype,
                        send_body *body, http_resp *resp, hutch_error *err) {
        for (unsigned attempt = 0;; attempt++) {
                http_resp_clear(resp);
                if (body)
                        body->off = 0;
                int r = http_send(c, method, url, ctype, body, resp, err);
                if (r < 0)
                        return r;
                if (resp->code == 401 && attempt < 2) {
                        if ((r = authenticate(c, resp->www_auth, err)) < 0)
                                return r;
                        continue;
                }
                return 0;
        }
}

static int push_refused(registry_client *c, http_resp *resp, const char *what, hutch_error *err) {
        long code = resp->code;
        char why[260] = "";
        (void) registry_error_summary(resp->body, resp->len, why, sizeof why);
        if (code == 401 || code == 403)
                return access_denied(c, code, what, err);
        if (code == 404)
                return hutch_error_set(err, -ENOENT, "%s has no repository %s for %s (HTTP 404)%s%s",
                                       c->host, c->repository, what, why[0] ? ": " : "", why);
        if (code == 429)
                return hutch_error_set(err, -EBUSY, "%s rate-limits %s (HTTP 429); try again later",
                                       c->host, what);
        return hutch_error_set(err, -EIO, "%s answered HTTP %ld for %s%s%s", c->host, code, what,
                               why[0] ? ": " : "", why);
}

int registry_blob_exists(registry_client *c, const char *digest, hutch_error *err) {
        char url[2048];
        if ((size_t) snprintf(url, sizeof url, "%s/v2/%s/blobs/%s", c->base, c->repository,
                              digest) >= sizeof url)
                return hutch_error_set(err, -ENAMETOOLONG, "blob URL too long");
        http_resp resp = { 0 };
        int r = push_request(c, "HEAD", url, NULL, NULL, &resp, err);
        if (r >= 0) {
                if (resp.code == 200)
                        r = 1;
                else if (resp.code == 404)
                        r = 0;
                else
                        r = push_refused(c, &resp, "a blob's check", err);
        }
        http_resp_clear(&resp);
        return r;
}

int registry_blob_upload(registry_client *c, int fd, const uint8_t *buf, uint64_t size,
                         const char *digest, hutch_error *err) {
        char url[4096];
        if ((size_t) snprintf(url, sizeof url, "%s/v2/%s/blobs/uploads/", c->base, c->repository) >=
            sizeof url)
                return hutch_error_set(err, -ENAMETOOLONG, "upload URL too long");
        http_resp resp = { 0 };
        int r = push_request(c, "POST", url, NULL, NULL, &resp, err);
        if (r >= 0 && resp.code != 202)
                r = push_refused(c, &resp, "a blob upload", err);
        if (r >= 0 && !resp.location)
                r = hutch_error_set(err, -EPROTO, "%s answered an upload without a Location",
                                    c->host);
        if (r >= 0) {
                const char *loc = resp.location;
                int k;
                if (loc[0] == '/' && loc[1] != '/')
                        k = snprintf(url, sizeof url, "%s%s", c->base, loc);
                else if (startswith(loc, "https://") || (c->insecure && startswith(loc, "http://")))
                        k = snprintf(url, sizeof url, "%s", loc);
                else
                        k = -1;
                if (k < 0)
                        r = hutch_error_set(err, -EPROTO,
                                            "%s named an upload location that is "
                                            "neither a path nor an %s URL",
                                            c->host, c->insecure ? "http(s)" : "https");
                else if ((size_t) k >= sizeof url)
                        r = hutch_error_set(err, -ENAMETOOLONG, "upload URL too long");
                for (const char *p = url; r >= 0 && *p; p++)
                        if ((unsigned char) *p <= 0x20 || (unsigned char) *p >= 0x7f)
                                r = hutch_error_set(err, -EPROTO,
                                                    "%s named an upload location with a byte "
                                                    "outside printable ASCII",
                                                    c->host);
        }
        if (r >= 0 && (r = url_append_param(url, sizeof url, "digest", digest)) < 0)
                r = hutch_error_set(err, r, "upload URL: %s", strerror(-r));
        http_resp_clear(&resp);
        if (r < 0)
                return r;
        send_body b = { .fd = fd, .buf = buf, .size = size };
        r = push_request(c, "PUT", url, "application/octet-stream", &b, &resp, err);
        if (r >= 0 && resp.code != 201)
                r = push_refused(c, &resp, "a blob upload", err);
        http_resp_clear(&resp);
        if (r >= 0)
                c->done_bytes += size;
        return r < 0 ? r : 0;
}

int registry_blob_mount(registry_client *c, const char *digest, const char *from, hutch_error *err) {
        char url[4096];
        if ((size_t) snprintf(url, sizeof url, "%s/v2/%s/blobs/uploads/", c->base, c->repository) >=
            sizeof url)
                return hutch_error_set(err, -ENAMETOOLONG, "upload URL too long");
        int r = url_append_param(url, sizeof url, "mount", digest);
        if (r == 0)
                r = url_append_param(url, sizeof url, "from", from);
        if (r < 0)
                return hutch_error_set(err, r, "mount URL: %s", strerror(-r));
        http_resp resp = { 0 };
        r = push_request(c, "POST", url, NULL, NULL, &resp, err);
        if (r >= 0) {
                if (resp.code == 201)
                        r = 1;
                else if (resp.code == 202)
                        r = 0; /* an upload session instead: left to expire */
                else
                        r = push_refused(c, &resp, "a blob mount", err);
        }
        http_resp_clear(&resp);
        return r;
}

int registry_put_manifest(registry_client *c, const char *tag, const uint8_t *buf, size_t len,
                          const char *media_type, char ret_digest[72], hutch_error *err) {
        char url[2048];
        if ((size_t) snprintf(url, sizeof url, "%s/v2/%s/manifests/%s", c->base, c->repository,
                              tag) >= sizeof url)
                return hutch_error_set(err, -ENAMETOOLONG, "manifest URL too long");
        char digest[72];
        sha256_hex(buf, len, digest);
        http_resp resp = { 0 };
        send_body b = { .fd = -1, .buf = buf, .size = len };
        int r = push_request(c, "PUT", url, media_type, &b, &resp, err);
        if (r >= 0 && resp.code != 201 && resp.code != 200)
                r = push_refused(c, &resp, "the manifest", err);
        if (r >= 0 && resp.docker_digest[0] && !streq(resp.docker_digest, digest))
                r = hutch_error_set(err, -EBADMSG,
                                    "digest mismatch: %s says the manifest it stored is %.80s, "
                                    "the one sent is %s",
                                    c->host, resp.docker_digest, digest);
        http_resp_clear(&resp);
        if (r < 0)
                return r;
        strcpy(ret_digest, digest);
        return 0;
}

/* ------------------------------------------------------------ the blob cache */

static bool digest_hex(const char *digest, char hex[65]) {
        if (!startswith(digest, "sha256:") || strlen(digest) != 71)
                return false;
        for (int i = 0; i < 64; i++) {
                char ch = digest[7 + i];
                if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
                        return false;
        }
        memcpy(hex, digest + 7, 65);
        return true;
}

int registry_cache_path(const char *blob_dir, const char *digest, char *buf, size_t n) {
        char hex[65];
        if (!digest_hex(digest, hex))
                return -EINVAL;
        if ((size_t) snprintf(buf, n, "%s/%s", blob_dir, hex) >= n)
                return -ENAMETOOLONG;
        if (access(buf, F_OK) < 0)
                buf[0] = '\0';
        return 0;
}

int registry_cache_gc(const char *blob_dir, hutch_error *err) {
        int dfd = open(blob_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return errno == ENOENT ? 0 : hutch_error_set(err, -errno, "opening %s: %m", blob_dir);
        DIR *d = fdopendir(dfd);
        if (!d) {
                close(dfd);
                return hutch_error_set(err, -errno, "reading %s: %m", blob_dir);
        }
        int n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l < 8 || !streq(de->d_name + l - 8, ".partial"))
                        continue;
                int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
                if (fd < 0)
                        continue;
                if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dirfd(d), de->d_name, 0) == 0)
                        n++;
                close(fd);
        }
        closedir(d);
        return n;
}

typedef struct xfer {
        registry_client *c;
        const registry_blob *b;
        char hex[65];
        char partial[4096], final[4096];
        int fd;
        EVP_MD_CTX *md;
        uint64_t off;
        bool status_checked, discard, too_big, resume;
        unsigned retries;
        long code;
        CURL *e;
        struct curl_slist *h;
        char errbuf[CURL_ERROR_SIZE];
        unsigned auth_gen; /* the client's auth_gen when this transfer started */
        http_resp hdrs;    /* WWW-Authenticate of a 401 */
        size_t discarded;
} xfer;

static void xfer_reset_handle(xfer *x) {
        if (x->e)
                curl_easy_cleanup(x->e);
        x->e = NULL;
        curl_slist_free_all(x->h);
        x->h = NULL;
        http_resp_clear(&x->hdrs);
}

static void xfer_clear(xfer *x) {
        xfer_reset_handle(x);
        if (x->md)
                EVP_MD_CTX_free(x->md);
        x->md = NULL;
        x->fd = safe_close(x->fd);
}

static size_t xfer_write(char *p, size_t sz, size_t nm, void *arg) {
        xfer *x = arg;
        size_t n = sz * nm;
        if (!x->status_checked) {
                x->status_checked = true;
                curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &x->code);
                x->discard = !(x->code == 200 || x->code == 206);
                if (x->code == 200 && x->off > 0) {
                        /* the server ignored the Range: start again */
                        x->c->done_bytes -= x->off;
                        x->off = 0;
                        if (ftruncate(x->fd, 0) < 0 || lseek(x->fd, 0, SEEK_SET) < 0 ||
                            !EVP_DigestInit_ex(x->md, EVP_sha256(), NULL))
                                return 0;
                }
        }
        if (x->discard) {
                x->discarded += n;
                return x->discarded > MAX_ERROR_BODY ? 0 : n;
        }
        if (x->off + n > (uint64_t) x->b->size) {
                x->too_big = true; /* stop at once: never more than the descriptor said */
                return 0;
        }
        if (fd_write_all(x->fd, p, n) < 0)
                return 0;
        EVP_DigestUpdate(x->md, p, n);
        x->off += n;
        x->c->done_bytes += n;
        return n;
}

static size_t xfer_header(char *p, size_t sz, size_t nm, void *arg) {
        xfer *x = arg;
        return resp_header(p, sz, nm, &x->hdrs);
}

/* Hash what a .partial already holds, for a resumed download. */
static int xfer_rehash(xfer *x) {
        if (!EVP_DigestInit_ex(x->md, EVP_sha256(), NULL))
                return -ENOMEM;
        struct stat st;
        if (fstat(x->fd, &st) < 0)
                return -errno;
        uint64_t have = (uint64_t) st.st_size;
        if (have >= (uint64_t) x->b->size) {
                /* a complete one was never renamed (crash): check it anew */
                have = 0;
        }
        if (lseek(x->fd, 0, SEEK_SET) < 0)
                return -errno;
        uint8_t buf[65536];
        uint64_t done = 0;
        while (done < have) {
                ssize_t k = read(x->fd, buf, MIN(sizeof buf, have - done));
                if (k <= 0) {
                        have = done;
                        break;
                }
                EVP_DigestUpdate(x->md, buf, (size_t) k);
                done += (uint64_t) k;
        }
        if (ftruncate(x->fd, (off_t) have) < 0 || lseek(x->fd, (off_t) have, SEEK_SET) < 0)
                return -errno;
        if (have == 0 && !EVP_DigestInit_ex(x->md, EVP_sha256(), NULL))
                return -ENOMEM;
        x->off = have;
        return 0;
}

static int xfer_start(xfer *x, CURLM *m, hutch_error *err) {
        registry_client *c = x->c;
        xfer_reset_handle(x);
        x->status_checked = x->discard = x->too_big = false;
        x->discarded = 0;
        x->code = 0;
        x->errbuf[0] = '\0';
        uint64_t before = x->off;
        int r = xfer_rehash(x);
        if (r < 0)
                return hutch_error_set(err, r, "reading %s: %s", x->partial, strerror(-r));
        c->done_bytes += x->off;
        c->done_bytes -= before;
        char url[2048];
        snprintf(url, sizeof url, "%s/v2/%s/blobs/%s", c->base, c->repository, x->b->digest);
        if (!(x->e = curl_easy_init()))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        x->auth_gen = c->auth_gen;
        if (c->authz && !(x->h = curl_slist_append(NULL, c->authz)))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        easy_common(c, x->e, url, c->insecure);
        curl_easy_setopt(x->e, CURLOPT_HTTPHEADER, x->h);
        curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, xfer_write);
        curl_easy_setopt(x->e, CURLOPT_WRITEDATA, x);
        curl_easy_setopt(x->e, CURLOPT_HEADERFUNCTION, xfer_header);
        curl_easy_setopt(x->e, CURLOPT_HEADERDATA, x);
        curl_easy_setopt(x->e, CURLOPT_ERRORBUFFER, x->errbuf);
        curl_easy_setopt(x->e, CURLOPT_PRIVATE, x);
        /* 16 KiB by default: 16 times the recv and write calls for a blob */
        curl_easy_setopt(x->e, CURLOPT_BUFFERSIZE, 256L << 10);
        if (x->off > 0 && x->resume)
                curl_easy_setopt(x->e, CURLOPT_RESUME_FROM_LARGE, (curl_off_t) x->off);
        else if (x->off > 0) {
                c->done_bytes -= x->off;
                x->off = 0;
                if (ftruncate(x->fd, 0) < 0 || lseek(x->fd, 0, SEEK_SET) < 0)
                        return hutch_error_set(err, -errno, "truncating %s: %m", x->partial);
                EVP_DigestInit_ex(x->md, EVP_sha256(), NULL);
        }
        if (curl_multi_add_handle(m, x->e) != CURLM_OK)
                return hutch_error_set(err, -ENOMEM, "curl: adding a transfer failed");
        return 0;
}

/* Open and lock x's .partial: 1 locked, 0 busy (another pull holds it). */
static int xfer_open(xfer *x, bool wait, hutch_error *err) {
        for (;;) {
                x->fd = safe_close(x->fd);
                x->fd = open(x->partial, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (x->fd < 0)
                        return hutch_error_set(err, -errno, "creating %s: %m", x->partial);
                if (flock(x->fd, LOCK_EX | (wait ? 0 : LOCK_NB)) < 0) {
                        if (errno == EWOULDBLOCK)
                                return 0;
                        return hutch_error_set(err, -errno, "locking %s: %m", x->partial);
                }
                /* still the file at that name (not one renamed into place meanwhile)? */
                struct stat a, b;
                if (fstat(x->fd, &a) == 0 && stat(x->partial, &b) == 0 && a.st_ino == b.st_ino &&
                    a.st_dev == b.st_dev)
                        return 1;
        }
}

static bool cache_has(const char *final, int64_t size) {
        struct stat st;
        return stat(final, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == size;
}

/* Finish a transfer whose curl result is res: 1 done, 0 to be started again
 * (the caller re-adds it), < 0 failed. */
static int xfer_finish(xfer *x, CURLcode res, unsigned *reauths, hutch_error *err) {
        registry_client *c = x->c;
        if (!x->status_checked)
                curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &x->code);
        if (x->too_big) {
                ftruncate(x->fd, 0);
                return hutch_error_set(
                        err, -EFBIG,
                        "%s sent more than the %lld bytes the manifest gives blob %s: stopped",
                        c->host, (long long) x->b->size, x->b->digest);
        }
        if (res == CURLE_RANGE_ERROR || x->code == 416) {
                x->resume = false;
                if (x->retries++ < MAX_RETRIES)
                        return 0;
        }
        if (res != CURLE_OK && !(res == CURLE_WRITE_ERROR && x->discard)) {
                bool transient = res == CURLE_PARTIAL_FILE || res == CURLE_RECV_ERROR ||
                        res == CURLE_SEND_ERROR || res == CURLE_GOT_NOTHING ||
                        res == CURLE_OPERATION_TIMEDOUT;
                if (transient && x->retries++ < MAX_RETRIES) {
                        x->resume = true;
                        return 0;
                }
                return curl_fail(c, res, x->b->digest, x->errbuf, err);
        }
        if (x->code == 401 && x->auth_gen != c->auth_gen) {
                /* sent with a token another transfer has replaced since: again */
                return 0;
        }
        if (x->code == 401 && *reauths < MAX_REAUTH && x->hdrs.www_auth) {
                /* the token expired (Docker Hub's last 5 minutes): answer the
                 * challenge again, then this transfer again; the others in
                 * flight with the old token come back through the case above */
                int r = authenticate(c, x->hdrs.www_auth, err);
                if (r < 0)
                        return r;
                (*reauths)++;
                return 0;
        }
        if (x->code == 401 || x->code == 403)
                return access_denied(c, x->code, x->b->digest, err);
        if (x->code == 404)
                return hutch_error_set(err, -ENOENT, "blob unknown: %s has no %s in %s (HTTP 404)",
                                       c->host, x->b->digest, c->repository);
        if (x->code != 200 && x->code != 206)
                return hutch_error_set(err, -EIO, "%s answered HTTP %ld for blob %s", c->host,
                                       x->code, x->b->digest);
        if (x->off != (uint64_t) x->b->size) {
                ftruncate(x->fd, 0);
                return hutch_error_set(
                        err, -EBADMSG, "%s sent %llu bytes of blob %s, its descriptor says %lld",
                        c->host, (unsigned long long) x->off, x->b->digest, (long long) x->b->size);
        }
        unsigned char md[32];
        unsigned int ml = 0;
        EVP_DigestFinal_ex(x->md, md, &ml);
        char got[72] = "sha256:";
        for (int i = 0; i < 32; i++)
                sprintf(got + 7 + 2 * i, "%02x", md[i]);
        if (!streq(got, x->b->digest)) {
                ftruncate(x->fd, 0);
                unlink(x->partial);
                return hutch_error_set(err, -EBADMSG, "digest mismatch: %s sent %s for blob %s",
                                       c->host, got, x->b->digest);
        }
        /* No fsync: the cache is a staging area whose readers check what they
         * read (pull.c: the config against its digest, a layer's uncompressed
         * stream against the config's diff_id); a blob a crash damaged fails
         * there, and the pull that meets it removes it. Syncing 100 MiB of
         * layers cost more than the rest of the download (bench/pull.sh). */
        if (rename(x->partial, x->final) < 0)
                return hutch_error_set(err, -errno, "storing %s: %m", x->final);
        x->fd = safe_close(x->fd);
        return 1;
}

int registry_fetch_blobs(registry_client *c, const registry_blob *blobs, size_t n,
                         registry_progress_fn fn, void *arg, uint64_t *ret_bytes,
                         unsigned *ret_blobs, hutch_error *err) {
        int r = mkdir_p(c->blob_dir, 0700);
        if (r < 0)
                return hutch_error_set(err, r, "creating %s: %s", c->blob_dir, strerror(-r));
        _cleanup_free_ xfer *xs = calloc(n ? n : 1, sizeof *xs);
        if (!xs)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        uint64_t total = 0;
        unsigned n_want = 0, n_done = 0;
        size_t n_x = 0;
        for (size_t i = 0; i < n; i++) {
                xfer *x = &xs[n_x];
                *x = (xfer) { .c = c, .b = &blobs[i], .fd = -1, .resume = true };
                if (!digest_hex(blobs[i].digest, x->hex) || blobs[i].size < 0)
                        return hutch_error_set(err, -EINVAL, "invalid blob descriptor %.80s",
                                               blobs[i].digest);
                snprintf(x->final, sizeof x->final, "%s/%s", c->blob_dir, x->hex);
                snprintf(x->partial, sizeof x->partial, "%s/%s.partial", c->blob_dir, x->hex);
                bool dup = false;
                for (size_t k = 0; k < n_x; k++)
                        dup |= streq(xs[k].hex, x->hex);
                if (dup || cache_has(x->final, blobs[i].size))
                        continue;
                total += (uint64_t) blobs[i].size;
                n_want++;
                n_x++;
        }
        c->done_bytes = 0;
        uint64_t start_done = 0;
        CURLM *m = curl_multi_init();
        if (!m)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        r = 0;
        /* Pass 0 takes the free .partial files; pass 1 waits for those
         * another pull was downloading, and takes what it left. */
        for (int pass = 0; pass < 2 && r >= 0; pass++) {
                size_t next = 0;
                unsigned active = 0;
                unsigned reauths = 0;
                for (;;) {
                        while (r >= 0 && active < c->parallel && next < n_x) {
                                xfer *x = &xs[next++];
                                if (x->e || x->retries == 0xffff)
                                        continue;
                                int k = xfer_open(x, pass == 1, err);
                                if (k < 0) {
                                        r = k;
                                        break;
                                }
                                if (k == 0) {
                                        x->fd = safe_close(x->fd);
                                        continue; /* busy: pass 1 */
                                }
                                if (cache_has(x->final, x->b->size)) {
                                        unlink(x->partial);
                                        x->retries = 0xffff;
                                        n_done++;
                                        continue;
                                }
                                if (!(x->md = x->md ? x->md : EVP_MD_CTX_new())) {
                                        r = hutch_error_set(err, -ENOMEM, "out of memory");
                                        break;
                                }
                                if ((r = xfer_start(x, m, err)) < 0)
                                        break;
                                active++;
                        }
                        if (r < 0 || active == 0)
                                break;
                        int running = 0;
                        if (curl_multi_perform(m, &running) != CURLM_OK) {
                                r = hutch_error_set(err, -EIO, "curl: multi transfer failed");
                                break;
                        }
                        CURLMsg *msg;
                        int left;
                        while (r >= 0 && (msg = curl_multi_info_read(m, &left))) {
                                if (msg->msg != CURLMSG_DONE)
                                        continue;
                                xfer *x = NULL;
                                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &x);
                                CURLcode res = msg->data.result;
                                curl_multi_remove_handle(m, x->e);
                                int k = xfer_finish(x, res, &reauths, err);
                                if (k < 0) {
                                        r = k;
                                        break;
                                }
                                if (k == 0) {
                                        if ((r = xfer_start(x, m, err)) < 0)
                                                break;
                                        continue;
                                }
                                xfer_reset_handle(x);
                                x->retries = 0xffff;
                                active--;
                                n_done++;
                                if (fn)
                                        fn(arg, start_done + c->done_bytes, total, n_done, n_want);
                        }
                        if (r < 0)
                                break;
                        if (fn)
                                fn(arg, start_done + c->done_bytes, total, n_done, n_want);
                        if (running > 0 && curl_multi_poll(m, NULL, 0, 200, NULL) != CURLM_OK) {
                                r = hutch_error_set(err, -EIO, "curl: poll failed");
                                break;
                        }
                }
        }
        for (size_t i = 0; i < n_x; i++) {
                if (xs[i].e)
                        curl_multi_remove_handle(m, xs[i].e);
                xfer_clear(&xs[i]);
        }
        curl_multi_cleanup(m);
        if (r < 0)
                return r;
        if (n_done < n_want)
                return hutch_error_set(err, -EIO, "%u of %u blobs were not downloaded",
                                       n_want - n_done, n_want);
        int dfd = open(c->blob_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
                fsync(dfd);
                close(dfd);
        }
        if (ret_bytes)
                *ret_bytes = c->done_bytes;
        if (ret_blobs)
                *ret_blobs = n_want;
        return 0;
}

/* ------------------------------------------------------------- Amazon ECR */

static bool ecr_region_valid(const char *region) {
        size_t n = strlen(region);
        if (n == 0 || n > 32)
                return false;
        for (const char *p = region; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
                        return false;
        return true;
}

bool registry_ecr_host_valid(const char *host, const char *region) {
        size_t i = 0;
        while (host[i] >= '0' && host[i] <= '9')
                i++;
        if (i != 12 || !ecr_region_valid(region))
                return false;
        char want[128];
        if ((size_t) snprintf(want, sizeof want, ".dkr.ecr.%s.amazonaws.com", region) >= sizeof want)
                return false;
        return streq(host + 12, want);
}

int registry_ecr_login(const char *region, const char *key_id, const char *secret,
                       const char *ca_file, char **ret_user, char **ret_pass, hutch_error *err) {
        if (!ecr_region_valid(region))
                return hutch_error_set(err, -EINVAL, "invalid AWS region");
        char url[128], sigv4[96], host[96];
        snprintf(host, sizeof host, "api.ecr.%s.amazonaws.com", region);
        snprintf(url, sizeof url, "https://%s/", host);
        snprintf(sigv4, sizeof sigv4, "aws:amz:%s:ecr", region);
        /* easy_common() and curl_fail() want a client: one for this host */
        registry_client c = { .host = host, .ca_file = (char *) ca_file };
        CURL *e = curl_easy_init();
        if (!e)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/x-amz-json-1.1");
        if (h)
                h = curl_slist_append(
                        h,
                        "X-Amz-Target: AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken");
        http_resp resp = { .max = REGISTRY_MAX_TOKEN_RESPONSE };
        char errbuf[CURL_ERROR_SIZE] = "";
        easy_common(&c, e, url, false);
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "{}");
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, key_id);
        curl_easy_setopt(e, CURLOPT_PASSWORD, secret);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, resp_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &resp);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        CURLcode res = curl_easy_perform(e);
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp.code);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        int r = 0;
        if (res != CURLE_OK)
                r = curl_fail(&c, res, "ECR GetAuthorizationToken", errbuf, err);
        else if (resp.code == 400 || resp.code == 401 || resp.code == 403)
                r = hutch_error_set(err, -EACCES, "%s refused the build's AWS credentials (HTTP %ld)",
                                    host, resp.code);
        else if (resp.code != 200)
                r = hutch_error_set(err, -EACCES, "%s answered HTTP %ld", host, resp.code);
        if (r < 0) {
                if (resp.body)
                        explicit_bzero(resp.body, resp.len);
                http_resp_clear(&resp);
                return r;
        }
        json_t *j = json_loadb((const char *) resp.body, resp.len, 0, NULL);
        explicit_bzero(resp.body, resp.len);
        http_resp_clear(&resp);
        json_t *tv = json_object_get(json_array_get(json_object_get(j, "authorizationData"), 0),
                                     "authorizationToken");
        const char *tok = json_string_value(tv);
        size_t tl = json_string_length(tv);
        _cleanup_free_ char *raw = tok && tl > 0 && tl % 4 == 0 ? malloc(tl / 4 * 3 + 1) : NULL;
        int n = raw ? EVP_DecodeBlock((unsigned char *) raw, (const unsigned char *) tok, (int) tl)
                    : -1;
        if (tok)
                explicit_bzero((char *) tok, tl);
        json_decref(j);
        if (n > 0) {
                while (n > 0 && raw[n - 1] == 0) /* the padding EVP_DecodeBlock keeps */
                        n--;
                raw[n] = 0;
        }
        char *colon = n > 0 ? strchr(raw, ':') : NULL;
        if (!colon || colon == raw || !colon[1]) {
                if (raw)
                        explicit_bzero(raw, tl / 4 * 3 + 1);
                return hutch_error_set(err, -EPROTO, "%s sent no usable authorization token", host);
        }
        *colon = 0;
        char *u = strdup(raw), *p = strdup(colon + 1);
        explicit_bzero(raw, tl / 4 * 3 + 1);
        if (!u || !p) {
                free(u);
                free_secret(p);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        *ret_user = u;
        *ret_pass = p;
        return 0;
}
