// SPDX-License-Identifier: MIT
/*
 * kvpull-storm: a connection storm at fleet scale (issue 23, part 7). N
 * consumer ranks, all released at once, connect to one producer agent and
 * each pulls verified bytes; with --rounds they pull again, so that a QP
 * budget below 2N forces evictions and reopens. Public API only.
 *
 *   kvpull-storm --ranks N [--procs P] [--budget B] [--rounds R]
 *                [--timeout S] [--nice K] [--stream] [--layers L]
 *                [--layer-ms T] [--addr IP] [--port N]
 *
 * The producer is one agent, the one rank of a TP 1 engine, in this (the
 * parent) process, opened with default attributes for everything about
 * peers (role, layout and addr set; max_peers, max_per_source, rq_depth,
 * handshake_ms, idle_ms... 0) but two: max_inflight (requests tracked) is
 * 128 whatever the number of ranks (each round expects one request per
 * consumer engine: 128 at 1,024 ranks; the same value at every N keeps
 * bytes_per_peer comparable, since the producer's slots size their
 * follower records and notification buffers by it); and --budget B sets
 * max_qps (0, the default: the library's). Both are printed.
 *
 * The consumers: N ranks (a multiple of 8), each its own consumer agent
 * with default attributes (role, layout, addr), in engines of 8 (TP 8
 * consumer engines reading from the TP 1 producer: each rank reads its
 * head of the 8), spread round-robin over P forked processes (default 8),
 * so that an engine's ranks live in different processes as on a real
 * host. The model is llama-3.1-8b cut to one layer (K and V regions,
 * FLASH_HND, 16-token blocks): a consumer rank's block is 4 KiB per
 * region, a request reads 4 blocks (32 KiB), and 1,024 ranks fit in a VM
 * of a few GiB. --layers L cuts it to L layers instead (1 by default, 4
 * with --stream).
 *
 * --stream: every rank pulls with kvp_agent_pull_stream() instead of
 * kvp_agent_pull_from(), and the producer runs a prefill of every
 * request, layer by layer: its blocks hold only their background until
 * the release, then every --layer-ms T ms (default 1000; 0: all at once)
 * it writes one more layer of every block set (kvt_fill_producer_part())
 * and publishes it for every expected request (kvp_agent_publish():
 * layers [0, l) at every token, the last one as tokens_all =
 * KVP_TOKENS_END). A READ before its layer's publish lands background,
 * so the byte check also catches a byte read early. A rank that follows
 * before the prefill ends streams; one that follows later gets what is
 * published at once. The consumers keep default attributes (stall_ms
 * 10 s: a streamed request with no new progress for that long fails
 * alone, FAILED -ETIMEDOUT KVP_REASON_STALL).
 *
 * The processes are forked before the producer opens (no verbs state
 * crosses a fork). Each opens and registers its ranks' agents, computes
 * what each rank must hold after its pull (tests/lib/kvtest.h: the
 * producer's blocks hold identity patterns, a consumer's memory starts
 * as a per-rank background), says it is ready, and waits. The producer
 * opens, fills its blocks, listens, expects the round's request of every
 * consumer engine (kvp_agent_expect()), then releases every process at
 * once (a byte on each one's control pipe). Each rank then adds the
 * producer engine (kvp_agent_add_engine(); later rounds:
 * kvp_agent_pull_from() reconnects an engine that went down), pulls its
 * request, and on DONE compares every byte of its memory with the
 * expected image (wrong_bytes: bytes that differ), restores its
 * background for the next round and reports the time to the parent over
 * a pipe. A round starts once every rank of the previous one reported and
 * the producer released the requests of the engines whose ranks all
 * pulled (at most 30 s), so that their ranks are idle and may be evicted.
 *
 * Every wait has a deadline: setup 60 + N/4 s, each round --timeout
 * (default 60 + N/8 s; a rank not done by then fails with -ETIMEDOUT),
 * the releases 30 s, closing 60 s, an alarm() over all of it. A consumer
 * process polls only the agents whose fds woke, whose kvp_agent_arm()
 * time came or that said they have more, and sleeps on all their fds
 * (kvp_agent_fds()) otherwise, as an engine's event loop would: a pass
 * costs what is ready, not every agent of the process. The producer
 * sleeps on its agent and the report pipes. --nice K runs the consumer
 * processes at nice K (default 0), standing for other hosts.
 *
 * Printed, per run: the setup; the producer's mem_bytes, fds and RSS at
 * open and a consumer agent's mem_bytes, fds and share of its process's
 * RSS after open (registered, not connected); one line per round; the
 * producer's peak (stats.qps, stats.peers, fds and RSS sampled every
 * 250 ms, mem_bytes); the consumer processes' RSS per rank at the end of
 * their fullest round (rxe maps queue pairs' queues into the process:
 * file RSS, not in mem_bytes); when its worst poll
 * came (before, during or after the rounds) and the worst during the
 * rounds; its end state once the consumers closed their agents and it
 * polled 1 to 10 s more, until qps and peers read 0 (they should, and the
 * fds should be those at open: the report pipes are counted in both);
 * the errors (kind, errno, reason, and an example line of each); then one
 * line:
 *
 *   storm: peers=N qps=Q budget=B all_ready_ms=T p50_ms=A p99_ms=P
 *     refused=R timeouts=X worst_poll_ms=W evictions=E reopens=O
 *     bytes_per_peer=M wrong_bytes=K [mode=stream stalls=S]
 *
 * peers: consumer ranks; qps: the producer's stats.qps high-water; budget:
 * max_qps, or "default"; all_ready_ms: from the release to the last rank's
 * first pull DONE and verified (-1 when a rank never got there);
 * p50_ms, p99_ms: over the ranks' first pulls (nearest rank, of the ranks
 * that succeeded); refused: the producer's stats.refused; timeouts: rank
 * pulls that failed in any way (handshake, pull, FAILED event, deadline,
 * no report), requests not expected (kvp_agent_expect() failed), and
 * requests whose 8 ranks all pulled but that the producer did not report
 * RELEASED; worst_poll_ms: the longest kvp_agent_poll() call on the
 * producer (CLOCK_MONOTONIC around each call: on the same CPUs as the
 * consumer processes, which --nice 19 makes stand for other hosts so
 * that their handshakes do not lengthen a producer poll; the most CPU
 * time one poll took, CLOCK_THREAD_CPUTIME_ID, is printed beside it);
 * evictions: the producer's
 * stats.evictions + stats.idle_closes; reopens: the consumer agents'
 * stats.reconnects, summed; bytes_per_peer: the producer's highest
 * mem_bytes minus its mem_bytes after open and listen, over the peak of
 * stats.peers (N when every rank is connected at once, as without a
 * budget; if stats.peers reads 0, mem_bytes once every first pull was
 * reported, over N); wrong_bytes: over every rank and
 * round; mode=stream stalls=S, with --stream only: rank pulls that ended
 * FAILED for the stall deadline (reason KVP_REASON_STALL), over every
 * round; they are in timeouts too. With --stream, all_ready_ms, p50_ms
 * and p99_ms include the prefill (L x T ms). Exit status: 0; 1 when
 * anything failed or a byte was wrong; 2 for bad arguments.
 * scripts/rdma-bench.sh --storm runs the cases of the issue in one
 * soft-RoCE VM boot, the streamed ones included.
 */
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvpull.h"
#include "kvtest.h"
#include "rdma_tool.h"

#define PROG "kvpull-storm"
#define MODEL "llama-3.1-8b"
#define PRODUCER_ENGINE 0x73746f726d50ull
/* Consumer engine e's id is CONSUMER_ENGINE + e + 1. */
#define CONSUMER_ENGINE 0x73746f726d000000ull
#define TP 8		/* consumer ranks per engine */
#define NIDS 4		/* blocks per request */
#define NSETS 16	/* remote block sets: engine e reads set e % NSETS */
#define LOCAL_BLOCKS 8
#define MAX_RANKS 4096
#define STORM_INFLIGHT 128 /* the producer's max_inflight, at every N */
#define MAX_PROCS 64
#define MAX_ROUNDS 16
#define MAX_KINDS 32
#define MAX_LAYERS 32	  /* llama-3.1-8b's */
#define STREAM_LAYERS 4	  /* --layers with --stream, by default */
#define STREAM_LAYER_MS 1000 /* --layer-ms by default: most ranks of a
				* small storm follow mid-prefill */
#define MS 1000000ull
#define SEC 1000000000ull

struct opts {
	const char *addr;
	uint32_t ranks, procs, budget, rounds, timeout_s, nice;
	uint32_t stream, layers, layer_ms;
	uint16_t port;
};

/* What a consumer process tells the parent: one write() each, shorter
 * than PIPE_BUF, so records never interleave or split. */
enum { REC_READY = 1, REC_RESULT, REC_FINAL };

struct rec {
	uint32_t type, rank, round;
	int32_t err;	/* RESULT: 0, or the failure's -errno */
	uint32_t reason, peer_reason;
	uint64_t t_ns;	/* RESULT: DONE and verified, CLOCK_MONOTONIC */
	uint64_t wrong; /* RESULT: bytes that differ from the expected */
	/* READY: mem_bytes of the first agent after open, agents opened,
	 * ranks that failed to open, fds per agent, anonymous and file RSS
	 * per agent (bytes), the tool's own buffers per rank (bytes).
	 * FINAL: stats.reconnects summed, engines down while idle,
	 * stats.handshake_failures summed, the reopens' handshake times
	 * summed (ns), anonymous and file RSS at the end of the round where
	 * they were highest (bytes), the longest reopen (ns), stats.stalls
	 * and stats.progress_seen summed. */
	uint64_t a, b, c, d, e, f, g, h, k;
	char where[16];
	char why[KVP_WHY_LEN];
};

/* ---- shared by both sides ------------------------------------------------ */

/* Engine e's request: local blocks 1, 2, 4, 7 (the others keep their
 * background, which the check covers too), remote set e % NSETS. Each
 * remote block sits at the same position in every request that reads it,
 * so one identity pattern per block serves them all. */
static void request_ids(uint32_t engine, uint32_t *lid, uint32_t *rid,
			struct kvp_ids *ids)
{
	static const uint32_t local[NIDS] = { 1, 2, 4, 7 };
	uint32_t i;

	for (i = 0; i < NIDS; i++) {
		lid[i] = local[i];
		rid[i] = (engine % NSETS) * NIDS + i;
	}
	ids->local = lid;
	ids->remote = rid;
	ids->nlocal = ids->nremote = NIDS;
	ids->tokens = 0;
}

static void raise_nofile(void)
{
	struct rlimit rl;

	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Open fds of this process, the directory's own not counted. */
static long count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

/* This process's resident memory, bytes: anonymous, and file-backed
 * (rxe maps its queues into the process: they count there). */
static void rss(uint64_t *anon, uint64_t *file)
{
	FILE *f = fopen("/proc/self/status", "r");
	unsigned long long v;
	char line[128];

	*anon = *file = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "RssAnon: %llu", &v) == 1)
			*anon = v * 1024;
		else if (sscanf(line, "RssFile: %llu", &v) == 1)
			*file = v * 1024;
	}
	fclose(f);
}

/* ---- a consumer process -------------------------------------------------- */

enum { RS_IDLE, RS_ADDING, RS_PULL, RS_WAIT, RS_BROKEN };

static const char *const state_names[] = { "idle", "handshake",
					   "pull retried", "pull in flight",
					   "broken" };

struct rank {
	uint32_t id, engine;
	int state;
	kvp_layout *l;
	kvp_agent *a;
	uint32_t h; /* producer engine handle; 0 until added */
	struct kvt_mem mem, bg, exp;
	uint32_t lid[NIDS], rid[NIDS];
	struct kvp_ids ids;
	int pulled; /* its last round's pull was DONE and verified */
	int due;    /* polled at the next pass: its fds woke, or it has work */
	uint64_t wake; /* kvp_agent_arm()'s deadline, when not due */
	int32_t setup_err;
	char setup_why[KVP_WHY_LEN];
};

struct child {
	const struct opts *o;
	int ctl, rep;
	uint32_t proc, n, round; /* round: the current one + 1; 0 before */
	uint64_t round_ns, deadline;
	uint64_t idle_downs;
	uint64_t reopen_ns, reopen_max_ns; /* reopens' handshakes: sum, max */
	uint64_t rss_anon, rss_file; /* at the end of a round, the highest */
	uint32_t rss_round;	     /* the last round sampled */
	struct rank *r;
	struct pollfd *pfd;
};

static void send_rec(struct child *c, const struct rec *m)
{
	ssize_t k;

	do
		k = write(c->rep, m, sizeof(*m));
	while (k < 0 && errno == EINTR);
	if (k != (ssize_t)sizeof(*m))
		_exit(3); /* the parent is gone */
}

static void report(struct child *c, struct rank *r, int32_t err,
		   uint32_t reason, uint32_t peer_reason, const char *where,
		   const char *why, uint64_t wrong)
{
	struct rec m;

	memset(&m, 0, sizeof(m));
	m.type = REC_RESULT;
	m.rank = r->id;
	m.round = c->round - 1;
	m.err = err;
	m.reason = reason;
	m.peer_reason = peer_reason;
	m.t_ns = tool_now_ns();
	m.wrong = wrong;
	snprintf(m.where, sizeof(m.where), "%s", where ? where : "");
	snprintf(m.why, sizeof(m.why), "%s", why ? why : "");
	send_rec(c, &m);
	r->pulled = 0;
	if (r->state != RS_BROKEN)
		r->state = RS_IDLE;
}

/* A failure of this rank's round, with the engine's own account when the
 * event or call gave none. */
static void fail(struct child *c, struct rank *r, const char *where,
		 int32_t err, uint32_t reason, uint32_t peer_reason)
{
	struct kvp_engine_info ei;
	char why[KVP_WHY_LEN] = "";

	if (r->h && !kvp_agent_engine_info(r->a, r->h, &ei)) {
		snprintf(why, sizeof(why), "%s", ei.why);
		if (!reason) {
			reason = ei.reason;
			peer_reason = ei.peer_reason;
		}
	}
	report(c, r, err ? err : -EIO, reason, peer_reason, where, why, 0);
}

static void verify(struct child *c, struct rank *r)
{
	uint64_t wrong = 0, o;
	uint32_t i;

	for (i = 0; i < r->mem.nregions; i++)
		for (o = 0; o < r->mem.size[i]; o++)
			wrong += r->mem.buf[i][o] != r->exp.buf[i][o];
	report(c, r, 0, 0, 0, "", "", wrong);
	r->pulled = 1;
	/* Back to the background, so that the next round's check proves
	 * the next pull; the blocks are ours once DONE is reported. */
	for (i = 0; i < r->mem.nregions; i++)
		memcpy(r->mem.buf[i], r->bg.buf[i], r->mem.size[i]);
}

static void start_round(struct child *c)
{
	struct kvp_peer peer;
	char why[KVP_WHY_LEN];
	uint32_t i, reason;
	int err;

	c->round++;
	c->deadline = tool_now_ns() + c->round_ns;
	memset(&peer, 0, sizeof(peer));
	peer.addr = c->o->addr;
	peer.port = c->o->port;
	for (i = 0; i < c->n; i++) {
		struct rank *r = &c->r[i];

		r->due = 1;
		if (r->state == RS_BROKEN) {
			report(c, r, r->setup_err, 0, 0, "setup",
			       r->setup_why, 0);
			continue;
		}
		if (r->h) {
			r->state = RS_PULL;
			continue;
		}
		err = kvp_agent_add_engine(r->a, &peer, 1,
					   (uint32_t)(c->round_ns / MS),
					   &r->h);
		if (err) {
			reason = kvp_agent_last_error(r->a, why, sizeof(why));
			r->h = 0;
			report(c, r, err, reason, 0, "add_engine", why, 0);
			continue;
		}
		r->state = RS_ADDING;
	}
}

/* Polls one rank's agent and moves it on. Returns 2 when events came (poll
 * again at once), 1 when a pull is to be retried soon, 0 when idle. */
static int drive(struct child *c, struct rank *r)
{
	struct kvp_event ev[16];
	struct kvp_engine_info info;
	char why[KVP_WHY_LEN];
	uint32_t reason;
	int n, i, err;

	if (!r->a || r->state == RS_BROKEN)
		return 0;
	n = kvp_agent_poll(r->a, ev, 16);
	if (n < 0) {
		/* The agent cannot recover: this rank fails every round
		 * from now on. */
		if (r->state != RS_IDLE)
			fail(c, r, "poll", n, 0, 0);
		r->state = RS_BROKEN;
		r->setup_err = n;
		snprintf(r->setup_why, sizeof(r->setup_why),
			 "kvp_agent_poll: %s", kvp_strerror(n));
		return 0;
	}
	for (i = 0; i < n; i++) {
		const struct kvp_event *e = &ev[i];

		switch (e->type) {
		case KVP_EV_ENGINE_UP:
			if (r->state == RS_ADDING)
				r->state = RS_PULL;
			/* A reopen: its handshake's time, call to UP. */
			if (!kvp_agent_engine_info(r->a, r->h, &info) &&
			    info.reconnects) {
				c->reopen_ns += info.add_ns;
				if (info.add_ns > c->reopen_max_ns)
					c->reopen_max_ns = info.add_ns;
			}
			break;
		case KVP_EV_ENGINE_DOWN:
			/* After a verified pull: evicted, or closed for
			 * idleness; the next pull reconnects. Before a
			 * pull (RS_PULL) the pull itself reconnects. In
			 * flight: FAILED came. */
			if (r->state == RS_ADDING)
				fail(c, r, "handshake", e->status, e->reason,
				     e->peer_reason);
			else if (r->state == RS_IDLE && r->pulled)
				c->idle_downs++;
			break;
		case KVP_EV_DONE:
			if (r->state == RS_WAIT && e->req_id == c->round)
				verify(c, r);
			break;
		case KVP_EV_FAILED:
			if (r->state == RS_WAIT && e->req_id == c->round)
				fail(c, r, "pull failed", e->status,
				     e->reason, e->peer_reason);
			break;
		default:
			break;
		}
	}
	if (r->state == RS_PULL) {
		/* Same returns either way: only the READs' pace differs. */
		if (c->o->stream)
			err = kvp_agent_pull_stream(r->a, r->h, c->round,
						    &r->ids);
		else
			err = kvp_agent_pull_from(r->a, r->h, c->round,
						  &r->ids);
		if (!err) {
			r->state = RS_WAIT;
		} else if (err == -EAGAIN) {
			/* Down (evicted): reconnecting; or connecting. */
			r->state = RS_ADDING;
		} else if (err == -EBUSY || err == -ENOTCONN) {
			return n ? 2 : 1;
		} else {
			reason = kvp_agent_last_error(r->a, why, sizeof(why));
			report(c, r, err, reason, 0,
			       c->o->stream ? "pull_stream" : "pull_from",
			       why, 0);
		}
	}
	return n ? 2 : 0;
}

/* Arms a rank after its poll: due again at once when the agent has work
 * left, else at its deadline or when one of its fds wakes. */
static void rank_arm(struct rank *r)
{
	uint64_t w = UINT64_MAX;
	int err;

	r->due = 0;
	if (!r->a || r->state == RS_BROKEN)
		return;
	err = kvp_agent_arm(r->a, &w);
	r->due = err > 0;
	r->wake = err < 0 ? tool_now_ns() + MS : w;
}

/* Sleeps on the agents' fds and the control pipe until one is readable,
 * the earliest agent deadline, or max_ms; then marks the ranks whose fds
 * woke or whose deadline came as due. Only they are polled next: a pass
 * costs what is ready, not every agent of the process. */
static void child_sleep(struct child *c, int max_ms)
{
	uint64_t now = tool_now_ns(), wake = now + (uint64_t)max_ms * MS;
	int fds[KVP_AGENT_FDS], k = 0, j;
	uint32_t i;

	for (i = 0; i < c->n; i++) {
		struct rank *r = &c->r[i];

		if (!r->a || r->state == RS_BROKEN)
			continue;
		if (r->due)
			wake = now;
		if (r->wake < wake)
			wake = r->wake;
		if (kvp_agent_fds(r->a, fds, KVP_AGENT_FDS) != KVP_AGENT_FDS)
			continue;
		for (j = 0; j < KVP_AGENT_FDS; j++) {
			c->pfd[k].fd = fds[j];
			c->pfd[k].events = POLLIN;
			c->pfd[k++].revents = 0;
		}
	}
	c->pfd[k].fd = c->ctl;
	c->pfd[k].events = POLLIN;
	c->pfd[k++].revents = 0;
	(void)poll(c->pfd, (nfds_t)k,
		   wake <= now ? 0 : (int)((wake - now) / MS + 1));
	now = tool_now_ns();
	for (i = 0, k = 0; i < c->n; i++) {
		struct rank *r = &c->r[i];

		if (!r->a || r->state == RS_BROKEN)
			continue;
		for (j = 0; j < KVP_AGENT_FDS; j++)
			r->due |= c->pfd[k++].revents != 0;
		r->due |= r->wake <= now;
	}
}

/* A consumer process that crashes says where on stderr (the VM's console
 * shows it): binary(+offset) frames, for addr2line -e on the same binary.
 * Not async-signal-safe in every step, but the process is dying anyway. */
static void crashed(int sig)
{
	static const char msg[] = PROG ": a consumer process crashed, "
				  "backtrace:\n";
	void *bt[48];
	int n = backtrace(bt, 48);

	if (write(2, msg, sizeof(msg) - 1) < 0)
		n = 0;
	backtrace_symbols_fd(bt, n, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

static int open_rank(struct child *c, struct rank *r,
		     const kvp_layout *remote)
{
	struct kvp_agent_attr at;
	uint32_t i;
	int err;

	r->engine = r->id / TP;
	request_ids(r->engine, r->lid, r->rid, &r->ids);
	r->l = tool_model_layout(MODEL, c->o->layers, TP, r->id % TP,
				 CONSUMER_ENGINE + r->engine + 1,
				 LOCAL_BLOCKS);
	if (!r->l || kvt_mem_alloc(r->l, &r->mem)) {
		snprintf(r->setup_why, sizeof(r->setup_why),
			 "layout or memory");
		return -ENOMEM;
	}
	kvt_fill_background(&r->mem, 1000 + r->id);
	if (kvt_mem_copy(&r->bg, &r->mem) ||
	    kvt_mem_copy(&r->exp, &r->mem)) {
		snprintf(r->setup_why, sizeof(r->setup_why), "memory");
		return -ENOMEM;
	}
	kvt_expect_consumer(r->l, remote, &r->exp, NULL, &r->ids);
	for (i = 0; i < r->mem.nregions; i++)
		if (memcmp(r->exp.buf[i], r->bg.buf[i], r->mem.size[i]))
			break;
	if (i == r->mem.nregions) {
		snprintf(r->setup_why, sizeof(r->setup_why),
			 "the request would change no byte");
		return -EINVAL;
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = r->l;
	at.addr = c->o->addr;
	err = tool_agent_open(&at, &r->mem, &r->a);
	if (err) {
		r->a = NULL;
		snprintf(r->setup_why, sizeof(r->setup_why),
			 "kvp_agent_open or register: %s", kvp_strerror(err));
	}
	return err;
}

static int child_main(const struct opts *o, uint32_t proc, int ctl, int rep,
		      uint64_t round_ns)
{
	struct kvp_agent_stats st;
	struct child c;
	struct rec m;
	kvp_layout *remote;
	uint32_t i;
	uint64_t anon0, file0, anon1, file1;
	long fd0, fd1;
	int busy, ms, k;
	char b;

	raise_nofile();
	/* --nice: the consumers, standing for other hosts, yield the CPUs
	 * to the producer, whose polls are measured. */
	errno = 0;
	if (o->nice && nice((int)o->nice) == -1 && errno)
		fprintf(stderr, "storm: consumer %u: nice: %s\n", proc,
			strerror(errno));
	signal(SIGSEGV, crashed);
	signal(SIGBUS, crashed);
	signal(SIGFPE, crashed);
	signal(SIGILL, crashed);
	signal(SIGABRT, crashed);
	memset(&c, 0, sizeof(c));
	c.o = o;
	c.proc = proc;
	c.ctl = ctl;
	c.rep = rep;
	c.round_ns = round_ns;
	c.n = (o->ranks - proc + o->procs - 1) / o->procs;
	c.r = calloc(c.n, sizeof(*c.r));
	c.pfd = calloc((size_t)c.n * KVP_AGENT_FDS + 1, sizeof(*c.pfd));
	remote = tool_model_layout(MODEL, o->layers, 1, 0, PRODUCER_ENGINE,
				   NSETS * NIDS);
	if (!c.r || !c.pfd || !remote)
		return 1;
	memset(&m, 0, sizeof(m));
	m.type = REC_READY;
	fd0 = count_fds();
	rss(&anon0, &file0);
	for (i = 0; i < c.n; i++) {
		struct rank *r = &c.r[i];

		r->id = proc + i * o->procs;
		r->setup_err = open_rank(&c, r, remote);
		if (r->setup_err) {
			r->state = RS_BROKEN;
			m.c++;
			continue;
		}
		if (!m.b++) {
			kvp_agent_get_stats(r->a, &st);
			m.a = st.mem_bytes;
		}
	}
	fd1 = count_fds();
	rss(&anon1, &file1);
	m.d = m.b && fd0 >= 0 && fd1 >= fd0 ? (uint64_t)(fd1 - fd0) / m.b : 0;
	/* What opening a rank made resident: its agent, and the tool's
	 * memory, background and expected image (m.g). */
	m.e = m.b && anon1 > anon0 ? (anon1 - anon0) / m.b : 0;
	m.f = m.b && file1 > file0 ? (file1 - file0) / m.b : 0;
	for (i = 0; c.n && i < c.r[0].mem.nregions; i++)
		m.g += 3 * c.r[0].mem.size[i];
	send_rec(&c, &m);

	/* 'g': the next round starts now; 'q' or EOF: close and report. */
	for (;;) {
		struct pollfd p = { .fd = ctl, .events = POLLIN };

		if (poll(&p, 1, 0) > 0) {
			k = (int)read(ctl, &b, 1);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0 || b != 'g')
				break;
			start_round(&c);
		}
		busy = 0;
		for (i = 0; i < c.n; i++) {
			struct rank *r = &c.r[i];

			if (!r->due)
				continue;
			k = drive(&c, r);
			busy = k > busy ? k : busy;
			rank_arm(r);
			if (k == 1 && !r->due) /* a pull to try again */
				r->wake = tool_now_ns() + MS;
		}
		if (c.round && tool_now_ns() >= c.deadline)
			for (i = 0; i < c.n; i++) {
				struct rank *r = &c.r[i];
				char why[KVP_WHY_LEN];

				if (r->state == RS_IDLE ||
				    r->state == RS_BROKEN)
					continue;
				snprintf(why, sizeof(why),
					 "round not done in %llu s: %s",
					 (unsigned long long)(round_ns / SEC),
					 state_names[r->state]);
				report(&c, r, -ETIMEDOUT, 0, 0, "deadline",
				       why, 0);
			}
		if (busy == 2) {
			/* Events came: the ranks that had them are due
			 * again only if their agents say so. */
			child_sleep(&c, 0);
			continue;
		}
		for (i = 0, ms = 200; i < c.n; i++)
			if (c.r[i].state != RS_IDLE &&
			    c.r[i].state != RS_BROKEN)
				ms = 50;
		if (ms == 200 && c.round != c.rss_round) {
			/* Every rank of the round done: connected ranks
			 * hold their queue pairs now. */
			uint64_t a, f;

			c.rss_round = c.round;
			rss(&a, &f);
			if (a + f > c.rss_anon + c.rss_file) {
				c.rss_anon = a;
				c.rss_file = f;
			}
		}
		child_sleep(&c, busy ? 1 : ms);
	}

	memset(&m, 0, sizeof(m));
	m.type = REC_FINAL;
	m.b = c.idle_downs;
	m.d = c.reopen_ns;
	m.g = c.reopen_max_ns;
	m.e = c.rss_anon;
	m.f = c.rss_file;
	for (i = 0; i < c.n; i++) {
		if (!c.r[i].a)
			continue;
		kvp_agent_get_stats(c.r[i].a, &st);
		m.a += st.reconnects;
		m.c += st.handshake_failures;
		m.h += st.stalls;
		m.k += st.progress_seen;
	}
	for (i = 0; i < c.n; i++) {
		kvp_agent_close(c.r[i].a);
		kvt_mem_free(&c.r[i].mem);
		kvt_mem_free(&c.r[i].bg);
		kvt_mem_free(&c.r[i].exp);
		kvp_layout_destroy(c.r[i].l);
	}
	send_rec(&c, &m);
	kvp_layout_destroy(remote);
	free(c.r);
	free(c.pfd);
	return 0;
}

/* ---- the producer, in the parent ----------------------------------------- */

struct res {
	uint8_t have, ok;
	uint64_t t_ns, wrong;
};

/* Failures of one kind (where, errno, reasons), with an example. */
struct kind {
	char where[16];
	int32_t err;
	uint32_t reason, peer_reason;
	uint64_t count;
	uint32_t rank, round;
	char why[KVP_WHY_LEN];
};

struct run {
	const struct opts *o;
	kvp_agent *prod;
	const kvp_layout *pl;	/* the producer's layout and memory */
	struct kvt_mem *pmem;
	struct kvt_mem pbg;	/* --stream: its memory before a prefill */
	uint8_t *expected;	/* E: this round's request is expected */
	uint32_t layer_pub;	/* --stream: layers published this round */
	uint32_t nstalls[MAX_ROUNDS];
	uint64_t publish_failed;
	uint32_t N, E, P, R;
	uint64_t round_ns;
	pid_t pid[MAX_PROCS];
	int ctl[MAX_PROCS], rep[MAX_PROCS], gone[MAX_PROCS];
	int final[MAX_PROCS]; /* its REC_FINAL came */
	char fate[MAX_PROCS][48]; /* how a process that failed ended */
	uint8_t rbuf[MAX_PROCS][sizeof(struct rec)];
	size_t rlen[MAX_PROCS];
	uint32_t ready, finals, cur;
	struct res *res;      /* R x N */
	uint8_t *released;    /* R x E */
	uint32_t nres[MAX_ROUNDS], nreleased[MAX_ROUNDS];
	uint32_t nexpired[MAX_ROUNDS], nexpect_failed[MAX_ROUNDS];
	uint64_t t_go[MAX_ROUNDS];
	/* the producer */
	struct kvp_agent_stats st, st0;
	uint64_t worst_poll_ns, worst_at_ns, peak_qps, peak_peers, peak_mem;
	uint64_t worst_round_ns, mem_ready, peers_ready, disconnected_ev;
	uint64_t worst_cpu_ns;	/* the producer thread's CPU time, per poll */
	uint64_t next_fd_ns;
	long fds_before, fds_open, peak_fds, fds_end;
	int phase; /* 0 setup, 1 the rounds, 2 closing */
	int worst_phase;
	int fatal;
	/* the consumers */
	uint64_t cons_mem, cons_fds, cons_anon, cons_file, cons_buf;
	uint64_t reopens, idle_downs, hs_failures;
	uint64_t cons_stalls, progress_seen; /* stats summed */
	uint64_t reopen_ns, reopen_max_ns; /* reopens' handshakes: sum, max */
	uint64_t cons_rss_anon, cons_rss_file;
	uint64_t rss_open, rss_peak, rss_end, exp_dl;
	uint64_t opened, broken;
	uint32_t failed_procs;
	struct kind kinds[MAX_KINDS];
	uint32_t nkinds;
	uint64_t kinds_dropped;
};

static void add_kind(struct run *s, const char *where, int32_t err,
		     uint32_t reason, uint32_t peer_reason, uint32_t rank,
		     uint32_t round, const char *why)
{
	struct kind *k;
	uint32_t i;

	for (i = 0; i < s->nkinds; i++) {
		k = &s->kinds[i];
		if (!strcmp(k->where, where) && k->err == err &&
		    k->reason == reason && k->peer_reason == peer_reason) {
			k->count++;
			return;
		}
	}
	if (s->nkinds == MAX_KINDS) {
		s->kinds_dropped++;
		return;
	}
	k = &s->kinds[s->nkinds++];
	snprintf(k->where, sizeof(k->where), "%s", where);
	k->err = err;
	k->reason = reason;
	k->peer_reason = peer_reason;
	k->count = 1;
	k->rank = rank;
	k->round = round;
	snprintf(k->why, sizeof(k->why), "%s", why ? why : "");
}

static void on_rec(struct run *s, uint32_t proc, const struct rec *m)
{
	struct res *x;

	switch (m->type) {
	case REC_READY:
		s->ready++;
		if (!proc) {
			s->cons_mem = m->a;
			s->cons_fds = m->d;
			s->cons_anon = m->e;
			s->cons_file = m->f;
			s->cons_buf = m->g;
		}
		s->opened += m->b;
		s->broken += m->c;
		break;
	case REC_RESULT:
		if (m->round >= s->R || m->rank >= s->N)
			break;
		x = &s->res[(size_t)m->round * s->N + m->rank];
		if (x->have)
			break; /* already counted as not reported */
		x->have = 1;
		x->ok = !m->err;
		x->t_ns = m->t_ns;
		x->wrong = m->wrong;
		s->nres[m->round]++;
		if (m->err)
			add_kind(s, m->where, m->err, m->reason,
				 m->peer_reason, m->rank, m->round, m->why);
		/* The library's reason, not the errno: -ETIMEDOUT is also
		 * the transport giving up, or the round's deadline. */
		if (m->err && m->reason == KVP_REASON_STALL)
			s->nstalls[m->round]++;
		break;
	case REC_FINAL:
		s->final[proc] = 1;
		s->finals++;
		s->reopens += m->a;
		s->reopen_ns += m->d;
		if (m->g > s->reopen_max_ns)
			s->reopen_max_ns = m->g;
		s->idle_downs += m->b;
		s->hs_failures += m->c;
		s->cons_stalls += m->h;
		s->progress_seen += m->k;
		s->cons_rss_anon += m->e;
		s->cons_rss_file += m->f;
		break;
	}
}

/* How process p ended, once its pipe closed: waited for up to 1 s. Returns
 * 0 when it exited with 0. */
static int wait_proc(struct run *s, uint32_t p)
{
	uint64_t end = tool_now_ns() + SEC;
	pid_t k;
	int st;

	if (s->pid[p] <= 0)
		return 0;
	while ((k = waitpid(s->pid[p], &st, WNOHANG)) == 0 &&
	       tool_now_ns() < end)
		usleep(10000);
	if (k != s->pid[p]) {
		snprintf(s->fate[p], sizeof(s->fate[p]),
			 "pipe closed, still running");
		return 1;
	}
	s->pid[p] = 0;
	if (WIFEXITED(st) && !WEXITSTATUS(st))
		return 0;
	if (WIFSIGNALED(st))
		snprintf(s->fate[p], sizeof(s->fate[p]),
			 "killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	else
		snprintf(s->fate[p], sizeof(s->fate[p]), "exited with %d",
			 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return 1;
}

/* The ranks of process p not reported in round r fail: it is gone. */
static void fail_proc_ranks(struct run *s, uint32_t p, uint32_t r)
{
	char why[KVP_WHY_LEN];
	uint32_t i;

	snprintf(why, sizeof(why), "consumer process %u: %s", p,
		 s->fate[p][0] ? s->fate[p] : "gone");
	for (i = p; i < s->N; i += s->P) {
		struct res *x = &s->res[(size_t)r * s->N + i];

		if (x->have)
			continue;
		x->have = 1;
		s->nres[r]++;
		add_kind(s, "process died", -ECHILD, 0, 0, i, r, why);
	}
}

static void proc_gone(struct run *s, uint32_t p)
{
	s->gone[p] = 1;
	if (wait_proc(s, p))
		s->failed_procs++;
	if (!s->final[p] && s->phase == 1)
		fail_proc_ranks(s, p, s->cur);
}

/* Reads what the processes wrote. Returns how many records came. */
static int read_reports(struct run *s)
{
	uint32_t p;
	ssize_t k;
	int got = 0;

	for (p = 0; p < s->P; p++) {
		while (!s->gone[p]) {
			k = read(s->rep[p], s->rbuf[p] + s->rlen[p],
				 sizeof(struct rec) - s->rlen[p]);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				break;
			if (!k) {
				proc_gone(s, p);
				break;
			}
			s->rlen[p] += (size_t)k;
			if (s->rlen[p] == sizeof(struct rec)) {
				struct rec m;

				memcpy(&m, s->rbuf[p], sizeof(m));
				s->rlen[p] = 0;
				on_rec(s, p, &m);
				got++;
			}
		}
	}
	return got;
}

static void on_event(struct run *s, const struct kvp_event *e)
{
	uint64_t round = e->req_id - 1;
	uint64_t eng = e->engine_id - CONSUMER_ENGINE - 1;

	switch (e->type) {
	case KVP_EV_RELEASED:
		if (round < s->R && eng < s->E &&
		    !s->released[round * s->E + eng]) {
			s->released[round * s->E + eng] = 1;
			s->nreleased[round]++;
		}
		break;
	case KVP_EV_EXPIRED:
		if (round < s->R)
			s->nexpired[round]++;
		break;
	case KVP_EV_DISCONNECTED:
		s->disconnected_ev++;
		break;
	default:
		break;
	}
}

static void sample(struct run *s)
{
	uint64_t now = tool_now_ns();
	long f;

	kvp_agent_get_stats(s->prod, &s->st);
	if (s->st.qps > s->peak_qps)
		s->peak_qps = s->st.qps;
	if (s->st.peers > s->peak_peers)
		s->peak_peers = s->st.peers;
	if (s->st.mem_bytes > s->peak_mem)
		s->peak_mem = s->st.mem_bytes;
	if (now >= s->next_fd_ns) {
		uint64_t a, fl;

		f = count_fds();
		if (f > s->peak_fds)
			s->peak_fds = f;
		rss(&a, &fl);
		if (a + fl > s->rss_peak)
			s->rss_peak = a + fl;
		s->next_fd_ns = now + 250 * MS;
	}
}

static void producer_sleep(struct run *s, uint64_t deadline)
{
	struct pollfd w[KVP_AGENT_FDS + MAX_PROCS];
	int fds[KVP_AGENT_FDS], k = 0, i, err;
	uint64_t now = tool_now_ns(), wake;
	uint32_t p;

	err = kvp_agent_arm(s->prod, &wake);
	if (err)
		return; /* events waiting, or an error poll will report */
	if (kvp_agent_fds(s->prod, fds, KVP_AGENT_FDS) != KVP_AGENT_FDS)
		return;
	if (wake > now + 100 * MS)
		wake = now + 100 * MS;
	if (wake > deadline)
		wake = deadline;
	for (i = 0; i < KVP_AGENT_FDS; i++) {
		w[k].fd = fds[i];
		w[k].events = POLLIN;
		w[k++].revents = 0;
	}
	for (p = 0; p < s->P; p++) {
		if (s->gone[p])
			continue;
		w[k].fd = s->rep[p];
		w[k].events = POLLIN;
		w[k++].revents = 0;
	}
	now = tool_now_ns();
	(void)poll(w, (nfds_t)k,
		   wake <= now ? 0 : (int)((wake - now) / MS + 1));
}

/* The calling thread's CPU time: a poll's own cost, without the time
 * the scheduler gave other processes. */
static uint64_t cpu_ns(void)
{
	struct timespec t;

	(void)clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* --stream: the prefill of the round's requests, one layer every
 * layer_ms from the release: the layer's bytes of every block set are
 * written first, then the layer is published for every expected request.
 * Returns when the next layer is due, UINT64_MAX once all are out. */
static uint64_t prefill(struct run *s)
{
	const uint32_t L = s->o->layers;
	uint32_t lid[NIDS], rid[NIDS], set, e;
	struct kvp_progress p;
	struct kvp_ids ids;
	uint64_t due;
	int err;

	if (!s->o->stream || s->phase != 1)
		return UINT64_MAX;
	while (s->layer_pub < L) {
		due = s->t_go[s->cur] +
		      (uint64_t)(s->layer_pub + 1) * s->o->layer_ms * MS;
		if (tool_now_ns() < due)
			return due;
		for (set = 0; set < NSETS && set < s->E; set++) {
			request_ids(set, lid, rid, &ids);
			kvt_fill_producer_part(s->pl, s->pmem, &ids,
					       s->layer_pub, s->layer_pub + 1,
					       0, KVP_TOKENS_END);
		}
		s->layer_pub++;
		/* Layers [0, l) at every token; the last one as the
		 * finished prefill. */
		memset(&p, 0, sizeof(p));
		p.tokens_cur = KVP_TOKENS_END;
		if (s->layer_pub == L)
			p.tokens_all = KVP_TOKENS_END;
		else
			p.layers_cur = s->layer_pub;
		for (e = 0; e < s->E; e++) {
			if (!s->expected[e])
				continue;
			err = kvp_agent_publish(s->prod,
						CONSUMER_ENGINE + e + 1,
						s->cur + 1, &p);
			if (err) {
				s->publish_failed++;
				add_kind(s, "publish", err, 0, 0, e * TP,
					 s->cur, "");
			}
		}
	}
	return UINT64_MAX;
}

/* Drives the producer (and reads the reports) until cond(s) holds or the
 * deadline passes. Returns 1 when cond held. */
static int pump(struct run *s, int (*cond)(const struct run *),
		uint64_t deadline)
{
	struct kvp_event ev[64];
	uint64_t t0, t1, c0, c1, next;
	int n, i;

	for (;;) {
		if (cond(s))
			return 1;
		if (s->fatal || tool_now_ns() >= deadline)
			return 0;
		next = prefill(s);
		c0 = cpu_ns();
		t0 = tool_now_ns();
		n = kvp_agent_poll(s->prod, ev, 64);
		t1 = tool_now_ns();
		c1 = cpu_ns();
		if (c1 - c0 > s->worst_cpu_ns)
			s->worst_cpu_ns = c1 - c0;
		if (t1 - t0 > s->worst_poll_ns) {
			s->worst_poll_ns = t1 - t0;
			s->worst_phase = s->phase;
			s->worst_at_ns = t0;
		}
		if (s->phase == 1 && t1 - t0 > s->worst_round_ns)
			s->worst_round_ns = t1 - t0;
		if (n < 0) {
			s->fatal = n;
			add_kind(s, "producer poll", n, 0, 0, 0, s->cur, "");
			return 0;
		}
		for (i = 0; i < n; i++)
			on_event(s, &ev[i]);
		sample(s);
		if (read_reports(s) || n)
			continue;
		producer_sleep(s, next < deadline ? next : deadline);
	}
}

/* Every process ready, or gone (its ranks then fail every round). */
static int all_ready(const struct run *s)
{
	uint32_t p, gone = 0;

	for (p = 0; p < s->P; p++)
		gone += s->gone[p];
	return s->ready + gone >= s->P;
}

static int round_reported(const struct run *s)
{
	return s->nres[s->cur] == s->N;
}

/* Every engine whose ranks all pulled this round was released, and every
 * request of the round was reported (RELEASED or EXPIRED), so that none
 * holds a slot in the next round. */
static int round_settled(const struct run *s)
{
	const struct res *x = &s->res[(size_t)s->cur * s->N];
	uint32_t e, i;

	for (e = 0; e < s->E; e++) {
		if (s->released[(size_t)s->cur * s->E + e])
			continue;
		for (i = 0; i < TP && x[e * TP + i].ok; i++)
			;
		if (i == TP)
			return 0;
	}
	return s->nreleased[s->cur] + s->nexpired[s->cur] +
		       s->nexpect_failed[s->cur] >= s->E;
}

/* Every process closed its report pipe: it sent its last record (closing
 * its agents first) and exited, or died. */
static int all_gone(const struct run *s)
{
	uint32_t p;

	for (p = 0; p < s->P; p++)
		if (!s->gone[p])
			return 0;
	return 1;
}

static int producer_empty(const struct run *s)
{
	return !s->st.qps && !s->st.peers;
}

static int never(const struct run *s)
{
	(void)s;
	return 0;
}

/* Nearest rank: the smallest value with at least p% of them at or below. */
static double pct_ms(const uint64_t *v, uint32_t n, uint32_t p)
{
	uint64_t k = ((uint64_t)n * p + 99) / 100;

	if (!n)
		return -1;
	return v[k ? k - 1 : 0] / 1e6;
}

static int start_procs(struct run *s)
{
	int c[2], r[2];
	uint32_t p, q;

	fflush(NULL);
	for (p = 0; p < s->P; p++) {
		if (pipe(c))
			return -1;
		if (pipe(r)) {
			close(c[0]);
			close(c[1]);
			return -1;
		}
		s->pid[p] = fork();
		if (s->pid[p] < 0) {
			close(c[0]);
			close(c[1]);
			close(r[0]);
			close(r[1]);
			return -1;
		}
		if (!s->pid[p]) {
			/* The other processes' pipes: a write end left open
			 * here would hide their EOF. */
			for (q = 0; q < p; q++) {
				close(s->ctl[q]);
				close(s->rep[q]);
			}
			close(c[1]);
			close(r[0]);
			signal(SIGPIPE, SIG_DFL);
			_exit(child_main(s->o, p, c[0], r[1], s->round_ns));
		}
		close(c[0]);
		close(r[1]);
		s->ctl[p] = c[1];
		s->rep[p] = r[0];
		s->rlen[p] = 0;
		(void)fcntl(r[0], F_SETFL, O_NONBLOCK);
	}
	return 0;
}

static void tell_all(struct run *s, char b)
{
	uint32_t p;

	for (p = 0; p < s->P; p++)
		if (s->ctl[p] >= 0 && write(s->ctl[p], &b, 1) != 1) {
			close(s->ctl[p]);
			s->ctl[p] = -1;
		}
}

/* Waits up to 10 s for the processes not waited for yet, then kills what
 * is left. Counts in s->failed_procs those that did not exit with 0. */
static void reap(struct run *s)
{
	uint64_t end = tool_now_ns() + 10 * SEC;
	uint32_t p, left;
	int st;

	for (p = 0; p < s->P; p++)
		if (s->ctl[p] >= 0) {
			close(s->ctl[p]);
			s->ctl[p] = -1;
		}
	do {
		for (p = 0, left = 0; p < s->P; p++) {
			if (s->pid[p] <= 0)
				continue;
			if (waitpid(s->pid[p], &st, WNOHANG) == s->pid[p]) {
				if (!WIFEXITED(st) || WEXITSTATUS(st)) {
					s->failed_procs++;
					snprintf(s->fate[p], sizeof(s->fate[p]),
						 "status 0x%x", st);
				}
				s->pid[p] = 0;
			} else {
				left++;
			}
		}
		if (left)
			usleep(20000);
	} while (left && tool_now_ns() < end);
	for (p = 0; p < s->P; p++) {
		if (s->pid[p] <= 0)
			continue;
		kill(s->pid[p], SIGKILL);
		(void)waitpid(s->pid[p], &st, 0);
		s->pid[p] = 0;
		s->failed_procs++;
		snprintf(s->fate[p], sizeof(s->fate[p]),
			 "killed: not gone 10 s after the end");
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvpull-storm --ranks N [options]\n"
		"  --ranks N     consumer ranks, a multiple of 8 (engines of TP 8),\n"
		"                at most %d\n"
		"  --procs P     processes the consumer ranks are spread over [8]\n"
		"  --budget B    the producer's max_qps, its QP budget [0: the\n"
		"                library's default]\n"
		"  --rounds R    pulls per rank, a round after the previous one\n"
		"                is done, at most %d [1]\n"
		"  --timeout S   bound on each round, seconds [60 + N/8]\n"
		"  --nice K      the consumer processes' nice value, 0-19 [0]\n"
		"  --stream      pull with kvp_agent_pull_stream() while the\n"
		"                producer publishes each request layer by layer\n"
		"  --layers L    the model's layers, at most %d [1; %d with\n"
		"                --stream]\n"
		"  --layer-ms T  --stream: a layer published every T ms from the\n"
		"                release, 0: all at once [%d]\n"
		"  --addr IP     the producer's address, which the consumers\n"
		"                also use as their source [$KVP_ADDR0]\n"
		"  --port N      the producer's port [24800]\n"
		"  --version     print the version and exit\n"
		"One producer agent (default attributes but max_inflight and\n"
		"max_qps) against N consumer agents released at once, every pulled\n"
		"byte checked; the last line is\n"
		"  storm: peers=N qps=Q budget=B all_ready_ms=T p50_ms=A p99_ms=P\n"
		"    refused=R timeouts=X worst_poll_ms=W evictions=E reopens=O\n"
		"    bytes_per_peer=M wrong_bytes=K\n"
		"and with --stream \" mode=stream stalls=S\" after it (S: pulls\n"
		"FAILED for the stall deadline, KVP_REASON_STALL; in X too)\n"
		"(scripts/rdma-bench.sh --storm; tools/README.md).\n",
		MAX_RANKS, MAX_ROUNDS, MAX_LAYERS, STREAM_LAYERS,
		STREAM_LAYER_MS);
}

/* The producer: opened, filled, listening. Returns 0 or -errno. */
static int producer_open(struct run *s, kvp_layout **pl, struct kvt_mem *mem)
{
	struct kvp_agent_attr at;
	uint32_t lid[NIDS], rid[NIDS], set;
	struct kvp_ids ids;
	int err;

	*pl = tool_model_layout(MODEL, s->o->layers, 1, 0, PRODUCER_ENGINE,
				NSETS * NIDS);
	if (!*pl || kvt_mem_alloc(*pl, mem))
		return -ENOMEM;
	kvt_fill_background(mem, 5);
	s->pl = *pl;
	s->pmem = mem;
	/* Streamed: the blocks are written by each round's prefill. */
	if (s->o->stream && kvt_mem_copy(&s->pbg, mem))
		return -ENOMEM;
	for (set = 0; set < NSETS && !s->o->stream; set++) {
		request_ids(set, lid, rid, &ids);
		kvt_fill_producer(*pl, mem, &ids);
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = *pl;
	at.addr = s->o->addr;
	at.max_inflight = s->E > STORM_INFLIGHT ? s->E : STORM_INFLIGHT;
	at.max_qps = s->o->budget;
	err = tool_agent_open(&at, mem, &s->prod);
	if (err)
		return err;
	err = kvp_agent_listen(s->prod, s->o->addr, s->o->port);
	if (err) {
		kvp_agent_close(s->prod);
		s->prod = NULL;
	}
	return err;
}

int main(int argc, char **argv)
{
	struct opts o = { .procs = 8, .rounds = 1, .port = 24800,
			  .layer_ms = UINT32_MAX };
	const struct tool_opt opts[] = {
		{ "--ranks", TOOL_COUNT, &o.ranks, MAX_RANKS },
		{ "--procs", TOOL_COUNT, &o.procs, MAX_PROCS },
		{ "--budget", TOOL_U32, &o.budget, 0 },
		{ "--rounds", TOOL_COUNT, &o.rounds, MAX_ROUNDS },
		{ "--timeout", TOOL_COUNT, &o.timeout_s, 3600 },
		{ "--nice", TOOL_U32, &o.nice, 0 },
		{ "--stream", TOOL_FLAG, &o.stream, 0 },
		{ "--layers", TOOL_COUNT, &o.layers, MAX_LAYERS },
		{ "--layer-ms", TOOL_U32, &o.layer_ms, 0 },
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--port", TOOL_PORT, &o.port, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct kvt_mem pmem = { 0 };
	kvp_layout *pl = NULL;
	struct run *s;
	uint64_t *t = NULL, now, wrong = 0, failures = 0, setup_ns, unrel = 0;
	uint64_t cpu_go = 0, cpu_round = 0, wall_round = 0, stalls;
	uint32_t r, e, i, nt;
	double all_ms = -1;
	char budget[16];
	int err, ok;

	err = tool_parse_args(argc, argv, PROG, opts);
	if (err == TOOL_ARGS_HELP)
		usage(stdout);
	if (err)
		return err == TOOL_ARGS_BAD ? 2 : 0;
	if (!o.ranks)
		return tool_bad_arg(PROG, "--ranks is required");
	if (o.ranks % TP)
		return tool_bad_arg(PROG, "--ranks: %u is not a multiple of %d",
				    o.ranks, TP);
	if (o.nice > 19)
		return tool_bad_arg(PROG, "--nice: %u is above 19", o.nice);
	if (o.budget > 65535)
		return tool_bad_arg(PROG, "--budget: %u is out of range "
				    "(0-65535)", o.budget);
	if (tool_default_addr(PROG, &o.addr))
		return 2;
	if (o.procs > o.ranks)
		o.procs = o.ranks;
	if (!o.timeout_s)
		o.timeout_s = 60 + o.ranks / 8;
	if (o.layer_ms != UINT32_MAX && !o.stream)
		return tool_bad_arg(PROG, "--layer-ms: only with --stream");
	if (o.layer_ms == UINT32_MAX)
		o.layer_ms = STREAM_LAYER_MS;
	/* Half the consumers' default stall_ms (10 s) at most between two
	 * layers, so that a rank's stall is the library's, not the pace's. */
	if (o.layer_ms > 5000)
		return tool_bad_arg(PROG, "--layer-ms: %u is above 5000",
				    o.layer_ms);
	if (!o.layers)
		o.layers = o.stream ? STREAM_LAYERS : 1;
	/* And the prefill ends well inside the round. */
	if (o.stream && (uint64_t)o.layers * o.layer_ms > o.timeout_s * 500ull)
		return tool_bad_arg(PROG, "--layer-ms: %u layers of %u ms "
				    "take over half of the round's %u s",
				    o.layers, o.layer_ms, o.timeout_s);

	s = calloc(1, sizeof(*s));
	if (!s)
		return 1;
	s->o = &o;
	s->N = o.ranks;
	s->E = o.ranks / TP;
	s->P = o.procs;
	s->R = o.rounds;
	s->round_ns = (uint64_t)o.timeout_s * SEC;
	s->res = calloc((size_t)s->R * s->N, sizeof(*s->res));
	s->released = calloc((size_t)s->R * s->E, 1);
	s->expected = calloc(s->E, 1);
	t = calloc(s->N, sizeof(*t));
	if (!s->res || !s->released || !s->expected || !t)
		return 1;
	for (i = 0; i < MAX_PROCS; i++)
		s->ctl[i] = s->rep[i] = -1;
	setup_ns = (60 + (uint64_t)s->N / 4) * SEC;
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	/* The last resort against a call that blocks: every wait below has
	 * its own deadline well inside this. */
	alarm((unsigned)(setup_ns / SEC + s->R * (o.timeout_s + 60) + 180));
	snprintf(budget, sizeof(budget), o.budget ? "%u" : "default",
		 o.budget);

	printf("storm: %u consumer ranks (%u engines of TP %d, %s cut to %u "
	       "layer%s, flash_hnd, 16-token blocks; a rank reads its head of "
	       "%d: %d blocks, K and V) in %u processes, %u round(s), "
	       "%u s each at most\n",
	       s->N, s->E, TP, MODEL, o.layers, o.layers > 1 ? "s" : "",
	       TP, NIDS, s->P, s->R, o.timeout_s);
	if (o.stream)
		printf("storm: streamed: every rank pulls with "
		       "kvp_agent_pull_stream(); the producer writes and "
		       "publishes one layer of every request every %u ms from "
		       "the release (the last at +%u ms)\n",
		       o.layer_ms, o.layers * o.layer_ms);
	printf("storm: producer: one agent (TP 1) at %s:%u, attributes "
	       "default but max_inflight=%u (one request per consumer "
	       "engine and round), max_qps=%s; consumers: default "
	       "attributes\n",
	       o.addr, o.port, s->E > STORM_INFLIGHT ? s->E : STORM_INFLIGHT,
	       budget);

	s->fds_before = count_fds();
	if (start_procs(s)) {
		fprintf(stderr, PROG ": fork or pipe: %s\n", strerror(errno));
		s->fatal = -errno;
		goto out;
	}
	err = producer_open(s, &pl, &pmem);
	if (err) {
		fprintf(stderr, PROG ": producer: %s\n", kvp_strerror(err));
		add_kind(s, "producer open", err, 0, 0, 0, 0, "");
		s->fatal = err;
		goto out;
	}
	kvp_agent_get_stats(s->prod, &s->st0);
	s->st = s->st0;
	s->fds_open = s->peak_fds = count_fds();
	{
		uint64_t a, fl;

		rss(&a, &fl);
		s->rss_open = s->rss_peak = a + fl;
	}
	printf("storm: producer after open and listen: mem_bytes=%llu "
	       "fds=%ld (%ld before open; the report pipes are 2 per "
	       "process) qps=%llu peers=%llu rss=%llu KiB\n",
	       (unsigned long long)s->st0.mem_bytes, s->fds_open,
	       s->fds_before, (unsigned long long)s->st0.qps,
	       (unsigned long long)s->st0.peers,
	       (unsigned long long)(s->rss_open / 1024));

	if (!pump(s, all_ready, tool_now_ns() + setup_ns)) {
		fprintf(stderr, PROG ": %u of %u processes ready in %llu s\n",
			s->ready, s->P, (unsigned long long)(setup_ns / SEC));
		add_kind(s, "setup", -ETIMEDOUT, 0, 0, 0, 0,
			 "a process was not ready in time");
		s->fatal = -ETIMEDOUT;
		goto out;
	}
	for (i = 0; i < s->P; i++)
		if (s->gone[i])
			printf("storm: consumer process %u gone before the "
			       "release: %s\n", i, s->fate[i]);
	printf("storm: consumer agent after open and register, before "
	       "connecting: mem_bytes=%llu fds=%llu; process RSS per rank "
	       "opened: anon %llu KiB (%llu KiB of it the tool's buffers), "
	       "file %llu KiB; %llu agents open, "
	       "%llu failed to\n",
	       (unsigned long long)s->cons_mem,
	       (unsigned long long)s->cons_fds,
	       (unsigned long long)(s->cons_anon / 1024),
	       (unsigned long long)(s->cons_buf / 1024),
	       (unsigned long long)(s->cons_file / 1024),
	       (unsigned long long)s->opened, (unsigned long long)s->broken);

	for (r = 0; r < s->R && !s->fatal; r++) {
		struct res *x = &s->res[(size_t)r * s->N];
		uint64_t dl;

		s->cur = r;
		now = tool_now_ns();
		/* Late enough for a rank done at the round's deadline to
		 * notify; early enough that a failed engine's request is
		 * reported before the next round expects its own. */
		s->exp_dl = now + s->round_ns + 10 * SEC;
		/* Streamed: every request's prefill starts over, from the
		 * background; the last round's readers are all reported. */
		for (i = 0; o.stream && i < pmem.nregions; i++)
			memcpy(pmem.buf[i], s->pbg.buf[i], pmem.size[i]);
		s->layer_pub = 0;
		for (e = 0; e < s->E; e++) {
			err = kvp_agent_expect(s->prod, CONSUMER_ENGINE + e + 1,
					       r + 1, s->exp_dl);
			s->expected[e] = !err;
			if (err) {
				s->nexpect_failed[r]++;
				add_kind(s, "expect", err, 0, 0, e * TP, r, "");
			}
		}
		s->t_go[r] = tool_now_ns();
		cpu_go = cpu_ns();
		s->phase = 1;
		tell_all(s, 'g');
		for (i = 0; i < s->P; i++)
			if (s->gone[i])
				fail_proc_ranks(s, i, r);
		dl = s->t_go[r] + s->round_ns + 15 * SEC;
		if (!pump(s, round_reported, dl))
			for (i = 0; i < s->N; i++)
				if (!x[i].have) {
					x[i].have = 1;
					s->nres[r]++;
					add_kind(s, "no report", -ETIMEDOUT, 0,
						 0, i, r, "");
				}
		cpu_round = cpu_ns() - cpu_go;
		wall_round = tool_now_ns() - s->t_go[r];
		if (!r) {
			s->mem_ready = s->st.mem_bytes;
			s->peers_ready = s->st.peers;
			if (count_fds() > s->peak_fds)
				s->peak_fds = count_fds();
		}
		now = tool_now_ns();
		dl = s->exp_dl + 10 * SEC;
		if (dl < now + 30 * SEC)
			dl = now + 30 * SEC;
		(void)pump(s, round_settled, dl);
		for (i = 0, nt = 0; i < s->N; i++)
			if (x[i].ok)
				t[nt++] = x[i].t_ns - s->t_go[r];
		qsort(t, nt, sizeof(*t), tool_cmp_u64);
		printf("storm: round %u: %u of %u ranks pulled and verified, "
		       "last at %.1f ms, p50 %.1f ms, p99 %.1f ms; producer: "
		       "%u of %u requests released, %u expired, qps=%llu "
		       "peers=%llu refused=%llu evictions=%llu; the "
		       "producer's CPU time %.1f s of %.1f s\n",
		       r, nt, s->N, nt ? t[nt - 1] / 1e6 : -1.0,
		       pct_ms(t, nt, 50), pct_ms(t, nt, 99), s->nreleased[r],
		       s->E, s->nexpired[r], (unsigned long long)s->st.qps,
		       (unsigned long long)s->st.peers,
		       (unsigned long long)s->st.refused,
		       (unsigned long long)(s->st.evictions +
					    s->st.idle_closes),
		       cpu_round / 1e9, wall_round / 1e9);
		if (o.stream)
			printf("storm: round %u: streamed: %u of %u layers "
			       "published, %u pulls FAILED for a stall; "
			       "producer so far: publishes=%llu follows=%llu "
			       "progress_writes=%llu notes_dropped=%llu\n",
			       r, s->layer_pub, o.layers, s->nstalls[r],
			       (unsigned long long)s->st.publishes,
			       (unsigned long long)s->st.follows,
			       (unsigned long long)s->st.progress_writes,
			       (unsigned long long)s->st.notes_dropped);
	}

out:
	/* The consumers close their agents; the producer keeps polling so
	 * that it sees them go, then a little more. */
	s->cur = s->R - 1;
	s->phase = 2;
	tell_all(s, 'q');
	if (s->prod) {
		(void)pump(s, all_gone, tool_now_ns() + 60 * SEC);
		now = tool_now_ns();
		(void)pump(s, never, now + SEC);
		(void)pump(s, producer_empty, now + 10 * SEC);
		/* Before reap() closes the control pipes: the same pipes
		 * are open as at open. */
		s->fds_end = count_fds();
		{
			uint64_t a, fl;

			rss(&a, &fl);
			s->rss_end = a + fl;
		}
	}
	reap(s);
	if (s->prod) {
		(void)pump(s, never, tool_now_ns() + 200 * MS);
		kvp_agent_get_stats(s->prod, &s->st);
	}

	/* Requests whose 8 ranks all pulled, never released. */
	for (r = 0; r < s->R; r++)
		for (e = 0; e < s->E; e++) {
			const struct res *x =
				&s->res[(size_t)r * s->N + e * TP];

			for (i = 0; i < TP && x[i].ok; i++)
				;
			if (i == TP && !s->released[(size_t)r * s->E + e]) {
				unrel++;
				add_kind(s, "not released", 0, 0, 0, e * TP,
					 r, "every rank pulled; no RELEASED");
			}
		}
	for (r = 0; r < s->R; r++)
		for (i = 0; i < s->N; i++) {
			const struct res *x = &s->res[(size_t)r * s->N + i];

			if (!x->ok)
				failures++;
			wrong += x->wrong;
		}
	for (r = 0; r < s->R; r++)
		failures += s->nexpect_failed[r];
	failures += unrel;
	for (i = 0, nt = 0; i < s->N; i++)
		if (s->res[i].ok)
			t[nt++] = s->res[i].t_ns - s->t_go[0];
	qsort(t, nt, sizeof(*t), tool_cmp_u64);
	if (nt == s->N && nt)
		all_ms = t[nt - 1] / 1e6;

	printf("storm: peak: qps=%llu peers=%llu fds=%ld mem_bytes=%llu "
	       "rss=%llu KiB (mem_bytes %llu once every first pull was in, "
	       "peers=%llu)\n",
	       (unsigned long long)s->peak_qps,
	       (unsigned long long)s->peak_peers, s->peak_fds,
	       (unsigned long long)s->peak_mem,
	       (unsigned long long)(s->rss_peak / 1024),
	       (unsigned long long)s->mem_ready,
	       (unsigned long long)s->peers_ready);
	printf("storm: consumer processes at the end of their fullest round: "
	       "RSS per rank anon %llu KiB, file %llu KiB (rxe maps each "
	       "queue pair's queues into the process)\n",
	       (unsigned long long)(s->cons_rss_anon / s->N / 1024),
	       (unsigned long long)(s->cons_rss_file / s->N / 1024));
	printf("storm: worst producer poll %.1f ms, %s at +%.1f s from the "
	       "first release; worst during the rounds %.1f ms; most CPU "
	       "time in one poll %.1f ms\n",
	       s->worst_poll_ns / 1e6,
	       s->worst_phase == 0 ? "before the rounds" :
	       s->worst_phase == 1 ? "during the rounds" :
				     "while the consumers closed",
	       s->t_go[0] && s->worst_at_ns >= s->t_go[0] ?
		       (s->worst_at_ns - s->t_go[0]) / 1e9 : 0.0,
	       s->worst_round_ns / 1e6, s->worst_cpu_ns / 1e6);
	printf("storm: end, consumers closed: qps=%llu peers=%llu fds=%ld "
	       "(%ld at open) mem_bytes=%llu rss=%llu KiB connects=%llu "
	       "disconnects=%llu; "
	       "DISCONNECTED events %llu, consumer engines down after a "
	       "verified pull (evicted or closed idle, as consumers saw it) "
	       "%llu, consumer handshake failures %llu, processes that "
	       "failed %u\n",
	       (unsigned long long)s->st.qps, (unsigned long long)s->st.peers,
	       s->prod ? s->fds_end : -1L, s->fds_open,
	       (unsigned long long)s->st.mem_bytes,
	       (unsigned long long)(s->rss_end / 1024),
	       (unsigned long long)s->st.connects,
	       (unsigned long long)s->st.disconnects,
	       (unsigned long long)s->disconnected_ev,
	       (unsigned long long)s->idle_downs,
	       (unsigned long long)s->hs_failures, s->failed_procs);
	if (s->reopens)
		printf("storm: reopens: %llu, a reopen's handshake (the "
		       "pull that found its engine down to ENGINE_UP, "
		       "kvp_engine_info.add_ns) %.1f ms on average, %.1f ms "
		       "at most\n",
		       (unsigned long long)s->reopens,
		       s->reopen_ns / 1e6 / s->reopens, s->reopen_max_ns / 1e6);
	for (r = 0, stalls = 0; r < s->R; r++)
		stalls += s->nstalls[r];
	if (o.stream)
		printf("storm: streamed: producer publishes=%llu follows=%llu "
		       "progress_writes=%llu notes_dropped=%llu, publishes "
		       "failed %llu; consumers: progress_seen=%llu, "
		       "stats.stalls=%llu, pulls FAILED for a stall %llu\n",
		       (unsigned long long)s->st.publishes,
		       (unsigned long long)s->st.follows,
		       (unsigned long long)s->st.progress_writes,
		       (unsigned long long)s->st.notes_dropped,
		       (unsigned long long)s->publish_failed,
		       (unsigned long long)s->progress_seen,
		       (unsigned long long)s->cons_stalls,
		       (unsigned long long)stalls);
	for (i = 0; i < s->P; i++)
		if (s->fate[i][0])
			printf("storm: consumer process %u: %s\n", i,
			       s->fate[i]);
	if (!s->nkinds) {
		printf("storm: errors: none\n");
	} else {
		printf("storm: errors:");
		for (i = 0; i < s->nkinds; i++) {
			const struct kind *k = &s->kinds[i];

			printf("%s %llu x %s %s", i ? ";" : "",
			       (unsigned long long)k->count, k->where,
			       tool_errname(k->err));
			if (k->reason)
				printf(" %s", kvp_reason_str(k->reason));
			if (k->peer_reason)
				printf(" (peer: %s)",
				       kvp_reason_str(k->peer_reason));
		}
		if (s->kinds_dropped)
			printf("; %llu more of other kinds",
			       (unsigned long long)s->kinds_dropped);
		printf("\n");
		for (i = 0; i < s->nkinds; i++)
			printf("storm: error e.g. rank %u round %u: "
			       "%s: %s%s%s\n",
			       s->kinds[i].rank, s->kinds[i].round,
			       s->kinds[i].where,
			       kvp_strerror(s->kinds[i].err),
			       s->kinds[i].why[0] ? ": " : "",
			       s->kinds[i].why);
	}
	if (s->prod && !s->st.qps && !s->peak_qps)
		printf("storm: note: the producer's stats.qps read 0 all along "
		       "(not reported by this library)\n");
	{
		uint64_t peers = s->peak_peers ? s->peak_peers : s->N;
		uint64_t mem = s->peak_peers ? s->peak_mem : s->mem_ready;

		printf("storm: peers=%u qps=%llu budget=%s all_ready_ms=%.1f "
		       "p50_ms=%.1f p99_ms=%.1f refused=%llu timeouts=%llu "
		       "worst_poll_ms=%.1f evictions=%llu reopens=%llu "
		       "bytes_per_peer=%lld wrong_bytes=%llu",
		       s->N, (unsigned long long)s->peak_qps, budget, all_ms,
		       pct_ms(t, nt, 50), pct_ms(t, nt, 99),
		       (unsigned long long)s->st.refused,
		       (unsigned long long)failures, s->worst_poll_ns / 1e6,
		       (unsigned long long)(s->st.evictions +
					    s->st.idle_closes),
		       (unsigned long long)s->reopens,
		       (long long)((int64_t)(mem - s->st0.mem_bytes) /
				   (int64_t)peers),
		       (unsigned long long)wrong);
		/* Appended, so that the bulk line reads as before. */
		if (o.stream)
			printf(" mode=stream stalls=%llu",
			       (unsigned long long)stalls);
		printf("\n");
	}
	ok = !s->fatal && !failures && !wrong && !s->failed_procs &&
	     !s->publish_failed;
	kvp_agent_close(s->prod);
	kvt_mem_free(&pmem);
	kvt_mem_free(&s->pbg);
	kvp_layout_destroy(pl);
	free(s->res);
	free(s->released);
	free(s->expected);
	free(s);
	free(t);
	return ok ? 0 : 1;
}
