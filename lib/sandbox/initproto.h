/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control protocol between the host side (libhutch) and hutch-init, the
 * sandbox's PID 1. Compiled into both: libhutch (glibc) and hutch-init (musl,
 * static), so this file and initproto.c use nothing but the C library.
 *
 * Transport: one AF_UNIX SOCK_SEQPACKET connection per client; one message
 * per packet; file descriptors ride along as SCM_RIGHTS on the packet they
 * belong to. The host treats every byte and every descriptor that comes from
 * init as hostile (docs/design.md §4): the decoder checks every length.
 *
 * Frame (all integers little-endian):
 *
 *   u32 magic    INITPROTO_MAGIC ("HTI" + version byte)
 *   u16 type     INITPROTO_* message type
 *   u16 flags    INITPROTO_F_*
 *   u32 id       request id chosen by the client, echoed in the reply;
 *                0 for unsolicited events (exit, watch)
 *   u32 len      payload length, <= INITPROTO_MAX_PAYLOAD
 *   payload:     a sequence of fields, each
 *                  u16 tag, u32 len, len bytes of value
 *                integers are u64 (8 bytes), strings are raw bytes with no
 *                NUL inside (the decoder refuses an embedded NUL).
 *
 * A field tag may repeat (argv, env, list entries). Unknown tags are skipped
 * so that either side can add fields without breaking the other; unknown
 * message types get an INITPROTO_ERROR reply with EOPNOTSUPP.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INITPROTO_MAGIC 0x31495448u /* "HTI1" read as little-endian bytes */
#define INITPROTO_VERSION 1
#define INITPROTO_HEADER_SIZE 16
#define INITPROTO_FIELD_HEADER_SIZE 6
#define INITPROTO_MAX_PAYLOAD (60 * 1024)

/* Under gVisor: where the engine's OCI spec puts hutch-init's binary and the
 * tmpfs of the writable layer, which init builds the root from
 * (init/layer.c); the host template carries both as mount points. */
#define INITPROTO_GVISOR_INIT "/run/hutch/init"
#define INITPROTO_GVISOR_LAYER "/run/hutch/layer"
/* volume i is bound here in runsc's root, then at its path (init/layer.c) */
#define INITPROTO_GVISOR_VOLUMES "/run/hutch/vol"
/* The statx/fstatat shim (init/gvisor-compat.c) in the host template; under
 * gVisor hutch-init names it in /etc/ld.so.preload. */
#define INITPROTO_GVISOR_COMPAT "/run/hutch/gvisor-compat.so"
#define INITPROTO_MAX_FRAME (INITPROTO_HEADER_SIZE + INITPROTO_MAX_PAYLOAD)
#define INITPROTO_MAX_FDS 4
#define INITPROTO_MAX_STRING 4096   /* paths, argv items, env items */

#define INITPROTO_MAX_ARGS 1024     /* argv and env entries, each */
/* A staged command line (SPAWN_PART): the kernel's own bounds, one string
 * (MAX_ARG_STRLEN less its NUL) and all of argv and env together (ARG_MAX
 * with the default 8 MiB stack limit), as HUTCH_SPAWN_* in hutch.h. */
#define INITPROTO_STAGE_MAX_ITEM (128 * 1024 - 1)
#define INITPROTO_STAGE_MAX_TOTAL (2 * 1024 * 1024)
/* Metadata (user.e2b.<key> xattrs), as HUTCH_METADATA_* in hutch.h. */
#define INITPROTO_META_PREFIX "user.e2b."
#define INITPROTO_META_MAX 64
#define INITPROTO_META_KEY_MAX 246     /* XATTR_NAME_MAX 255 less the prefix */
#define INITPROTO_META_VALUE_MAX 4096
#define INITPROTO_META_TOTAL_MAX 16384 /* keys + values of one file */

/* Message types. Requests go host → init; replies and events init → host. */
enum {
        /* replies */
        INITPROTO_OK = 1,         /* generic success; may carry fields */
        INITPROTO_ERROR = 2,      /* T_ERRNO (positive errno) + T_MESSAGE */

        /* session */
        INITPROTO_HELLO = 10,     /* T_VERSION, T_TOKEN → OK{T_VERSION, T_PID (init's own, =1)} */
        INITPROTO_SUBSCRIBE = 11, /* T_FLAGS: INITPROTO_SUB_ALL_EXITS → OK */

        /* processes */
        INITPROTO_SPAWN = 20,     /* T_ARG*, T_ENV*, T_CWD, T_UID, T_GID, T_STDIN, T_PTY_ROWS,
                                     T_PTY_COLS, T_TAG → OK{T_PID} + fds: stdin(w)?, stdout(r),
                                     stderr(r) — or, with a pty, the master only.
                                     T_FD_LAYOUT says which (INITPROTO_FDS_*). */
        INITPROTO_SIGNAL = 21,    /* T_PID, T_SIGNAL, T_GROUP → OK */
        INITPROTO_RESIZE = 22,    /* T_PID, T_PTY_ROWS, T_PTY_COLS → OK */
        INITPROTO_CLOSE_STDIN = 23, /* T_PID → OK */
        INITPROTO_ATTACH = 24,    /* T_PID or T_TAG → OK{T_FD_LAYOUT, process fields} + fds as
                                     for SPAWN; for a process that has exited (and is still
                                     remembered) OK{T_PID, T_TAG, T_EXIT_CODE, T_SIGNAL, T_CORE}
                                     without T_FD_LAYOUT and without fds */
        /* A command line or environment too large for one frame (a string
         * over INITPROTO_MAX_STRING, or more than a frame holds) goes ahead
         * in parts, staged per connection: T_FLAGS 1 starts afresh, then
         * T_ARG / T_ENV start an item and T_ARG_MORE / T_ENV_MORE append a
         * chunk to the last one → OK. A SPAWN with T_STAGED 1 then takes
         * its argv and env from the stage (and carries none itself); the
         * stage is emptied by that SPAWN, by an error, or by a new start.
         * Bounds: INITPROTO_STAGE_MAX_ITEM per item, _TOTAL in all. */
        INITPROTO_SPAWN_PART = 26,
        INITPROTO_LIST_PROCS = 25, /* → one OK per live spawned process with F_MORE, in spawn
                                      order, then a final OK without F_MORE and without fields;
                                      process fields: T_PID, T_TAG, T_ARG*, T_ENV* (left out
                                      when the frame would overflow), T_CWD, T_UID, T_GID,
                                      T_PTY, T_PTY_ROWS, T_PTY_COLS */

        /* files (performed inside the sandbox root, with fsuid/fsgid T_UID/T_GID) */
        INITPROTO_FS_STAT = 40,   /* T_PATH → OK{file fields} */
        INITPROTO_FS_LIST = 41,   /* T_PATH, T_DEPTH → OK{file fields} per entry with F_MORE,
                                     then a final OK without F_MORE and without fields */
        INITPROTO_FS_MKDIR = 42,  /* T_PATH, T_PARENTS → OK{T_CREATED} */
        INITPROTO_FS_MOVE = 43,   /* T_PATH, T_PATH2 → OK{file fields of the destination} */
        INITPROTO_FS_REMOVE = 44, /* T_PATH → OK */
        INITPROTO_FS_OPEN_READ = 45,   /* T_PATH → OK{file fields} + fd (O_RDONLY) */
        INITPROTO_FS_WRITE_BEGIN = 46, /* T_PATH → OK{T_WRITE_ID} + fd (pipe write end) */
        INITPROTO_FS_WRITE_COMMIT = 47, /* T_WRITE_ID, T_SIZE[, T_META_SET, (T_META_KEY,
                                           T_META_VALUE)*] → OK{file fields} once the data up
                                           to the pipe's EOF is written, fsynced, renamed.
                                           With T_META_SET=1 the file's user.e2b.* xattrs
                                           become exactly the pairs given (none: removed). */
        INITPROTO_FS_WRITE_ABORT = 48, /* T_WRITE_ID → OK; temp file removed */
        INITPROTO_FS_WATCH_ADD = 49,   /* T_PATH, T_RECURSIVE, T_UID, T_GID → OK{T_WATCH_ID};
                                          the watch lives with the connection */
        INITPROTO_FS_WATCH_REMOVE = 50, /* T_WATCH_ID → OK */

        /* the gvisor backend's relay answers these itself (hutch-init does
         * not know them): bring the mux to a frame boundary both ways for a
         * checkpoint, and let it go on (init/mux.h, MUX_SYNC) */
        INITPROTO_RELAY_SYNC = 60,   /* → OK once the guest is quiet */
        INITPROTO_RELAY_UNSYNC = 61, /* → OK */
        /* under gVisor only: T_FLAGS 1 opens hutch-init's 127.0.0.1 listener
         * (the sandbox's way to the egress proxy), 0 closes it → OK */
        INITPROTO_NET_LISTEN = 62,

        /* unsolicited events (id 0) */
        INITPROTO_EV_EXIT = 80,   /* T_PID, T_EXIT_CODE, T_SIGNAL, T_CORE, T_CPU_US */
        INITPROTO_EV_WATCH = 81,  /* T_WATCH_ID, T_PATH (full path), T_EVENT (INITPROTO_WEV_*);
                                     a write's temporary file never shows, its commit is
                                     CREATE (new file) and WRITE (data or replaced) */
};

/* Field tags. */
enum {
        T_ERRNO = 1,
        T_MESSAGE = 2,
        T_VERSION = 3,
        T_TOKEN = 4,
        T_FLAGS = 5,

        T_PID = 10,
        T_ARG = 11,
        T_ENV = 12,
        T_CWD = 13,
        T_UID = 14,
        T_GID = 15,
        T_STDIN = 16,     /* 0 /dev/null, 1 pipe */
        T_PTY_ROWS = 17,
        T_PTY_COLS = 18,
        T_TAG = 19,
        T_SIGNAL = 20,
        T_GROUP = 21,
        T_EXIT_CODE = 22,
        T_CORE = 23,
        T_FD_LAYOUT = 24,
        T_PTY = 25,       /* 1 when the process has a pty */
        T_ARG_MORE = 26,  /* SPAWN_PART: a chunk appended to the last T_ARG */
        T_ENV_MORE = 27,  /* SPAWN_PART: a chunk appended to the last T_ENV */
        T_STAGED = 28,    /* SPAWN: u64 1, argv and env are the staged ones */
        T_CPU_US = 29,    /* EV_EXIT: user + system CPU µs (wait4's rusage) */
        T_REQUEST_ID = 30, /* SPAWN: the API request that asked for it; kept with the
                              process and given back in LIST_PROCS (1-64 of [A-Za-z0-9._-]) */
        T_KEEP = 31,      /* SPAWN: u64 1, init starts it again whenever it ends (its stdio
                             then /dev/null), sooner after a long run than after a short one */

        T_PATH = 40,
        T_PATH2 = 41,
        T_DEPTH = 42,
        T_PARENTS = 43,
        T_CREATED = 44,
        T_SIZE = 45,
        T_WRITE_ID = 46,
        T_RECURSIVE = 47,
        T_WATCH_ID = 48,
        T_EVENT = 49,

        /* file fields (one entry) */
        T_NAME = 60,
        T_TYPE = 61,        /* HUTCH_FILE_* */
        T_TARGET_TYPE = 62,
        T_SYMLINK = 63,     /* symlink target */
        T_MODE = 64,
        T_FUID = 65,
        T_FGID = 66,
        T_MTIME_NS = 67,
        T_OWNER = 68,
        T_GROUPNAME = 69,
        /* Metadata: user.e2b.<key> xattrs, as consecutive T_META_KEY,
         * T_META_VALUE pairs (key without the prefix); in file fields of
         * regular files and directories, and in FS_WRITE_COMMIT. Bounded
         * by HUTCH_METADATA_* (hutch.h) on both sides. */
        T_META_KEY = 70,
        T_META_VALUE = 71,
        T_META_SET = 72,    /* u64 1: FS_WRITE_COMMIT replaces the metadata */
};

enum { INITPROTO_F_MORE = 1 };
enum {
        INITPROTO_SUB_ALL_EXITS = 1,
        /* When this connection closes, init exits, and with PID 1 gone the
         * kernel kills every process of the sandbox: `hutch run` ties the
         * sandbox to its own life this way, so a SIGKILLed CLI leaves no
         * process running. */
        INITPROTO_SUB_EXIT_WITH_CONN = 2,
};

/* Which descriptors ride with a SPAWN/ATTACH reply, in this order. */
enum {
        INITPROTO_FDS_PIPES = 1,       /* stdout, stderr */
        INITPROTO_FDS_PIPES_STDIN = 2, /* stdin, stdout, stderr */
        INITPROTO_FDS_PTY = 3,         /* pty master */
};

/* Watch event kinds (match E2B's EventType numbering). */
enum {
        INITPROTO_WEV_CREATE = 1,
        INITPROTO_WEV_WRITE = 2,
        INITPROTO_WEV_REMOVE = 3,
        INITPROTO_WEV_RENAME = 4,
        INITPROTO_WEV_CHMOD = 5,
};

/* ------------------------------------------------------------- encoding */

typedef struct initproto_writer {
        uint8_t buf[INITPROTO_MAX_FRAME];
        size_t len;     /* bytes used, header included */
        bool overflow;  /* a field did not fit; finish() then fails with -EMSGSIZE */
} initproto_writer;

void initproto_begin(initproto_writer *w, uint16_t type, uint16_t flags, uint32_t id);
void initproto_put_u64(initproto_writer *w, uint16_t tag, uint64_t v);
void initproto_put_bytes(initproto_writer *w, uint16_t tag, const void *data, size_t len);
void initproto_put_str(initproto_writer *w, uint16_t tag, const char *s); /* NULL: no field */
/* Patch the payload length into the header. Returns the frame length or -EMSGSIZE. */
int initproto_finish(initproto_writer *w);

/* ------------------------------------------------------------- decoding */

typedef struct initproto_msg {
        uint16_t type;
        uint16_t flags;
        uint32_t id;
        const uint8_t *payload;
        uint32_t payload_len;
} initproto_msg;

/* Validate a whole received frame: magic, length == header + payload, and
 * that the payload is a well-formed sequence of fields. Returns 0 or
 * -EBADMSG / -EPROTO (wrong magic or version). */
int initproto_parse(const void *frame, size_t len, initproto_msg *ret);

typedef struct initproto_field {
        uint16_t tag;
        uint32_t len;
        const uint8_t *value;
} initproto_field;

typedef struct initproto_iter {
        const uint8_t *p, *end;
} initproto_iter;

void initproto_iter_init(initproto_iter *it, const initproto_msg *m);
/* 1 and the next field, 0 at the end, -EBADMSG on a malformed field. */
int initproto_next(initproto_iter *it, initproto_field *ret);

/* Field value accessors: -EBADMSG when the field has the wrong size or a
 * string contains a NUL or exceeds max. */
int initproto_field_u64(const initproto_field *f, uint64_t *ret);
/* Copy a string field into buf (NUL-terminated); bufsz must exceed f->len. */
int initproto_field_str(const initproto_field *f, char *buf, size_t bufsz);

/* First field with the given tag. 1 found, 0 absent, -EBADMSG malformed. */
int initproto_find(const initproto_msg *m, uint16_t tag, initproto_field *ret);
int initproto_find_u64(const initproto_msg *m, uint16_t tag, uint64_t *ret);
/* Returns 0 (absent, buf untouched) or 1; -EBADMSG / -ENAMETOOLONG on bad input. */
int initproto_find_str(const initproto_msg *m, uint16_t tag, char *buf, size_t bufsz);

const char *initproto_type_name(uint16_t type);

/* A metadata key (without the prefix): 1..INITPROTO_META_KEY_MAX bytes of
 * printable ASCII, no '/'. Both sides check it: the host before sending,
 * init before setting, and when reading what the sandbox may have set. */
bool initproto_meta_key_valid(const char *key);
