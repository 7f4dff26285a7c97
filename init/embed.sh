#!/bin/sh
# Wrap the hutch-init binary into an assembler file so libhutch carries it:
# the engine copies these bytes into a sealed memfd and executes that, so a
# sandbox can never reach (or overwrite) a host file for its PID 1.
set -eu
in=$(realpath "$1")
cat > "$2" <<ASM
/* generated from $in; do not edit */
        .section .rodata.hutch_init,"a"
        .globl hutch_init_start
        .globl hutch_init_end
        .balign 64
hutch_init_start:
        .incbin "$in"
hutch_init_end:
        .section .note.GNU-stack,"",@progbits
ASM
