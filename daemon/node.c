/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "daemon/node.h"
#include "util/macro.h"

static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";

bool node_id_valid(const char *s) {
        size_t n = 0;
        for (; s[n]; n++)
                if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9')) ||
                    n >= NODE_ID_LEN)
                        return false;
        return n == NODE_ID_LEN;
}

void node_id_default(char out[NODE_ID_LEN + 1]) {
        char buf[256] = "";
        int fd = open("/etc/machine-id", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t k = read(fd, buf, sizeof buf - 1);
                buf[k > 0 ? k : 0] = 0;
                close(fd);
        }
        buf[strcspn(buf, "\n")] = 0;
        if (!*buf && gethostname(buf, sizeof buf - 1) < 0)
                buf[0] = 0;
        /* FNV-1a, 64 bits */
        uint64_t h = 0xcbf29ce484222325ull;
        for (const char *p = buf; *p; p++)
                h = (h ^ (uint8_t) *p) * 0x100000001b3ull;
        for (size_t i = 0; i < NODE_ID_LEN; i++) {
                out[i] = alphabet[h % 36];
                h /= 36;
        }
        out[NODE_ID_LEN] = 0;
}

void node_id_stamp(server *srv, char *random_id) {
        memcpy(random_id, srv->cfg.node_id, NODE_ID_LEN);
}

void node_sandbox_id_new(server *srv, char id[HUTCH_ID_LEN + 1]) {
        if (hutch_sandbox_id_new(id) < 0)
                abort(); /* getrandom on a running kernel does not fail */
        node_id_stamp(srv, id);
}

bool node_draining(server *srv) {
        char p[1100];
        snprintf(p, sizeof p, "%s/draining", srv->cfg.data_dir);
        return access(p, F_OK) == 0;
}

static json_t *templates_present(server *srv) {
        json_t *a = json_array();
        char p[1100];
        snprintf(p, sizeof p, "%s/templates", srv->cfg.data_dir);
        DIR *d = opendir(p);
        if (!d)
                return a;
        struct dirent *de;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.' &&
                    de->d_type == DT_LNK) /* a name; its versions are directories */
                        json_array_append_new(a, json_string(de->d_name));
        closedir(d);
        return a;
}

enum MHD_Result node_info(server *srv, request *req) {
        struct sysinfo si;
        uint64_t free_b = 0, total_b = 0;
        if (sysinfo(&si) == 0) {
                free_b = ((uint64_t) si.freeram + si.bufferram) * si.mem_unit;
                total_b = (uint64_t) si.totalram * si.mem_unit;
        }
        /* MemAvailable is the better number where /proc/meminfo has it */
        FILE *f = fopen("/proc/meminfo", "re");
        if (f) {
                char line[128];
                unsigned long long kb;
                while (fgets(line, sizeof line, f))
                        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                                free_b = kb * 1024;
                fclose(f);
        }
        unsigned live = 0, paused = 0;
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead) {
                        live++;
                        paused += sb->paused;
                }
        struct statvfs vfs;
        uint64_t disk_free = statvfs(srv->cfg.data_dir, &vfs) == 0
                ? (uint64_t) vfs.f_bavail * vfs.f_frsize
                : 0;
        json_t *o = json_pack("{s:s, s:b, s:I, s:I, s:I, s:i, s:i, s:i, s:I, s:s, s:o}", "nodeID",
                              srv->cfg.node_id, "draining", node_draining(srv), "memFreeBytes",
                              (json_int_t) free_b, "memTotalBytes", (json_int_t) total_b,
                              "diskFreeBytes", (json_int_t) disk_free, "sandboxes", (int) live,
                              "paused", (int) paused, "poolReady", (int) srv->n_pool,
                              "sandboxMemoryMB", (json_int_t) srv->cfg.memory_mb, "version",
                              HUTCH_VERSION, "templates", templates_present(srv));
        /* the caller's own team only: what a router needs for a cluster-wide
         * team limit, and nothing of the other teams */
        json_object_set_new(o, "teamSandboxes", json_integer(sbx_live_count(srv, req->team)));
        int64_t snaps = 0;
        hutch_error e = { 0 };
        if (store_snapshot_count(srv->store, req->team, &snaps, &e) < 0) {
                json_decref(o);
                return http_reply_error(req->conn, 500, "database: %s", e.msg);
        }
        json_object_set_new(o, "teamSnapshots", json_integer(snaps));
        return http_reply_json(req->conn, 200, o);
}
