/* SPDX-License-Identifier: Apache-2.0 */
/*
 * This daemon as one node of several behind `hutch router` (docs/scale-out.md):
 * its node id, stamped on every sandbox and snapshot id it allocates so a
 * router forwards by id alone, its drain flag, and GET /node (identity and
 * capacity, what the router places creates by).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "daemon/server.h"

#define NODE_ID_LEN 4 /* [a-z0-9]{4}: the first characters of every id */

/* The node-id setting: exactly NODE_ID_LEN of [a-z0-9]. */
bool node_id_valid(const char *s);
/* The default node id: a hash of /etc/machine-id, else of the host name. */
void node_id_default(char out[NODE_ID_LEN + 1]);
/* A new sandbox id for this node: the node id, then 16 random [a-z0-9]
 * (82 bits). */
void node_sandbox_id_new(server *srv, char id[HUTCH_ID_LEN + 1]);
/* Overwrite the first NODE_ID_LEN characters of a random [a-z0-9] id. */
void node_id_stamp(server *srv, char *random_id);
/* DATA_DIR/draining exists (`hutch node drain`): creates answer 503. */
bool node_draining(server *srv);
/* GET /node */
enum MHD_Result node_info(server *srv, request *req);
