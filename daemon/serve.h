/* SPDX-License-Identifier: Apache-2.0 */
/* What cli/ calls: run the daemon, open its database (for `hutch key`). */
#pragma once

#include "daemon/server.h"

int server_run(const server_config *cfg);
int server_open_store(const char *data_dir, hutch_store **ret);
