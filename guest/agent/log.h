/* Logging to the guest console, shared by every part of the agent and by the
 * forked children before they execve.  A leaf: it depends on nothing else. */
#ifndef PARACELL_AGENT_LOG_H
#define PARACELL_AGENT_LOG_H

#include <stddef.h>

/* One line of text (an ERROR frame, a child's failure report); below
 * PIPE_BUF so that a child's report is one write the agent reads whole. */
#define ERRTEXT_MAX 512

void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For problems caused by the host's requests: rate-limited, since a hostile
 * host must not flood the console (slow under TCG). */
void loghost(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

long long now_ms(void);

/* Copies at most cap bytes of src into dst with control characters turned
 * into '?', so that text quoting host or container input stays one line;
 * returns the length (dst is not NUL-terminated). */
size_t text_oneline(char *dst, const char *src, size_t cap);

#endif
