/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gvisor relay's seccomp filter as hutch-init's static binary carries
 * it: generated at build time by `seccomp-gen --relay` from
 * lib/sandbox/seccomp-relay.c (relay-seccomp-bpf.c in the build dir).
 * musl's headers have no linux/filter.h, so struct sock_filter's layout is
 * spelled out here (it is the kernel's ABI).
 */
#pragma once

#include <stdint.h>

struct relay_bpf_insn {
        uint16_t code;
        uint8_t jt;
        uint8_t jf;
        uint32_t k;
};

_Static_assert(sizeof(struct relay_bpf_insn) == 8, "struct sock_filter is 8 bytes");

/* struct sock_fprog */
struct relay_bpf_prog {
        unsigned short len;
        const struct relay_bpf_insn *filter;
};

/* linux/seccomp.h */
#define RELAY_SECCOMP_SET_MODE_FILTER 1
#define RELAY_SECCOMP_FILTER_FLAG_TSYNC 1

extern const unsigned short relay_seccomp_filter_len;
extern const struct relay_bpf_insn relay_seccomp_filter[];
