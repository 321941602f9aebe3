// SPDX-License-Identifier: MIT
/*
 * One consumer agent and many producer engines, over real verbs (soft-RoCE
 * in the VM), through kvp_agent_add_engine() and kvp_agent_pull_from():
 *  - a decode engine (TP 2) pulling interleaved requests from prefill
 *    engines of TP 1, 2 and 4 with other memory layouts and block sizes,
 *    and from a fourth engine of the TP 2 one's geometry (its plan cached);
 *  - a prefill engine killed mid-transfer: only its requests fail, the
 *    other engine's complete; restarted (new keys, same ports), it is
 *    reconnected on demand by the same agent;
 *  - a consumer engine killed mid-transfer: its requests expire on the
 *    producer, whose only connection slot then serves a new consumer
 *    engine;
 *  - a producer that stops polling: the consumer runs out of notification
 *    credit, fails the engine with -ETIMEDOUT after stall_ms, and
 *    reconnects once the producer polls again;
 *  - a consumer whose max_qps holds two engines, pulling from three: the
 *    least recently used idle engine is closed for the newcomer and
 *    reconnected on demand, an engine with a pull in flight never;
 *  - the same budget when the least recently used engine has every pull
 *    DONE but a notification still waiting for its producer's credit:
 *    it is not idle, the other engine makes room, and the producer
 *    releases every request once it polls again;
 *  - a producer with one rank slot: a consumer rank that reads requests
 *    the producer has not expected (nothing in its tables says so) is
 *    not evicted for a newcomer while it reads; the newcomer gets the
 *    slot once it is quiet.
 * Every rank is a process with its own agent; every consumer's whole
 * memory is checked byte for byte against the identity expectation.
 *
 *   rdma_engines [NAME-FILTER]
 *
 * Needs KVP_ADDR0, as set by scripts/rxe-vm.sh. Exits 77 without an RDMA
 * device.
 */
#include "rdma/harness.h"

#define MODEL "llama-3.1-8b" /* 8 KV heads: TP 1, 2 and 4 all work */
#define MAXI 24		     /* ids per list of one request */
#define MAXREQ 448
#define MAXENG 4
#define MAXKIDS 32
#define SEC 1000000000ull

static struct rt_env env;

/* An engine: a producer engine of a case, or a consumer engine. */
struct eng_spec {
	const char *name;
	uint64_t id;
	uint32_t tp, block, kv_layout, nblocks, layers;
	uint16_t port; /* producer rank r listens on env.port + port + r */
	uint32_t max_inflight, max_peers; /* producer agent, 0: defaults */
	uint32_t rq_depth, srq;		  /* producer agent, 0: defaults */
	uint32_t qps;	/* consumer agent: queue pairs per rank, 0: 2 */
};

struct req {
	uint64_t id;
	uint64_t consumer;   /* consumer engine the producer expects */
	uint32_t eng;	     /* producer engine: index in the case's list */
	uint32_t phase;	     /* bit: the producer incarnations expecting it */
	uint32_t deadline_s; /* the producer's deadline, from its expect */
	uint32_t tokens, nr, nl;
	uint32_t rid[MAXI], lid[MAXI];
};

/* llama-3.1-8b with `layers` layers, run as: */
#define ENG(nm, eid, tp_, blk, kvl, nb, ly, pt)                             \
	{ .name = nm, .id = eid, .tp = tp_, .block = blk, .kv_layout = kvl, \
	  .nblocks = nb, .layers = ly, .port = pt }
#define NHD KVP_KV_FLASH_NHD
#define HND KVP_KV_FLASH_HND

static struct kvp_ids ids_of(const struct req *r)
{
	struct kvp_ids x = { .local = r->lid,
			     .remote = r->rid,
			     .nlocal = r->nl,
			     .nremote = r->nr,
			     .tokens = r->tokens };

	return x;
}

static kvp_layout *spec_layout(const struct eng_spec *s, uint32_t rank)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(MODEL, &m))
		return NULL;
	m.layers = s->layers;
	memset(&e, 0, sizeof(e));
	e.engine_id = s->id;
	e.tp_size = s->tp;
	e.tp_rank = rank;
	e.block_tokens = s->block;
	e.num_blocks = s->nblocks;
	e.kv_layout = s->kv_layout;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

static uint32_t *shuffled(uint64_t *seed, uint32_t n)
{
	uint32_t *p = malloc((n + 1) * sizeof(*p)), i;

	for (i = 0; p && i < n; i++)
		p[i] = i;
	for (i = n; p && i > 1; i--) {
		uint32_t j = (uint32_t)(kvt_rand(seed) % i), t = p[i - 1];

		p[i - 1] = p[j];
		p[j] = t;
	}
	return p;
}

/* Draws the requests' blocks: local ids distinct across all requests (one
 * consumer memory holds them all), remote ids distinct across the requests
 * of one producer engine. Where an engine runs out, single-block requests
 * reuse its blocks: each such block holds the first tokens of every
 * request reading it, so one fill serves them all. */
static int make_blocks(struct req *rq, uint32_t n, const struct eng_spec *engs,
		       uint32_t neng, const struct eng_spec *cons,
		       uint64_t seed)
{
	uint32_t *lp = shuffled(&seed, cons->nblocks), *rp[MAXENG] = { 0 };
	uint32_t ru[MAXENG] = { 0 }, lu = 0, i, k, e;
	int ret = -1;

	for (e = 0; e < neng; e++)
		rp[e] = shuffled(&seed, engs[e].nblocks);
	for (i = 0; i < n; i++) {
		const struct eng_spec *p = &engs[rq[i].eng];
		struct req *r = &rq[i];

		if (!lp || !rp[r->eng])
			goto out;
		r->nr = (r->tokens + p->block - 1) / p->block;
		r->nl = (r->tokens + cons->block - 1) / cons->block;
		if (r->nr > MAXI || r->nl > MAXI || lu + r->nl > cons->nblocks)
			goto out;
		if (ru[r->eng] + r->nr > p->nblocks) {
			if (r->nr != 1)
				goto out;
			ru[r->eng] = 0;
		}
		for (k = 0; k < r->nr; k++)
			r->rid[k] = rp[r->eng][ru[r->eng]++];
		for (k = 0; k < r->nl; k++)
			r->lid[k] = lp[lu++];
	}
	ret = 0;
out:
	if (ret)
		fprintf(stderr, "  requests do not fit the engines' blocks\n");
	free(lp);
	for (e = 0; e < neng; e++)
		free(rp[e]);
	return ret;
}

/* ---- children ------------------------------------------------------------ */

static pid_t kids[MAXKIDS];
static int kst[MAXKIDS];
static uint8_t kreaped[MAXKIDS];
static uint32_t nkids;

static void kid_add(pid_t p)
{
	if (nkids < MAXKIDS) {
		kids[nkids] = p;
		kreaped[nkids] = 0;
		nkids++;
	}
}

static int kid_status(uint32_t i)
{
	int st = kst[i];

	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Reaps the children that exited; -1 if one of them failed. */
static int kids_check(void)
{
	uint32_t i;
	int bad = 0;

	for (i = 0; i < nkids; i++) {
		if (kreaped[i] || waitpid(kids[i], &kst[i], WNOHANG) <= 0)
			continue;
		kreaped[i] = 1;
		if (kid_status(i)) {
			fprintf(stderr, "  child %d ended with %d\n",
				(int)kids[i], kid_status(i));
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

/* Waits for child p to exit 0, up to secs; then SIGUSR1 (a backtrace),
 * SIGKILL, and failure. */
static int kid_wait(pid_t p, double secs)
{
	double end = rt_now() + secs;
	uint32_t i;

	for (i = 0; i < nkids && kids[i] != p; i++)
		;
	if (i == nkids)
		return -1;
	while (!kreaped[i]) {
		if (waitpid(p, &kst[i], WNOHANG) > 0) {
			kreaped[i] = 1;
			break;
		}
		if (rt_now() > end) {
			fprintf(stderr, "  child %d: timeout, killing\n", (int)p);
			kill(p, SIGUSR1);
			usleep(500000);
			kill(p, SIGKILL);
			if (waitpid(p, &kst[i], 0) == p)
				kreaped[i] = 1;
			return -1;
		}
		usleep(5000);
	}
	if (kid_status(i))
		fprintf(stderr, "  child %d ended with %d\n", (int)p,
			kid_status(i));
	return kid_status(i) ? -1 : 0;
}

/* SIGKILL, on purpose: reaped without counting as a failure. */
static void kid_kill(pid_t p)
{
	uint32_t i;

	for (i = 0; i < nkids; i++)
		if (kids[i] == p && !kreaped[i]) {
			kill(p, SIGKILL);
			waitpid(p, &kst[i], 0);
			kst[i] = 0;
			kreaped[i] = 1;
		}
}

/* The end of a case: nothing of it survives. */
static void kids_end(void)
{
	uint32_t i;

	for (i = 0; i < nkids; i++)
		if (!kreaped[i]) {
			kill(kids[i], SIGKILL);
			waitpid(kids[i], &kst[i], 0);
		}
	nkids = 0;
}

/* Reads n bytes from fd within secs; fails early when a child failed. */
static int wait_bytes(int fd, uint32_t n, double secs, const char *what)
{
	double end = rt_now() + secs;
	char c;

	while (n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, 100) > 0) {
			if (read(fd, &c, 1) != 1) {
				fprintf(stderr, "  %s: pipe closed\n", what);
				return -1;
			}
			n--;
			continue;
		}
		if (kids_check() || rt_now() > end) {
			fprintf(stderr, "  %s: %s\n", what,
				rt_now() > end ? "timeout" : "a child failed");
			return -1;
		}
	}
	return 0;
}

/* Opens or closes n pipes (pairs of fds, -1 when closed). */
static int pipes_open(int (*p)[2], uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		p[i][0] = p[i][1] = -1;
	for (i = 0; i < n; i++)
		if (pipe(p[i]))
			return -1;
	return 0;
}

static void pipes_close(int (*p)[2], uint32_t n)
{
	uint32_t i, k;

	for (i = 0; i < n; i++)
		for (k = 0; k < 2; k++)
			if (p[i][k] >= 0)
				close(p[i][k]);
}

static int put_bytes(int fd, uint32_t n)
{
	while (n--)
		if (write(fd, "s", 1) != 1)
			return -1;
	return 0;
}

/* Waits (a child) for one byte on fd while keeping agent `a` polled
 * through `poll_fn`. */
static int wait_byte_polling(int fd, double secs, int (*poll_fn)(void *),
			     void *arg)
{
	double end = rt_now() + secs;
	char c;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, 0) > 0)
			return read(fd, &c, 1) == 1 ? 0 : -1;
		if (poll_fn(arg) < 0 || rt_now() > end || rt_usr1)
			return -1;
		usleep(200);
	}
}

/* ---- producer rank ------------------------------------------------------- */

struct prod_opts {
	uint32_t phases;      /* expects the requests of these phases */
	uint64_t may_expire;  /* consumer engine whose requests may expire
			       * (after a DISCONNECTED), 0: none */
	uint32_t min_expired; /* of those */
	uint32_t want_disc;   /* DISCONNECTED events to see, at least */
	int disc_fd;	      /* a byte at the first DISCONNECTED, or -1 */
	uint32_t first_disc_slots; /* check connects == disconnects == 1 at
				    * the first DISCONNECTED */
	uint32_t pause_after; /* RELEASED events before it stops polling */
	int paused_fd, resume_fd;
	uint64_t want_connects; /* stats.connects at the end, 0: unchecked */
};

static int find_req(const struct req *rq, uint32_t n, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (rq[i].id == id)
			return (int)i;
	return -1;
}

static int producer_rank(const struct eng_spec *s, uint32_t ei, uint32_t rank,
			 const struct req *rq, uint32_t n,
			 const struct prod_opts *o, int ready_fd, int stop_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_agent_stats st;
	struct kvp_event ev[16];
	kvp_agent *a = NULL;
	kvp_layout *l = spec_layout(s, rank);
	uint8_t *got = calloc(n + 1, 1), *mine = calloc(n + 1, 1);
	uint32_t i, nmine = 0, reported = 0, released = 0, expired = 0;
	uint32_t disc = 0;
	int ret = 1, err, k, stopped = 0, paused = 0;
	double end = rt_now() + 75;
	char who[64], c;

	snprintf(who, sizeof(who), "%s P%u", s->name, rank);
	alarm(85);
	signal(SIGUSR1, rt_on_usr1);
	if (!l || !got || !mine || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout or memory");
	kvt_fill_background(&mem, 100 + rank);
	for (i = 0; i < n; i++) {
		struct kvp_ids x = ids_of(&rq[i]);

		/* Every request of the engine is filled (a consumer may
		 * pull one that is never expected); only the phases' ones
		 * are expected. */
		if (rq[i].eng != ei)
			continue;
		kvt_fill_producer(l, &mem, &x);
		if (!(rq[i].phase & o->phases))
			continue;
		mine[i] = 1;
		nmine++;
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l;
	at.addr = env.addr0;
	at.max_inflight = s->max_inflight;
	at.max_peers = s->max_peers;
	at.rq_depth = s->rq_depth;
	at.srq = s->srq;
	err = kvp_agent_open(&at, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	err = kvp_agent_listen(a, env.addr0,
			       (uint16_t)(env.port + s->port + rank));
	if (err)
		RT_FAIL("listen: %s", kvp_strerror(err));
	for (i = 0; i < n; i++) {
		if (!mine[i])
			continue;
		err = kvp_agent_expect(a, rq[i].consumer, rq[i].id,
				       rt_now_ns() + rq[i].deadline_s * SEC);
		if (err)
			RT_FAIL("expect %llu: %s",
				(unsigned long long)rq[i].id,
				kvp_strerror(err));
	}
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("ready pipe");
	while (reported < nmine || disc < o->want_disc || !stopped) {
		if (reported == nmine && disc >= o->want_disc) {
			struct pollfd p = { .fd = stop_fd, .events = POLLIN };

			if (poll(&p, 1, 0) > 0 && read(stop_fd, &c, 1) == 1)
				stopped = 1;
		}
		k = kvp_agent_poll(a, ev, 16);
		if (k < 0)
			RT_FAIL("poll: %s", kvp_strerror(k));
		for (i = 0; i < (uint32_t)k; i++) {
			int j;

			if (ev[i].type == KVP_EV_DISCONNECTED) {
				if (disc++)
					continue;
				kvp_agent_get_stats(a, &st);
				if (o->first_disc_slots &&
				    (st.connects != 1 || st.disconnects != 1))
					RT_FAIL("at the first DISCONNECTED: connects %llu disconnects %llu, want 1 and 1",
						(unsigned long long)st.connects,
						(unsigned long long)
							st.disconnects);
				if (o->disc_fd >= 0 &&
				    write(o->disc_fd, "x", 1) != 1)
					RT_FAIL("disconnect pipe");
				continue;
			}
			j = find_req(rq, n, ev[i].req_id);
			if (j < 0 || !mine[j] || got[j]++)
				RT_FAIL("event %u for a bad or repeated id %llu",
					ev[i].type,
					(unsigned long long)ev[i].req_id);
			if (ev[i].type == KVP_EV_RELEASED) {
				if (ev[i].engine_id != rq[j].consumer)
					RT_FAIL("%llu released by engine %llx",
						(unsigned long long)rq[j].id,
						(unsigned long long)
							ev[i].engine_id);
				released++;
			} else if (ev[i].type == KVP_EV_EXPIRED) {
				if (!o->may_expire ||
				    rq[j].consumer != o->may_expire)
					RT_FAIL("%llu expired",
						(unsigned long long)rq[j].id);
				if (!disc)
					RT_FAIL("%llu expired before its consumer's DISCONNECTED",
						(unsigned long long)rq[j].id);
				expired++;
			} else {
				RT_FAIL("unexpected event %u", ev[i].type);
			}
			reported++;
		}
		if (o->pause_after && !paused && released >= o->pause_after) {
			struct pollfd p = { .fd = o->resume_fd,
					    .events = POLLIN };

			/* Not polling: the notification buffers the
			 * consumers fill are not re-posted. */
			paused = 1;
			if (write(o->paused_fd, "p", 1) != 1 ||
			    poll(&p, 1, 60000) <= 0 ||
			    read(o->resume_fd, &c, 1) != 1)
				RT_FAIL("never resumed");
		}
		if (rt_now() > end || rt_usr1)
			RT_FAIL("timeout: %u of %u reported, %u disconnects",
				reported, nmine, disc);
		if (!k)
			usleep(200);
	}
	kvp_agent_get_stats(a, &st);
	if (expired < o->min_expired)
		RT_FAIL("%u expired, want at least %u", expired,
			o->min_expired);
	if (o->want_connects && st.connects != o->want_connects)
		RT_FAIL("connects %llu, want %llu",
			(unsigned long long)st.connects,
			(unsigned long long)o->want_connects);
	if (env.verbose || o->may_expire)
		printf("     %s: %u released, %u expired, %u disconnects, %llu connects, %llu notes (%llu dropped)\n",
		       who, released, expired, disc,
		       (unsigned long long)st.connects,
		       (unsigned long long)st.notes_recv,
		       (unsigned long long)st.notes_dropped);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	free(got);
	free(mine);
	return ret;
}

static int spawn_engine(const struct eng_spec *s, uint32_t ei,
			const struct req *rq, uint32_t n,
			const struct prod_opts *o, int ready_fd, int stop_fd,
			pid_t *pids)
{
	uint32_t r;

	fflush(NULL);
	for (r = 0; r < s->tp; r++) {
		pid_t p = fork();

		if (p == 0)
			RT_EXIT(producer_rank(s, ei, r, rq, n, o, ready_fd,
					      stop_fd));
		if (p < 0)
			return -1;
		kid_add(p);
		if (pids)
			pids[r] = p;
	}
	return 0;
}

static pid_t spawn(int (*fn)(const void *, uint32_t), const void *arg,
		   uint32_t rank)
{
	pid_t p;

	fflush(NULL);
	p = fork();
	if (p == 0)
		RT_EXIT(fn(arg, rank));
	if (p > 0)
		kid_add(p);
	return p;
}

/* ---- consumer rank ------------------------------------------------------- */

enum { R_NONE, R_PULLED, R_DONE, R_FAILED };

struct cons {
	char who[64];
	const struct eng_spec *es; /* producer engines */
	uint32_t neng;
	struct req *rq;
	uint32_t nrq;
	kvp_agent *a;
	kvp_layout *l, *ref[MAXENG];
	struct kvt_mem mem, bg; /* bg: the memory before any transfer */
	uint32_t h[MAXENG], ups[MAXENG], downs[MAXENG], disc[MAXENG];
	int down_status[MAXENG];
	uint32_t down_reason[MAXENG];
	double t_down[MAXENG];
	uint8_t st[MAXREQ];
	int status[MAXREQ];
	uint64_t want_bytes[MAXREQ];
};

static void cons_free(struct cons *c)
{
	uint32_t e;

	if (!c)
		return;
	kvp_agent_close(c->a);
	kvt_mem_free(&c->mem);
	kvt_mem_free(&c->bg);
	kvp_layout_destroy(c->l);
	for (e = 0; e < c->neng; e++)
		kvp_layout_destroy(c->ref[e]);
	free(c);
}

/* A consumer rank's process: its guards, its agent (attr's role, layout,
 * address and max_ids set here), its memory registered. NULL on failure
 * (reason printed). */
static struct cons *cons_new(const struct eng_spec *cs, uint32_t rank,
			     const struct eng_spec *es, uint32_t neng,
			     struct req *rq, uint32_t nrq,
			     const struct kvp_agent_attr *attr)
{
	struct kvp_agent_attr at = *attr;
	struct cons *c = calloc(1, sizeof(*c));
	const char *who = cs->name;
	uint32_t e;
	int err;

	alarm(80);
	signal(SIGUSR1, rt_on_usr1);
	if (!c)
		RT_FAIL("memory");
	who = c->who;
	snprintf(c->who, sizeof(c->who), "%s D%u", cs->name, rank);
	c->es = es;
	c->neng = neng;
	c->rq = rq;
	c->nrq = nrq;
	c->l = spec_layout(cs, rank);
	for (e = 0; e < neng; e++) {
		c->ref[e] = spec_layout(&es[e], 0);
		if (!c->ref[e])
			RT_FAIL("layout of %s", es[e].name);
	}
	if (!c->l || kvt_mem_alloc(c->l, &c->mem))
		RT_FAIL("layout or memory");
	kvt_fill_background(&c->mem, 7 + rank);
	if (kvt_mem_copy(&c->bg, &c->mem))
		RT_FAIL("memory");
	at.role = KVP_ROLE_CONSUMER;
	at.layout = c->l;
	at.addr = env.addr0;
	at.max_ids = MAXI;
	at.qps_per_peer = cs->qps;
	err = kvp_agent_open(&at, &c->a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = rt_register_all(c->a, &c->mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	return c;
out:
	cons_free(c);
	return NULL;
}


static int cons_add(struct cons *c, uint32_t e, uint32_t timeout_ms)
{
	struct kvp_peer peers[RT_MAX_RANKS];
	const char *who = c->who;
	uint32_t r, h = 0, i;
	int err;

	memset(peers, 0, sizeof(peers));
	for (r = 0; r < c->es[e].tp; r++) {
		peers[r].addr = env.addr0;
		peers[r].port = (uint16_t)(env.port + c->es[e].port + r);
	}
	err = kvp_agent_add_engine(c->a, peers, c->es[e].tp, timeout_ms, &h);
	if (err)
		RT_FAIL("add %s: %s", c->es[e].name, kvp_strerror(err));
	if (!h)
		RT_FAIL("add %s: handle 0", c->es[e].name);
	for (i = 0; i < c->neng; i++)
		if (c->h[i] == h)
			RT_FAIL("add %s: the handle of %s", c->es[e].name,
				c->es[i].name);
	c->h[e] = h;
	return 0;
out:
	return -1;
}

static int eng_of(const struct cons *c, uint32_t h)
{
	uint32_t e;

	for (e = 0; e < c->neng; e++)
		if (h && c->h[e] == h)
			return (int)e;
	return -1;
}

/* Bytes a request's READs move, from the plan. */
static uint64_t plan_bytes(const kvp_plan *plan, const struct kvp_ids *ids)
{
	uint32_t mw = 0, ms = 0, i;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint64_t b = 0;
	int n;

	kvp_plan_emit_bound(plan, MAXI, &mw, &ms);
	wr = calloc(mw + 1, sizeof(*wr));
	sge = calloc(ms + 1, sizeof(*sge));
	n = wr && sge ? kvp_plan_emit(plan, ids, wr, mw, sge, ms, NULL) : -1;
	for (i = 0; n > 0 && i < (uint32_t)n; i++)
		b += wr[i].len;
	free(wr);
	free(sge);
	return b;
}

static int cons_pull(struct cons *c, uint32_t k)
{
	struct kvp_ids x = ids_of(&c->rq[k]);
	struct kvp_engine_info in;
	uint32_t e = c->rq[k].eng;
	int err;

	if (c->st[k] != R_NONE)
		return -EINVAL;
	err = kvp_agent_pull_from(c->a, c->h[e], c->rq[k].id, &x);
	if (err)
		return err;
	c->st[k] = R_PULLED;
	if (!kvp_agent_engine_info(c->a, c->h[e], &in) && in.plan)
		c->want_bytes[k] = plan_bytes(in.plan, &x);
	return 0;
}

/* One poll; checks every event against what was asked. -1 on a wrong one. */
static int cons_poll(struct cons *c)
{
	struct kvp_event ev[32];
	const char *who = c->who;
	int n, i, k, e;

	n = kvp_agent_poll(c->a, ev, 32);
	if (n < 0)
		RT_FAIL("poll: %s", kvp_strerror(n));
	for (i = 0; i < n; i++) {
		const struct kvp_event *v = &ev[i];

		e = eng_of(c, v->engine);
		switch (v->type) {
		case KVP_EV_DONE:
		case KVP_EV_FAILED:
			k = find_req(c->rq, c->nrq, v->req_id);
			if (k < 0 || c->st[k] != R_PULLED)
				RT_FAIL("event %u for %llu, not in flight",
					v->type,
					(unsigned long long)v->req_id);
			if (e != (int)c->rq[k].eng)
				RT_FAIL("event %u for %llu: handle %x, want %x",
					v->type, (unsigned long long)v->req_id,
					v->engine, c->h[c->rq[k].eng]);
			if (v->type == KVP_EV_DONE) {
				if (!v->reads || !v->elapsed_ns ||
				    !v->bytes || v->bytes != c->want_bytes[k])
					RT_FAIL("DONE %llu: %u reads %llu bytes (plan: %llu) %llu ns",
						(unsigned long long)v->req_id,
						v->reads,
						(unsigned long long)v->bytes,
						(unsigned long long)
							c->want_bytes[k],
						(unsigned long long)
							v->elapsed_ns);
				c->st[k] = R_DONE;
				break;
			}
			if (v->status >= 0 || v->ngroups != 1 || !v->ids ||
			    v->ids[0].nlocal != c->rq[k].nl ||
			    memcmp(v->ids[0].local, c->rq[k].lid,
				   c->rq[k].nl * sizeof(uint32_t)))
				RT_FAIL("FAILED %llu: status %d, not its ids",
					(unsigned long long)v->req_id,
					v->status);
			c->st[k] = R_FAILED;
			c->status[k] = v->status;
			break;
		case KVP_EV_ENGINE_UP:
			if (e < 0 || v->engine_id != c->es[e].id)
				RT_FAIL("ENGINE_UP: handle %x, engine %llx",
					v->engine,
					(unsigned long long)v->engine_id);
			c->ups[e]++;
			break;
		case KVP_EV_ENGINE_DOWN:
			if (e < 0)
				RT_FAIL("ENGINE_DOWN: handle %x", v->engine);
			c->downs[e]++;
			c->down_status[e] = v->status;
			c->down_reason[e] = v->reason;
			c->t_down[e] = rt_now();
			break;
		case KVP_EV_DISCONNECTED:
			if (e < 0)
				RT_FAIL("DISCONNECTED: handle %x", v->engine);
			c->disc[e]++;
			break;
		default:
			RT_FAIL("unexpected event %u", v->type);
		}
	}
	return n;
out:
	return -1;
}

static int cons_poll_fn(void *arg)
{
	return cons_poll(arg);
}

/* Predicates for cons_wait(). */
static int quiet(const struct cons *c)
{
	uint32_t k;

	for (k = 0; k < c->nrq; k++)
		if (c->st[k] == R_PULLED)
			return 0;
	return 1;
}

struct want {
	uint32_t ups[MAXENG], downs[MAXENG];
	int quiet;
};

static int wanted(const struct cons *c, const struct want *w)
{
	uint32_t e;

	for (e = 0; e < c->neng; e++)
		if (c->ups[e] < w->ups[e] || c->downs[e] < w->downs[e])
			return 0;
	return !w->quiet || quiet(c);
}

static int cons_wait(struct cons *c, const struct want *w, double secs,
		     const char *what)
{
	double end = rt_now() + secs;
	int n;

	for (;;) {
		n = cons_poll(c);
		if (n < 0)
			return -1;
		if (wanted(c, w))
			return 0;
		if (rt_now() > end || rt_usr1) {
			fprintf(stderr, "  [%s] timeout waiting for %s\n",
				c->who, what);
			return -1;
		}
		if (!n)
			usleep(50);
	}
}

/* Pulls request k, polling while the agent is busy. */
static int cons_pull_busy(struct cons *c, uint32_t k, double secs)
{
	double end = rt_now() + secs;
	const char *who = c->who;
	int err;

	for (;;) {
		err = cons_pull(c, k);
		if (!err)
			return 0;
		if (err != -EBUSY)
			RT_FAIL("pull %llu from %s: %s",
				(unsigned long long)c->rq[k].id,
				c->es[c->rq[k].eng].name, kvp_strerror(err));
		if (cons_poll(c) < 0)
			return -1;
		if (rt_now() > end)
			RT_FAIL("pull %llu: busy for %.0f s",
				(unsigned long long)c->rq[k].id, secs);
	}
out:
	return -1;
}

/* An engine that is down: the first pull starts the reconnect (-EAGAIN),
 * pulls keep returning -EAGAIN until ENGINE_UP, then one succeeds. */
static int cons_pull_reconnect(struct cons *c, uint32_t k, double secs)
{
	uint32_t e = c->rq[k].eng, ups = c->ups[e], again = 0;
	double end = rt_now() + secs;
	const char *who = c->who;
	struct kvp_engine_info in = { 0 };
	int err;

	for (;;) {
		err = cons_pull(c, k);
		if (!err)
			break;
		if (err != -EAGAIN)
			RT_FAIL("pull from %s (down): %s, want -EAGAIN",
				c->es[e].name, kvp_strerror(err));
		if (!again++ && (kvp_agent_engine_info(c->a, c->h[e], &in) ||
				 in.state != KVP_ENGINE_CONNECTING))
			RT_FAIL("after -EAGAIN: state %u, not connecting",
				in.state);
		if (cons_poll(c) < 0)
			return -1;
		if (c->downs[e] > 1 && c->ups[e] == ups)
			RT_FAIL("reconnect failed: %s",
				kvp_strerror(c->down_status[e]));
		if (rt_now() > end)
			RT_FAIL("not up again within %.0f s", secs);
		usleep(50);
	}
	if (!again || c->ups[e] != ups + 1)
		RT_FAIL("%u pulls returned -EAGAIN, %u ENGINE_UP, want >= 1 and 1",
			again, c->ups[e] - ups);
	return 0;
out:
	return -1;
}

/* Names the requests whose blocks hold wrong bytes (or "none": bytes no
 * request writes). */
static void blame(const struct cons *c, const struct kvt_mem *exp)
{
	struct kvt_mem need = { 0 }, tmp = { 0 };
	uint32_t k, r, shown = 0;
	uint64_t o, bad;

	if (kvt_mem_copy(&need, &c->bg) || kvt_mem_copy(&tmp, &c->bg))
		goto out;
	for (r = 0; r < need.nregions; r++)
		memset(need.buf[r], 0, need.size[r]);
	for (k = 0; k < c->nrq; k++) {
		struct kvp_ids x = ids_of(&c->rq[k]);

		if (c->st[k] == R_NONE)
			continue;
		kvt_expect_consumer(c->l, c->ref[c->rq[k].eng], &tmp, &need,
				    &x);
		for (r = 0, bad = 0; r < need.nregions; r++)
			for (o = 0; o < need.size[r]; o++)
				if (need.buf[r][o] && (need.buf[r][o] = 0,
						       c->mem.buf[r][o] !=
							       exp->buf[r][o]))
					bad++;
		if (bad && shown++ < 8)
			fprintf(stderr,
				"  [%s] request %llu (#%u, state %u, local %u..., remote %u...): %llu bytes differ\n",
				c->who, (unsigned long long)c->rq[k].id, k,
				c->st[k], c->rq[k].lid[0], c->rq[k].rid[0],
				(unsigned long long)bad);
	}
out:
	kvt_mem_free(&need);
	kvt_mem_free(&tmp);
}

/* The whole memory against the identity expectation: DONE requests'
 * blocks hold the producer's bytes, FAILED ones anything, every other byte
 * its background. */
static int cons_check_mem(struct cons *c)
{
	struct kvt_mem exp = { 0 }, need = { 0 };
	const char *who = c->who;
	uint32_t k, r;
	uint64_t o;
	int ret = -1;

	if (kvt_mem_copy(&exp, &c->bg) || kvt_mem_copy(&need, &c->bg))
		RT_FAIL("memory");
	for (r = 0; r < need.nregions; r++)
		memset(need.buf[r], 0, need.size[r]);
	for (k = 0; k < c->nrq; k++) {
		struct kvp_ids x = ids_of(&c->rq[k]);

		if (c->st[k] == R_PULLED)
			RT_FAIL("%llu never reported",
				(unsigned long long)c->rq[k].id);
		if (c->st[k] == R_DONE || c->st[k] == R_FAILED)
			kvt_expect_consumer(c->l, c->ref[c->rq[k].eng], &exp,
					    c->st[k] == R_FAILED ? &need : NULL,
					    &x);
	}
	for (r = 0; r < need.nregions; r++)
		for (o = 0; o < need.size[r]; o++)
			if (need.buf[r][o])
				exp.buf[r][o] = c->mem.buf[r][o];
	if (kvt_mem_compare(&c->mem, &exp, who)) {
		blame(c, &exp);
		RT_FAIL("memory differs from the expectation");
	}
	ret = 0;
out:
	kvt_mem_free(&exp);
	kvt_mem_free(&need);
	return ret;
}

static int info(const struct cons *c, uint32_t e, struct kvp_engine_info *in)
{
	int err = kvp_agent_engine_info(c->a, c->h[e], in);

	if (err)
		fprintf(stderr, "  [%s] engine_info %s: %s\n", c->who,
			c->es[e].name, kvp_strerror(err));
	return err;
}

/* ---- 1. one decode engine, four prefill engines -------------------------- */

static const struct eng_spec c1_cons =
	ENG("decode", RT_CONS_ENGINE, 2, 16, HND, 80, 2, 0);

static const struct eng_spec c1_engs[4] = {
	ENG("tp1 NHD/16", 0x50310, 1, 16, NHD, 32, 2, 0),
	ENG("tp2 HND/32", 0x50320, 2, 32, HND, 16, 2, 8),
	ENG("tp4 FlashInfer/16", 0x50340, 4, 16, KVP_KV_FLASHINFER, 32, 2, 16),
	ENG("tp2 HND/32 #2", 0x50321, 2, 32, HND, 16, 2, 24),
};

#define C1_REQ 16 /* 12 round-robin over the first three, 4 from the 4th */
static struct req c1_rq[C1_REQ];

static int c1_consumer(const void *arg, uint32_t rank)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_engine_info in;
	struct want w = { .ups = { 1, 1, 1, 0 } };
	struct cons *c;
	const char *who = "decode";
	uint32_t e, k;
	int ret = 1;

	(void)arg;
	memset(&at, 0, sizeof(at));
	at.max_inflight = 16;
	c = cons_new(&c1_cons, rank, c1_engs, 4, c1_rq, C1_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	for (e = 0; e < 3; e++)
		if (cons_add(c, e, 30000))
			goto out;
	if (cons_wait(c, &w, 40, "three ENGINE_UP"))
		goto out;
	for (k = 0; k < 12; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	w.quiet = 1;
	if (cons_wait(c, &w, 40, "12 DONE"))
		goto out;
	/* The fourth, of the second's geometry, added alone (its add_ns
	 * compares with the first three's). */
	if (cons_add(c, 3, 30000))
		goto out;
	w.ups[3] = 1;
	if (cons_wait(c, &w, 30, "the fourth ENGINE_UP"))
		goto out;
	for (k = 12; k < C1_REQ; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	if (cons_wait(c, &w, 30, "4 DONE from the fourth"))
		goto out;
	for (k = 0; k < C1_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu not DONE", (unsigned long long)c1_rq[k].id);
	for (e = 0; e < 4; e++) {
		const struct eng_spec *s = &c1_engs[e];
		/* Producer ranks this rank reads from (its half of the
		 * heads), each over the default 2 queue pairs. */
		uint32_t conns = (s->tp > 2 ? s->tp / 2 : 1) * 2;

		if (info(c, e, &in))
			goto out;
		if (in.qps != 2)
			RT_FAIL("%s: %u queue pairs per rank, want 2", s->name,
				in.qps);
		if (c->downs[e] || c->ups[e] != 1 || in.state != KVP_ENGINE_UP)
			RT_FAIL("%s: %u up %u down, state %u", s->name,
				c->ups[e], c->downs[e], in.state);
		if (in.plan_cached != (e == 3))
			RT_FAIL("%s: plan_cached %u, want %u", s->name,
				in.plan_cached, e == 3);
		if (in.engine_id != s->id || in.tp_size != s->tp ||
		    in.conns != conns || !in.plan || !in.plan_bytes ||
		    !in.table_bytes || !in.add_ns || in.done != 4 ||
		    in.pulls != 4 || in.failed || in.reconnects ||
		    in.transport_failures || in.stalls ||
		    in.handshake_failures)
			RT_FAIL("%s: engine %llx tp %u conns %u (want %u) plan %p %llu B tables %llu B add %llu ns pulls %llu done %llu failed %llu",
				s->name, (unsigned long long)in.engine_id,
				in.tp_size, in.conns, conns,
				(const void *)in.plan,
				(unsigned long long)in.plan_bytes,
				(unsigned long long)in.table_bytes,
				(unsigned long long)in.add_ns,
				(unsigned long long)in.pulls,
				(unsigned long long)in.done,
				(unsigned long long)in.failed);
		if (rank == 0)
			printf("     D0 <- %-18s add->UP %7.1f ms (%s), plan %llu B, tables %llu B, conns %u, %llu READs %llu B\n",
			       s->name, in.add_ns / 1e6,
			       in.plan_cached ? "plan cached" : "plan compiled",
			       (unsigned long long)in.plan_bytes,
			       (unsigned long long)in.table_bytes, in.conns,
			       (unsigned long long)in.reads,
			       (unsigned long long)in.read_bytes);
	}
	kvp_agent_get_stats(c->a, &st);
	if (st.plan_compiles != 3 || st.plan_hits != 1 || st.done != C1_REQ)
		RT_FAIL("stats: %llu compiles %llu hits %llu done",
			(unsigned long long)st.plan_compiles,
			(unsigned long long)st.plan_hits,
			(unsigned long long)st.done);
	/* The two engines of one geometry share the plan itself. */
	{
		struct kvp_engine_info i1;

		if (info(c, 1, &i1) || info(c, 3, &in) || i1.plan != in.plan)
			RT_FAIL("engines 2 and 4 do not share their plan");
	}
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

/* Requests base, base + 1, ... for consumer RT_CONS_ENGINE, each from
 * engine eng(k), expected in phase 1 with a deadline of 60 s. */
static void reqs_init(struct req *rq, uint32_t n, uint64_t base,
		      uint32_t (*eng)(uint32_t), uint32_t (*tokens)(uint32_t))
{
	uint32_t k;

	for (k = 0; k < n; k++) {
		memset(&rq[k], 0, sizeof(rq[k]));
		rq[k].id = base + k;
		rq[k].consumer = RT_CONS_ENGINE;
		rq[k].eng = eng(k);
		rq[k].phase = 1;
		rq[k].deadline_s = 60;
		rq[k].tokens = tokens(k);
	}
}

/* Every rank of engines es[0..n) in a process, serving phase 1; 0 once
 * all listen (their count in *nprod). */
static int engines_start(const struct eng_spec *es, uint32_t n,
			 const struct req *rq, uint32_t nrq, int ready_rd,
			 int ready_wr, int stop_rd, uint32_t *nprod)
{
	static const struct prod_opts o = { .phases = 1, .disc_fd = -1 };
	uint32_t e;

	*nprod = 0;
	for (e = 0; e < n; e++) {
		if (spawn_engine(&es[e], e, rq, nrq, &o, ready_wr, stop_rd,
				 NULL))
			return -1;
		*nprod += es[e].tp;
	}
	return wait_bytes(ready_rd, *nprod, 30, "producers ready");
}

/* Stops nprod producer ranks and waits for every child. */
static int engines_stop(int stop_wr, uint32_t nprod)
{
	uint32_t k;

	if (put_bytes(stop_wr, nprod))
		return -1;
	for (k = 0; k < nkids; k++)
		if (kid_wait(kids[k], 20))
			return -1;
	return 0;
}

static uint32_t c1_eng(uint32_t k)
{
	return k < 12 ? k % 3 : 3;
}

static uint32_t c1_tokens(uint32_t k)
{
	return 40 + 8 * (k % 4); /* last blocks partial */
}

static int run_many(void)
{
	enum { READY, STOP, NPIPES };
	int f[NPIPES][2], ret = -1;
	uint32_t k, nprod = 0;
	pid_t d[2];

	reqs_init(c1_rq, C1_REQ, 1000, c1_eng, c1_tokens);
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c1_rq, C1_REQ, c1_engs, 4, &c1_cons, 11) ||
	    engines_start(c1_engs, 4, c1_rq, C1_REQ, f[READY][0], f[READY][1],
			  f[STOP][0], &nprod))
		goto out;
	for (k = 0; k < 2; k++)
		if ((d[k] = spawn(c1_consumer, NULL, k)) < 0)
			goto out;
	if (kid_wait(d[0], 90) | kid_wait(d[1], 10) ||
	    engines_stop(f[STOP][1], nprod))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 2. a prefill engine killed mid-transfer, restarted ------------------ */

static const struct eng_spec c2_cons =
	ENG("decode", RT_CONS_ENGINE, 1, 16, HND, 208, 1, 0);

static const struct eng_spec c2_engs[2] = {
	ENG("A tp2", 0x50a2, 2, 16, HND, 192, 1, 32),
	ENG("B tp1", 0x50b1, 1, 16, NHD, 64, 1, 40),
};

/* Phase 1: A's 8 big requests interleaved with B's 4; phase 2 (after the
 * restart): 4 from A, 2 from B. */
#define C2_REQ 18
#define C2_P1 12
static struct req c2_rq[C2_REQ];

struct c2_fds {
	int posted, down, restarted;
};

static int c2_consumer(const void *arg, uint32_t rank)
{
	const struct c2_fds *fd = arg;
	struct kvp_agent_attr at;
	struct kvp_engine_info ia, ib;
	struct want w = { .ups = { 1, 1 } };
	struct cons *c;
	const char *who = "decode";
	uint32_t k, adone = 0, afailed = 0;
	int ret = 1, why = 0;

	memset(&at, 0, sizeof(at));
	at.max_inflight = 16;
	/* Eight send queue entries keep most of A's READs waiting in the
	 * agent when it dies (rdma_fail.c's kill case, same reason). */
	at.sq_depth = 8;
	c = cons_new(&c2_cons, rank, c2_engs, 2, c2_rq, C2_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 30000) || cons_add(c, 1, 30000) ||
	    cons_wait(c, &w, 40, "two ENGINE_UP"))
		goto out;
	for (k = 0; k < C2_P1; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	if (write(fd->posted, "p", 1) != 1)
		RT_FAIL("pipe");
	w.downs[0] = 1;
	w.quiet = 1;
	if (cons_wait(c, &w, 40, "every request reported and A down"))
		goto out;
	for (k = 0; k < C2_P1; k++) {
		if (c2_rq[k].eng == 1 && c->st[k] != R_DONE)
			RT_FAIL("B's %llu: %s", (unsigned long long)c2_rq[k].id,
				kvp_strerror(c->status[k]));
		if (c2_rq[k].eng == 0) {
			adone += c->st[k] == R_DONE;
			afailed += c->st[k] == R_FAILED;
			if (c->st[k] == R_FAILED && !why)
				why = c->status[k];
		}
	}
	if (!afailed)
		RT_FAIL("none of A's requests failed although A died");
	if (c->downs[0] != 1 || c->down_status[0] >= 0 || c->downs[1])
		RT_FAIL("%u ENGINE_DOWN for A (%s), %u for B, want 1 and 0",
			c->downs[0], kvp_strerror(c->down_status[0]),
			c->downs[1]);
	if (info(c, 0, &ia))
		goto out;
	if (ia.transport_failures < 1 || ia.state != KVP_ENGINE_DOWN ||
	    ia.status >= 0 || ia.failed != afailed || ia.done != adone)
		RT_FAIL("A: %llu transport failures, state %u, status %d, %llu done %llu failed",
			(unsigned long long)ia.transport_failures, ia.state,
			ia.status, (unsigned long long)ia.done,
			(unsigned long long)ia.failed);
	printf("     A killed: %u of A's requests DONE, %u FAILED (%s), ENGINE_DOWN %s, %u DISCONNECTED; B's 4 DONE\n",
	       adone, afailed, kvp_strerror(why),
	       kvp_strerror(c->down_status[0]), c->disc[0]);
	if (write(fd->down, "d", 1) != 1 ||
	    wait_byte_polling(fd->restarted, 40, cons_poll_fn, c))
		RT_FAIL("A never restarted");
	/* The same agent, its memory registered once: A is reconnected on
	 * demand, with the addresses it had and its new keys. */
	if (cons_pull_reconnect(c, C2_P1, 30))
		goto out;
	for (k = C2_P1 + 1; k < C2_REQ; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	w.ups[0] = 2;
	if (cons_wait(c, &w, 30, "A's new requests"))
		goto out;
	for (k = C2_P1; k < C2_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu after the restart: %s",
				(unsigned long long)c2_rq[k].id,
				kvp_strerror(c->status[k]));
	if (info(c, 0, &ia) || info(c, 1, &ib))
		goto out;
	if (ia.reconnects != 1 || ia.state != KVP_ENGINE_UP ||
	    c->downs[0] != 1 || ib.reconnects || ib.transport_failures ||
	    c->downs[1] || ib.done != 6)
		RT_FAIL("A: %llu reconnects, state %u, %u down; B: %llu reconnects %llu failures %u down %llu done",
			(unsigned long long)ia.reconnects, ia.state,
			c->downs[0], (unsigned long long)ib.reconnects,
			(unsigned long long)ib.transport_failures, c->downs[1],
			(unsigned long long)ib.done);
	printf("     A restarted: reconnected in %.1f ms (%s), 4 DONE; reconnects %llu\n",
	       ia.add_ns / 1e6, ia.plan_cached ? "plan kept" : "plan compiled",
	       (unsigned long long)ia.reconnects);
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static int run_restart(void)
{
	struct prod_opts oa = { .phases = 1, .disc_fd = -1 };
	struct prod_opts oa2 = { .phases = 2, .disc_fd = -1 };
	struct prod_opts ob = { .phases = 3, .disc_fd = -1 };
	enum { READY, STOP, POSTED, DOWN, RESTARTED, NPIPES };
	int f[NPIPES][2], ret = -1;
	struct c2_fds fd;
	pid_t pa[2], d;
	uint32_t k, a = 0, b = 0;

	for (k = 0; k < C2_REQ; k++) {
		struct req *r = &c2_rq[k];

		memset(r, 0, sizeof(*r));
		r->consumer = RT_CONS_ENGINE;
		r->deadline_s = 60;
		r->phase = k < C2_P1 ? 1 : 2;
		/* A B A B A B A B A A A A | A A A A B B */
		r->eng = k < C2_P1 ? (k < 8 && k % 2) : k >= C2_REQ - 2;
		r->id = 2000 + (r->eng ? 100 + b++ : a++) +
			(k < C2_P1 ? 0 : 50);
		r->tokens = r->eng == 0 && k < C2_P1 ? 320 : 64;
	}
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c2_rq, C2_REQ, c2_engs, 2, &c2_cons, 12))
		goto out;
	fd.posted = f[POSTED][1];
	fd.down = f[DOWN][1];
	fd.restarted = f[RESTARTED][0];
	if (spawn_engine(&c2_engs[0], 0, c2_rq, C2_REQ, &oa, f[READY][1],
			 f[STOP][0], pa) ||
	    spawn_engine(&c2_engs[1], 1, c2_rq, C2_REQ, &ob, f[READY][1],
			 f[STOP][0], NULL) ||
	    wait_bytes(f[READY][0], 3, 30, "producers ready"))
		goto out;
	if ((d = spawn(c2_consumer, &fd, 0)) < 0 ||
	    wait_bytes(f[POSTED][0], 1, 40, "consumer posted"))
		goto out;
	kid_kill(pa[0]);
	kid_kill(pa[1]);
	if (wait_bytes(f[DOWN][0], 1, 40, "consumer saw A down"))
		goto out;
	/* New processes: new registrations (addresses, rkeys), same ports. */
	if (spawn_engine(&c2_engs[0], 0, c2_rq, C2_REQ, &oa2, f[READY][1],
			 f[STOP][0], NULL) ||
	    wait_bytes(f[READY][0], 2, 30, "A restarted") ||
	    write(f[RESTARTED][1], "r", 1) != 1)
		goto out;
	if (kid_wait(d, 60) || put_bytes(f[STOP][1], 3))
		goto out;
	for (k = 0; k < nkids; k++)
		if (kid_wait(kids[k], 20))
			goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 3. a consumer engine killed, a new one connects --------------------- */

static const struct eng_spec c3_prod[1] = {
	{ .name = "prefill tp1", .id = 0x50c1, .tp = 1, .block = 16,
	  .kv_layout = KVP_KV_FLASH_HND, .nblocks = 96, .layers = 1,
	  .port = 48, .max_inflight = 16,
	  /* One consumer rank at a time: the new engine connects only if
	   * the killed one's slot was freed. */
	  .max_peers = 1 },
};

/* One queue pair per producer rank: the producer's one slot. */
static const struct eng_spec c3_cons[2] = {
	{ .name = "decode X", .id = RT_CONS_ENGINE, .tp = 1, .block = 16,
	  .kv_layout = HND, .nblocks = 96, .layers = 1, .qps = 1 },
	{ .name = "decode Y", .id = RT_CONS_ENGINE + 1, .tp = 1, .block = 16,
	  .kv_layout = HND, .nblocks = 96, .layers = 1, .qps = 1 },
};

#define C3_X 4 /* X's requests, then Y's */
#define C3_REQ 6
static struct req c3_rq[C3_REQ];

static int c3_consumer(const void *arg, uint32_t y)
{
	const int *posted = arg;
	struct kvp_agent_attr at;
	struct want w = { .ups = { 1 } };
	struct cons *c;
	const char *who = "decode";
	uint32_t k;
	int ret = 1;

	memset(&at, 0, sizeof(at));
	at.max_inflight = 8;
	at.sq_depth = 8;
	c = cons_new(&c3_cons[y], 0, c3_prod, 1, c3_rq, C3_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 20000) || cons_wait(c, &w, 30, "ENGINE_UP"))
		goto out;
	if (c->downs[0])
		RT_FAIL("ENGINE_DOWN: %s", kvp_strerror(c->down_status[0]));
	for (k = y ? C3_X : 0; k < (y ? C3_REQ : C3_X); k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	if (!y) {
		if (write(*posted, "p", 1) != 1)
			RT_FAIL("pipe");
		for (;;) /* killed while polling */
			if (cons_poll(c) < 0)
				goto out;
	}
	w.quiet = 1;
	if (cons_wait(c, &w, 30, "Y's requests"))
		goto out;
	for (k = C3_X; k < C3_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu: %s", (unsigned long long)c3_rq[k].id,
				kvp_strerror(c->status[k]));
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static int run_consumer_killed(void)
{
	enum { READY, STOP, POSTED, DISC, NPIPES };
	int f[NPIPES][2], ret = -1;
	struct prod_opts o = { .phases = 1, .may_expire = RT_CONS_ENGINE,
			       .min_expired = 1, .want_disc = 2,
			       .first_disc_slots = 1, .want_connects = 2 };
	pid_t x, y, p[1];
	uint32_t k;

	for (k = 0; k < C3_REQ; k++) {
		struct req *r = &c3_rq[k];

		memset(r, 0, sizeof(*r));
		r->id = 3000 + k;
		r->consumer = c3_cons[k >= C3_X].id;
		r->phase = 1;
		/* X's expire a few seconds after the kill. */
		r->deadline_s = k < C3_X ? 6 : 60;
		r->tokens = k < C3_X ? 320 : 64;
	}
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c3_rq, C3_REQ, c3_prod, 1, &c3_cons[0], 13))
		goto out;
	o.disc_fd = f[DISC][1];
	if (spawn_engine(&c3_prod[0], 0, c3_rq, C3_REQ, &o, f[READY][1],
			 f[STOP][0], p) ||
	    wait_bytes(f[READY][0], 1, 30, "producer ready"))
		goto out;
	if ((x = spawn(c3_consumer, &f[POSTED][1], 0)) < 0 ||
	    wait_bytes(f[POSTED][0], 1, 30, "X posted"))
		goto out;
	kid_kill(x);
	if (wait_bytes(f[DISC][0], 1, 30, "producer saw X disconnect"))
		goto out;
	if ((y = spawn(c3_consumer, NULL, 1)) < 0 || kid_wait(y, 50) ||
	    put_bytes(f[STOP][1], 1) || kid_wait(p[0], 30))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 4. a producer stops polling: stall, then resume --------------------- */

#define STALL_MS 1000

static const struct eng_spec c4_prod[1] = {
	{ .name = "prefill tp1", .id = 0x50d1, .tp = 1, .block = 4,
	  .kv_layout = KVP_KV_FLASH_HND, .nblocks = 32, .layers = 1,
	  .port = 56,
	  /* Notification receive depth max(128, 32): 128 buffers. */
	  .max_inflight = 32 },
};

static const struct eng_spec c4_cons =
	ENG("decode", RT_CONS_ENGINE, 1, 4, HND, 424, 1, 0);

/* 8 before the producer stops, up to 400 while it does not poll (never
 * expected), 8 after it resumes. */
#define C4_P1 8
#define C4_P2 400
#define C4_REQ (C4_P1 + C4_P2 + 8)
static struct req c4_rq[C4_REQ];

struct c4_fds {
	int go, down, resumed;
};

static int c4_consumer(const void *arg, uint32_t rank)
{
	const struct c4_fds *fd = arg;
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_engine_info in;
	struct want w = { .ups = { 1 }, .quiet = 1 };
	struct cons *c;
	const char *who = "decode";
	uint32_t k, next, done = 0, failed = 0, busy = 0;
	uint64_t waits0;
	double t_credit = 0, t_last = 0, end, lat;
	int ret = 1, err, n, pulling = 1;

	memset(&at, 0, sizeof(at));
	at.max_inflight = 64;
	at.stall_ms = STALL_MS;
	c = cons_new(&c4_cons, rank, c4_prod, 1, c4_rq, C4_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 20000) || cons_wait(c, &w, 30, "ENGINE_UP"))
		goto out;
	for (k = 0; k < C4_P1; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	if (cons_wait(c, &w, 30, "the first requests") ||
	    wait_byte_polling(fd->go, 30, cons_poll_fn, c))
		RT_FAIL("the producer never stopped polling");
	/* The producer no longer re-posts notification buffers: pull until
	 * the engine goes down, never after (a pull then would start a
	 * reconnect). */
	kvp_agent_get_stats(c->a, &st);
	waits0 = st.credit_waits;
	next = C4_P1;
	end = rt_now() + 30;
	while (!c->downs[0]) {
		if (pulling && next < C4_P1 + C4_P2) {
			err = cons_pull(c, next);
			if (!err) {
				next++;
				t_last = rt_now();
			} else if (err == -EBUSY) {
				busy++;
				usleep(200); /* slots held: let time pass */
			} else if (err == -ENOTCONN) {
				pulling = 0; /* failing */
			} else {
				RT_FAIL("pull %u: %s", next, kvp_strerror(err));
			}
		}
		n = cons_poll(c);
		if (n < 0)
			goto out;
		if (!t_credit) {
			kvp_agent_get_stats(c->a, &st);
			if (st.credit_waits > waits0)
				t_credit = rt_now();
		}
		if (next == C4_P1 + C4_P2 && !c->downs[0])
			RT_FAIL("%u pulls accepted without a stall",
				C4_P2);
		if (rt_now() > end)
			RT_FAIL("no ENGINE_DOWN after %u pulls (%s)",
				next - C4_P1,
				t_credit ? "credit ran out" :
					   "credit never ran out");
	}
	if (cons_wait(c, &w, 10, "the stalled requests reported"))
		goto out;
	if (c->down_status[0] != -ETIMEDOUT || c->downs[0] != 1)
		RT_FAIL("ENGINE_DOWN %s, want -ETIMEDOUT",
			kvp_strerror(c->down_status[0]));
	if (!t_credit)
		RT_FAIL("ENGINE_DOWN without a credit wait");
	/* Never expected: a pull whose data came in finds no lease
	 * (-ESTALE), one cut by the stall -ETIMEDOUT; none DONE. */
	for (k = C4_P1; k < next; k++) {
		done += c->st[k] == R_DONE;
		if (c->st[k] == R_FAILED) {
			failed++;
			if (c->status[k] != -ETIMEDOUT &&
			    c->status[k] != -ESTALE)
				RT_FAIL("%llu FAILED %s, want -ETIMEDOUT or -ESTALE",
					(unsigned long long)c4_rq[k].id,
					kvp_strerror(c->status[k]));
		}
	}
	if (done)
		RT_FAIL("%u pulls of requests never expected DONE", done);
	if (info(c, 0, &in))
		goto out;
	if (in.stalls != 1 || in.state != KVP_ENGINE_DOWN ||
	    in.status != -ETIMEDOUT)
		RT_FAIL("engine: %llu stalls, state %u, status %d",
			(unsigned long long)in.stalls, in.state, in.status);
	kvp_agent_get_stats(c->a, &st);
	lat = (c->t_down[0] - t_credit) * 1e3;
	printf("     stall: %u pulls accepted (%u -EBUSY), %u DONE, %u FAILED; ENGINE_DOWN -ETIMEDOUT %.0f ms after the first credit wait, %.0f ms after the last pull (stall_ms %u, %llu credit waits)\n",
	       next - C4_P1, busy, done, failed, lat,
	       (c->t_down[0] - t_last) * 1e3, STALL_MS,
	       (unsigned long long)(st.credit_waits - waits0));
	if (lat < STALL_MS * 0.9 || lat > STALL_MS + 2000)
		RT_FAIL("stall detected after %.0f ms, want %u ms (+2 s)", lat,
			STALL_MS);
	if (write(fd->down, "d", 1) != 1 ||
	    wait_byte_polling(fd->resumed, 30, cons_poll_fn, c))
		RT_FAIL("the producer never resumed");
	if (cons_pull_reconnect(c, C4_P1 + C4_P2, 30))
		goto out;
	for (k = C4_P1 + C4_P2 + 1; k < C4_REQ; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	w.ups[0] = 2;
	if (cons_wait(c, &w, 30, "the requests after the resume"))
		goto out;
	for (k = C4_P1 + C4_P2; k < C4_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu after the resume: %s",
				(unsigned long long)c4_rq[k].id,
				kvp_strerror(c->status[k]));
	if (info(c, 0, &in))
		goto out;
	if (in.reconnects != 1 || in.stalls != 1 || c->downs[0] != 1)
		RT_FAIL("after the resume: %llu reconnects %llu stalls %u down",
			(unsigned long long)in.reconnects,
			(unsigned long long)in.stalls, c->downs[0]);
	printf("     resumed: reconnected in %.1f ms, 8 DONE\n",
	       in.add_ns / 1e6);
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static int run_stall(void)
{
	enum { READY, STOP, PAUSED, RESUME, GO, DOWN, RESUMED, NPIPES };
	int f[NPIPES][2], ret = -1;
	struct prod_opts o = { .phases = 1, .disc_fd = -1, .want_disc = 1,
			       .pause_after = C4_P1 };
	struct c4_fds fd;
	pid_t d, p[1];
	uint32_t k;

	for (k = 0; k < C4_REQ; k++) {
		struct req *r = &c4_rq[k];

		memset(r, 0, sizeof(*r));
		r->id = 4000 + k;
		r->consumer = RT_CONS_ENGINE;
		r->phase = k < C4_P1 || k >= C4_P1 + C4_P2;
		r->deadline_s = 60;
		r->tokens = 4; /* one block */
	}
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c4_rq, C4_REQ, c4_prod, 1, &c4_cons, 14))
		goto out;
	o.paused_fd = f[PAUSED][1];
	o.resume_fd = f[RESUME][0];
	fd.go = f[GO][0];
	fd.down = f[DOWN][1];
	fd.resumed = f[RESUMED][0];
	if (spawn_engine(&c4_prod[0], 0, c4_rq, C4_REQ, &o, f[READY][1],
			 f[STOP][0], p) ||
	    wait_bytes(f[READY][0], 1, 30, "producer ready"))
		goto out;
	if ((d = spawn(c4_consumer, &fd, 0)) < 0 ||
	    wait_bytes(f[PAUSED][0], 1, 40, "producer paused") ||
	    write(f[GO][1], "g", 1) != 1 ||
	    wait_bytes(f[DOWN][0], 1, 40, "consumer saw the stall") ||
	    write(f[RESUME][1], "r", 1) != 1 ||
	    write(f[RESUMED][1], "r", 1) != 1)
		goto out;
	if (kid_wait(d, 60) || put_bytes(f[STOP][1], 1) ||
	    kid_wait(p[0], 30))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 5. the QP budget: LRU engine closed, reopened on demand ------------- */

static const struct eng_spec c5_cons =
	ENG("decode", RT_CONS_ENGINE, 1, 16, HND, 64, 1, 0);

static const struct eng_spec c5_engs[3] = {
	ENG("A", 0x50e1, 1, 16, HND, 48, 1, 80),
	ENG("B", 0x50e2, 1, 16, NHD, 48, 1, 84),
	ENG("C", 0x50e3, 1, 32, HND, 24, 1, 88),
};

/* k0 A, k1 B, k2 C, k3 B, k4 C, k5 A, k6 B */
#define C5_REQ 7
static const uint32_t c5_eng[C5_REQ] = { 0, 1, 2, 1, 2, 0, 1 };
static struct req c5_rq[C5_REQ];

/* Engine e went down to make room: -ENOSPC, KVP_REASON_EVICTED, no
 * DISCONNECTED and no transport failure counted. */
static int evicted(struct cons *c, uint32_t e, uint32_t downs)
{
	struct kvp_engine_info in;
	const char *who = c->who;

	if (info(c, e, &in))
		return -1;
	if (c->downs[e] != downs || c->down_status[e] != -ENOSPC ||
	    c->down_reason[e] != KVP_REASON_EVICTED || c->disc[e] ||
	    in.state != KVP_ENGINE_DOWN || in.reason != KVP_REASON_EVICTED ||
	    in.transport_failures || !strstr(in.why, "max_qps"))
		RT_FAIL("%s: %u downs (want %u), status %s, reason %u, %u DISCONNECTED, state %u, %llu transport failures, why \"%s\"",
			c->es[e].name, c->downs[e], downs,
			kvp_strerror(c->down_status[e]), c->down_reason[e],
			c->disc[e], in.state,
			(unsigned long long)in.transport_failures, in.why);
	return 0;
out:
	return -1;
}

static int c5_consumer(const void *arg, uint32_t rank)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_engine_info in;
	struct want w = { .ups = { 1, 1, 0 } };
	struct cons *c;
	const char *who = "decode";
	uint32_t k;
	int ret = 1, err;

	(void)arg;
	memset(&at, 0, sizeof(at));
	at.max_qps = 4; /* two engines of one rank, two queue pairs each */
	c = cons_new(&c5_cons, rank, c5_engs, 3, c5_rq, C5_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 30000) || cons_add(c, 1, 30000) ||
	    cons_wait(c, &w, 40, "A and B up"))
		goto out;
	w.quiet = 1;
	for (k = 0; k < 2; k++)
		if (cons_pull_busy(c, k, 20) || cons_wait(c, &w, 30, "DONE"))
			goto out;
	/* C finds no slot: A, idle and used longest ago, goes for it. */
	if (cons_add(c, 2, 30000))
		goto out;
	w.ups[2] = 1;
	w.downs[0] = 1;
	if (cons_wait(c, &w, 40, "C up, A down") || evicted(c, 0, 1))
		goto out;
	if (c->downs[1] || c->downs[2])
		RT_FAIL("B or C went down: %u, %u", c->downs[1], c->downs[2]);
	if (cons_pull_busy(c, 2, 20) || cons_wait(c, &w, 30, "C's DONE"))
		goto out;
	/* B and C each with a pull not yet polled: neither is idle, so A
	 * cannot come back; nothing changes. */
	if (cons_pull(c, 3) || cons_pull(c, 4))
		RT_FAIL("pulls from B and C refused");
	err = cons_pull(c, 5);
	if (err != -ENOSPC)
		RT_FAIL("pull from A with B and C busy: %s, want -ENOSPC",
			kvp_strerror(err));
	if (info(c, 0, &in) || in.state != KVP_ENGINE_DOWN)
		RT_FAIL("A: state %u after -ENOSPC, want DOWN", in.state);
	if (cons_wait(c, &w, 30, "B's and C's DONE"))
		goto out;
	/* Now both are idle: B, used before C, makes room for A. */
	w.downs[1] = 1;
	if (cons_pull_reconnect(c, 5, 40) ||
	    cons_wait(c, &w, 30, "A's DONE, B down") || evicted(c, 1, 1))
		goto out;
	/* And B comes back in C's place (C used before A). */
	w.downs[2] = 1;
	if (cons_pull_reconnect(c, 6, 40) ||
	    cons_wait(c, &w, 30, "B's DONE, C down") || evicted(c, 2, 1))
		goto out;
	for (k = 0; k < C5_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu not DONE", (unsigned long long)c5_rq[k].id);
	kvp_agent_get_stats(c->a, &st);
	if (st.evictions != 3 || st.reconnects != 2 || st.qps != 4 ||
	    st.transport_failures)
		RT_FAIL("stats: %llu evictions (want 3), %llu reconnects (want 2), %llu QPs (want 4), %llu transport failures",
			(unsigned long long)st.evictions,
			(unsigned long long)st.reconnects,
			(unsigned long long)st.qps,
			(unsigned long long)st.transport_failures);
	if (info(c, 0, &in))
		goto out;
	printf("     3 engines through a budget of 4 QPs: 3 evictions, A back in %.1f ms (plan %s)\n",
	       in.add_ns / 1e6, in.plan_cached ? "cached" : "compiled");
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static uint32_t c5_eng_of(uint32_t k)
{
	return c5_eng[k];
}

static uint32_t c5_tokens(uint32_t k)
{
	return 24 + 8 * k;
}

static int run_budget(void)
{
	enum { READY, STOP, NPIPES };
	int f[NPIPES][2], ret = -1;
	uint32_t nprod;
	pid_t d;

	reqs_init(c5_rq, C5_REQ, 5000, c5_eng_of, c5_tokens);
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c5_rq, C5_REQ, c5_engs, 3, &c5_cons, 15) ||
	    engines_start(c5_engs, 3, c5_rq, C5_REQ, f[READY][0], f[READY][1],
			  f[STOP][0], &nprod) ||
	    (d = spawn(c5_consumer, NULL, 0)) < 0 || kid_wait(d, 90) ||
	    engines_stop(f[STOP][1], nprod))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 6. the QP budget: an engine that owes notifications is not idle ----- */

static const struct eng_spec c6_cons =
	ENG("decode", RT_CONS_ENGINE, 1, 16, HND, 64, 1, 0);

static const struct eng_spec c6_engs[3] = {
	/* A: four receive buffers on its rank's first queue pair (no shared
	 * queue), so that once it stops polling a few pulls use its credit
	 * up and the next notification waits */
	{ .name = "A", .id = 0x50f1, .tp = 1, .block = 16, .kv_layout = HND,
	  .nblocks = 48, .layers = 1, .port = 92, .rq_depth = 4,
	  .srq = KVP_SRQ_OFF },
	ENG("B", 0x50f2, 1, 16, NHD, 48, 1, 96),
	ENG("C", 0x50f3, 1, 16, HND, 48, 1, 100),
};

/* k0..k15 A, k16 B, k17 C */
#define C6_A 16
#define C6_REQ (C6_A + 2)
static struct req c6_rq[C6_REQ];

struct c6_fds {
	int paused, resume;
};

static int c6_consumer(const void *arg, uint32_t rank)
{
	const struct c6_fds *fd = arg;
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_engine_info in;
	struct want w = { .ups = { 1, 1, 0 } };
	struct cons *c;
	const char *who = "decode";
	uint32_t k, next, owed = 0;
	double end;
	int ret = 1;

	memset(&at, 0, sizeof(at));
	at.max_qps = 4; /* two engines of one rank, two queue pairs each */
	at.stall_ms = 60000; /* the waiting notification outlives the case */
	c = cons_new(&c6_cons, rank, c6_engs, 3, c6_rq, C6_REQ, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 30000) || cons_add(c, 1, 30000) ||
	    cons_wait(c, &w, 40, "A and B up"))
		goto out;
	w.quiet = 1;
	if (cons_pull_busy(c, 0, 20) || cons_wait(c, &w, 30, "A's first DONE") ||
	    wait_byte_polling(fd->paused, 30, cons_poll_fn, c))
		RT_FAIL("A's producer never stopped polling");
	/* A's producer re-posts no receive buffer now, but its NIC still
	 * serves READs: pull until, every pull DONE and the credit read
	 * again, a notification waits. */
	for (next = 1; next < C6_A && !owed; next++) {
		if (cons_pull_busy(c, next, 20) ||
		    cons_wait(c, &w, 30, "DONE from A"))
			goto out;
		end = rt_now() + 0.1;
		while (rt_now() < end)
			if (cons_poll(c) < 0)
				goto out;
			else
				usleep(500);
		kvp_agent_get_stats(c->a, &st);
		owed = next + 1 - (uint32_t)st.notes_sent;
	}
	if (!owed)
		RT_FAIL("%u pulls from A, every notification sent: its credit never ran out",
			next);
	/* B used after A: A is the least recently used engine, and every
	 * pull of it is DONE, but it still owes its producer a notification:
	 * only B is idle, and B makes room for C. */
	if (info(c, 1, &in) || c->downs[1] || in.state != KVP_ENGINE_UP)
		RT_FAIL("B: %u downs (%s, reason %u), state %u, why \"%s\"",
			c->downs[1], kvp_strerror(c->down_status[1]),
			c->down_reason[1], in.state, in.why);
	if (cons_pull_busy(c, C6_A, 20) || cons_wait(c, &w, 30, "B's DONE"))
		goto out;
	if (cons_add(c, 2, 30000))
		goto out;
	end = rt_now() + 40;
	while (!c->ups[2] || !c->downs[1]) {
		if (cons_poll(c) < 0)
			goto out;
		if (c->downs[0])
			RT_FAIL("A went down (%s, reason %u) with %u notification(s) still owed to its producer",
				kvp_strerror(c->down_status[0]),
				c->down_reason[0], owed);
		if (c->downs[2])
			RT_FAIL("C went down: %s",
				kvp_strerror(c->down_status[2]));
		if (rt_now() > end)
			RT_FAIL("timeout waiting for C up, B down");
		usleep(50);
	}
	if (evicted(c, 1, 1))
		goto out;
	if (info(c, 0, &in))
		goto out;
	if (c->downs[0] || in.state != KVP_ENGINE_UP)
		RT_FAIL("A: %u downs, state %u, want 0 and UP", c->downs[0],
			in.state);
	kvp_agent_get_stats(c->a, &st);
	if (next + 1 - (uint32_t)st.notes_sent != owed)
		RT_FAIL("%llu notifications sent of %u (A's and B's) before the resume, want %u owed",
			(unsigned long long)st.notes_sent, next + 1, owed);
	/* A's producer polls again: the owed notification goes out, and
	 * the rest of A's requests (every one is expected) are pulled. */
	if (write(fd->resume, "r", 1) != 1)
		RT_FAIL("resume pipe");
	for (k = next; k < C6_A; k++)
		if (cons_pull_busy(c, k, 20))
			goto out;
	w.ups[2] = 1;
	w.downs[1] = 1;
	if (cons_pull_busy(c, C6_A + 1, 20) ||
	    cons_wait(c, &w, 30, "A's and C's DONE"))
		goto out;
	end = rt_now() + 20;
	for (;;) {
		kvp_agent_get_stats(c->a, &st);
		if (st.notes_sent == C6_REQ)
			break;
		if (cons_poll(c) < 0)
			goto out;
		if (rt_now() > end)
			RT_FAIL("%llu notifications sent, want %u",
				(unsigned long long)st.notes_sent, C6_REQ);
		usleep(200);
	}
	for (k = 0; k < C6_REQ; k++)
		if (c->st[k] != R_DONE)
			RT_FAIL("%llu not DONE", (unsigned long long)c6_rq[k].id);
	if (st.evictions != 1 || st.transport_failures)
		RT_FAIL("stats: %llu evictions (want 1), %llu transport failures",
			(unsigned long long)st.evictions,
			(unsigned long long)st.transport_failures);
	printf("     A, least recently used, owed %u notification(s): B closed for C instead; A's producer released all %u\n",
	       owed, C6_A);
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static uint32_t c6_eng_of(uint32_t k)
{
	return k < C6_A ? 0 : k - C6_A + 1;
}

static uint32_t c6_tokens(uint32_t k)
{
	(void)k;
	return 16;
}

static int run_owed(void)
{
	enum { READY, STOP, PAUSED, RESUME, NPIPES };
	int f[NPIPES][2], ret = -1;
	/* A's producer stops polling once it released the first request,
	 * and must release every one of them (none may expire) */
	struct prod_opts oa = { .phases = 1, .disc_fd = -1, .pause_after = 1 };
	struct prod_opts o = { .phases = 1, .disc_fd = -1 };
	struct c6_fds fd;
	uint32_t e;
	pid_t d;

	reqs_init(c6_rq, C6_REQ, 6000, c6_eng_of, c6_tokens);
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c6_rq, C6_REQ, c6_engs, 3, &c6_cons, 16))
		goto out;
	oa.paused_fd = f[PAUSED][1];
	oa.resume_fd = f[RESUME][0];
	for (e = 0; e < 3; e++)
		if (spawn_engine(&c6_engs[e], e, c6_rq, C6_REQ, e ? &o : &oa,
				 f[READY][1], f[STOP][0], NULL))
			goto out;
	if (wait_bytes(f[READY][0], 3, 30, "producers ready"))
		goto out;
	fd.paused = f[PAUSED][0];
	fd.resume = f[RESUME][1];
	if ((d = spawn(c6_consumer, &fd, 0)) < 0 || kid_wait(d, 90) ||
	    engines_stop(f[STOP][1], 3))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

/* ---- 7. a rank reading before expect() is not evicted -------------------- */

/* A producer rank of one rank slot (max_peers 1: max_qps 2, one consumer
 * rank of two queue pairs). Consumer A pulls request after request that
 * the producer never expects: it reads and notifies, but its engine never
 * has a request expected or early that A has not notified, so only the
 * READs show that it is busy. Each pull ends FAILED -ESTALE (no lease:
 * the producer never held it). Consumer B, of another engine, connects
 * while A pulls: A must not be evicted for it while it pulls; B gets A's
 * slot once A went quiet, and pulls its request. */
static const struct eng_spec c7_prod[1] = {
	{ .name = "P", .id = 0x50f7, .tp = 1, .block = 16, .kv_layout = HND,
	  .nblocks = 64, .layers = 2, .port = 104, .max_peers = 1 },
};

static const struct eng_spec c7_cons =
	ENG("decode", RT_CONS_ENGINE, 1, 16, HND, 64, 2, 0);

#define C7_ENGINE_B (RT_CONS_ENGINE + 1)
#define C7_PULL_S 2.0 /* A pulls for this long once B is on its way */
static struct req c7_rq[2]; /* A's blocks (never expected), B's request */

struct c7_fds {
	int a_pulling; /* A -> parent: pulling (B may come) */
	int a_done;    /* A -> parent: stopped pulling, then evicted */
};

/* How each of A's pulls ends: FAILED, the producer held none of them. */
static int c7_ended(const struct kvp_event *ev)
{
	return ev->type == KVP_EV_FAILED && ev->status == -ESTALE &&
	       ev->reason == KVP_REASON_LEASE;
}

/* A: pulls c7_rq[0]'s blocks under ids 7000, 7001, ..., at most 4 in
 * flight, until C7_PULL_S after its first DONE; then waits to be evicted
 * (ENGINE_DOWN -ECONNRESET, KVP_REASON_PEER_EVICTED or a reset) for B. */
static int c7_consumer_a(const void *arg, uint32_t rank)
{
	const struct c7_fds *fd = arg;
	struct kvp_agent_attr at;
	struct kvp_event ev[16];
	struct want w = { .ups = { 1 } };
	struct kvp_ids x = ids_of(&c7_rq[0]);
	struct cons *c;
	const char *who = "decode A";
	uint32_t pulled = 0, done = 0, inflight = 0, downs = 0;
	double t_first = 0, end;
	int ret = 1, err, n, i, down_status = 0;

	memset(&at, 0, sizeof(at));
	at.max_inflight = 4;
	c = cons_new(&c7_cons, rank, c7_prod, 1, c7_rq, 1, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 30000) || cons_wait(c, &w, 30, "ENGINE_UP"))
		goto out;
	end = rt_now() + 60;
	while (!t_first || rt_now() < t_first + C7_PULL_S) {
		while (inflight < 4) {
			err = kvp_agent_pull_from(c->a, c->h[0], 7000 + pulled,
						  &x);
			if (err == -EBUSY)
				break; /* slots wait for their notifications */
			if (err == -ENOTCONN)
				RT_FAIL("pull %u (%u DONE, %u in flight): its engine is going down: evicted while it read",
					pulled, done, inflight);
			if (err)
				RT_FAIL("pull %u (%u DONE): %s", pulled, done,
					kvp_strerror(err));
			pulled++;
			inflight++;
		}
		n = kvp_agent_poll(c->a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < n; i++) {
			if (c7_ended(&ev[i])) {
				done++;
				inflight--;
				continue;
			}
			if (ev[i].type == KVP_EV_DISCONNECTED)
				continue;
			RT_FAIL("while pulling (%u ended, %u in flight): event %u %s (%s): evicted while it read",
				done, inflight, ev[i].type,
				kvp_strerror(ev[i].status),
				kvp_reason_str(ev[i].reason));
		}
		if (done && !t_first) {
			t_first = rt_now();
			if (write(fd->a_pulling, "p", 1) != 1)
				RT_FAIL("pipe");
		}
		if (rt_now() > end)
			RT_FAIL("no pull ended");
	}
	/* The last ones in, then quiet: now it may go. */
	end = rt_now() + 30;
	while (inflight || !downs) {
		n = kvp_agent_poll(c->a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < n; i++) {
			if (c7_ended(&ev[i]) && !downs) {
				done++;
				inflight--;
			} else if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				downs++;
				down_status = ev[i].status;
			} else if (ev[i].type != KVP_EV_DISCONNECTED) {
				RT_FAIL("after pulling (%u DONE, %u in flight): event %u %s",
					done, inflight, ev[i].type,
					kvp_strerror(ev[i].status));
			}
		}
		if (downs && inflight)
			RT_FAIL("evicted with %u pulls in flight", inflight);
		if (rt_now() > end)
			RT_FAIL("never evicted once quiet (%u in flight)",
				inflight);
		usleep(200);
	}
	if (down_status != -ECONNRESET)
		RT_FAIL("ENGINE_DOWN %s, want a reset (evicted)",
			kvp_strerror(down_status));
	/* every pull wrote the same blocks */
	c->st[0] = R_DONE;
	if (cons_check_mem(c))
		goto out;
	printf("     A pulled %u requests before any expect() (each FAILED -ESTALE: never held) and was not evicted until it went quiet\n",
	       done);
	if (write(fd->a_done, "d", 1) != 1)
		RT_FAIL("pipe");
	ret = 0;
out:
	cons_free(c);
	return ret;
}

/* B: once A pulls, connects (refused while A is busy: it retries within
 * its 30 s) and pulls its request. */
static int c7_consumer_b(const void *arg, uint32_t rank)
{
	struct kvp_agent_attr at;
	struct want w = { .ups = { 1 }, .quiet = 1 };
	struct eng_spec cs = c7_cons;
	struct cons *c;
	const char *who = "decode B";
	int ret = 1;

	(void)arg;
	memset(&at, 0, sizeof(at));
	cs.name = "decode B";
	cs.id = C7_ENGINE_B;
	c = cons_new(&cs, rank, c7_prod, 1, c7_rq + 1, 1, &at);
	if (!c)
		return 1;
	who = c->who;
	if (cons_add(c, 0, 30000) || cons_wait(c, &w, 40, "B's ENGINE_UP") ||
	    cons_pull_busy(c, 0, 20) || cons_wait(c, &w, 30, "B's DONE"))
		goto out;
	if (c->st[0] != R_DONE)
		RT_FAIL("B's request: %s", kvp_strerror(c->status[0]));
	if (cons_check_mem(c))
		goto out;
	ret = 0;
out:
	cons_free(c);
	return ret;
}

static int run_read_early(void)
{
	enum { READY, STOP, PULLING, ADONE, NPIPES };
	int f[NPIPES][2], ret = -1;
	struct prod_opts o = { .phases = 1, .disc_fd = -1, .want_disc = 1 };
	struct c7_fds fd;
	pid_t a, b, p[1];

	memset(c7_rq, 0, sizeof(c7_rq));
	c7_rq[0].id = 7000; /* A pulls these blocks under 7000, 7001, ... */
	c7_rq[0].consumer = RT_CONS_ENGINE;
	c7_rq[0].tokens = 64;
	c7_rq[1].id = 7999;
	c7_rq[1].consumer = C7_ENGINE_B;
	c7_rq[1].phase = 1;
	c7_rq[1].deadline_s = 60;
	c7_rq[1].tokens = 48;
	if (pipes_open(f, NPIPES) ||
	    make_blocks(c7_rq, 2, c7_prod, 1, &c7_cons, 17))
		goto out;
	fd.a_pulling = f[PULLING][1];
	fd.a_done = f[ADONE][1];
	if (spawn_engine(&c7_prod[0], 0, c7_rq, 2, &o, f[READY][1],
			 f[STOP][0], p) ||
	    wait_bytes(f[READY][0], 1, 30, "producer ready") ||
	    (a = spawn(c7_consumer_a, &fd, 0)) < 0 ||
	    wait_bytes(f[PULLING][0], 1, 40, "A pulling") ||
	    (b = spawn(c7_consumer_b, NULL, 0)) < 0 ||
	    wait_bytes(f[ADONE][0], 1, 60, "A done") || kid_wait(a, 30) ||
	    kid_wait(b, 60) || put_bytes(f[STOP][1], 1) || kid_wait(p[0], 30))
		goto out;
	ret = 0;
out:
	kids_end();
	pipes_close(f, NPIPES);
	return ret;
}

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	uint32_t pass = 0, fail = 0, i;
	struct {
		const char *name;
		int (*fn)(void);
	} t[] = {
		{ "one decode engine, three prefill engines (+1 cached plan)",
		  run_many },
		{ "prefill engine killed mid-transfer, restarted",
		  run_restart },
		{ "consumer engine killed, a new one connects",
		  run_consumer_killed },
		{ "producer stops polling: stall, then resume", run_stall },
		{ "max_qps: the LRU idle engine closed, reopened on demand",
		  run_budget },
		{ "max_qps: an engine that owes notifications is not idle",
		  run_owed },
		{ "producer: a rank reading before expect() is not evicted",
		  run_read_early },
	};

	if (rt_start(&env, 20500))
		return 1;
	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		double t0 = rt_now();

		if (filter && !strstr(t[i].name, filter))
			continue;
		rt_report(t[i].name, !t[i].fn(), t0, &pass, &fail);
	}
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
