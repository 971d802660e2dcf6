/* The agent's side of container processes, one slot per channel: spawning,
 * START, stdin, signals, the output relay and the exit report. */
#ifndef PARACELL_AGENT_PROCESS_H
#define PARACELL_AGENT_PROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "container.h"
#include "spec.h"

struct pollfd;

/* Starts the SPEC's process in container c, as its init when c is CTR_NEW
 * (c becomes CTR_LIVE) and as an exec otherwise: the guest pid, or -1 with
 * err set to one line. */
int proc_spawn(unsigned chan, const struct spec *s, struct ctr *c, char *err, size_t errlen);
/* 0 when chan can take a SPEC, else -1 with err set. */
int proc_chan_free(unsigned chan, char *err, size_t errlen);
void proc_start(unsigned chan);
/* 0: taken (or dropped); 1: stdin buffer full, retry the frame later (only
 * when the host sent beyond the channel's window). */
int proc_stdin(unsigned chan, const unsigned char *data, size_t len);
/* Sends STDIN_CREDIT for the stdin bytes passed on (or dropped) since the
 * last, per process, once enough has gathered. */
void proc_send_credits(void);
void proc_signal(unsigned chan, uint32_t signo, uint32_t flags);
void proc_resize(unsigned chan, unsigned rows, unsigned cols);
void proc_reap(void);
/* Adds the fds the loop should wait on; returns the new count. */
int proc_poll_prepare(struct pollfd *pfd, int n, int max);
void proc_poll_handle(const struct pollfd *pfd, int n);
/* Sends EXIT for every process that has ended and whose output is drained. */
void proc_collect(void);
int proc_active(void);
/* After a rollback: every exec'd process is killed, and leaves without an
 * EXIT; its channel is free at once (the host has ended its session), and
 * the init's stdin window restarts from what is buffered for it. */
void proc_rolled_back(void);

#endif
