// SPDX-License-Identifier: MIT
/*
 * kvpull-stream-bench: a streamed pull (kvp_agent_pull_stream()) beside a
 * bulk pull (kvp_agent_pull_from() once the prefill is done), while the
 * producer simulates a prefill at a set pace. Public API only.
 *
 *   kvpull-stream-bench [--case NAME] [--runs N] [--addr IP] [--port N]
 *
 * Each case forks its producer ranks and one consumer rank (rank 0 of its
 * engine). A producer rank's memory starts as poison (0xee); its "prefill"
 * writes each step's bytes (copied from a seeded random image: whole
 * blocks of the layers the step completes; chunk boundaries fall on block
 * boundaries) only when the step's time comes, then publishes the step
 * (kvp_agent_publish()). The consumer pulls three requests, one at a time:
 *   - alone: pulled streamed (stream_events); every layer but the last
 *     published at every token and, once KVP_EV_ARRIVED says they
 *     landed, the last layer alone: from that publish (the last rank's)
 *     to DONE is layer_xfer_ms, the transfer of the layer a streamed
 *     pull can never overlap, measured alone (for a hybrid's unequal
 *     layers, the one that is exposed);
 *   - bulk: paced prefill, the pull once the last step is published;
 *   - stream: paced prefill, the streamed pull issued before it starts.
 * The compute per layer is the case's factor times layer_xfer_ms. Each
 * pull's bytes are compared with what the plan's READs of the random image
 * give: wrong_bytes differ, early_bytes are poison (a READ before its
 * step). One line per case:
 *
 *   stream: case=NAME layers=L chunks=C bytes=B reads_bulk=R1
 *     reads_stream=R2 layer_xfer_ms=X exposed_bulk_ms=Y exposed_stream_ms=Z
 *     ratio=Z/Y total_bulk_ms=T1 total_stream_ms=T2 progress_msgs=M
 *     wrong_bytes=W early_bytes=E
 *
 * Each of the three pulls runs N times (--runs, 5 by default), over
 * producer memory poisoned again and consumer memory cleared before each
 * run: the line gives the medians of the times (ratio: of the medians),
 * the largest READ and progress counts, and wrong and early bytes summed
 * over the runs; each run's times go to stderr. Under emulation one
 * run's figures scatter by tens of percent.
 *
 * exposed: from the last publish (of any producer rank) to DONE; total:
 * from the start of the prefill (the first rank's, once its memory is
 * poisoned) to DONE; progress_msgs: progress records the producer ranks
 * wrote for the streamed request, per consumer rank (each producer rank
 * publishes its own progress). A "goals:" line follows each case's line:
 * "ok", or each goal of the streaming issue the medians miss, and by how
 * much. KVP_BENCH_TRACE=1 adds, per run, the last steps' publish, the
 * next progress seen and the layer's arrival, and the consumer's poll
 * times (soft-RoCE on loopback moves a READ's bytes inside the post
 * call, so a poll that posts many layers lasts as long as their
 * transfer).
 * scripts/rdma-bench.sh --stream runs every case in one soft-RoCE VM boot.
 */
#define _GNU_SOURCE /* ppoll */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvpull.h"
#include "kvtest.h"
#include "rdma_tool.h"

#define PRODUCER_ENGINE 0x73747270ull
#define CONSUMER_ENGINE 0x73747263ull
#define POISON 0xee
#define NREQ 3 /* alone, bulk, stream */
#define MAXG 4
#define MAXSTEPS 256
#define MAXRUNS 9 /* --runs at most */

struct bcase {
	const char *name, *model;
	uint32_t layers, state_layers; /* kept of the preset's */
	uint32_t P;
	uint32_t tokens;   /* per request */
	uint32_t chunks;   /* 1: layer by layer; more: chunked prefill */
	double factor;	   /* compute per layer / one layer's transfer */
};

static const struct bcase cases[] = {
	/* all 32 layers of llama-3.1-8b: 4 KiB per token and layer */
	{ "dense-layerwise", "llama-3.1-8b", 32, 0, 1, 256, 1, 2.0 },
	{ "dense-chunked", "llama-3.1-8b", 32, 0, 1, 256, 4, 2.0 },
	{ "hybrid", "nemotron-h-8b", 2, 2, 1, 256, 1, 2.0 },
	{ "tp2to1", "llama-3.1-8b", 32, 0, 2, 256, 1, 2.0 },
	{ "short", "llama-3.1-8b", 32, 0, 1, 16, 1, 2.0 },
	{ "link-bound", "llama-3.1-8b", 32, 0, 1, 256, 1, 0.5 },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* What the consumer tells the producer ranks, and what they report back,
 * in memory shared by the processes (mapped before they fork). */
struct ctl {
	volatile uint32_t seq;	    /* a run: bumped by the consumer */
	volatile uint32_t req;	    /* its request */
	volatile uint64_t pace_ns;  /* compute per layer; 0: all at once */
	volatile uint32_t alone;    /* the run measures one layer alone */
	volatile uint32_t rest;	    /* alone: publish the last layer (= seq) */
	volatile uint64_t t_first[TOOL_MAX_RANKS]; /* alone: the last layer's
						    * publish */
	volatile uint64_t t_begin[TOOL_MAX_RANKS]; /* its prefill's start,
						    * after the poison */
	volatile uint32_t done[TOOL_MAX_RANKS];	  /* the last run done */
	volatile uint64_t t_last[TOOL_MAX_RANKS]; /* its last publish */
	volatile uint64_t writes[TOOL_MAX_RANKS]; /* progress records */
	/* KVP_BENCH_TRACE: rank 0's publishes of the run just done */
	volatile uint32_t npub;
	volatile uint64_t t_pub[MAXSTEPS];
};

struct bench {
	const struct bcase *c;
	const char *addr;
	uint32_t port;
	struct ctl *ctl;
	uint32_t runs;	   /* of each of the three pulls: medians */
	struct kvp_ids ids[NREQ][MAXG];
	uint32_t lid[NREQ][MAXG][64], rid[NREQ][MAXG][64];
};

/* Blocks per region: NREQ requests, above the state slots of a hybrid's
 * pool. */
static uint32_t nblocks(const struct bcase *c)
{
	return NREQ * ((c->tokens + 15) / 16) + (c->state_layers ? 256 : 8);
}

static kvp_layout *build(const struct bcase *c, int producer, uint32_t rank)
{
	struct kvp_engine_desc e = { 0 };
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(c->model, &m))
		return NULL;
	m.layers = c->layers;
	m.state_layers = c->state_layers;
	e.engine_id = producer ? PRODUCER_ENGINE : CONSUMER_ENGINE;
	e.tp_size = producer ? c->P : 1;
	e.tp_rank = rank;
	e.block_tokens = 16;
	e.num_blocks = nblocks(c);
	e.kv_layout = KVP_KV_FLASH_HND;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

/* The producer ranks' bytes: a seeded random image per rank. */
static void truth(struct kvt_mem *m, uint32_t rank)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (rank + 1);
	uint32_t r;
	uint64_t o;

	for (r = 0; r < m->nregions; r++)
		for (o = 0; o < m->size[r]; o++)
			m->buf[r][o] = (uint8_t)(kvt_rand(&s) >> 32);
}

/* Request k's ids: distinct blocks per request, state slot k. */
static int make_ids(struct bench *b, const kvp_layout *pl)
{
	struct kvp_layout_info li;
	uint32_t k, g, i, nb = (b->c->tokens + 15) / 16;
	uint32_t base = tool_token_base(pl, NREQ);

	kvp_layout_get_info(pl, &li);
	for (k = 0; k < NREQ; k++) {
		for (g = 0; g < li.ngroups && g < MAXG; g++) {
			struct kvp_group_desc gd;
			struct kvp_ids *x = &b->ids[k][g];
			uint32_t n;

			if (kvp_layout_get_group(pl, g, &gd))
				continue;
			n = gd.kind == KVP_GROUP_STATE ? 1 : nb;
			for (i = 0; i < n; i++) {
				/* state: slot k; tokens: above the
				 * state slots (hybrid pools share pages) */
				b->rid[k][g][i] = gd.kind == KVP_GROUP_STATE ?
							  k :
							  base + k * nb + i;
				b->lid[k][g][i] = b->rid[k][g][i];
			}
			x->local = b->lid[k][g];
			x->remote = b->rid[k][g];
			x->nlocal = x->nremote = n;
			x->tokens = gd.kind == KVP_GROUP_STATE ? 0 :
								b->c->tokens;
			if (gd.kind != KVP_GROUP_STATE &&
			    base + NREQ * nb > nblocks(b->c))
				return -1;
		}
	}
	return 0;
}

/* A view's page extent: the bytes its fields span from the page start. */
static uint64_t page_extent(const kvp_layout *l, uint32_t view)
{
	struct kvp_layout_info li;
	struct kvp_field_desc f;
	uint64_t end = 0, e;
	uint32_t i, v, d;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nfields; i++) {
		if (kvp_layout_get_field(l, i, &v, &f) || v != view)
			continue;
		e = f.offset + f.elem_size;
		for (d = 0; d < f.ndim; d++)
			e += (uint64_t)(f.dim[d].size - 1) * f.dim[d].stride;
		if (e > end)
			end = e;
	}
	return end;
}

/* Writes what layers [l0, l1) hold of tokens [t0, t1) of request `ids`:
 * whole blocks (t0, t1 fall on block boundaries, or at the end), state
 * pages with the last chunk; poison instead when src is NULL. */
static void write_part(const kvp_layout *l, struct kvt_mem *live,
		       const struct kvt_mem *src, const struct kvp_ids *ids,
		       uint32_t l0, uint32_t l1, uint64_t t0, uint64_t t1)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v;
	struct kvp_group_desc gd;
	uint32_t i, k;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		uint64_t ext;

		if (kvp_layout_get_view(l, i, &v) || v.layer < l0 ||
		    v.layer >= l1 || kvp_layout_get_group(l, v.group, &gd))
			continue;
		ext = page_extent(l, i);
		for (k = 0; k < ids[v.group].nremote; k++) {
			uint64_t b0 = (uint64_t)k * gd.block_tokens;
			uint64_t off = v.offset + (uint64_t)ids[v.group].remote[k] *
							  v.stride;

			if (gd.kind == KVP_GROUP_STATE ?
				    t1 != KVP_TOKENS_END :
				    b0 < t0 || b0 >= t1)
				continue;
			if (src)
				memcpy(live->buf[v.region] + off,
				       src->buf[v.region] + off, ext);
			else /* poison again, for the next run */
				memset(live->buf[v.region] + off, POISON, ext);
		}
	}
}

/* Drives agent a until `until`, asleep on its fds in between (ppoll: ns
 * timeouts): a producer's "compute" leaves the CPU to the consumer, as a
 * GPU's would in a deployment. Under emulation the ranks and soft-RoCE's
 * own work share 2 vCPUs, so a spinning producer would slow the
 * transfer it overlaps. */
/* One sleep on agent a's fds: until it has work, its own next timer
 * (within 100 us while a request streams in: the progress record raises
 * no completion), or `until`. 0, or -1. */
static int agent_nap(kvp_agent *a, uint64_t until)
{
	struct pollfd w[KVP_AGENT_FDS];
	int fds[KVP_AGENT_FDS], i, k;
	uint64_t now, wake;
	struct timespec ts;

	if (kvp_agent_fds(a, fds, KVP_AGENT_FDS) != KVP_AGENT_FDS)
		return -1;
	k = kvp_agent_arm(a, &wake);
	if (k)
		return k < 0 ? -1 : 0; /* completions wait: poll first */
	now = tool_now_ns();
	if (wake > until)
		wake = until;
	if (wake <= now)
		return 0;
	ts.tv_sec = (time_t)((wake - now) / 1000000000ull);
	ts.tv_nsec = (long)((wake - now) % 1000000000ull);
	for (i = 0; i < KVP_AGENT_FDS; i++) {
		w[i].fd = fds[i];
		w[i].events = POLLIN;
		w[i].revents = 0;
	}
	(void)ppoll(w, KVP_AGENT_FDS, &ts, NULL);
	return 0;
}

/* 0, or a negative errno. */
static int poll_for(kvp_agent *a, uint64_t until)
{
	struct kvp_event ev[16];
	int n;

	for (;;) {
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			return n;
		if (tool_now_ns() >= until)
			return 0;
		if (agent_nap(a, until))
			return -EIO;
	}
}

/* One paced prefill of request `id` (its blocks: request index id %
 * NREQ; pace 0: everything at once), over poison written first. 0, or a
 * negative errno. */
static int prefill(struct bench *b, kvp_agent *a, const kvp_layout *l,
		   struct kvt_mem *live, const struct kvt_mem *src,
		   uint32_t rank, uint32_t id, uint64_t pace)
{
	const struct bcase *c = b->c;
	struct kvp_progress s[MAXSTEPS], pub = { 0, 0, 0, 0 };
	uint32_t n = 0, q, layers = c->layers + c->state_layers, i;
	uint64_t chunk = (c->tokens / c->chunks + 15) / 16 * 16, t0, t1;
	uint64_t step_ns, next;
	struct kvp_agent_stats st0, st1;
	const uint32_t k = id % NREQ;
	int err;

	/* the steps: layer by layer in each chunk */
	for (t0 = 0; t0 < c->tokens; t0 = t1) {
		t1 = t0 + chunk >= c->tokens ? KVP_TOKENS_END : t0 + chunk;
		for (q = 1; q < layers && n < MAXSTEPS - 2; q++)
			s[n++] = (struct kvp_progress){ t0, t1, q, 0 };
		s[n++] = (struct kvp_progress){ t1, t1, 0, 0 };
	}
	step_ns = pace * layers * chunk / c->tokens / (n / c->chunks);
	write_part(l, live, NULL, b->ids[k], 0, layers, 0, KVP_TOKENS_END);
	kvp_agent_get_stats(a, &st0);
	if (b->ctl->alone) {
		/* every layer but the last at every token; the last alone,
		 * once the consumer saw the others land */
		uint32_t seq = b->ctl->seq;

		if (layers > 1) {
			write_part(l, live, src, b->ids[k], 0, layers - 1, 0,
				   KVP_TOKENS_END);
			err = kvp_agent_publish(a, CONSUMER_ENGINE, id,
						&(struct kvp_progress){
							0, KVP_TOKENS_END,
							layers - 1, 0 });
			while (!err && b->ctl->rest != seq)
				err = poll_for(a, tool_now_ns() + 200000);
			if (err)
				return err;
		}
		write_part(l, live, src, b->ids[k], layers - 1, layers, 0,
			   KVP_TOKENS_END);
		err = kvp_agent_publish(a, CONSUMER_ENGINE, id,
					&(struct kvp_progress){
						KVP_TOKENS_END, KVP_TOKENS_END,
						0, 0 });
		if (err)
			return err;
		b->ctl->t_first[rank] = tool_now_ns();
		n = 0;
	}
	next = tool_now_ns();
	b->ctl->t_begin[rank] = next;
	for (i = 0; i < n; i++) {
		next += pace ? step_ns : 0;
		for (q = 0; q < layers; q++)
			write_part(l, live, src, b->ids[k], q, q + 1,
				   kvt_ready(&pub, q), kvt_ready(&s[i], q));
		/* the step's "compute" */
		err = pace ? poll_for(a, next) : 0;
		if (!err)
			err = kvp_agent_publish(a, CONSUMER_ENGINE, id, &s[i]);
		if (err)
			return err;
		pub = s[i];
		if (rank == 0) {
			b->ctl->t_pub[i] = tool_now_ns();
			b->ctl->npub = i + 1;
		}
	}
	b->ctl->t_last[rank] = tool_now_ns();
	kvp_agent_get_stats(a, &st1);
	b->ctl->writes[rank] = st1.progress_writes - st0.progress_writes;
	return 0;
}

static int producer(void *arg, uint32_t rank, int ready_fd, int stop_fd)
{
	struct bench *b = arg;
	struct kvt_mem live = { 0 }, src = { 0 };
	kvp_layout *l = build(b->c, 1, rank);
	kvp_agent *a = NULL;
	struct kvp_event ev[16];
	uint32_t seen = 0, k;
	const char *what = "setup";
	int err = -ENOMEM, ret = 1;

	alarm(600);
	if (!l || kvt_mem_alloc(l, &live) || kvt_mem_alloc(l, &src))
		goto fail;
	truth(&src, rank);
	for (k = 0; k < live.nregions; k++)
		memset(live.buf[k], POISON, live.size[k]);
	what = "open";
	err = tool_producer_open(l, b->addr, (uint16_t)(b->port + rank),
				 NREQ * MAXRUNS, &live, &a);
	if (err)
		goto fail;
	what = "expect";
	for (k = 0; k < NREQ * b->runs && !err; k++)
		err = kvp_agent_expect(a, CONSUMER_ENGINE, k,
				       tool_now_ns() + 600000000000ull);
	if (err)
		goto fail;
	if (write(ready_fd, "r", 1) != 1)
		goto out; /* the parent is gone */
	for (;;) {
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };

		if (b->ctl->seq != seen) {
			seen = b->ctl->seq;
			what = "prefill";
			err = prefill(b, a, l, &live, &src, rank, b->ctl->req,
				      b->ctl->pace_ns);
			if (err)
				goto fail;
			b->ctl->done[rank] = seen;
		}
		/* between runs: asleep on the agent (1 ms at most: the next
		 * run is a counter in shared memory, not an fd) */
		what = "poll";
		err = kvp_agent_poll(a, ev, 16);
		if (err >= 0)
			err = tool_agent_sleep(a, stop_fd, 1);
		if (err)
			goto fail;
		if (poll(&p, 1, 0) > 0)
			break;
	}
	ret = 0;
	goto out;
fail:
	/* the reason, or the case would end with exit status 1 and no word
	 * (no RDMA device: "stream-bench: NAME: producer rank 0: listen: no
	 * RDMA device") */
	fprintf(stderr, "stream-bench: %s: producer rank %u: %s: %s\n",
		b->c->name, rank, what, kvp_strerror(err));
out:
	kvp_agent_close(a);
	kvt_mem_free(&live);
	kvt_mem_free(&src);
	kvp_layout_destroy(l);
	return ret;
}

struct pulled {
	uint64_t t_done, reads, bytes, wrong, early;
	uint64_t t_seen;    /* KVP_BENCH_TRACE: the last new progress */
	/* KVP_BENCH_TRACE, streamed: each new progress seen, each layer's
	 * ARRIVED */
	uint32_t nseen, narr;
	uint64_t npoll, poll_ns, poll_max;
	uint64_t t_seens[MAXSTEPS], t_arr[MAXSTEPS];
};

/* Starts run `req` on the producers and pulls it: bulk once every rank
 * published its last step, or streamed from the start. */
static int run(struct bench *b, kvp_agent *a, uint32_t h, uint32_t req,
	       uint64_t pace, int stream, struct pulled *out)
{
	const int alone = stream == 2; /* the last layer's transfer, alone */
	const uint32_t layers = b->c->layers + b->c->state_layers;
	struct kvp_agent_stats s0, s1;
	struct kvp_event ev[16];
	uint32_t i, seq = b->ctl->seq + 1, pulled = 0;
	uint64_t seen_n = 0;
	int n, err;

	kvp_agent_get_stats(a, &s0);
	b->ctl->req = req;
	b->ctl->pace_ns = pace;
	b->ctl->alone = (uint32_t)alone;
	out->nseen = out->narr = 0;
	out->npoll = out->poll_ns = out->poll_max = 0;
	b->ctl->seq = seq;
	if (stream) {
		err = kvp_agent_pull_stream(a, h, req, b->ids[req % NREQ]);
		if (err)
			return err;
		pulled = 1;
	}
	for (;;) {
		if (!pulled) {
			for (i = 0; i < b->c->P && b->ctl->done[i] == seq; i++)
				;
			if (i == b->c->P) {
				err = kvp_agent_pull_from(a, h, req,
							  b->ids[req % NREQ]);
				if (err)
					return err;
				pulled = 1;
			}
		}
		{
			uint64_t tq = tool_now_ns();

			n = kvp_agent_poll(a, ev, 16);
			out->npoll++;
			tq = tool_now_ns() - tq;
			out->poll_ns += tq;
			if (tq > out->poll_max)
				out->poll_max = tq;
		}
		if (n < 0)
			return n;
		/* KVP_BENCH_TRACE: when the streamed pull last saw new
		 * progress (the rest of exposed_stream_ms is the READs) */
		if (getenv("KVP_BENCH_TRACE") && stream == 1) {
			struct kvp_agent_stats st;

			kvp_agent_get_stats(a, &st);
			if (st.progress_seen != seen_n) {
				seen_n = st.progress_seen;
				out->t_seen = tool_now_ns();
				if (out->nseen < MAXSTEPS)
					out->t_seens[out->nseen++] =
						out->t_seen;
			}
		}
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_ARRIVED) {
				if (stream == 1) {
					uint32_t l;

					for (l = out->narr; l < ev[i].layers &&
							    l < MAXSTEPS; l++)
						out->t_arr[l] = tool_now_ns();
					if (ev[i].layers > out->narr)
						out->narr = ev[i].layers;
				}
				/* alone: all but the last layer landed; the
				 * last may go */
				if (alone && ev[i].layers + 1 >= layers)
					b->ctl->rest = seq;
				continue;
			}
			if (ev[i].type != KVP_EV_DONE)
				return ev[i].status ? ev[i].status : -EPROTO;
			if (alone && layers > 1 && b->ctl->rest != seq)
				return -EPROTO; /* DONE before ARRIVED */
			out->t_done = tool_now_ns();
			kvp_agent_get_stats(a, &s1);
			out->reads = s1.reads - s0.reads;
			out->bytes = s1.read_bytes - s0.read_bytes;
			/* the producers' last publishes are in */
			for (i = 0; i < b->c->P; i++)
				while (b->ctl->done[i] != seq)
					usleep(100);
			return 0;
		}
	}
}

/* The last layer's publish of the alone run just done: the last of the
 * ranks'. */
static uint64_t first_publish(const struct bench *b)
{
	uint64_t last = 0;
	uint32_t i;

	for (i = 0; i < b->c->P; i++)
		if (b->ctl->t_first[i] > last)
			last = b->ctl->t_first[i];
	return last;
}

/* The start of the prefill just done: the first rank's, once its memory
 * is poisoned. */
static uint64_t prefill_start(const struct bench *b)
{
	uint64_t first = UINT64_MAX;
	uint32_t i;

	for (i = 0; i < b->c->P; i++)
		if (b->ctl->t_begin[i] < first)
			first = b->ctl->t_begin[i];
	return first;
}

/* The last publish of the run just done, over the producer ranks. */
static uint64_t last_publish(const struct bench *b)
{
	uint64_t last = 0;
	uint32_t i;

	for (i = 0; i < b->c->P; i++)
		if (b->ctl->t_last[i] > last)
			last = b->ctl->t_last[i];
	return last;
}

/* KVP_BENCH_TRACE: the streamed run's last steps (rank 0's publishes,
 * matched to the progresses seen in order, and the layers' ARRIVED), in
 * ms after each publish. A single-rank case only: with several ranks a
 * progress seen is any rank's. */
static void trace(const struct bench *b, const struct pulled *p)
{
	const uint64_t t0 = b->ctl->t_pub[0];
	uint32_t n = b->ctl->npub, i, k;

	fprintf(stderr, "  trace: last progress seen %.2f ms after the last publish, DONE %.2f ms after that; %u publishes, %u seen, %u layers arrived\n",
		((double)p->t_seen - (double)last_publish(b)) / 1e6,
		((double)p->t_done - (double)p->t_seen) / 1e6, n, p->nseen,
		p->narr);
	if (b->c->P != 1)
		return;
	for (i = n > 6 && atoi(getenv("KVP_BENCH_TRACE")) < 2 ? n - 6 : 0, k = 0;
	     i < n; i++) {
		const uint64_t tp = b->ctl->t_pub[i];

		/* the first progress seen after this publish */
		while (k < p->nseen && p->t_seens[k] < tp)
			k++;
		fprintf(stderr, "    step %u: publish at %.2f ms", i,
			(double)(tp - t0) / 1e6);
		if (k < p->nseen)
			fprintf(stderr, ", next seen +%.2f ms",
				((double)p->t_seens[k] - (double)tp) / 1e6);
		/* step i makes layer i ready */
		if (i < p->narr)
			fprintf(stderr, ", layer %u arrived +%.2f ms", i,
				((double)p->t_arr[i] - (double)tp) / 1e6);
		fprintf(stderr, "\n");
	}
	fprintf(stderr, "    DONE +%.2f ms after the last publish\n",
		((double)p->t_done - (double)b->ctl->t_pub[n - 1]) / 1e6);
}

/* The goals for this case, from the medians (med: layer_xfer,
 * exposed bulk and stream, total bulk and stream): one line, "ok" or what
 * missed and by how much. */
static void goals(const struct bcase *c, const double *med, uint64_t reads_b,
		  uint64_t reads_s, uint64_t writes, uint64_t wrong,
		  uint64_t early)
{
	const uint32_t layers = c->layers + c->state_layers;
	const double compute = c->factor * med[0] * layers;
	int miss = 0;

	printf("goals: case=%s", c->name);
	if (c->factor >= 2.0 && med[2] > 1.5 * med[0]) {
		printf(" exposed_stream_ms %.2f > 1.5 x layer_xfer_ms %.2f;",
		       med[2], 1.5 * med[0]);
		miss = 1;
	}
	if (c->factor < 1.0) {
		const double bound =
			(compute > med[1] ? compute : med[1]) + 1.5 * med[0];

		if (med[4] > bound) {
			printf(" total_stream_ms %.1f > max(compute %.1f, bulk transfer %.1f) + 1.5 x layer_xfer_ms = %.1f;",
			       med[4], compute, med[1], bound);
			miss = 1;
		}
		if (reads_s > reads_b) {
			printf(" reads_stream %llu > reads_bulk %llu;",
			       (unsigned long long)reads_s,
			       (unsigned long long)reads_b);
			miss = 1;
		}
	}
	if (c->tokens <= 16 && med[4] > 1.05 * med[3]) {
		printf(" total_stream_ms %.1f > 1.05 x total_bulk_ms %.1f;",
		       med[4], 1.05 * med[3]);
		miss = 1;
	}
	/* each producer rank publishes its own progress: the bound holds
	 * per (producer rank, consumer rank) */
	if (writes > (uint64_t)c->P * layers * c->chunks) {
		printf(" progress_msgs %llu > %u producer ranks x layers x chunks %u;",
		       (unsigned long long)writes, c->P, layers * c->chunks);
		miss = 1;
	}
	if (wrong || early) {
		printf(" wrong_bytes %llu, early_bytes %llu;",
		       (unsigned long long)wrong, (unsigned long long)early);
		miss = 1;
	}
	printf(miss ? "\n" : " ok\n");
}

/* Compares request req's local blocks with what the plan's READs of the
 * producers' random images give. */
static int verify(const struct bench *b, const kvp_plan *plan,
		  const kvp_layout *dl, struct kvt_mem *mem, uint32_t req,
		  struct pulled *o)
{
	struct kvt_mem exp = { 0 }, seen = { 0 }, prod[TOOL_MAX_RANKS];
	struct kvt_mem *pp[TOOL_MAX_RANKS];
	uint32_t maxw, maxs, i, r;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint64_t bytes = 0, off;
	int n, ret = -1;

	memset(prod, 0, sizeof(prod));
	kvp_plan_emit_bound(plan, 64, &maxw, &maxs);
	wr = calloc(maxw + 1, sizeof(*wr));
	sge = calloc(maxs + 1, sizeof(*sge));
	if (!wr || !sge || kvt_mem_alloc(dl, &exp) ||
	    kvt_mem_alloc(dl, &seen))
		goto out;
	for (r = 0; r < exp.nregions; r++) {
		memcpy(exp.buf[r], mem->buf[r], exp.size[r]);
		memset(seen.buf[r], 0, seen.size[r]);
	}
	for (i = 0; i < b->c->P; i++) {
		kvp_layout *pl = build(b->c, 1, i);

		if (!pl || kvt_mem_alloc(pl, &prod[i])) {
			kvp_layout_destroy(pl);
			goto out;
		}
		truth(&prod[i], i);
		pp[i] = &prod[i];
		kvp_layout_destroy(pl);
	}
	n = kvp_plan_emit(plan, b->ids[req], wr, maxw, sge, maxs, NULL);
	if (n < 0 || kvt_execute(plan, wr, (uint32_t)n, sge, pp, &exp, &seen,
				 &bytes))
		goto out;
	for (r = 0; r < exp.nregions; r++)
		for (off = 0; off < exp.size[r]; off++)
			if (seen.buf[r][off] &&
			    mem->buf[r][off] != exp.buf[r][off]) {
				o->wrong++;
				o->early += mem->buf[r][off] == POISON;
			}
	ret = 0;
out:
	for (i = 0; i < TOOL_MAX_RANKS; i++)
		kvt_mem_free(&prod[i]);
	kvt_mem_free(&exp);
	kvt_mem_free(&seen);
	free(wr);
	free(sge);
	return ret;
}

/* The median of n values (sorted in place; the upper one of two). */
/* The median of v[0..n) (n <= MAXRUNS), v left in run order. */
static double median(const double *in, uint32_t n)
{
	double v[MAXRUNS];
	uint32_t i, j;

	memcpy(v, in, n * sizeof(*v));
	for (i = 1; i < n; i++)
		for (j = i; j && v[j - 1] > v[j]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

static int consumer(void *arg, uint32_t rank)
{
	struct bench *b = arg;
	const struct bcase *c = b->c;
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_engine_info ei;
	struct pulled alone = { 0 }, bulk = { 0 }, str = { 0 };
	kvp_layout *dl = build(c, 0, rank);
	kvp_agent *a = NULL;
	uint64_t xfer, pace, writes = 0, w, reads_b = 0, reads_s = 0;
	uint64_t wrong = 0, early = 0;
	/* per run: layer_xfer, exposed bulk, exposed stream, total bulk,
	 * total stream (ms) */
	double m[5][MAXRUNS], med[5];
	uint32_t h, i, r, layers;
	int err, ret = 1;

	alarm(600);
	err = -ENOMEM;
	if (!dl || kvt_mem_alloc(dl, &mem))
		goto fail;
	for (i = 0; i < mem.nregions; i++)
		memset(mem.buf[i], 0x11, mem.size[i]);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = dl;
	at.addr = b->addr;
	at.max_ids = 64;
	at.max_inflight = 4;
	at.stream_events = 1; /* layer_xfer: ARRIVED of a layer alone */
	err = tool_agent_open(&at, &mem, &a);
	if (!err)
		err = tool_add_engine(a, b->addr, (uint16_t)b->port, c->P, &h);
	if (!err)
		err = kvp_agent_engine_info(a, h, &ei);
	if (err) {
		fprintf(stderr, "stream-bench: %s: consumer: %s\n", c->name,
			kvp_strerror(err));
		goto out;
	}
	layers = c->layers + c->state_layers;
	for (r = 0; r < b->runs; r++) {
		/* each run over fresh memory: a missed READ shows */
		for (i = 0; i < mem.nregions; i++)
			memset(mem.buf[i], 0x11, mem.size[i]);
		/* one layer's transfer, alone: the bulk pull of a request
		 * published at once, over its layers */
		err = run(b, a, h, NREQ * r, 0, 2, &alone);
		if (err)
			goto fail;
		xfer = alone.t_done - first_publish(b);
		pace = (uint64_t)(c->factor * (double)xfer);
		err = run(b, a, h, NREQ * r + 1, pace, 0, &bulk);
		if (err)
			goto fail;
		m[0][r] = (double)xfer / 1e6;
		m[1][r] = (double)(bulk.t_done - last_publish(b)) / 1e6;
		m[3][r] = (double)(bulk.t_done - prefill_start(b)) / 1e6;
		err = run(b, a, h, NREQ * r + 2, pace, 1, &str);
		if (err)
			goto fail;
		m[2][r] = (double)(str.t_done - last_publish(b)) / 1e6;
		if (getenv("KVP_BENCH_TRACE"))
			trace(b, &str);
		if (getenv("KVP_BENCH_TRACE"))
			fprintf(stderr, "  polls: alone %llu (%.2f us avg, %.2f ms max), bulk %llu (%.2f us, %.2f ms), stream %llu (%.2f us, %.2f ms)\n",
				(unsigned long long)alone.npoll, alone.poll_ns / 1e3 / (alone.npoll + !alone.npoll), alone.poll_max / 1e6,
				(unsigned long long)bulk.npoll, bulk.poll_ns / 1e3 / (bulk.npoll + !bulk.npoll), bulk.poll_max / 1e6,
				(unsigned long long)str.npoll, str.poll_ns / 1e3 / (str.npoll + !str.npoll), str.poll_max / 1e6);
		m[4][r] = (double)(str.t_done - prefill_start(b)) / 1e6;
		for (i = 0, w = 0; i < c->P; i++)
			w += b->ctl->writes[i];
		if (w > writes)
			writes = w;
		if (bulk.reads > reads_b)
			reads_b = bulk.reads;
		if (str.reads > reads_s)
			reads_s = str.reads;
		if (verify(b, ei.plan, dl, &mem, 1, &bulk) ||
		    verify(b, ei.plan, dl, &mem, 2, &str)) {
			fprintf(stderr, "stream-bench: %s: cannot verify the "
					"bytes\n",
				c->name);
			goto out;
		}
		wrong += bulk.wrong + str.wrong;
		early += bulk.early + str.early;
		bulk.wrong = bulk.early = str.wrong = str.early = 0;
	}
	for (i = 0; i < 5; i++)
		med[i] = median(m[i], b->runs);
	printf("stream: case=%s layers=%u chunks=%u bytes=%llu reads_bulk=%llu "
	       "reads_stream=%llu layer_xfer_ms=%.2f exposed_bulk_ms=%.2f "
	       "exposed_stream_ms=%.2f ratio=%.3f total_bulk_ms=%.1f "
	       "total_stream_ms=%.1f progress_msgs=%llu wrong_bytes=%llu "
	       "early_bytes=%llu\n",
	       c->name, layers, c->chunks, (unsigned long long)alone.bytes,
	       (unsigned long long)reads_b, (unsigned long long)reads_s,
	       med[0], med[1], med[2], med[1] > 0 ? med[2] / med[1] : 0.0,
	       med[3], med[4], (unsigned long long)writes,
	       (unsigned long long)wrong, (unsigned long long)early);
	goals(c, med, reads_b, reads_s, writes, wrong, early);
	if (b->runs > 1)
		for (r = 0; r < b->runs; r++)
			fprintf(stderr,
				"  run %u: layer_xfer_ms=%.2f exposed_bulk_ms=%.2f exposed_stream_ms=%.2f total_bulk_ms=%.1f total_stream_ms=%.1f\n",
				r + 1, m[0][r], m[1][r], m[2][r], m[3][r],
				m[4][r]);
	ret = wrong ? 1 : 0;
	goto out;
fail:
	fprintf(stderr, "stream-bench: %s: %s\n", c->name, kvp_strerror(err));
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(dl);
	return ret;
}

int main(int argc, char **argv)
{
	static const char P[] = "kvpull-stream-bench";
	const char *only = NULL, *addr = NULL;
	uint32_t port = 21800, i, runs = 5;
	const struct tool_opt opts[] = {
		{ "--case", TOOL_STR, &only, 0 },
		{ "--runs", TOOL_COUNT, &runs, MAXRUNS },
		{ "--addr", TOOL_STR, &addr, 0 },
		{ "--port", TOOL_PORT, &port, 65535 - TOOL_MAX_RANKS },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	int bad, fail = 0, any = 0;

	bad = tool_parse_args(argc, argv, P, opts);
	if (bad == TOOL_ARGS_HELP)
		printf("usage: %s [--case NAME] [--runs N] [--addr IP] [--port N]\n"
		       "cases: dense-layerwise dense-chunked hybrid tp2to1 "
		       "short link-bound\n"
		       "--runs: each pull N times (1-%u), medians printed [5]\n",
		       P, MAXRUNS);
	if (bad)
		return bad == TOOL_ARGS_BAD ? 2 : 0;
	if (tool_default_addr(P, &addr))
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (i = 0; i < NCASES; i++) {
		struct bench *b;
		struct tool_ranks prod;
		kvp_layout *pl;

		if (only && strcmp(only, cases[i].name))
			continue;
		any = 1;
		b = mmap(NULL, sizeof(*b) + sizeof(struct ctl),
			 PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			 0);
		if (b == MAP_FAILED) {
			fprintf(stderr, "%s: out of memory\n", P);
			return 1;
		}
		memset(b, 0, sizeof(*b) + sizeof(struct ctl));
		b->c = &cases[i];
		b->addr = addr;
		b->port = port + i * TOOL_MAX_RANKS;
		b->ctl = (struct ctl *)(b + 1);
		b->runs = runs;
		pl = build(b->c, 1, 0);
		if (!pl) {
			fprintf(stderr, "%s: %s: cannot build the layout\n", P,
				b->c->name);
			return 1;
		}
		if (make_ids(b, pl)) {
			fprintf(stderr, "%s: %s: the blocks do not fit\n", P,
				b->c->name);
			return 1;
		}
		kvp_layout_destroy(pl);
		if (tool_start_producers(&prod, b->c->P, producer, b)) {
			/* each rank said why (no RDMA device: every case
			 * would fail alike) */
			fprintf(stderr, "stream-bench: %s: the producer ranks "
					"did not start\n",
				b->c->name);
			(void)tool_stop_producers(&prod, 1);
			munmap(b, sizeof(*b) + sizeof(struct ctl));
			return 1;
		}
		if (tool_run_consumers(&prod, 1, consumer, b))
			fail = 1;
		if (tool_stop_producers(&prod, 0))
			fail = 1;
		munmap(b, sizeof(*b) + sizeof(struct ctl));
	}
	if (!any)
		return tool_bad_arg(P, "--case: unknown case '%s'", only);
	return fail;
}
