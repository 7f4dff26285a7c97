#!/bin/sh
# Wrap the hutch-init binary into an assembler file so libhutch carries it:
# the engine copies these bytes into a sealed memfd and executes that, so a
# sandbox can never reach (or overwrite) a host file for its PID 1.
#   embed.sh INPUT OUTPUT.S [SYMBOL]   (SYMBOL_start, SYMBOL_end; default hutch_init)
set -eu
in=$(realpath "$1")
sym=${3:-hutch_init}
cat > "$2" <<ASM
/* generated from $in; do not edit */
        .section .rodata.$sym,"a"
        .globl ${sym}_start
        .globl ${sym}_end
        .balign 64
${sym}_start:
        .incbin "$in"
${sym}_end:
        .section .note.GNU-stack,"",@progbits
ASM
