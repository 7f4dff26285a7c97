/* SPDX-License-Identifier: Apache-2.0 */
/* Template builds (daemon/templates.c): the E2B build API. */
#pragma once

#include "daemon/server.h"

struct route;
struct tpl_upload;

int templates_setup(server *srv);     /* DATA_DIR/builds; fail what a previous daemon left */
void templates_teardown(server *srv); /* kill running builders */
enum MHD_Result templates_dispatch(server *srv, request *req, const struct route *rt);
/* PUT /upload/<templateID>/<hash>?expires=&token=: no API key, the link
 * authorises itself. begin queues an error or claims the body. */
enum MHD_Result templates_upload_begin(server *srv, request *req);
enum MHD_Result templates_upload_body(server *srv, request *req, const char *data, size_t *size);
enum MHD_Result templates_upload_finish(server *srv, request *req);
void templates_upload_free(struct tpl_upload *u);
/* Sandbox create's template: a built template's ID or [ns/]alias[:tag] of
 * the team → its ID, alias and the ready build's result; -ENOENT. */
int templates_resolve(server *srv, int64_t team, const char *ref, char ret_tid[32],
                      char ret_alias[64], json_t **ret_result, hutch_error *err);
/* A built template's default for its sandboxes: "user" or "workdir"
 * (NULL when none, or a user envd does not know). */
const char *templates_sbx_default(sbx *sb, const char *what);
/* A built template's start and ready commands (each one /bin/sh -c
 * word running the command through a login bash, as E2B does), its user,
 * workdir and the build's env, for daemon/startcmd.c: 1 and ret filled,
 * 0 when it has no start command, -ENOMEM. */
typedef struct templates_start {
        char *start, *ready, *cwd;
        char **envp;
        hutch_fs_user user;
} templates_start;
int templates_start_spec(sbx *sb, templates_start *ret);
void templates_start_clear(templates_start *s);
/* When template_id is a template the team built: the template its layers
 * sit on ("host" or an image template's name), for a snapshot taken from
 * one of its sandboxes (an ns snapshot's layer holds the build's files
 * too), and in layer (when not NULL) the path of its ready build's layer
 * stream, "" when it has none (a gvisor checkpoint holds only what the
 * sandbox wrote: it restores over the base and that layer). -ENOENT. */
int templates_snapshot_base(server *srv, int64_t team, const char *template_id, char *buf, size_t n,
                            char *layer, size_t layer_n);
/* The cached layer stream of a result's "layer" (0), -ENOENT. */
int templates_layer_path(server *srv, const char *layer, char *buf, size_t n);
