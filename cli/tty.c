/* SPDX-License-Identifier: Apache-2.0 */
/* What `hutch run -t` and `hutch exec -t` share: our terminal in raw mode
 * for the session (every key reaches the command's terminal, whose line
 * discipline inside the sandbox makes Ctrl-C and Ctrl-Z signals), put back
 * on every way out, and our window size. And the environment names both
 * verbs take. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include "cli/cli.h"

static struct termios saved_tio;
static bool tio_saved;

static void cli_tty_restore_at_exit(void) {
        cli_tty_restore();
}

void cli_tty_raw(void) {
        struct termios t;
        if (tio_saved || !isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &t) < 0)
                return;
        saved_tio = t;
        tio_saved = true;
        static bool registered;
        if (!registered && atexit(cli_tty_restore_at_exit) == 0)
                registered = true;
        cfmakeraw(&t);
        (void) tcsetattr(STDIN_FILENO, TCSADRAIN, &t);
}

void cli_tty_restore(void) {
        if (tio_saved)
                (void) tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_tio);
        tio_saved = false;
}

void cli_tty_size(uint16_t *rows, uint16_t *cols) {
        struct winsize ws;
        if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
                *rows = ws.ws_row;
                *cols = ws.ws_col;
        } else if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
                *rows = ws.ws_row;
                *cols = ws.ws_col;
        } else {
                *rows = 24;
                *cols = 80;
        }
}

/* a volume's name (volume.c, run.c's --volume): here, so that the lean
 * `hutch` checks it without linking volume.c's store */
bool cli_volume_name_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > 128)
                return false;
        for (const char *p = s; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                      (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
                        return false;
        return true;
}

bool cli_env_name_valid(const char *kv) {
        const char *eq = strchr(kv, '=');
        if (!eq || eq == kv || (kv[0] >= '0' && kv[0] <= '9'))
                return false;
        for (const char *p = kv; p < eq; p++)
                if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                      (*p >= '0' && *p <= '9') || *p == '_'))
                        return false;
        return true;
}

int cli_signals_open(void) {
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGHUP);
        sigaddset(&mask, SIGQUIT);
        sigaddset(&mask, SIGWINCH);
        sigprocmask(SIG_BLOCK, &mask, NULL);
        signal(SIGPIPE, SIG_IGN);
        return signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
}
