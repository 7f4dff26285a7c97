/* SPDX-License-Identifier: Apache-2.0 */
/* Image references (Docker's rules), registries.conf, the candidates a
 * short name resolves to, WWW-Authenticate challenges, and the
 * credentials file's mode. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/image.h"
#include "image/reference.h"
#include "image/registry.h"
#include "tap.h"

static bool eq(const char *a, const char *b) {
        return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void ref_is(const char *s, const char *reg, const char *repo, const char *tag,
                   const char *digest, const char *hub_repo) {
        image_reference r = { 0 };
        hutch_error err = { 0 };
        int k = image_reference_parse(s, &r, &err);
        char *on = NULL;
        if (k == 0)
                image_reference_repository_on(&r, r.registry ? r.registry : "docker.io", &on);
        ok(k == 0 && eq(r.registry, reg) && eq(r.repository, repo) && eq(r.tag, tag) &&
                   eq(r.digest, digest) && eq(on, hub_repo),
           "'%s' -> %s / %s : %s @ %s (on its registry %s; got %d %s / %s : %s, %s) %s", s, reg,
           repo, tag, digest, hub_repo, k, r.registry, r.repository, r.tag, on, err.msg);
        free(on);
        image_reference_clear(&r);
}

static void ref_bad(const char *s, const char *msg_part) {
        image_reference r = { 0 };
        hutch_error err = { 0 };
        int k = image_reference_parse(s, &r, &err);
        ok(k == -EINVAL && r.repository == NULL && strstr(err.msg, msg_part),
           "'%.60s' refused (%d: %s; want '%s')", s, k, err.msg, msg_part);
}

static void name_is(const char *s, const char *want) {
        image_reference r = { 0 };
        char *n = NULL;
        image_reference_parse(s, &r, NULL);
        image_reference_template_name(&r, &n);
        ok(eq(n, want), "template name of '%s' is %s (got %s)", s, want, n);
        free(n);
        image_reference_clear(&r);
}

static const char D[] = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

int main(void) {
        char buf[512];
        ref_is("python:3.12", NULL, "python", "3.12", NULL, "library/python");
        ref_is("python", NULL, "python", "latest", NULL, "library/python");
        ref_is("user/img", NULL, "user/img", "latest", NULL, "user/img");
        ref_is("docker.io/library/debian:stable", "docker.io", "library/debian", "stable", NULL,
               "library/debian");
        ref_is("docker.io/debian", "docker.io", "debian", "latest", NULL, "library/debian");
        ref_is("index.docker.io/debian", "docker.io", "debian", "latest", NULL, "library/debian");
        ref_is("localhost/img:t", "localhost", "img", "t", NULL, "img");
        ref_is("localhost:5000/a/b/c:v1.0-rc_1", "localhost:5000", "a/b/c", "v1.0-rc_1", NULL,
               "a/b/c");
        ref_is("reg.example.com:8443/ns/img:tag", "reg.example.com:8443", "ns/img", "tag", NULL,
               "ns/img");
        ref_is("127.0.0.1:5000/x", "127.0.0.1:5000", "x", "latest", NULL, "x");
        ref_is("[::1]:5000/x:y", "[::1]:5000", "x", "y", NULL, "x");
        snprintf(buf, sizeof buf, "busybox@%s", D);
        ref_is(buf, NULL, "busybox", NULL, D, "library/busybox");
        snprintf(buf, sizeof buf, "r.io/a:t@%s", D);
        ref_is(buf, "r.io", "a", "t", D, "a");
        ref_is("a__b/c.d-e--f", NULL, "a__b/c.d-e--f", "latest", NULL, "a__b/c.d-e--f");
        /* an upper-case first component is a registry (Docker's rule) */
        ref_is("Registry/img", "Registry", "img", "latest", NULL, "img");

        ref_bad("", "empty");
        ref_bad("Python:3", "lower case");
        ref_bad("user/Img", "lower case");
        ref_bad("a//b", "invalid repository");
        ref_bad("a/", "invalid repository");
        ref_bad("-a", "invalid repository");
        ref_bad("a___b", "invalid repository");
        ref_bad("img:", "invalid tag");
        ref_bad("img:.x", "invalid tag");
        ref_bad("img:-x", "invalid tag");
        ref_bad("img@sha256:abc", "invalid digest");
        ref_bad("img@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                "invalid digest");
        ref_bad("img@md5:0123", "invalid digest");
        ref_bad("a b", "space");
        ref_bad("host:99999/x", "invalid registry");
        ref_bad("bad_host.com/x", "invalid registry");
        ref_bad(":5000/x", "invalid");
        ref_bad("user:pass@host/x", "invalid");
        memset(buf, 'a', 129);
        snprintf(buf + 129, sizeof buf - 129, "%s", "");
        char tagged[300];
        snprintf(tagged, sizeof tagged, "img:%s", buf);
        ref_bad(tagged, "invalid tag");
        memset(buf, 'a', 256);
        buf[256] = '\0';
        ref_bad(buf, "longer than");

        memset(buf, 'a', 240);
        buf[240] = '\0';
        ref_bad(buf, "with its registry"); /* docker.io/library/ + 240 > 255 */
        snprintf(tagged, sizeof tagged, "ns/%s", buf);
        ref_is(tagged, NULL, tagged, "latest", NULL, tagged); /* docker.io/ns/ + 240 fits */

        name_is("python:3.12", "python-3.12");
        name_is("localhost:5000/ns/my_img:V1", "my_img-v1"); /* the tag may have upper case */
        snprintf(buf, sizeof buf, "busybox@%s", D);
        name_is(buf, "busybox-0123456789ab");

        /* registries.conf */
        const char *text = "# site registries\n"
                           "search reg.example:5000 docker.io\n"
                           "mirror docker.io mirror.example:5000   # Docker Hub through the site mirror\n"
                           "mirror docker.io mirror2.example\n"
                           "insecure mirror.example:5000 reg.example:5000\n"
                           "ca mirror2.example /etc/hutch/ca.pem\r\n"
                           "allow ghcr.io\n";
        registries_conf c = { 0 };
        hutch_error err = { 0 };
        int k = registries_conf_parse(text, strlen(text), &c, &err);
        ok(k == 0 && c.n_search == 2 && c.n_mirror == 2 && c.n_insecure == 2 && c.n_ca == 1 &&
                   c.n_allow == 1 && registries_conf_names(&c, "ghcr.io"),
           "conf parses (%d %s)", k, err.msg);
        ok(registries_conf_insecure(&c, "reg.example:5000") &&
                   !registries_conf_insecure(&c, "mirror2.example"),
           "insecure entries");
        ok(eq(registries_conf_ca(&c, "mirror2.example"), "/etc/hutch/ca.pem"), "ca entry");
        ok(registries_conf_names(&c, "reg.example:5000") &&
                   registries_conf_names(&c, "mirror2.example") &&
                   registries_conf_names(&c, "registry-1.docker.io") &&
                   !registries_conf_names(&c, "evil.example") &&
                   !registries_conf_names(&c, "169.254.169.254"),
           "the hosts a restricted pull may reach: search entries, mirrors, Docker Hub's spellings");

        image_reference r = { 0 };
        image_reference_parse("python:3.12", &r, NULL);
        image_candidate *v = NULL;
        size_t n = 0;
        k = image_reference_candidates(&r, &c, &v, &n, &err);
        ok(k == 0 && n == 4, "short name: 4 candidates (got %zu)", n);
        if (n == 4) {
                ok(eq(v[0].host, "reg.example:5000") && eq(v[0].repository, "python") && !v[0].mirror,
                   "1st: the search registry, name as written (%s %s)", v[0].host, v[0].repository);
                ok(eq(v[1].host, "mirror.example:5000") && eq(v[1].repository, "library/python") &&
                           v[1].mirror && eq(v[1].registry, "docker.io"),
                   "2nd: Docker Hub's first mirror, library/ (%s %s)", v[1].host, v[1].repository);
                ok(eq(v[2].host, "mirror2.example"), "3rd: the second mirror");
                ok(eq(v[3].host, "registry-1.docker.io") && eq(v[3].repository, "library/python"),
                   "4th: Docker Hub itself (%s)", v[3].host);
        }
        image_candidates_free(v, n);
        image_reference_clear(&r);
        image_reference_parse("localhost:5000/x:1", &r, NULL);
        k = image_reference_candidates(&r, &c, &v, &n, &err);
        ok(k == 0 && n == 1 && eq(v[0].host, "localhost:5000"),
           "a qualified name: its registry only");
        image_candidates_free(v, n);
        image_reference_clear(&r);
        registries_conf_clear(&c);

        k = registries_conf_parse("", 0, &c, &err);
        ok(k == 0 && c.n_search == 1 && eq(c.search[0], "docker.io"), "empty conf: search docker.io");
        registries_conf_clear(&c);
        const char *bad[] = { "serch docker.io\n",  "mirror docker.io\n", "mirror a b c\n",
                              "ca host rel/path\n", "insecure\n",         "search a\nsearch b\n",
                              "search bad_host\n",  "search   # none\n",  "search ok\0x" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                size_t bl = i == 8 ? 11 : strlen(bad[i]);
                err.msg[0] = '\0';
                k = registries_conf_parse(bad[i], bl, &c, &err);
                ok(k < 0 && (i == 8 || strstr(err.msg, "line ")), "bad conf %zu refused (%s)", i,
                   err.msg);
        }
        k = registries_conf_load("/nonexistent/registries.conf", &c, &err);
        ok(k == 0 && c.n_search == 1, "a missing conf is the defaults");
        registries_conf_clear(&c);

        /* WWW-Authenticate */
        registry_challenge ch = { 0 };
        const char *h = "Bearer realm=\"https://auth.example/token\",service=\"registry.example\","
                        "scope=\"repository:library/python:pull\"";
        k = registry_challenge_parse(h, strlen(h), &ch);
        ok(k == 0 && ch.scheme == REGISTRY_AUTH_BEARER &&
                   eq(ch.realm, "https://auth.example/token") && eq(ch.service, "registry.example") &&
                   eq(ch.scope, "repository:library/python:pull"),
           "bearer challenge");
        registry_challenge_clear(&ch);
        h = "Basic realm=\"Registry Realm\", Bearer realm=\"https://a/t\" , service=s";
        k = registry_challenge_parse(h, strlen(h), &ch);
        ok(k == 0 && ch.scheme == REGISTRY_AUTH_BEARER && eq(ch.realm, "https://a/t") &&
                   eq(ch.service, "s") && !ch.scope,
           "Bearer wins over Basic");
        registry_challenge_clear(&ch);
        h = "Basic realm=\"x\"";
        k = registry_challenge_parse(h, strlen(h), &ch);
        ok(k == 0 && ch.scheme == REGISTRY_AUTH_BASIC, "basic challenge");
        registry_challenge_clear(&ch);
        h = "Bearer realm=\"https://a/t\\\"q\"";
        k = registry_challenge_parse(h, strlen(h), &ch);
        ok(k == 0 && eq(ch.realm, "https://a/t\"q"), "quoted-pair");
        registry_challenge_clear(&ch);
        const char *bad_ch[] = { "Bearer realm=\"unterminated", "Bearer service=x",
                                 "Negotiate abc==", "", "Bearer realm=\"a\x01b\"" };
        for (size_t i = 0; i < sizeof bad_ch / sizeof bad_ch[0]; i++)
                ok(registry_challenge_parse(bad_ch[i], strlen(bad_ch[i]), &ch) == -EINVAL,
                   "challenge '%s' refused", bad_ch[i]);

        /* credentials: 0600, refused when wider */
        char dir[] = "/tmp/hutch-test-ref.XXXXXX";
        if (mkdtemp(dir)) {
                char path[256];
                snprintf(path, sizeof path, "%s/registries.auth", dir);
                k = registry_auth_set(path, "reg.example:5000", "alice", "s3cr:et", &err);
                struct stat st;
                ok(k == 0 && stat(path, &st) == 0 && (st.st_mode & 0777) == 0600,
                   "stored 0600 (%s)", err.msg);
                char *u = NULL, *p = NULL;
                k = registry_auth_get(path, "reg.example:5000", &u, &p, &err);
                ok(k == 1 && eq(u, "alice") && eq(p, "s3cr:et"), "read back");
                free(u);
                free(p);
                u = p = NULL;
                ok(registry_auth_get(path, "other", &u, &p, &err) == 0 && !u,
                   "no credentials for another host");
                chmod(path, 0644);
                ok(registry_auth_get(path, "reg.example:5000", &u, &p, &err) == -EPERM,
                   "0644 refused: %s", err.msg);
                chmod(path, 0600);
                k = registry_auth_set(path, "reg.example:5000", NULL, NULL, &err);
                ok(k == 0 && registry_auth_get(path, "reg.example:5000", &u, &p, &err) == 0,
                   "removed");
                unlink(path);
                rmdir(dir);
        }
        /* the registries a build's AWS key may be exchanged for */
        ok(registry_ecr_host_valid("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1"),
           "ECR host of its region");
        static const char *const not_ecr[][2] = {
                { "123456789012.dkr.ecr.us-east-1.amazonaws.com", "eu-west-1" },
                { "12345678901.dkr.ecr.us-east-1.amazonaws.com", "us-east-1" },
                { "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil", "us-east-1" },
                { "123456789012.dkr.ecr.us-east-1.amazonaws.com:443", "us-east-1" },
                { "x123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1" },
                { "123456789012.dkr.ecr.us-east-1.amazonaws.com", "" },
                { "123456789012.dkr.ecr..amazonaws.com", "" },
                { "127.0.0.1:5000", "us-east-1" },
        };
        for (size_t i = 0; i < sizeof not_ecr / sizeof not_ecr[0]; i++)
                ok(!registry_ecr_host_valid(not_ecr[i][0], not_ecr[i][1]), "not ECR: %s for '%s'",
                   not_ecr[i][0], not_ecr[i][1]);
        /* a registry's error body, as a push quotes it */
        {
                char sum[260];
                static const char body[] = "{\"errors\":[{\"code\":\"DENIED\",\"message\":"
                                           "\"requested access\\u001b[31m denied\"}]}";
                k = registry_error_summary((const uint8_t *) body, strlen(body), sum, sizeof sum);
                ok(k == 0 && strcmp(sum, "DENIED: requested access?[31m denied") == 0,
                   "error summary, control bytes replaced: %d '%s'", k, sum);
                static const char html[] = "<html>502</html>";
                k = registry_error_summary((const uint8_t *) html, strlen(html), sum, sizeof sum);
                ok(k == -ENOENT && sum[0] == 0, "no summary of an HTML page: %d '%s'", k, sum);
                char big[8192];
                memset(big, ' ', sizeof big);
                memcpy(big, body, strlen(body));
                k = registry_error_summary((const uint8_t *) big, sizeof big, sum, sizeof sum);
                ok(k == -ENOENT, "no summary of a body over 4 KiB: %d", k);
        }
        /* a pushed template's start and ready commands, read back from its config */
        {
                static const char cfg[] =
                        "{\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]},\"config\":{\"Labels\":"
                        "{\"dev.hutch.start-cmd\":\"echo s\",\"dev.hutch.ready-cmd\":\"true\",\"x\":\"y\"}}}";
                image_config ic = { 0 };
                hutch_error ierr = { 0 };
                k = image_config_parse((const uint8_t *) cfg, strlen(cfg), &ic, &ierr);
                ok(k == 0 && eq(ic.start_cmd, "echo s") && eq(ic.ready_cmd, "true"),
                   "labels: start and ready commands (%d %s)", k, ierr.msg);
                image_config_clear(&ic);
                static const char badcfg[] = "{\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]},"
                                             "\"config\":{\"Labels\":{\"dev.hutch.start-cmd\":7}}}";
                k = image_config_parse((const uint8_t *) badcfg, strlen(badcfg), &ic, &ierr);
                ok(k == -EBADMSG, "a start command that is not a string is refused: %s", ierr.msg);
        }
        return tap_done();
}
