/* SPDX-License-Identifier: MIT */
/*
 * What the RDMA tools (kvpull-demo, kvpull-rdma-bench) share: an agent
 * opened with its memory registered, a producer's sleep on the agent's
 * fds, and producer and consumer ranks run as child processes (arguments:
 * args.h). Public API only (plus tests/lib/kvtest.h's memory).
 */
#ifndef KVP_TOOL_RDMA_TOOL_H
#define KVP_TOOL_RDMA_TOOL_H

#include <stdint.h>
#include <sys/types.h>

#include "args.h"
#include "kvpull.h"
#include "kvtest.h"

#define TOOL_MAX_RANKS 8

/* CLOCK_MONOTONIC. */
uint64_t tool_now_ns(void);
double tool_now_s(void);

/* *addr, or $KVP_ADDR0 (set by scripts/rxe-vm.sh) when *addr is NULL.
 * Returns 0, or 2 after saying on stderr that there is neither. */
int tool_default_addr(const char *prog, const char **addr);

/* "EAGAIN" for -EAGAIN, "0" for 0, "?" for a code without a name. */
const char *tool_errname(int err);

/* qsort() order of uint64_t values. */
int tool_cmp_u64(const void *a, const void *b);

/* ---- layouts ---- */

/* Rank `rank` of a TP `tp` engine `engine_id` of preset `model` cut to
 * its first `layers` layers, with `nblocks` blocks in the tools' default
 * KV layout and block size (defaults.h). Returns the layout (the caller
 * destroys it), or NULL when the preset or the layout is refused. */
kvp_layout *tool_model_layout(const char *model, uint32_t layers, uint32_t tp,
			      uint32_t rank, uint64_t engine_id,
			      uint32_t nblocks);

/* The first page of every token group that lies above `slots` state pages
 * in each region where a state view and a token view share memory (vLLM's
 * hybrid pools), else 0: token ids from there on never overlap the first
 * `slots` states. */
uint32_t tool_token_base(const kvp_layout *l, uint32_t slots);

/* ---- agents ---- */

/* Opens an agent with *at and registers every region of *mem (region i
 * under index i). Returns 0 and the agent in *a (the caller closes it), or
 * a negative errno with nothing left open. */
int tool_agent_open(const struct kvp_agent_attr *at, struct kvt_mem *mem,
		    kvp_agent **a);

/* A producer rank of layout `l`: tool_agent_open(), then listens at
 * addr:port. Same returns. */
int tool_producer_open(const kvp_layout *l, const char *addr, uint16_t port,
		       uint32_t max_inflight, struct kvt_mem *mem,
		       kvp_agent **a);

/* A consumer: adds the producer engine whose n ranks listen at addr:port+i
 * (kvp_agent_add_engine()) and polls until it is up (60 s at most).
 * Returns 0 and its handle in *engine, or a negative errno (the
 * ENGINE_DOWN event's reason). */
int tool_add_engine(kvp_agent *a, const char *addr, uint16_t port, uint32_t n,
		    uint32_t *engine);

/* Sleeps until the agent's fds or stop_fd are readable, the agent's next
 * deadline, or max_ms have passed, as kvp_agent_fds() describes; returns at
 * once when events are already waiting. Returns 0 or a negative errno. */
int tool_agent_sleep(kvp_agent *a, int stop_fd, int max_ms);

/* ---- ranks as processes ---- */

/* A producer rank: writes one byte to ready_fd once it listens, then
 * serves until stop_fd reads EOF. Returns the process's exit status. */
typedef int tool_producer_fn(void *arg, uint32_t rank, int ready_fd,
			     int stop_fd);
/* A consumer rank; returns the process's exit status. */
typedef int tool_consumer_fn(void *arg, uint32_t rank);

struct tool_ranks {
	pid_t pid[TOOL_MAX_RANKS];
	uint32_t n;
	int stop_fd; /* closed to stop the producers */
};

/* Forks n <= TOOL_MAX_RANKS producer ranks, fn(arg, rank, ...) in each,
 * and waits until each is ready. Returns 0, or -1 when one could not be
 * started or failed first; either way tool_stop_producers() ends them. */
int tool_start_producers(struct tool_ranks *p, uint32_t n,
			 tool_producer_fn *fn, void *arg);

/* Forks n consumer ranks, fn(arg, rank) in each, and waits for them all.
 * Returns 0 when every one exited with 0, else -1. */
int tool_run_consumers(const struct tool_ranks *p, uint32_t n,
		       tool_consumer_fn *fn, void *arg);

/* Tells the producers to stop (SIGTERM first when `term`) and waits for
 * them. Returns how many did not exit with 0. */
uint32_t tool_stop_producers(struct tool_ranks *p, int term);

#endif
