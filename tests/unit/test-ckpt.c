/* SPDX-License-Identifier: Apache-2.0 */
/* The gvisor checkpoint stream (lib/sandbox/gvisor.c): what gvisor_unpack
 * accepts and refuses, and which streams count as checkpoints. No root, no
 * runsc: files in a temporary directory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"
#include "tap.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/macro.h"

static char base[64];

/* a few at a time: a stream's path and the output dir's are both in use */
static const char *path_of(const char *name) {
        static char p[4][256];
        static unsigned next;
        char *b = p[next++ % 4];
        snprintf(b, sizeof p[0], "%s/%s", base, name);
        return b;
}

static void put(FILE *f, const void *p, size_t n) {
        if (fwrite(p, 1, n, f) != n)
                abort();
}

/* magic, token (its length given separately), then files as name/bytes */
static const char *stream(const char *name, const char *magic, uint32_t token_len, const char *token, uint32_t n_files,
                          const char *const *files) {
        const char *p = path_of(name);
        FILE *f = fopen(p, "wbe");
        if (!f)
                abort();
        put(f, magic, strlen(magic));
        if (token) {
                put(f, &token_len, 4);
                put(f, token, strlen(token));
                put(f, &n_files, 4);
                for (uint32_t i = 0; files && files[2 * i]; i++) {
                        uint16_t nl = (uint16_t) strlen(files[2 * i]);
                        uint64_t sz = strlen(files[2 * i + 1]);
                        put(f, &nl, 2);
                        put(f, files[2 * i], nl);
                        put(f, &sz, 8);
                        put(f, files[2 * i + 1], (size_t) sz);
                }
        }
        fclose(f);
        return p;
}

static unsigned vol_slots;

static int unpack(const char *stream_path, char *token, hutch_error *err) {
        (void) rm_rf_at(AT_FDCWD, path_of("out"));
        return gvisor_unpack(stream_path, path_of("out"), token, &vol_slots, err);
}

int main(void) {
        char tmpl[] = "/tmp/hutch-ckpttest-XXXXXX";
        if (!mkdtemp(tmpl))
                return 1;
        snprintf(base, sizeof base, "%s", tmpl);
        const char *tok = "0123456789abcdef0123456789abcdef";
        char got[HUTCH_TOKEN_LEN + 1];
        hutch_error err = { 0 };
        static const char *const one[] = { "checkpoint.img", "state", "pages.bin", "12345", NULL };

        const char *good = stream("good", "HUTCHGV2", 32, tok, 2, one);
        ok(hutch_stream_is_checkpoint(good), "a HUTCHGV2 stream is a checkpoint");
        ok(unpack(good, got, &err) == 0, "a well-formed stream unpacks: %s", err.msg);
        ok(streq(got, tok), "and gives its token");
        _cleanup_free_ char *img = NULL, *pages = NULL;
        ok(read_file_at(AT_FDCWD, path_of("out/checkpoint.img"), 64, &img) >= 0 && streq(img, "state"),
           "with its files' bytes");
        ok(read_file_at(AT_FDCWD, path_of("out/pages.bin"), 64, &pages) >= 0 && streq(pages, "12345"),
           "every one of them");

        ok(vol_slots == 0, "a sandbox without volumes had no volume mounts");

        /* hutch's own entry: the volume mounts a copy needs stand-ins for */
        static const char *const vols[] = { "checkpoint.img", "state", "hutch-volumes", "3", NULL };
        ok(unpack(stream("vols", "HUTCHGV2", 32, tok, 2, vols), got, &err) == 0 && vol_slots == 3,
           "the volume count is read: %s", err.msg);
        ok(access(path_of("out/hutch-volumes"), F_OK) < 0, "and is no file runsc sees");
        static const char *const badvols[] = { "hutch-volumes", "9", NULL };
        ok(unpack(stream("badvols", "HUTCHGV2", 32, tok, 1, badvols), got, &err) == -EBADMSG,
           "more volume mounts than a sandbox may have is refused");

        /* a checkpoint of an older hutch (runsc's own overlay, before the
         * sized layer): routed to the gvisor backend, refused with why */
        const char *v1 = stream("v1", "HUTCHGV1", 32, tok, 2, one);
        ok(hutch_stream_is_checkpoint(v1), "a HUTCHGV1 stream is a checkpoint (of the gvisor backend)");
        err.msg[0] = 0;
        ok(unpack(v1, got, &err) == -EPROTONOSUPPORT, "a HUTCHGV1 stream is refused");
        ok(strstr(err.msg, "older hutch") != NULL, "saying it is an older hutch's: %s", err.msg);

        const char *layer = stream("layer", "HUTCHLY1", 0, NULL, 0, NULL);
        ok(!hutch_stream_is_checkpoint(layer), "a layer snapshot is not a checkpoint");
        ok(unpack(layer, got, &err) == -EBADMSG, "nor unpacked as one");
        ok(unpack(stream("empty", "", 0, NULL, 0, NULL), got, &err) == -EBADMSG, "an empty file is refused");
        ok(unpack(stream("short", "HUTCH", 0, NULL, 0, NULL), got, &err) == -EBADMSG, "a short magic is refused");
        ok(unpack(stream("toklen", "HUTCHGV2", 31, tok, 2, one), got, &err) == -EBADMSG,
           "a token of the wrong length is refused");
        ok(unpack(stream("tokhex", "HUTCHGV2", 32, "0123456789abcdef0123456789abcdeZ", 2, one), got, &err) ==
                   -EBADMSG,
           "a token that is not lowercase hex is refused");
        ok(unpack(stream("nofiles", "HUTCHGV2", 32, tok, 0, NULL), got, &err) == -EBADMSG, "no files is refused");
        ok(unpack(stream("toomany", "HUTCHGV2", 32, tok, 65, one), got, &err) == -EBADMSG,
           "more files than a checkpoint has is refused");
        static const char *const dots[] = { "../escape", "x", NULL };
        ok(unpack(stream("dots", "HUTCHGV2", 32, tok, 1, dots), got, &err) == -EBADMSG,
           "a file name with a path in it is refused");
        ok(access(path_of("escape"), F_OK) < 0, "and nothing is written outside");
        static const char *const hidden[] = { ".hidden", "x", NULL };
        ok(unpack(stream("hidden", "HUTCHGV2", 32, tok, 1, hidden), got, &err) == -EBADMSG,
           "a file name starting with a dot is refused");
        ok(unpack(stream("missing", "HUTCHGV2", 32, tok, 3, one), got, &err) == -EBADMSG,
           "fewer files than announced is refused");
        /* announced size past the end of the stream */
        {
                const char *p = stream("trunc", "HUTCHGV2", 32, tok, 1, one);
                ok(truncate(p, 8 + 4 + 32 + 4 + 2 + 14 + 8 + 2) == 0, "truncating a stream");
                ok(unpack(p, got, &err) == -EBADMSG, "a truncated file is refused");
        }
        ok(unpack(path_of("nonexistent"), got, &err) == -ENOENT, "a missing stream is ENOENT");

        (void) rm_rf_at(AT_FDCWD, base);
        return tap_done();
}
