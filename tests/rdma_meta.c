// SPDX-License-Identifier: MIT
/*
 * Metadata carried over the user's own channel, over real verbs (soft-RoCE
 * in the VM). Each producer rank takes its blob with kvp_agent_get_meta()
 * and writes it to a pipe (the "user's channel"); the parent reads every
 * rank's, and each consumer rank, forked after, connects with them in
 * struct kvp_peer, pulls and checks its whole memory byte for byte
 * (tests/rdma/harness.h). Besides the good blob, each producer rank
 * publishes a stale one (another agent of the same engine and rank, other
 * memory: what a restarted rank would send), one of another engine and
 * one of another model.
 *
 *  - get_meta: -ENXIO before registration, -ENOSPC with the size, the
 *    NULL/0 query, -EINVAL, stable bytes, the rank's addresses inside;
 *  - connect with a corrupt, truncated, other-engine or misplaced blob, or
 *    blobs of a model the plan cannot match: -EPROTO at once, before any
 *    network exchange (the same call aimed at ports nobody listens on
 *    still says -EPROTO), nothing left behind;
 *  - a stale blob: -EPROTO once the rank's in-band blob differs;
 *  - then the good blobs on the same agent: connect, pull, bytes checked;
 *  - blobs for some ranks only, including ranks the consumer never meets.
 *
 *   rdma_meta [NAME-FILTER]
 *
 * Needs KVP_ADDR0, as set by scripts/rxe-vm.sh. Exits 77 without an RDMA
 * device.
 */
#include "rdma/harness.h"

#ifdef __clang__
#pragma clang diagnostic ignored "-Winitializer-overrides"
#else
#pragma GCC diagnostic ignored "-Woverride-init"
#endif

#define BLOB_MAX (1u << 20)
#define PRENET_SECS 1.0 /* a refusal before the network is instant */
#define CONNECT_MS 20000

/* Each producer rank's blobs: its own; another agent's of the same engine
 * and rank on other memory (stale); one of another engine; one of another
 * model (same engine, a layout the consumer's plan cannot match). */
enum { B_GOOD, B_STALE, B_OTHER, B_MODEL, B_KINDS };

struct blob {
	uint8_t *p;
	uint32_t len;
};

struct meta_case {
	struct rt_case tc;
	uint32_t given;	 /* bit r: carry producer rank r's blob */
	int rejections;	 /* bad blobs first, then the good ones */
};

/* Shared by the hooks; the parent fills blobs before forking consumers. */
struct meta_ctx {
	const struct meta_case *mc;
	int fd[RT_MAX_RANKS][2]; /* producer rank r -> parent */
	struct blob b[RT_MAX_RANKS][B_KINDS];
};

#define LLAMA(nm, p, d)                                                  \
	.name = nm, .model = "llama-3.1-8b", .layers = 2, .P = p, .D = d, \
	.pblock = 16, .dblock = 16, .playout = KVP_KV_FLASH_HND,         \
	.dlayout = KVP_KV_FLASH_NHD, .pblocks = 48, .dblocks = 48,       \
	.nreq = 3, .tokens = 120, .kill_rank = -1

static const struct meta_case cases[] = {
	{ .tc = { LLAMA("carried 2->1: every blob, rejections first", 2, 1) },
	  .given = 3, .rejections = 1 },
	{ .tc = { LLAMA("carried 1->2: every blob, rejections first", 1, 2) },
	  .given = 1, .rejections = 1 },
	{ .tc = { LLAMA("carried 2->1: rank 1's blob only", 2, 1) },
	  .given = 2 },
	/* Consumer rank 1 reads from producer rank 1 only: the plan comes
	 * from rank 0's carried blob, rank 1's is learnt in-band. */
	{ .tc = { LLAMA("carried 2->2: rank 0's blob only", 2, 2) },
	  .given = 1 },
};

static int write_full(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = write(fd, p, n);

		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Reads exactly n bytes, waiting at most until `deadline` (rt_now()). */
static int read_full(int fd, void *buf, size_t n, double deadline)
{
	uint8_t *p = buf;

	while (n) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (rt_now() > deadline || poll(&pf, 1, 100) < 0)
			return -1;
		if (!(pf.revents & (POLLIN | POLLHUP)))
			continue;
		r = read(fd, p, n);
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Takes `a`'s blob into a new buffer, checking the size query first. */
static int take_meta(const kvp_agent *a, struct blob *out, const char *who)
{
	size_t need = 0, len = 0;
	int err;

	err = kvp_agent_get_meta(a, NULL, 0, &need);
	if (err != -ENOSPC || !need || need > BLOB_MAX) {
		fprintf(stderr, "  [%s] size query: %s, %zu\n", who,
			kvp_strerror(err), need);
		return -1;
	}
	out->p = malloc(need);
	if (!out->p)
		return -1;
	err = kvp_agent_get_meta(a, out->p, need, &len);
	if (err || len != need) {
		fprintf(stderr, "  [%s] get_meta: %s, %zu of %zu\n", who,
			kvp_strerror(err), len, need);
		return -1;
	}
	out->len = (uint32_t)len;
	return 0;
}

static int open_agent(const kvp_layout *l, uint32_t role, const char *addr,
		      kvp_agent **out)
{
	struct kvp_agent_attr at;

	memset(&at, 0, sizeof(at));
	at.role = role;
	at.layout = l;
	at.addr = addr;
	return kvp_agent_open(&at, out);
}

/* Another agent of `l`'s engine and rank, on memory `m`: -ENXIO until its
 * last region is registered, then its blob in *out. */
static int other_agent_meta(const struct rt_env *env, const kvp_layout *l,
			    struct kvt_mem *m, struct blob *out,
			    const char *who)
{
	kvp_agent *a = NULL;
	size_t len = 0;
	uint32_t r;
	int ret = 1, err;

	err = open_agent(l, KVP_ROLE_PRODUCER, env->addr0, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	for (r = 0; r < m->nregions; r++) {
		err = kvp_agent_get_meta(a, NULL, 0, &len);
		if (err != -ENXIO || len)
			RT_FAIL("get_meta with %u of %u regions: %s, want -ENXIO",
				r, m->nregions, kvp_strerror(err));
		err = kvp_agent_register(a, r, m->buf[r], m->size[r]);
		if (err)
			RT_FAIL("register: %s", kvp_strerror(err));
	}
	if (take_meta(a, out, who))
		RT_FAIL("blob");
	ret = 0;
out:
	kvp_agent_close(a);
	return ret;
}

/* Decodes blob b and checks it is rank `rank` of `tp` of engine `engine`,
 * with region i at bases[i] (NULL: no keys at all, a consumer's). */
static int check_blob(const struct blob *b, uint64_t engine, uint32_t tp,
		      uint32_t rank, uint8_t *const *bases, const char *who)
{
	struct kvp_layout_info li;
	kvp_layout *l = NULL;
	uint64_t addr;
	uint32_t i, key;
	int ret = 1, err;

	err = kvp_meta_decode(b->p, b->len, &l);
	if (err)
		RT_FAIL("own blob does not decode: %s", kvp_strerror(err));
	kvp_layout_get_info(l, &li);
	if (li.engine_id != engine || li.tp_size != tp || li.tp_rank != rank)
		RT_FAIL("blob of engine %llx rank %u of %u",
			(unsigned long long)li.engine_id, li.tp_rank,
			li.tp_size);
	for (i = 0; i < li.nregions; i++) {
		if (kvp_layout_get_region_key(l, i, &addr, &key))
			RT_FAIL("region %u", i);
		if (addr != (bases ? (uint64_t)(uintptr_t)bases[i] : 0))
			RT_FAIL("region %u at %llx in the blob", i,
				(unsigned long long)addr);
	}
	ret = 0;
out:
	kvp_layout_destroy(l);
	return ret;
}

/* Producer rank, listening: checks kvp_agent_get_meta() and publishes its
 * good, stale and other-engine blobs on its pipe. */
static int publish(const struct rt_env *env, const struct rt_case *tc,
		   kvp_agent *a, const struct kvt_mem *mem, uint32_t rank)
{
	struct meta_ctx *cx = env->arg;
	struct blob b[B_KINDS], again = { 0 };
	struct kvt_mem m2 = { 0 }, m3 = { 0 };
	struct rt_case mtc = *tc;
	kvp_layout *same = rt_layout(tc, 1, rank);
	kvp_layout *other = rt_layout_engine(tc, 1, rank, RT_PROD_ENGINE + 1);
	kvp_layout *model = NULL;
	uint8_t small[8];
	size_t len = 0, i;
	uint32_t k;
	char who[80];
	int ret = 1, err;

	snprintf(who, sizeof(who), "%s P%u", tc->name, rank);
	memset(b, 0, sizeof(b));
	mtc.model = "qwen2.5-1.5b";
	model = rt_layout(&mtc, 1, rank);
	if (!same || !other || !model || kvt_mem_alloc(same, &m2) ||
	    kvt_mem_alloc(model, &m3))
		RT_FAIL("layouts");
	if (kvp_agent_get_meta(NULL, small, sizeof(small), &len) != -EINVAL ||
	    kvp_agent_get_meta(a, NULL, 16, &len) != -EINVAL ||
	    kvp_agent_get_meta(a, small, sizeof(small), NULL) != -EINVAL)
		RT_FAIL("get_meta argument errors were not -EINVAL");
	if (take_meta(a, &b[B_GOOD], who))
		RT_FAIL("blob");
	/* One byte short: -ENOSPC, the size, the buffer untouched. */
	again.p = malloc(b[B_GOOD].len);
	if (!again.p)
		RT_FAIL("memory");
	memset(again.p, 0xa5, b[B_GOOD].len);
	len = 0;
	err = kvp_agent_get_meta(a, again.p, b[B_GOOD].len - 1, &len);
	if (err != -ENOSPC || len != b[B_GOOD].len)
		RT_FAIL("cap one short: %s, len %zu, want -ENOSPC and %u",
			kvp_strerror(err), len, b[B_GOOD].len);
	for (i = 0; i < b[B_GOOD].len; i++)
		if (again.p[i] != 0xa5)
			RT_FAIL("-ENOSPC wrote to the buffer");
	/* The same bytes every time. */
	err = kvp_agent_get_meta(a, again.p, b[B_GOOD].len, &len);
	if (err || len != b[B_GOOD].len ||
	    memcmp(again.p, b[B_GOOD].p, len))
		RT_FAIL("second get_meta differs: %s", kvp_strerror(err));
	if (check_blob(&b[B_GOOD], RT_PROD_ENGINE, tc->P, rank, mem->buf, who))
		RT_FAIL("good blob");
	/* Same engine and rank, other memory: what a restarted rank sends. */
	if (other_agent_meta(env, same, &m2, &b[B_STALE], who) ||
	    check_blob(&b[B_STALE], RT_PROD_ENGINE, tc->P, rank, m2.buf, who))
		RT_FAIL("stale blob");
	if (b[B_STALE].len == b[B_GOOD].len &&
	    !memcmp(b[B_STALE].p, b[B_GOOD].p, b[B_GOOD].len))
		RT_FAIL("another agent's blob is the same");
	if (other_agent_meta(env, other, &m2, &b[B_OTHER], who) ||
	    check_blob(&b[B_OTHER], RT_PROD_ENGINE + 1, tc->P, rank, m2.buf,
		       who))
		RT_FAIL("other engine's blob");
	if (other_agent_meta(env, model, &m3, &b[B_MODEL], who) ||
	    check_blob(&b[B_MODEL], RT_PROD_ENGINE, tc->P, rank, m3.buf, who))
		RT_FAIL("other model's blob");
	for (k = 0; k < B_KINDS; k++)
		if (write_full(cx->fd[rank][1], &b[k].len, sizeof(b[k].len)) ||
		    write_full(cx->fd[rank][1], b[k].p, b[k].len))
			RT_FAIL("blob pipe");
	ret = 0;
out:
	for (k = 0; k < B_KINDS; k++)
		free(b[k].p);
	free(again.p);
	kvt_mem_free(&m2);
	kvt_mem_free(&m3);
	kvp_layout_destroy(same);
	kvp_layout_destroy(other);
	kvp_layout_destroy(model);
	return ret;
}

/* Parent: reads every producer rank's blobs; the consumers inherit them. */
static int collect(const struct rt_env *env, const struct rt_case *tc)
{
	struct meta_ctx *cx = env->arg;
	double deadline = rt_now() + 10;
	uint32_t r, k;

	for (r = 0; r < tc->P; r++)
		for (k = 0; k < B_KINDS; k++) {
			struct blob *b = &cx->b[r][k];

			if (read_full(cx->fd[r][0], &b->len, sizeof(b->len),
				      deadline) ||
			    !b->len || b->len > BLOB_MAX)
				return -1;
			b->p = malloc(b->len);
			if (!b->p || read_full(cx->fd[r][0], b->p, b->len,
					       deadline))
				return -1;
		}
	return 0;
}

/* One rejected connect: the good blobs with slot `slot` replaced by
 * meta[len], or with every slot's replaced by kind `kind` when slot is
 * RT_MAX_RANKS. With `prenet`, the refusal must come at once, and the same
 * call aimed at ports nobody listens on must still be -EPROTO (not
 * -ECONNREFUSED): nothing reached the network. */
static int reject(const struct rt_env *env, const struct rt_case *tc,
		  kvp_agent *a, const struct kvp_peer *good, uint32_t slot,
		  const void *meta, uint32_t len, uint32_t kind, int prenet,
		  uint32_t reason, const char *what, const char *who)
{
	char why[KVP_WHY_LEN];
	struct meta_ctx *cx = env->arg;
	struct kvp_peer p[RT_MAX_RANKS], dead[RT_MAX_RANKS];
	struct kvp_agent_stats st;
	uint32_t r;
	double t0, dt;
	int ret = 1, err;

	memcpy(p, good, tc->P * sizeof(*p));
	for (r = 0; r < tc->P; r++)
		if (slot == RT_MAX_RANKS) {
			p[r].meta = cx->b[r][kind].p;
			p[r].meta_len = cx->b[r][kind].len;
		} else if (r == slot) {
			p[r].meta = meta;
			p[r].meta_len = len;
		}
	if (prenet) {
		memcpy(dead, p, tc->P * sizeof(*p));
		for (r = 0; r < tc->P; r++)
			dead[r].port = (uint16_t)(env->port + RT_MAX_RANKS - 1);
		t0 = rt_now();
		err = kvp_agent_connect(a, dead, tc->P, CONNECT_MS);
		dt = rt_now() - t0;
		if (err != -EPROTO || dt > PRENET_SECS)
			RT_FAIL("%s, nobody listening: %s in %.3f s, want -EPROTO at once",
				what, kvp_strerror(err), dt);
	}
	t0 = rt_now();
	err = kvp_agent_connect(a, p, tc->P, CONNECT_MS);
	dt = rt_now() - t0;
	if (err != -EPROTO)
		RT_FAIL("%s: %s, want -EPROTO", what, kvp_strerror(err));
	if (prenet && dt > PRENET_SECS)
		RT_FAIL("%s: -EPROTO after %.3f s", what, dt);
	/* Its own reason (0: more than one check may catch it first). */
	r = kvp_agent_last_error(a, why, sizeof(why));
	if (reason && r != reason)
		RT_FAIL("%s: reason %u \"%s\", want %u (%s)", what, r, why,
			reason, kvp_reason_str(reason));
	kvp_agent_get_stats(a, &st);
	if (kvp_agent_plan(a) || st.connects)
		RT_FAIL("%s: a plan or connection was left behind", what);
	if (env->verbose)
		fprintf(stderr, "  [%s] %s: -EPROTO in %.3f s\n", who, what,
			dt);
	ret = 0;
out:
	return ret;
}

/* Consumer rank: bad blobs first, each refused with nothing left behind. */
/* The fuzz_meta crash (tests/fuzz/crashes/meta-short-key-table) made from
 * rank 0's blob and carried for it: refused before the network, as
 * malformed, nothing read past it (this runs under ASan too). */
static int short_keys(const struct rt_env *env, const struct rt_case *tc,
		      kvp_agent *a, const struct kvp_peer *good,
		      const char *who)
{
	struct meta_ctx *cx = env->arg;
	kvp_layout *l = NULL;
	uint8_t *sk = NULL;
	size_t len = 0;
	int ret = 1;

	if (kvp_meta_decode(cx->b[0][B_GOOD].p, cx->b[0][B_GOOD].len, &l) ||
	    kvt_short_key_table(l, &sk, &len))
		RT_FAIL("short key table blob");
	if (reject(env, tc, a, good, 0, sk, (uint32_t)len, 0, 1,
		   KVP_REASON_MALFORMED, "short key table", who))
		goto out;
	ret = 0;
out:
	free(sk);
	kvp_layout_destroy(l);
	return ret;
}

static int rejections(const struct rt_env *env, const struct rt_case *tc,
		      kvp_agent *a, const struct kvp_peer *peers,
		      const char *who)
{
	struct meta_ctx *cx = env->arg;
	struct kvp_peer good[RT_MAX_RANKS];
	const struct blob *last = cx->b[tc->P - 1];
	uint8_t *flip = NULL;
	uint32_t r;
	int ret = 1, err;

	memcpy(good, peers, tc->P * sizeof(*good));
	for (r = 0; r < tc->P; r++) {
		good[r].meta = cx->b[r][B_GOOD].p;
		good[r].meta_len = cx->b[r][B_GOOD].len;
	}
	/* meta and meta_len disagree: an argument error. */
	good[0].meta_len = 0;
	err = kvp_agent_connect(a, good, tc->P, CONNECT_MS);
	good[0].meta_len = cx->b[0][B_GOOD].len;
	if (err != -EINVAL)
		RT_FAIL("meta without a length: %s", kvp_strerror(err));
	good[0].meta = NULL;
	err = kvp_agent_connect(a, good, tc->P, CONNECT_MS);
	good[0].meta = cx->b[0][B_GOOD].p;
	if (err != -EINVAL)
		RT_FAIL("a length without meta: %s", kvp_strerror(err));
	/* A byte in the middle flipped (here: in a field record, which
	 * the decoder or the cross-rank check refuses). */
	flip = malloc(last[B_GOOD].len);
	if (!flip)
		RT_FAIL("memory");
	memcpy(flip, last[B_GOOD].p, last[B_GOOD].len);
	flip[last[B_GOOD].len / 2] ^= 0xff;
	if (reject(env, tc, a, good, tc->P - 1, flip, last[B_GOOD].len, 0, 1,
		   0, "corrupt blob", who) ||
	    reject(env, tc, a, good, 0, cx->b[0][B_GOOD].p,
		   cx->b[0][B_GOOD].len / 2, 0, 1, KVP_REASON_MALFORMED,
		   "truncated blob", who) ||
	    short_keys(env, tc, a, good, who) ||
	    /* With one rank, nothing to compare another engine with before
	     * the in-band blob. */
	    reject(env, tc, a, good, tc->P - 1, last[B_OTHER].p,
		   last[B_OTHER].len, 0, tc->P > 1,
		   tc->P > 1 ? KVP_REASON_ENGINE_ID : 0,
		   "other engine's blob", who) ||
	    (tc->P > 1 &&
	     reject(env, tc, a, good, 0, cx->b[1][B_GOOD].p,
		    cx->b[1][B_GOOD].len, 0, 1, KVP_REASON_RANK,
		    "rank 1's blob in slot 0", who)) ||
	    /* Well-formed and consistent: kvp_plan_compile() refuses. */
	    reject(env, tc, a, good, RT_MAX_RANKS, NULL, 0, B_MODEL, 1,
		   KVP_REASON_MODEL, "another model's blobs", who) ||
	    reject(env, tc, a, good, tc->P - 1, last[B_STALE].p,
		   last[B_STALE].len, 0, 0, KVP_REASON_CARRIED, "stale blob",
		   who))
		goto out;
	ret = 0;
out:
	free(flip);
	return ret;
}

/* Consumer rank, before the harness's connect: its own blob, the
 * rejections, then the carried blobs of the case. */
static int carry(const struct rt_env *env, const struct rt_case *tc,
		 kvp_agent *a, struct kvp_peer *peers, uint32_t rank)
{
	struct meta_ctx *cx = env->arg;
	struct blob mine = { 0 };
	kvp_layout *l = rt_layout(tc, 0, rank);
	kvp_agent *b = NULL;
	size_t len = 0;
	uint32_t r;
	char who[80];
	int ret = 1, err;

	snprintf(who, sizeof(who), "%s D%u", tc->name, rank);
	if (!l)
		RT_FAIL("layout");
	/* A consumer's blob: its layout, no keys; -ENXIO unregistered. */
	if (take_meta(a, &mine, who) ||
	    check_blob(&mine, RT_CONS_ENGINE, tc->D, rank, NULL, who))
		RT_FAIL("consumer blob");
	err = open_agent(l, KVP_ROLE_CONSUMER, env->addr0, &b);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = kvp_agent_get_meta(b, NULL, 0, &len);
	if (err != -ENXIO)
		RT_FAIL("unregistered consumer's get_meta: %s, want -ENXIO",
			kvp_strerror(err));
	if (cx->mc->rejections && rejections(env, tc, a, peers, who))
		goto out;
	for (r = 0; r < tc->P; r++)
		if (cx->mc->given & (1u << r)) {
			peers[r].meta = cx->b[r][B_GOOD].p;
			peers[r].meta_len = cx->b[r][B_GOOD].len;
		}
	ret = 0;
out:
	kvp_agent_close(b);
	kvp_layout_destroy(l);
	free(mine.p);
	return ret;
}

static int run_case(const struct meta_case *mc, struct rt_env *env)
{
	struct meta_ctx cx;
	uint32_t r, k;
	int ret = -1;

	memset(&cx, 0, sizeof(cx));
	cx.mc = mc;
	for (r = 0; r < RT_MAX_RANKS; r++)
		cx.fd[r][0] = cx.fd[r][1] = -1;
	for (r = 0; r < mc->tc.P; r++)
		if (pipe(cx.fd[r]))
			goto out;
	env->listened = publish;
	env->producers_ready = collect;
	env->connecting = carry;
	env->arg = &cx;
	ret = rt_run(&mc->tc, env);
out:
	env->arg = NULL;
	for (r = 0; r < RT_MAX_RANKS; r++) {
		for (k = 0; k < 2; k++)
			if (cx.fd[r][k] >= 0)
				close(cx.fd[r][k]);
		for (k = 0; k < B_KINDS; k++)
			free(cx.b[r][k].p);
	}
	return ret;
}

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	struct rt_env env;
	uint32_t i, pass = 0, fail = 0;

	if (rt_start(&env, 20000))
		return 1;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		double t0 = rt_now();
		int ok;

		if (filter && !strstr(cases[i].tc.name, filter))
			continue;
		ok = !run_case(&cases[i], &env);
		env.port = (uint16_t)(env.port + RT_MAX_RANKS);
		rt_report(cases[i].tc.name, ok, t0, &pass, &fail);
	}
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
