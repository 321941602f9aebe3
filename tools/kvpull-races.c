// SPDX-License-Identifier: MIT
/*
 * kvpull-races: pulls whose producer lets go of the request at random
 * times before, during and after the consumer's READs (issue 34). DONE is
 * a promise that every byte is the one the producer wrote for that
 * request and held for it while it was read; this counts the DONEs that
 * break it. Public API only.
 *
 *   kvpull-races [--trials N] [--seed S] [--typical-us T] [--lease-off]
 *                [--window W] [--read-window R] [--timeout S]
 *                [--addr IP] [--port N]
 *
 * --read-window R: the consumer's kvp_agent_attr.read_window (READs in
 * flight per queue pair; 0, the default: the library's, which is no
 * window on a loopback, as here). With a window, a request's lease READ
 * waits behind at most R READs of other requests, not behind every READ
 * they posted.
 *
 * One producer agent (this process, the one rank of a TP 1 engine,
 * default attributes) and one consumer agent (a process forked before
 * anything is opened, default attributes; TP 1, same layout), on
 * llama-3.1-8b cut to 2 layers (flash_hnd, 16-token blocks: 4 regions, a
 * block a 32 KiB page in each); a request is 8 blocks, 1,048,576 bytes.
 * The producer's blocks form 16 sets of 8 (set k: blocks k + 16 j), the
 * consumer's 8 slots of 8 (slot s: blocks s + 8 j): at most 8 trials
 * (--window) are in flight, and each set serves trial after trial.
 *
 * Trial i pulls request id i (1..N). Its bytes: every 8-byte word of page
 * (view v, position j in the request) is a function of (i, v, j, the
 * word's offset), so a byte of any other request, or a mix, is told
 * apart. The producer takes a free set, and lets go of it in one of four
 * ways, drawn with drand48() from --seed before anything runs, with a
 * fraction f uniform in [0, 2):
 *
 *   expiry (38%)  writes request i's pattern into the set, expects
 *                 (consumer engine, i) with a deadline f x T away;
 *   never (20%)   expects nothing: the set holds another request's bytes,
 *                 and is rewritten f x T after the go;
 *   other (20%)   writes request i's pattern, expects (another consumer
 *                 engine, i) (one never connected) with a deadline f x T
 *                 away;
 *   clean (22%)   writes request i's pattern, expects (consumer engine,
 *                 i) 60 s away: untouched until RELEASED.
 *
 * then tells the consumer to pull i (kvp_agent_pull_from()). On RELEASED
 * or EXPIRED, and for never at its time, it lets go: it writes at once
 * another request's pattern (i's reuse pattern) into the set and frees it
 * for the next trial. T, the typical pull, is the median time from the
 * expect to the consumer's DONE over the last 32 clean pulls, the first
 * 32 of them warm-up pulls run before the trials (ids 2^40 + k, not
 * counted): deadlines follow the pace of the moment, which on a shared
 * machine varies several times over within a run; --typical-us fixes it
 * instead. The consumer, on DONE, checks
 * every byte of the request's local blocks (all 8 pages in each region)
 * against request i's pattern (at setup it checks that those pages are
 * exactly the bytes kvtest.h says a request writes). Trials overlap: the
 * producer starts one whenever fewer than --window are at the consumer
 * and a set is free, one per pass of its loop, which polls its agent in between, so
 * that an EXPIRED waits for at most one set's writing. The ways and
 * fractions are the same for a seed; which set a trial gets, and when,
 * depend on the run. A request's size was not cut: 10,000 trials take
 * about 2.5 minutes in the soft-RoCE VM.
 *
 * --lease-off sets KVP_LEASE_OFF=1 in the consumer process only, before
 * its kvp_agent_open() (the library then skips its lease check: the
 * unchecked run of scripts/rdma-bench.sh --races); otherwise the tool
 * removes the variable from its environment.
 *
 * Every wait is bounded: the consumer's setup 60 s; a pull with no DONE
 * or FAILED 60 s after its GO (accepted or not by then); an
 * expected request with no RELEASED or EXPIRED 15 s past its deadline; no
 * trial finished for 60 s; --timeout for the whole run (default 300 +
 * N / 20 s), with an alarm() 180 s later. Any of those ends the run: the
 * figures are printed and the exit status is 1.
 *
 * Printed: the setup; T as the trials started (p50, min, max); a line
 * per way,
 *   races: way=W trials=n released=a expired=b done_ok=c done_stale=d
 *     failed=e refused=r stale_bytes=B letgo_before=x letgo_during=y
 *     letgo_after=z stale_letgo_{before,during,after}=..
 *     failed_letgo_{before,during,after}=..
 * (done_ok: DONE with every byte request i's; refused: the pull call
 * refused; letgo_*: when the producer let go, against the consumer's
 * pull call and the DONE or FAILED event it saw: before the call, between
 * them, after the event; stale_letgo_*, failed_letgo_*: the same for the
 * done_stale and the FAILED ones); the FAILED events by way, errno and
 * reason; the agents' counters; how long after its deadline the producer
 * began to rewrite an expired set (its reaction); the clean DONEs' times (kvp_event.elapsed_ns, pull to the last READ's
 * completion; and the pull call to the event as the tool saw it); then
 *
 *   races: trials=N raced=R done_stale=S failed_stale=F done_clean=D
 *     failed_clean=C p50_done_us=X check=on|off
 *
 * raced: trials of the ways that let go (expiry, never, other), whatever
 * their outcome; done_stale: DONEs with any byte that is not request i's
 * (any way: a clean one would be a bug of its own, and its way line says);
 * failed_stale: FAILED in a raced trial; done_clean, failed_clean: DONE
 * and FAILED in clean trials; p50_done_us: the median of the clean
 * DONEs' elapsed_ns, microseconds; check: off with --lease-off. Exit
 * status: 0 when it ran (whatever the figures); 1 when a bound above
 * was hit, a pull was refused, an expect failed or setup failed; 2 for
 * bad arguments. scripts/rdma-bench.sh --races runs it twice in one
 * soft-RoCE VM boot, checked and with --lease-off, and prints one line.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvpull.h"
#include "kvtest.h"
#include "rdma_tool.h"

#define PROG "kvpull-races"
#define MODEL "llama-3.1-8b"
#define LAYERS 2
#define NIDS 8	     /* blocks per request */
#define WINDOW 8     /* the consumer's slots: --window at most */
#define NSETS 16     /* the producer's block sets */
#define MAX_VIEWS 16
#define PRODUCER_ENGINE 0x7261636550ull
#define CONSUMER_ENGINE 0x7261636543ull
#define OTHER_ENGINE 0x726163654full /* expected for, never connected */
#define WARMUP 32
#define RING 32	 /* T: the median of the last RING clean pulls */
#define WARM_ID (1ull << 40)	 /* warm-up k pulls WARM_ID + k */
#define REUSE_BIT (1ull << 48)	 /* what a let-go writes: i | REUSE_BIT */
#define MAX_TRIALS 1000000
#define CLEAN_S 60	/* a clean trial's deadline */
#define PULL_S 60	/* a pull's bound at the consumer */
#define LATE_S 15	/* an expected request's event past its deadline */
#define STUCK_S 60	/* no trial finished */
#define MS 1000000ull
#define SEC 1000000000ull

enum way { WAY_EXPIRY, WAY_NEVER, WAY_OTHER, WAY_CLEAN, NWAYS };
static const char *const way_names[NWAYS] = { "expiry", "never", "other",
					      "clean" };
/* Shares, percent, in way order. */
static const unsigned way_pct[NWAYS] = { 38, 20, 20, 22 };

struct opts {
	const char *addr;
	uint32_t trials, seed, typical_us, lease_off, timeout_s, window;
	uint32_t read_window; /* the consumer's kvp_agent_attr.read_window */
	uint16_t port;
};

/* Between the processes, one write() each (below PIPE_BUF). */
enum { M_START = 1, M_GO, M_QUIT, M_READY, M_RESULT, M_FINAL };
enum { R_DONE = 1, R_FAILED, R_REFUSED, R_TIMEOUT };

struct msg {
	uint32_t type;
	uint32_t set;	  /* GO: the producer's block set */
	uint64_t req;	  /* GO, RESULT */
	uint32_t outcome; /* RESULT: R_* */
	int32_t status;	  /* RESULT: the event's or call's -errno; READY,
			   * FINAL: 0 or the setup's */
	uint32_t reason, peer_reason;
	uint64_t t_pull;  /* RESULT: before the accepted pull call */
	uint64_t t_event; /* RESULT: the DONE or FAILED event, as polled */
	uint64_t elapsed; /* RESULT: DONE's elapsed_ns */
	uint64_t wrong;	  /* RESULT: bytes not request req's */
	/* FINAL: the consumer's stats.pulls, done, failed, reads,
	 * read_bytes, engine downs seen (status, reason and why: the
	 * first's) */
	uint64_t a, b, c, d, e, f;
	char why[KVP_WHY_LEN];
};

/* ---- layouts, pages and patterns: both sides ---------------------------- */

/* A view's block pages: block b's at offset + b * stride, len bytes. */
struct pages {
	uint32_t n;
	struct {
		uint32_t region;
		uint64_t offset, stride, len;
	} v[MAX_VIEWS];
};

/* The extent of each view's page: where its fields' last element ends.
 * Returns 0, or -1 for a layout this tool does not cover. */
static int get_pages(const kvp_layout *l, struct pages *p)
{
	struct kvp_layout_info li;
	uint32_t i, d, view;

	kvp_layout_get_info(l, &li);
	if (li.nviews > MAX_VIEWS || li.ngroups != 1)
		return -1;
	memset(p, 0, sizeof(*p));
	p->n = li.nviews;
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		if (kvp_layout_get_view(l, i, &v))
			return -1;
		p->v[i].region = v.region;
		p->v[i].offset = v.offset;
		p->v[i].stride = v.stride;
	}
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		uint64_t end;

		if (kvp_layout_get_field(l, i, &view, &f) || view >= p->n)
			return -1;
		end = f.offset + f.elem_size;
		for (d = 0; d < f.ndim; d++)
			end += (uint64_t)(f.dim[d].size - 1) * f.dim[d].stride;
		if (end > p->v[view].len)
			p->v[view].len = end;
	}
	return 0;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 31);
}

/* The seed of request req's page (view, pos); word k of the page is
 * word(seed, k): seeds differ between requests, so every word does. */
static uint64_t page_seed(uint64_t req, uint32_t view, uint32_t pos)
{
	return mix(mix(mix(0x72616365ull, req), view), pos);
}

static uint64_t word(uint64_t seed, uint64_t k)
{
	return seed ^ ((k + 1) * 0x9e3779b97f4a7c15ull);
}

static void fill_page(uint8_t *p, uint64_t len, uint64_t seed)
{
	uint64_t k, w;

	for (k = 0; k < len / 8; k++) {
		w = word(seed, k);
		memcpy(p + 8 * k, &w, 8);
	}
	w = word(seed, k);
	memcpy(p + 8 * k, &w, len % 8);
}

/* Bytes of the page that differ from request req's. */
static uint64_t check_page(const uint8_t *p, uint64_t len, uint64_t seed)
{
	uint64_t k, w, x, wrong = 0;
	uint32_t b;

	for (k = 0; k <= len / 8; k++) {
		uint32_t n = k < len / 8 ? 8 : (uint32_t)(len % 8);

		w = word(seed, k);
		x = 0;
		memcpy(&x, p + 8 * k, n);
		if (n < 8)
			w &= (1ull << (8 * n)) - 1;
		if (x == w)
			continue;
		for (b = 0; b < n; b++)
			wrong += (uint8_t)(x >> (8 * b)) !=
				 (uint8_t)(w >> (8 * b));
	}
	return wrong;
}

/* Writes request req's pattern into the blocks ids[0..NIDS) of mem. */
static void fill_req(const struct pages *p, struct kvt_mem *mem,
		     const uint32_t *ids, uint64_t req)
{
	uint32_t v, j;

	for (v = 0; v < p->n; v++)
		for (j = 0; j < NIDS; j++)
			fill_page(mem->buf[p->v[v].region] + p->v[v].offset +
					  ids[j] * p->v[v].stride,
				  p->v[v].len, page_seed(req, v, j));
}

static uint64_t check_req(const struct pages *p, const struct kvt_mem *mem,
			  const uint32_t *ids, uint64_t req)
{
	uint64_t wrong = 0;
	uint32_t v, j;

	for (v = 0; v < p->n; v++)
		for (j = 0; j < NIDS; j++)
			wrong += check_page(mem->buf[p->v[v].region] +
						    p->v[v].offset +
						    ids[j] * p->v[v].stride,
					    p->v[v].len, page_seed(req, v, j));
	return wrong;
}

static void set_ids(uint32_t set, uint32_t *rid)
{
	uint32_t j;

	for (j = 0; j < NIDS; j++)
		rid[j] = set + NSETS * j;
}

static void slot_ids(uint32_t slot, uint32_t *lid)
{
	uint32_t j;

	for (j = 0; j < NIDS; j++)
		lid[j] = slot + WINDOW * j;
}

/* One record, all or nothing; -1 when the peer is gone. */
static int send_msg(int fd, const struct msg *m)
{
	ssize_t k;

	do
		k = write(fd, m, sizeof(*m));
	while (k < 0 && errno == EINTR);
	return k == (ssize_t)sizeof(*m) ? 0 : -1;
}

/* Reads what is there into buf/len (a non-blocking fd); returns 1 and a
 * whole record in *m, 0 when none is complete yet, -1 at EOF or error. */
static int recv_msg(int fd, uint8_t *buf, size_t *len, struct msg *m)
{
	ssize_t k;

	while (*len < sizeof(*m)) {
		k = read(fd, buf + *len, sizeof(*m) - *len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return 0;
		if (k <= 0)
			return -1;
		*len += (size_t)k;
	}
	memcpy(m, buf, sizeof(*m));
	*len = 0;
	return 1;
}

/* Sleeps on the agent's fds (a may be NULL) and fd until one is readable
 * or max_ns has passed; not at all when the agent has events waiting. */
static void sleep_on(kvp_agent *a, int fd, uint64_t max_ns)
{
	struct pollfd w[KVP_AGENT_FDS + 1];
	int fds[KVP_AGENT_FDS], k = 0, i, err;
	uint64_t now = tool_now_ns(), wake = UINT64_MAX;

	err = a ? kvp_agent_arm(a, &wake) : -EINVAL;
	if (err > 0)
		return;
	if (!err && wake < now + max_ns)
		max_ns = wake > now ? wake - now : 0;
	if (a && kvp_agent_fds(a, fds, KVP_AGENT_FDS) == KVP_AGENT_FDS)
		for (i = 0; i < KVP_AGENT_FDS; i++) {
			w[k].fd = fds[i];
			w[k].events = POLLIN;
			w[k++].revents = 0;
		}
	w[k].fd = fd;
	w[k].events = POLLIN;
	w[k++].revents = 0;
	(void)poll(w, (nfds_t)k, max_ns ? (int)((max_ns + MS - 1) / MS) : 0);
}

/* ---- the consumer process ------------------------------------------------ */

struct slot {
	int busy;    /* a GO came for it, no RESULT sent yet */
	int pending; /* the pull is not accepted yet (retried) */
	int dead;    /* timed out: its memory may still be written */
	uint64_t req, t_go, t_pull;
	uint64_t t_event; /* the poll that returned its event; 0: none */
	uint32_t lid[NIDS], rid[NIDS];
	struct kvp_ids ids;
};

struct cons {
	const struct opts *o;
	int ctl, rep;
	kvp_agent *a;
	uint32_t h;
	struct pages pg;
	struct kvt_mem mem;
	struct slot s[WINDOW];
	uint64_t downs;
	/* The first ENGINE_DOWN: status, reason, the engine's account. */
	int32_t down_status;
	uint32_t down_reason;
	char down_why[KVP_WHY_LEN];
};

static void cons_result(struct cons *c, struct slot *s, uint32_t outcome,
			int32_t status, uint32_t reason, uint32_t peer_reason,
			uint64_t elapsed, uint64_t wrong, const char *why)
{
	struct msg m;

	memset(&m, 0, sizeof(m));
	m.type = M_RESULT;
	m.req = s->req;
	m.outcome = outcome;
	m.status = status;
	m.reason = reason;
	m.peer_reason = peer_reason;
	m.t_pull = s->t_pull;
	m.t_event = s->t_event ? s->t_event : tool_now_ns();
	m.elapsed = elapsed;
	m.wrong = wrong;
	snprintf(m.why, sizeof(m.why), "%s", why ? why : "");
	if (send_msg(c->rep, &m))
		_exit(3); /* the producer is gone */
	s->busy = s->pending = 0;
	s->t_event = 0;
}

static struct slot *slot_of(struct cons *c, uint64_t req)
{
	uint32_t i;

	for (i = 0; i < WINDOW; i++)
		if (c->s[i].busy && !c->s[i].pending && c->s[i].req == req)
			return &c->s[i];
	return NULL;
}

/* Compares what the layout says a request writes (kvtest's need map)
 * with the pages this tool checks: the same bytes, each once. */
static int check_pages(const struct cons *c, const kvp_layout *local,
		       const kvp_layout *remote)
{
	struct kvt_mem img = { 0 }, need = { 0 };
	uint32_t lid[NIDS], rid[NIDS], v, j, r;
	struct kvp_ids ids = { .local = lid, .remote = rid, .nlocal = NIDS,
			       .nremote = NIDS };
	uint64_t o, bad = 0, in = 0, marked = 0;
	int ret = -1;

	slot_ids(WINDOW - 1, lid);
	set_ids(NSETS - 1, rid);
	if (kvt_mem_like(&img, &c->mem, 0) || kvt_mem_like(&need, &c->mem, 0))
		goto out;
	kvt_expect_consumer(local, remote, &img, &need, &ids);
	for (v = 0; v < c->pg.n; v++)
		for (j = 0; j < NIDS; j++) {
			uint8_t *p = need.buf[c->pg.v[v].region] +
				     c->pg.v[v].offset +
				     lid[j] * c->pg.v[v].stride;

			for (o = 0; o < c->pg.v[v].len; o++) {
				bad += p[o] != 1;
				p[o] = 0;
			}
			in += c->pg.v[v].len;
		}
	for (r = 0; r < need.nregions; r++)
		for (o = 0; o < need.size[r]; o++)
			marked += need.buf[r][o] != 0;
	ret = bad || marked || !in ? -1 : 0;
out:
	kvt_mem_free(&img);
	kvt_mem_free(&need);
	return ret;
}

static int cons_setup(struct cons *c, char *why, size_t n)
{
	struct kvp_agent_attr at;
	kvp_layout *l, *remote;
	int err;

	l = tool_model_layout(MODEL, LAYERS, 1, 0, CONSUMER_ENGINE,
			      WINDOW * NIDS);
	remote = tool_model_layout(MODEL, LAYERS, 1, 0, PRODUCER_ENGINE,
				   NSETS * NIDS);
	if (!l || !remote || kvt_mem_alloc(l, &c->mem) ||
	    get_pages(l, &c->pg)) {
		snprintf(why, n, "layout or memory");
		err = -ENOMEM;
		goto out;
	}
	if (check_pages(c, l, remote)) {
		snprintf(why, n, "the pages checked are not the bytes a "
				 "request writes");
		err = -EINVAL;
		goto out;
	}
	kvt_fill_background(&c->mem, 34);
	if (c->o->lease_off)
		setenv("KVP_LEASE_OFF", "1", 1);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = c->o->addr;
	at.read_window = c->o->read_window;
	err = tool_agent_open(&at, &c->mem, &c->a);
	if (err) {
		c->a = NULL;
		snprintf(why, n, "kvp_agent_open or register: %s",
			 kvp_strerror(err));
		goto out;
	}
	err = tool_add_engine(c->a, c->o->addr, c->o->port, 1, &c->h);
	if (err)
		snprintf(why, n, "adding the producer engine: %s",
			 kvp_strerror(err));
out:
	kvp_layout_destroy(l);
	kvp_layout_destroy(remote);
	return err;
}

/* A GO: the request goes to a free slot, its pull to be tried. */
static int cons_go(struct cons *c, const struct msg *m)
{
	struct slot *s = NULL;
	uint32_t i;

	for (i = 0; i < WINDOW && !s; i++)
		if (!c->s[i].busy && !c->s[i].dead)
			s = &c->s[i];
	if (!s || m->set >= NSETS)
		return -1;
	s->busy = s->pending = 1;
	s->req = m->req;
	s->t_go = s->t_pull = tool_now_ns();
	slot_ids((uint32_t)(s - c->s), s->lid);
	set_ids(m->set, s->rid);
	s->ids.local = s->lid;
	s->ids.remote = s->rid;
	s->ids.nlocal = s->ids.nremote = NIDS;
	s->ids.tokens = 0;
	return 0;
}

/* Tries the pending pulls; returns 1 when one is to be retried. */
static int cons_pull(struct cons *c)
{
	char why[KVP_WHY_LEN];
	uint32_t i, reason;
	int err, again = 0;

	for (i = 0; i < WINDOW; i++) {
		struct slot *s = &c->s[i];

		if (!s->pending)
			continue;
		s->t_pull = tool_now_ns();
		err = kvp_agent_pull_from(c->a, c->h, s->req, &s->ids);
		if (!err) {
			s->pending = 0;
		} else if (err == -EAGAIN || err == -EBUSY ||
			   err == -ENOTCONN) {
			/* Reconnecting, or full: again soon. */
			again = 1;
		} else {
			reason = kvp_agent_last_error(c->a, why, sizeof(why));
			cons_result(c, s, R_REFUSED, err, reason, 0, 0, 0,
				    why);
		}
	}
	return again;
}

/* An event of the poll that returned at t: DONE's bytes are checked
 * (after t: the check's time is not the pull's). */
static void cons_event(struct cons *c, const struct kvp_event *e, uint64_t t)
{
	struct slot *s;

	switch (e->type) {
	case KVP_EV_DONE:
		s = slot_of(c, e->req_id);
		if (!s)
			break;
		s->t_event = t;
		cons_result(c, s, R_DONE, 0, 0, 0, e->elapsed_ns,
			    check_req(&c->pg, &c->mem, s->lid, s->req), NULL);
		break;
	case KVP_EV_FAILED:
		s = slot_of(c, e->req_id);
		if (!s)
			break;
		s->t_event = t;
		cons_result(c, s, R_FAILED, e->status, e->reason,
			    e->peer_reason, 0, 0, NULL);
		break;
	case KVP_EV_ENGINE_DOWN:
		if (!c->downs++) {
			struct kvp_engine_info ei;

			c->down_status = e->status;
			c->down_reason = e->reason;
			if (!kvp_agent_engine_info(c->a, c->h, &ei))
				snprintf(c->down_why, sizeof(c->down_why),
					 "%s", ei.why);
		}
		break;
	default:
		break;
	}
}

static int child_main(const struct opts *o, int ctl, int rep)
{
	struct kvp_agent_stats st;
	struct kvp_event ev[32];
	struct cons c;
	struct msg m;
	uint8_t buf[sizeof(struct msg)];
	size_t len = 0;
	uint64_t now, end;
	uint32_t i;
	int n, k, again = 0, quit = 0;

	memset(&c, 0, sizeof(c));
	c.o = o;
	c.ctl = ctl;
	c.rep = rep;
	(void)fcntl(ctl, F_SETFL, O_NONBLOCK);
	/* M_START: the producer listens. */
	end = tool_now_ns() + 60 * SEC;
	while ((k = recv_msg(ctl, buf, &len, &m)) == 0 &&
	       tool_now_ns() < end) {
		struct pollfd p = { .fd = ctl, .events = POLLIN };

		(void)poll(&p, 1, 100);
	}
	if (k <= 0 || m.type != M_START)
		return 1;
	memset(&m, 0, sizeof(m));
	m.type = M_READY;
	m.status = cons_setup(&c, m.why, sizeof(m.why));
	if (send_msg(rep, &m) || m.status)
		return 1;

	while (!quit) {
		while ((k = recv_msg(ctl, buf, &len, &m)) == 1) {
			if (m.type == M_QUIT) {
				quit = 1;
				break;
			}
			if (m.type != M_GO || cons_go(&c, &m)) {
				fprintf(stderr, PROG ": consumer: a GO with "
						"no free slot\n");
				return 1;
			}
			again = 1;
		}
		if (k < 0)
			break;
		if (again)
			again = cons_pull(&c);
		n = kvp_agent_poll(c.a, ev, 32);
		if (n < 0) {
			fprintf(stderr, PROG ": consumer: kvp_agent_poll: "
					"%s\n", kvp_strerror(n));
			return 1;
		}
		now = tool_now_ns();
		for (k = 0; k < n; k++)
			cons_event(&c, &ev[k], now);
		now = tool_now_ns();
		for (i = 0; i < WINDOW; i++) {
			struct slot *s = &c.s[i];

			if (!s->busy || now - s->t_go < PULL_S * SEC)
				continue;
			cons_result(&c, s, R_TIMEOUT, -ETIMEDOUT, 0, 0, 0, 0,
				    s->pending ? "never accepted" :
						 "no DONE or FAILED");
			s->dead = 1;
		}
		if (!n)
			sleep_on(c.a, ctl, again ? MS : 100 * MS);
	}

	memset(&m, 0, sizeof(m));
	m.type = M_FINAL;
	kvp_agent_get_stats(c.a, &st);
	m.a = st.pulls;
	m.b = st.done;
	m.c = st.failed;
	m.d = st.reads;
	m.e = st.read_bytes;
	m.f = c.downs;
	m.status = c.down_status;
	m.reason = c.down_reason;
	snprintf(m.why, sizeof(m.why), "%s", c.down_why);
	kvp_agent_close(c.a);
	kvt_mem_free(&c.mem);
	return send_msg(rep, &m) ? 1 : 0;
}

/* ---- the producer, in the parent ----------------------------------------- */

struct trial {
	uint64_t req;
	double frac;	  /* of T: the deadline, or never's let-go */
	uint8_t way;
	uint8_t started, held, let_go, reported, finished;
	uint8_t ev;	  /* what let it go: RELEASED, EXPIRED; 0: a time */
	uint8_t set;
	int32_t expect_err;
	uint64_t t_go, deadline, t_letgo;
	uint64_t T;	  /* T when it started */
	/* the consumer's RESULT */
	uint32_t outcome, reason, peer_reason;
	int32_t status;
	uint64_t t_pull, t_event, elapsed, wrong;
};

#define NO_TRIAL UINT32_MAX
#define MAX_KINDS 32

/* FAILED or refused pulls of one kind: way, errno, reason. */
struct kind {
	uint32_t way, outcome, reason;
	int32_t status;
	uint64_t count;
	char why[KVP_WHY_LEN];
};

struct run {
	const struct opts *o;
	kvp_agent *prod;
	kvp_layout *pl;
	struct pages pg;
	struct kvt_mem mem;
	struct trial *t; /* WARMUP warm-up pulls, then the N trials */
	uint32_t total, next, inflight, finished;
	uint32_t holder[NSETS];	/* the trial a set serves, or NO_TRIAL */
	uint32_t freeq[NSETS], free_head, nfree;
	uint64_t typical_ns, t_progress, t_end, t_start;
	uint64_t ring[RING]; /* the last clean pulls, expect to DONE seen */
	uint32_t nring, ring_pos;
	int warm_done;
	int ctl, rep, child_gone;
	pid_t pid;
	uint8_t rbuf[sizeof(struct msg)];
	size_t rlen;
	int fatal;
	char fatal_why[KVP_WHY_LEN + 64];
	uint64_t stray, disconnects, expect_failed, refused, timeouts;
	int32_t disc_status; /* the first DISCONNECTED's */
	uint32_t disc_reason;
	struct msg final;
	int have_final;
	struct kind kinds[MAX_KINDS];
	uint32_t nkinds;
};

static void fatal(struct run *r, const char *why)
{
	if (r->fatal)
		return;
	r->fatal = 1;
	snprintf(r->fatal_why, sizeof(r->fatal_why), "%s", why);
}

static uint32_t trial_of(const struct run *r, uint64_t req)
{
	uint64_t i;

	if (req >= WARM_ID && req < WARM_ID + WARMUP)
		return (uint32_t)(req - WARM_ID);
	i = req - 1 + WARMUP;
	return req && i < r->total ? (uint32_t)i : NO_TRIAL;
}

static void add_kind(struct run *r, const struct trial *t, const char *why)
{
	struct kind *k;
	uint32_t i;

	for (i = 0; i < r->nkinds; i++) {
		k = &r->kinds[i];
		if (k->way == t->way && k->outcome == t->outcome &&
		    k->status == t->status && k->reason == t->reason) {
			k->count++;
			return;
		}
	}
	if (r->nkinds == MAX_KINDS)
		return;
	k = &r->kinds[r->nkinds++];
	k->way = t->way;
	k->outcome = t->outcome;
	k->status = t->status;
	k->reason = t->reason;
	k->count = 1;
	snprintf(k->why, sizeof(k->why), "%s", why);
}

static void maybe_finished(struct run *r, struct trial *t)
{
	if (t->finished || !t->let_go || !t->reported)
		return;
	t->finished = 1;
	r->finished++;
	r->t_progress = tool_now_ns();
}

/* The producer lets go of trial t's set: another request's bytes at once,
 * and the set is free for the next trial. */
static void let_go(struct run *r, struct trial *t, uint8_t ev)
{
	uint32_t rid[NIDS];

	if (t->let_go)
		return;
	/* When the bytes start to change. */
	t->t_letgo = tool_now_ns();
	set_ids(t->set, rid);
	fill_req(&r->pg, &r->mem, rid, t->req | REUSE_BIT);
	t->let_go = 1;
	t->held = 0;
	t->ev = ev;
	r->holder[t->set] = NO_TRIAL;
	r->freeq[(r->free_head + r->nfree++) % NSETS] = t->set;
	maybe_finished(r, t);
}

static void start_trial(struct run *r)
{
	struct trial *t = &r->t[r->next];
	uint32_t rid[NIDS];
	uint64_t now, engine = CONSUMER_ENGINE;
	struct msg m;
	int err = 0;

	t->set = (uint8_t)r->freeq[r->free_head];
	r->free_head = (r->free_head + 1) % NSETS;
	r->nfree--;
	r->holder[t->set] = r->next;
	set_ids(t->set, rid);
	if (t->way != WAY_NEVER)
		fill_req(&r->pg, &r->mem, rid, t->req);
	now = tool_now_ns();
	t->t_go = now;
	t->T = r->typical_ns;
	t->deadline = now + (uint64_t)(t->frac * (double)r->typical_ns);
	if (t->way == WAY_CLEAN)
		t->deadline = now + CLEAN_S * SEC;
	if (t->way == WAY_OTHER)
		engine = OTHER_ENGINE;
	if (t->way != WAY_NEVER) {
		err = kvp_agent_expect(r->prod, engine, t->req, t->deadline);
		t->held = !err;
	}
	t->started = 1;
	r->next++;
	if (err) {
		/* Not held: let go at once; the run's status says. */
		t->expect_err = err;
		r->expect_failed++;
		let_go(r, t, 0);
	}
	memset(&m, 0, sizeof(m));
	m.type = M_GO;
	m.set = t->set;
	m.req = t->req;
	if (send_msg(r->ctl, &m))
		fatal(r, "the consumer process is gone");
	r->inflight++;
}

static void on_event(struct run *r, const struct kvp_event *e)
{
	uint32_t i;
	struct trial *t;

	if (e->type == KVP_EV_DISCONNECTED) {
		if (!r->disconnects++) {
			r->disc_status = e->status;
			r->disc_reason = e->reason;
		}
		return;
	}
	if (e->type != KVP_EV_RELEASED && e->type != KVP_EV_EXPIRED)
		return;
	i = trial_of(r, e->req_id);
	t = i == NO_TRIAL ? NULL : &r->t[i];
	if (!t || !t->held ||
	    e->engine_id != (t->way == WAY_OTHER ? OTHER_ENGINE :
						    CONSUMER_ENGINE)) {
		r->stray++;
		return;
	}
	let_go(r, t, (uint8_t)e->type);
}

/* Nearest rank, of n sorted values. */
static uint64_t pct(const uint64_t *v, uint32_t n, uint32_t p)
{
	uint64_t k = ((uint64_t)n * p + 99) / 100;

	return n ? v[k ? k - 1 : 0] : 0;
}


/* A clean pull's time, expect to DONE seen, goes into T (the median of
 * the last RING) unless --typical-us fixed it: deadlines follow the pace
 * of the moment, whatever else loads the machine. */
static void clean_pulled(struct run *r, const struct trial *t)
{
	uint64_t v[RING];

	if (t->outcome != R_DONE || t->t_event <= t->t_go)
		return;
	r->ring[r->ring_pos++ % RING] = t->t_event - t->t_go;
	if (r->nring < RING)
		r->nring++;
	if (r->o->typical_us)
		return;
	memcpy(v, r->ring, r->nring * sizeof(*v));
	qsort(v, r->nring, sizeof(*v), tool_cmp_u64);
	r->typical_ns = pct(v, r->nring, 50);
}

static void on_msg(struct run *r, const struct msg *m)
{
	char why[KVP_WHY_LEN + 64];
	struct trial *t;
	uint32_t i;

	if (m->type == M_FINAL) {
		r->final = *m;
		r->have_final = 1;
		return;
	}
	if (m->type != M_RESULT)
		return;
	i = trial_of(r, m->req);
	t = i == NO_TRIAL ? NULL : &r->t[i];
	if (!t || !t->started || t->reported) {
		fatal(r, "a result for a request not pulled");
		return;
	}
	t->reported = 1;
	t->outcome = m->outcome;
	t->status = m->status;
	t->reason = m->reason;
	t->peer_reason = m->peer_reason;
	t->t_pull = m->t_pull;
	t->t_event = m->t_event;
	t->elapsed = m->elapsed;
	t->wrong = m->wrong;
	r->inflight--;
	r->refused += m->outcome == R_REFUSED;
	if (m->outcome == R_TIMEOUT) {
		r->timeouts++;
		snprintf(why, sizeof(why), "request %llu: %s in %d s",
			 (unsigned long long)m->req, m->why, PULL_S);
		fatal(r, why);
	}
	if (m->outcome != R_DONE && i >= WARMUP)
		add_kind(r, t, m->why);
	if (t->way == WAY_CLEAN)
		clean_pulled(r, t);
	maybe_finished(r, t);
}

/* Reads the consumer's records; returns how many came. */
static int read_msgs(struct run *r)
{
	struct msg m;
	int k, got = 0;

	while (!r->child_gone &&
	       (k = recv_msg(r->rep, r->rbuf, &r->rlen, &m)) != 0) {
		if (k < 0) {
			r->child_gone = 1;
			break;
		}
		on_msg(r, &m);
		got++;
	}
	return got;
}

/* never's let-go times, and the bound on each held request's event.
 * Returns the next time due. */
static uint64_t timers(struct run *r, uint64_t now)
{
	char why[128];
	uint64_t next = UINT64_MAX;
	uint32_t k;

	for (k = 0; k < NSETS; k++) {
		struct trial *t;

		if (r->holder[k] == NO_TRIAL)
			continue;
		t = &r->t[r->holder[k]];
		if (t->way == WAY_NEVER) {
			if (now >= t->deadline)
				let_go(r, t, 0);
			else if (t->deadline < next)
				next = t->deadline;
		} else if (t->held && now > t->deadline + LATE_S * SEC) {
			snprintf(why, sizeof(why), "request %llu: no RELEASED "
				 "or EXPIRED %d s past its deadline",
				 (unsigned long long)t->req, LATE_S);
			fatal(r, why);
		}
	}
	return next;
}

/* Runs the trials: the producer's loop. */
static void run_trials(struct run *r)
{
	struct kvp_event ev[32];
	uint64_t now, next;
	char why[64];
	int n, i, got, started;

	r->t_progress = tool_now_ns();
	while (!r->fatal && r->finished < r->total) {
		now = tool_now_ns();
		if (now > r->t_end) {
			fatal(r, "the run's --timeout passed");
			break;
		}
		if (now - r->t_progress > STUCK_S * SEC) {
			snprintf(why, sizeof(why), "no trial finished in %d s",
				 STUCK_S);
			fatal(r, why);
			break;
		}
		if (r->child_gone) {
			fatal(r, "the consumer process is gone");
			break;
		}
		/* The trials wait for T, from the whole warm-up. */
		if (r->next == WARMUP && r->finished == WARMUP &&
		    !r->warm_done) {
			r->warm_done = 1;
			if (r->nring < WARMUP / 2) {
				fatal(r, "fewer than half the warm-up pulls "
					 "DONE");
				break;
			}
		}
		/* One a pass: a poll between two sets' writes, so that an
		 * EXPIRED waits for at most one. */
		started = r->next < r->total && r->inflight < r->o->window &&
			  r->nfree && (r->next < WARMUP || r->warm_done);
		if (started)
			start_trial(r);
		n = kvp_agent_poll(r->prod, ev, 32);
		if (n < 0) {
			snprintf(why, sizeof(why), "producer: kvp_agent_poll: "
				 "%s", kvp_strerror(n));
			fatal(r, why);
			break;
		}
		for (i = 0; i < n; i++)
			on_event(r, &ev[i]);
		got = read_msgs(r);
		next = timers(r, tool_now_ns());
		if (n || got || started)
			continue;
		now = tool_now_ns();
		if (next > now + 100 * MS)
			next = now + 100 * MS;
		sleep_on(r->prod, r->rep, next > now ? next - now : 0);
	}
}

/* The consumer closes; the producer polls meanwhile (10 s at most). */
static void finish(struct run *r)
{
	struct kvp_event ev[32];
	uint64_t end = tool_now_ns() + 10 * SEC;
	struct msg m;
	pid_t k;
	int st;

	memset(&m, 0, sizeof(m));
	m.type = M_QUIT;
	if (r->ctl >= 0)
		(void)send_msg(r->ctl, &m);
	while (!r->child_gone && tool_now_ns() < end) {
		if (r->prod && kvp_agent_poll(r->prod, ev, 32) > 0)
			continue;
		if (!read_msgs(r))
			sleep_on(r->prod, r->rep, 20 * MS);
	}
	if (r->pid <= 0)
		return;
	while ((k = waitpid(r->pid, &st, WNOHANG)) == 0 &&
	       tool_now_ns() < end)
		usleep(10000);
	if (k != r->pid) {
		kill(r->pid, SIGKILL);
		(void)waitpid(r->pid, &st, 0);
		fatal(r, "the consumer process did not exit");
	} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fatal(r, "the consumer process failed");
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvpull-races [options]\n"
		"  --trials N      trials, at most %d [10000]\n"
		"  --seed S        drand48's seed for the ways and times [34]\n"
		"  --typical-us T  the typical pull, microseconds (deadlines and\n"
		"                  let-go times are 0-2x it) [0: the median of\n"
		"                  the last %d clean pulls, warm-up first]\n"
		"  --lease-off     KVP_LEASE_OFF=1 in the consumer process: the\n"
		"                  library's lease check off\n"
		"  --read-window R the consumer's READs in flight per queue pair\n"
		"                  (kvp_agent_attr.read_window) [0: the library's]\n"
		"  --window W      trials at the consumer at once, at most %d [%d]\n"
		"  --timeout S     bound on the run, seconds [300 + N/20]\n"
		"  --addr IP       the producer's address, also the consumer's\n"
		"                  source [$KVP_ADDR0]\n"
		"  --port N        the producer's port [24900]\n"
		"  --version       print the version and exit\n"
		"One producer agent lets go of the requests it is pulled from at\n"
		"random times (expiry, never expected, expected for another\n"
		"consumer engine) or holds them (clean); the consumer checks every\n"
		"byte of each DONE. The last line is\n"
		"  races: trials=N raced=R done_stale=S failed_stale=F\n"
		"    done_clean=D failed_clean=C p50_done_us=X check=on|off\n"
		"(scripts/rdma-bench.sh --races; tools/README.md).\n",
		MAX_TRIALS, WARMUP, WINDOW, WINDOW);
}

/* The trials' ways and fractions, from the seed alone. */
static int make_trials(struct run *r)
{
	uint32_t i, w, acc;
	double x;

	r->t = calloc(r->total, sizeof(*r->t));
	if (!r->t)
		return -1;
	srand48(r->o->seed);
	for (i = 0; i < r->total; i++) {
		struct trial *t = &r->t[i];

		if (i < WARMUP) {
			t->req = WARM_ID + i;
			t->way = WAY_CLEAN;
			continue;
		}
		t->req = i - WARMUP + 1;
		x = drand48() * 100;
		for (w = 0, acc = way_pct[0]; w < NWAYS - 1 && x >= acc; )
			acc += way_pct[++w];
		t->way = (uint8_t)w;
		t->frac = 2 * drand48();
	}
	return 0;
}

static int producer_open(struct run *r)
{
	uint32_t k, rid[NIDS];
	int err;

	r->pl = tool_model_layout(MODEL, LAYERS, 1, 0, PRODUCER_ENGINE,
				  NSETS * NIDS);
	if (!r->pl || kvt_mem_alloc(r->pl, &r->mem) || get_pages(r->pl, &r->pg))
		return -ENOMEM;
	/* Every set starts with some request's bytes: none of the trials'. */
	for (k = 0; k < NSETS; k++) {
		set_ids(k, rid);
		fill_req(&r->pg, &r->mem, rid, REUSE_BIT | k);
		r->holder[k] = NO_TRIAL;
		r->freeq[k] = k;
	}
	r->nfree = NSETS;
	err = tool_producer_open(r->pl, r->o->addr, r->o->port, 0, &r->mem,
				 &r->prod);
	if (err)
		r->prod = NULL;
	return err;
}

static int start_child(struct run *r)
{
	int c[2], p[2];

	fflush(NULL);
	if (pipe(c))
		return -1;
	if (pipe(p)) {
		close(c[0]);
		close(c[1]);
		return -1;
	}
	r->pid = fork();
	if (r->pid < 0)
		return -1;
	if (!r->pid) {
		close(c[1]);
		close(p[0]);
		signal(SIGPIPE, SIG_DFL);
		alarm(0);
		_exit(child_main(r->o, c[0], p[1]));
	}
	close(c[0]);
	close(p[1]);
	r->ctl = c[1];
	r->rep = p[0];
	(void)fcntl(r->rep, F_SETFL, O_NONBLOCK);
	return 0;
}

/* Waits for the consumer's READY (its agent up, the engine added). */
static int wait_ready(struct run *r)
{
	uint64_t end = tool_now_ns() + 90 * SEC;
	struct kvp_event ev[32];
	struct msg m;
	int k;

	memset(&m, 0, sizeof(m));
	m.type = M_START;
	if (send_msg(r->ctl, &m))
		return -1;
	while (tool_now_ns() < end) {
		k = recv_msg(r->rep, r->rbuf, &r->rlen, &m);
		if (k < 0)
			return -1;
		if (k && m.type == M_READY) {
			if (m.status)
				fprintf(stderr, PROG ": consumer: %s (%s)\n",
					m.why, kvp_strerror(m.status));
			return m.status ? -1 : 0;
		}
		if (kvp_agent_poll(r->prod, ev, 32) <= 0)
			sleep_on(r->prod, r->rep, 20 * MS);
	}
	fprintf(stderr, PROG ": the consumer was not ready in 90 s\n");
	return -1;
}

/* Where the producer let go, against the consumer's pull: 0 before the
 * call, 1 between the call and the event, 2 after the event. */
static int letgo_when(const struct trial *t)
{
	return t->t_letgo < t->t_pull ? 0 : t->t_letgo < t->t_event ? 1 : 2;
}

struct wstat {
	uint64_t n, released, expired, done_ok, done_stale, failed, refused;
	uint64_t stale_bytes, lg[3], slg[3], flg[3];
};

/* T as the trials started. */
static void typical_line(const struct run *r)
{
	uint64_t *v = calloc(r->total + 1, sizeof(*v));
	uint32_t i, n = 0;

	if (!v)
		return;
	for (i = WARMUP; i < r->total; i++)
		if (r->t[i].started)
			v[n++] = r->t[i].T;
	qsort(v, n, sizeof(*v), tool_cmp_u64);
	printf("races: T, the typical pull (%s): p50 %.1f us, min %.1f us, "
	       "max %.1f us as the trials started; deadlines and let-go "
	       "times 0-2 T away\n",
	       r->o->typical_us ? "--typical-us" :
				  "the median of the last 32 clean pulls, "
				  "expect to DONE, the warm-up's first",
	       pct(v, n, 50) / 1e3, n ? v[0] / 1e3 : 0.0,
	       n ? v[n - 1] / 1e3 : 0.0);
	free(v);
}

static void report(struct run *r, double secs)
{
	struct wstat w[NWAYS];
	struct kvp_agent_stats ps;
	uint64_t *el, *seen, *lag, raced = 0, stale = 0, fstale = 0;
	uint32_t i, ne = 0, nl = 0;

	memset(w, 0, sizeof(w));
	typical_line(r);
	el = calloc(r->total + 1, sizeof(*el));
	seen = calloc(r->total + 1, sizeof(*seen));
	lag = calloc(r->total + 1, sizeof(*lag));
	if (!el || !seen || !lag) {
		free(el);
		free(seen);
		free(lag);
		return;
	}
	for (i = WARMUP; i < r->total; i++) {
		const struct trial *t = &r->t[i];
		struct wstat *s = &w[t->way];

		if (!t->started)
			continue;
		s->n++;
		s->released += t->ev == KVP_EV_RELEASED;
		s->expired += t->ev == KVP_EV_EXPIRED;
		if (t->ev == KVP_EV_EXPIRED)
			lag[nl++] = t->t_letgo > t->deadline ?
					    t->t_letgo - t->deadline : 0;
		if (!t->reported)
			continue;
		if (t->outcome == R_DONE && !t->wrong)
			s->done_ok++;
		if (t->outcome == R_DONE && t->wrong)
			s->done_stale++;
		s->failed += t->outcome == R_FAILED;
		s->refused += t->outcome == R_REFUSED;
		s->stale_bytes += t->wrong;
		if (t->let_go && t->outcome != R_REFUSED &&
		    t->outcome != R_TIMEOUT) {
			s->lg[letgo_when(t)]++;
			if (t->outcome == R_DONE && t->wrong)
				s->slg[letgo_when(t)]++;
			if (t->outcome == R_FAILED)
				s->flg[letgo_when(t)]++;
		}
		if (t->way == WAY_CLEAN && t->outcome == R_DONE) {
			el[ne] = t->elapsed;
			seen[ne++] = t->t_event - t->t_pull;
		}
	}
	for (i = 0; i < NWAYS; i++) {
		const struct wstat *s = &w[i];

		printf("races: way=%s trials=%llu released=%llu expired=%llu "
		       "done_ok=%llu done_stale=%llu failed=%llu refused=%llu "
		       "stale_bytes=%llu letgo_before=%llu letgo_during=%llu "
		       "letgo_after=%llu stale_letgo_before=%llu "
		       "stale_letgo_during=%llu stale_letgo_after=%llu "
		       "failed_letgo_before=%llu failed_letgo_during=%llu "
		       "failed_letgo_after=%llu\n",
		       way_names[i], (unsigned long long)s->n,
		       (unsigned long long)s->released,
		       (unsigned long long)s->expired,
		       (unsigned long long)s->done_ok,
		       (unsigned long long)s->done_stale,
		       (unsigned long long)s->failed,
		       (unsigned long long)s->refused,
		       (unsigned long long)s->stale_bytes,
		       (unsigned long long)s->lg[0],
		       (unsigned long long)s->lg[1],
		       (unsigned long long)s->lg[2],
		       (unsigned long long)s->slg[0],
		       (unsigned long long)s->slg[1],
		       (unsigned long long)s->slg[2],
		       (unsigned long long)s->flg[0],
		       (unsigned long long)s->flg[1],
		       (unsigned long long)s->flg[2]);
		stale += s->done_stale;
		if (i != WAY_CLEAN) {
			raced += s->n;
			fstale += s->failed;
		}
	}
	if (!r->nkinds)
		printf("races: failed: none\n");
	for (i = 0; i < r->nkinds; i++) {
		const struct kind *k = &r->kinds[i];

		printf("races: %s: way=%s %llu x %s%s%s%s%s%s\n",
		       k->outcome == R_FAILED ? "failed" :
		       k->outcome == R_REFUSED ? "pull refused" : "timed out",
		       way_names[k->way], (unsigned long long)k->count,
		       tool_errname(k->status), k->reason ? " (" : "",
		       k->reason ? kvp_reason_str(k->reason) : "",
		       k->reason ? ")" : "", k->why[0] ? ": " : "", k->why);
	}
	kvp_agent_get_stats(r->prod, &ps);
	printf("races: producer: released=%llu expired=%llu notes_recv=%llu "
	       "notes_dropped=%llu; events matching no held request %llu, "
	       "expects refused %llu, consumer disconnects %llu",
	       (unsigned long long)ps.released, (unsigned long long)ps.expired,
	       (unsigned long long)ps.notes_recv,
	       (unsigned long long)ps.notes_dropped,
	       (unsigned long long)r->stray,
	       (unsigned long long)r->expect_failed,
	       (unsigned long long)r->disconnects);
	if (r->disconnects)
		printf(" (the first: %s, %s)", tool_errname(r->disc_status),
		       kvp_reason_str(r->disc_reason));
	printf("\n");
	if (r->have_final) {
		printf("races: consumer: pulls=%llu done=%llu failed=%llu "
		       "reads=%llu read_bytes=%llu engine_downs=%llu",
		       (unsigned long long)r->final.a,
		       (unsigned long long)r->final.b,
		       (unsigned long long)r->final.c,
		       (unsigned long long)r->final.d,
		       (unsigned long long)r->final.e,
		       (unsigned long long)r->final.f);
		if (r->final.f)
			printf(" (the first: %s, %s: %s)",
			       tool_errname(r->final.status),
			       kvp_reason_str(r->final.reason), r->final.why);
		printf("\n");
	}
	qsort(lag, nl, sizeof(*lag), tool_cmp_u64);
	printf("races: EXPIRED to the set rewritten, from the deadline: "
	       "p50 %.1f us, p99 %.1f us, max %.1f us (%u)\n",
	       pct(lag, nl, 50) / 1e3, pct(lag, nl, 99) / 1e3,
	       nl ? lag[nl - 1] / 1e3 : 0.0, nl);
	qsort(el, ne, sizeof(*el), tool_cmp_u64);
	qsort(seen, ne, sizeof(*seen), tool_cmp_u64);
	printf("races: clean DONEs: %u; elapsed_ns p50 %.1f us, p99 %.1f us; "
	       "pull call to the event, as the tool saw it: p50 %.1f us, "
	       "p99 %.1f us\n",
	       ne, pct(el, ne, 50) / 1e3, pct(el, ne, 99) / 1e3,
	       pct(seen, ne, 50) / 1e3, pct(seen, ne, 99) / 1e3);
	printf("races: %u trials in %.1f s (%.0f a second)%s%s\n",
	       r->total - WARMUP, secs, secs > 0 ? (r->total - WARMUP) / secs : 0,
	       r->fatal ? "; stopped: " : "", r->fatal ? r->fatal_why : "");
	printf("races: trials=%u raced=%llu done_stale=%llu failed_stale=%llu "
	       "done_clean=%llu failed_clean=%llu p50_done_us=%.1f "
	       "check=%s\n",
	       r->total - WARMUP, (unsigned long long)raced,
	       (unsigned long long)stale, (unsigned long long)fstale,
	       (unsigned long long)(w[WAY_CLEAN].done_ok +
				    w[WAY_CLEAN].done_stale),
	       (unsigned long long)w[WAY_CLEAN].failed, pct(el, ne, 50) / 1e3,
	       r->o->lease_off ? "off" : "on");
	free(el);
	free(seen);
	free(lag);
}

int main(int argc, char **argv)
{
	struct opts o = { .trials = 10000, .seed = 34, .port = 24900,
			  .window = WINDOW };
	const struct tool_opt opts[] = {
		{ "--trials", TOOL_COUNT, &o.trials, MAX_TRIALS },
		{ "--seed", TOOL_U32, &o.seed, 0 },
		{ "--typical-us", TOOL_U32, &o.typical_us, 10000000 },
		{ "--lease-off", TOOL_FLAG, &o.lease_off, 0 },
		{ "--window", TOOL_COUNT, &o.window, WINDOW },
		{ "--read-window", TOOL_U32, &o.read_window, 65535 },
		{ "--timeout", TOOL_COUNT, &o.timeout_s, 86400 },
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--port", TOOL_PORT, &o.port, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct run r;
	uint64_t i, bytes;
	double secs = 0;
	int err, ok;

	err = tool_parse_args(argc, argv, PROG, opts);
	if (err == TOOL_ARGS_HELP)
		usage(stdout);
	if (err)
		return err == TOOL_ARGS_BAD ? 2 : 0;
	if (tool_default_addr(PROG, &o.addr))
		return 2;
	if (!o.timeout_s)
		o.timeout_s = 300 + o.trials / 20;
	/* Only --lease-off switches the check off, in the consumer alone. */
	unsetenv("KVP_LEASE_OFF");

	memset(&r, 0, sizeof(r));
	r.o = &o;
	r.ctl = r.rep = -1;
	r.total = WARMUP + o.trials;
	if (make_trials(&r))
		return 1;
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	/* The last resort: every wait below has its own bound inside. */
	alarm(o.timeout_s + 180);

	printf("races: seed=%u trials=%u (and %d warm-up pulls), %d in flight "
	       "at most, %d block sets; %s cut to %d layers, flash_hnd, "
	       "16-token blocks, TP 1 -> 1, %d blocks a request; lease "
	       "check %s (KVP_LEASE_OFF%s in the consumer)\n",
	       o.seed, o.trials, WARMUP, o.window, NSETS, MODEL, LAYERS, NIDS,
	       o.lease_off ? "off" : "on", o.lease_off ? "=1" : " unset");
	printf("races: ways: expiry %u%%, never %u%%, other %u%%, clean %u%%:",
	       way_pct[WAY_EXPIRY], way_pct[WAY_NEVER], way_pct[WAY_OTHER],
	       way_pct[WAY_CLEAN]);
	{
		uint64_t n[NWAYS] = { 0 };

		for (i = WARMUP; i < r.total; i++)
			n[r.t[i].way]++;
		printf(" %llu, %llu, %llu, %llu trials\n",
		       (unsigned long long)n[0], (unsigned long long)n[1],
		       (unsigned long long)n[2], (unsigned long long)n[3]);
	}
	if (start_child(&r)) {
		fprintf(stderr, PROG ": fork or pipe: %s\n", strerror(errno));
		return 1;
	}
	err = producer_open(&r);
	if (err) {
		fprintf(stderr, PROG ": producer: %s\n", kvp_strerror(err));
		finish(&r);
		return 1;
	}
	if (wait_ready(&r)) {
		finish(&r);
		kvp_agent_close(r.prod);
		return 1;
	}
	for (i = 0, bytes = 0; i < r.pg.n; i++)
		bytes += r.pg.v[i].len * NIDS;
	printf("races: a request is %llu bytes (%u views, a block's page "
	       "in each), every one checked on DONE\n",
	       (unsigned long long)bytes, r.pg.n);
	if (o.typical_us)
		r.typical_ns = (uint64_t)o.typical_us * 1000;
	r.t_start = tool_now_ns();
	r.t_end = r.t_start + (uint64_t)o.timeout_s * SEC;
	/* The warm-up first: its pulls give T unless --typical-us did. */
	run_trials(&r);
	secs = (tool_now_ns() - r.t_start) / 1e9;
	for (i = 0, bytes = 0; i < WARMUP; i++)
		bytes += r.t[i].outcome == R_DONE && !r.t[i].wrong;
	printf("races: warm-up: %llu of %d pulls DONE with every byte "
	       "right\n", (unsigned long long)bytes, WARMUP);
	finish(&r);
	report(&r, secs);
	ok = !r.fatal && !r.refused && !r.expect_failed;
	kvp_agent_close(r.prod);
	kvt_mem_free(&r.mem);
	kvp_layout_destroy(r.pl);
	free(r.t);
	return ok ? 0 : 1;
}
