// SPDX-License-Identifier: MIT
/*
 * The operator's window (issue 39) on live agents: one process holds a
 * producer rank and a consumer rank (TP 1 each, llama cut to 2 layers),
 * and two consumers the producer refuses: one with a shared secret the
 * producer lacks (its connect request refused, KVP_REASON_AUTH), one of
 * another model (its handshake refused, KVP_REASON_MODEL). The consumer
 * pulls three requests in bulk, one streamed (published in two parts)
 * and one the producer never expected (FAILED -ESTALE). Then:
 *
 *  - each agent's exposition (kvp_agent_metrics(), Prometheus text)
 *    passes `promtool check metrics` with nothing to say (promtool: the
 *    KVP_PROMTOOL environment variable, else /usr/bin/promtool; make
 *    check-rdma carries it into the VM);
 *  - the pull histogram counted every pull once (its _count lines sum to
 *    the pulls accepted, by outcome as the events said), the exposed
 *    time histogram the streamed pull, the handshake histograms the
 *    consumer's engine and the producer's queue pairs;
 *  - every refusal (stats.refused) came to the producer's log callback
 *    as a record with its reason and the consumer's address, and
 *    kvpull_refusals_total says the same by reason;
 *  - the consumer's callback saw each pull start, and complete or fail
 *    with its bytes, READs or reason, as the events did;
 *  - the JSON exposition keeps counters, gauges and histograms apart;
 *    a short buffer gets what fits and the length needed;
 *  - the library wrote nothing to stderr (fd 2 goes to a file while the
 *    agents live, which must stay empty).
 *
 *   rdma_metrics [--dump]
 *
 * --dump also prints both agents' expositions (text and JSON) between
 * "== NAME" and "== end" lines and one line
 *   metrics-run: pulls=P counted=C refusals=R refusal_events=E
 * for scripts/rdma-bench.sh --metrics, which writes them to
 * build/metrics/ and checks them with promtool on the host.
 */
#include <sys/stat.h>

#include "rdma/harness.h"

#define M_PORT 19960
#define M_NREQ 5 /* 3 bulk, 1 streamed, 1 never expected */
#define M_LOG 512
#define M_EXPO (1u << 20)

static const struct rt_case M_CASE = {
	.name = "metrics", .model = "llama-3.1-8b", .layers = 2, .P = 1,
	.D = 1, .pblock = 16, .dblock = 16, .pblocks = 64, .dblocks = 64,
	.nreq = M_NREQ, .tokens = 128, .kill_rank = -1, .seed = 39,
};
/* The consumer of another model (its handshake is refused). */
static const struct rt_case M_OTHER = {
	.name = "other model", .model = "qwen2.5-7b", .layers = 2, .P = 1,
	.D = 1, .pblock = 16, .dblock = 16, .pblocks = 16, .dblocks = 16,
	.nreq = 1, .tokens = 16, .kill_rank = -1, .seed = 1,
};

/* What a log callback was handed, copied (the record is the agent's for
 * the callback's length only). */
struct logbook {
	uint32_t n, dropped;
	struct {
		struct kvp_log_record r;
		char addr[48], line[KVP_WHY_LEN * 2];
	} rec[M_LOG];
};

static void on_log(void *user, const struct kvp_log_record *r)
{
	struct logbook *b = user;

	if (b->n == M_LOG) {
		b->dropped++;
		return;
	}
	b->rec[b->n].r = *r;
	snprintf(b->rec[b->n].addr, sizeof(b->rec[0].addr), "%s",
		 r->peer_addr ? r->peer_addr : "(null)");
	snprintf(b->rec[b->n].line, sizeof(b->rec[0].line), "%s",
		 r->line ? r->line : "(null)");
	b->rec[b->n].r.peer_addr = b->rec[b->n].addr;
	b->rec[b->n].r.line = b->rec[b->n].line;
	b->n++;
}

/* --dump: the records, one a line: kind, level, line. */
static void dump_log(const char *name, const struct logbook *b)
{
	static const char *const level[] = { "?", "error", "warning", "info",
					     "debug" };
	uint32_t i;

	printf("== %s\n", name);
	for (i = 0; i < b->n; i++)
		printf("%s %s %s\n", kvp_log_kind_str(b->rec[i].r.kind),
		       level[b->rec[i].r.level <= KVP_LOG_DEBUG ?
				     b->rec[i].r.level :
				     0],
		       b->rec[i].line);
	printf("== end\n");
}

static uint32_t count_kind(const struct logbook *b, uint32_t kind)
{
	uint32_t i, n = 0;

	for (i = 0; i < b->n; i++)
		n += b->rec[i].r.kind == kind;
	return n;
}

struct run {
	const struct rt_env *env;
	kvp_layout *pl, *cl, *ol;
	struct kvt_mem pm, cm, om, c2m;
	kvp_agent *p, *c, *c2, *c3;
	struct logbook plog, clog;
	uint32_t eng;
	struct rt_req rq[M_NREQ];
	/* the consumer's events of each request: type, status */
	uint32_t type[M_NREQ];
	int32_t status[M_NREQ];
	uint64_t bytes[M_NREQ];
	uint32_t reads[M_NREQ];
	uint32_t up, down2, down3; /* engine events seen */
	char *ptext, *ctext, *pjson, *cjson;
};

#define CHECK(c, ...)                                                      \
	do {                                                               \
		if (!(c)) {                                                \
			printf("  ");                                      \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
			goto out;                                          \
		}                                                          \
	} while (0)

static int open_agent(uint32_t role, const kvp_layout *l,
		      const char *addr, struct logbook *log,
		      const void *secret, kvp_agent **out)
{
	struct kvp_agent_attr at;

	memset(&at, 0, sizeof(at));
	at.role = role;
	at.layout = l;
	at.addr = addr;
	at.max_inflight = 16;
	if (secret) {
		at.secret = secret;
		at.secret_len = 32;
	}
	if (log) {
		at.comp_mask = KVP_AGENT_ATTR_LOG;
		at.log_fn = on_log;
		at.log_user = log;
		at.log_level = KVP_LOG_DEBUG;
	}
	return kvp_agent_open(&at, out);
}

/* Polls every agent once, recording the consumers' events. */
static int pump(struct run *x)
{
	kvp_agent *const cons[3] = { x->c, x->c2, x->c3 };
	struct kvp_event ev[16];
	int n, i, k, j;

	n = kvp_agent_poll(x->p, ev, 16);
	if (n < 0)
		return n;
	for (j = 0; j < 3; j++) {
		if (!cons[j])
			continue;
		n = kvp_agent_poll(cons[j], ev, 16);
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (ev[i].type == KVP_EV_ENGINE_UP && !j)
				x->up++;
			if (ev[i].type == KVP_EV_ENGINE_DOWN && j == 1)
				x->down2++;
			if (ev[i].type == KVP_EV_ENGINE_DOWN && j == 2)
				x->down3++;
			if (j || (ev[i].type != KVP_EV_DONE &&
				  ev[i].type != KVP_EV_FAILED))
				continue;
			for (k = 0; k < M_NREQ; k++)
				if (ev[i].req_id == x->rq[k].id) {
					x->type[k] = ev[i].type;
					x->status[k] = ev[i].status;
					x->bytes[k] = ev[i].bytes;
					x->reads[k] = ev[i].reads;
				}
		}
	}
	return 0;
}

/* Pumps until cond(x) holds, at most 20 s. */
static int pump_until(struct run *x, int (*cond)(const struct run *x))
{
	double end = rt_now() + 20;

	while (rt_now() < end) {
		if (pump(x))
			return -EIO;
		if (cond(x))
			return 0;
		usleep(100);
	}
	return -ETIMEDOUT;
}

static int is_up(const struct run *x)
{
	return x->up > 0;
}

static int refused_both(const struct run *x)
{
	return x->down2 && x->down3;
}

static int all_reported(const struct run *x)
{
	uint32_t k;

	for (k = 0; k < M_NREQ; k++)
		if (!x->type[k])
			return 0;
	return 1;
}

/* A refused consumer: its own agent (and memory), one engine added. */
static int refused_consumer(struct run *x, const kvp_layout *l,
			    struct kvt_mem *m, const void *secret,
			    kvp_agent **out)
{
	struct kvp_peer peer = { .addr = x->env->addr0, .port = M_PORT };
	uint32_t eng;
	int err;

	err = open_agent(KVP_ROLE_CONSUMER, l,
			 x->env->addr1 ? x->env->addr1 : x->env->addr0, NULL,
			 secret, out);
	if (!err)
		err = rt_register_all(*out, m);
	if (!err)
		err = kvp_agent_add_engine(*out, &peer, 1, 20000, &eng);
	return err;
}

/* kvp_agent_metrics() into a buffer of its own size; NULL on failure. */
static char *expo(kvp_agent *a, uint32_t fmt)
{
	char *b;
	int n = kvp_agent_metrics(a, fmt, NULL, 0);

	if (n < 0 || !(b = malloc((size_t)n + 1)))
		return NULL;
	if (kvp_agent_metrics(a, fmt, b, (size_t)n + 1) != n ||
	    strlen(b) != (size_t)n) {
		free(b);
		return NULL;
	}
	return b;
}

/* The sum of the values of family `name`'s samples (lines "name{...} V"
 * or "name V") whose labels contain `with` (NULL: any). */
static uint64_t sum_samples(const char *text, const char *name,
			    const char *with)
{
	size_t nl = strlen(name);
	const char *s = text;
	uint64_t sum = 0;

	while (*s) {
		const char *e = strchr(s, '\n');
		size_t len = e ? (size_t)(e - s) : strlen(s);

		if (len > nl && !strncmp(s, name, nl) &&
		    (s[nl] == '{' || s[nl] == ' ')) {
			const char *sp = memchr(s, ' ', len);
			char line[512];

			snprintf(line, sizeof(line), "%.*s", (int)len, s);
			if (sp && (!with || strstr(line, with)))
				sum += strtoull(sp + 1, NULL, 10);
		}
		s += len + (e != NULL);
	}
	return sum;
}

/* `promtool check metrics` on text: 0 when it exits 0 and prints
 * nothing; else what it said. */
static int promtool(const char *dir, const char *name, const char *text)
{
	const char *tool = getenv("KVP_PROMTOOL");
	char path[256], outp[256], said[1024];
	FILE *f;
	pid_t pid;
	int st = 0, fd;
	size_t n;

	if (!tool)
		tool = "/usr/bin/promtool";
	if (access(tool, X_OK)) {
		printf("  %s: promtool not found (scripts/install-deps.sh installs it; make check-rdma carries it into the VM)\n",
		       tool);
		return -1;
	}
	snprintf(path, sizeof(path), "%s/%s.prom", dir, name);
	snprintf(outp, sizeof(outp), "%s/%s.promtool", dir, name);
	f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f))
		return -1;
	pid = fork();
	if (pid == 0) {
		int in = open(path, O_RDONLY);
		int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 ||
		    dup2(out, 2) < 0)
			_exit(127);
		execl(tool, "promtool", "check", "metrics", (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	fd = open(outp, O_RDONLY);
	n = fd < 0 ? 0 : (size_t)read(fd, said, sizeof(said) - 1);
	if (fd >= 0)
		close(fd);
	said[n < sizeof(said) ? n : 0] = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) || n) {
		printf("  promtool check metrics (%s): status %d: %s\n", name,
		       WIFEXITED(st) ? WEXITSTATUS(st) : -1, said);
		return -1;
	}
	return 0;
}

/* The agents closed (before promtool's fork: no registered memory is
 * then shared with a child), their memory freed; the expositions kept. */
static void run_close(struct run *x)
{
	kvp_agent_close(x->c3);
	kvp_agent_close(x->c2);
	kvp_agent_close(x->c);
	kvp_agent_close(x->p);
	kvt_mem_free(&x->pm);
	kvt_mem_free(&x->cm);
	kvt_mem_free(&x->om);
	kvt_mem_free(&x->c2m);
	kvp_layout_destroy(x->pl);
	kvp_layout_destroy(x->cl);
	kvp_layout_destroy(x->ol);
}

/* The whole run: agents, pulls, refusals; the expositions kept in x. */
static int drive(struct run *x)
{
	static const uint8_t secret[32] = "kvpull-metrics-test-secret-32b!";
	const struct kvp_progress part = { .tokens_all = 0,
					   .tokens_cur = KVP_TOKENS_END,
					   .layers_cur = 1 };
	const struct kvp_progress all = { .tokens_all = KVP_TOKENS_END,
					  .tokens_cur = KVP_TOKENS_END };
	struct kvp_peer peer = { .addr = x->env->addr0, .port = M_PORT };
	const uint64_t deadline = rt_now_ns() + 30000000000ull;
	uint32_t k;
	int ret = -1;

	x->pl = rt_layout(&M_CASE, 1, 0);
	x->cl = rt_layout(&M_CASE, 0, 0);
	x->ol = rt_layout(&M_OTHER, 0, 0);
	CHECK(x->pl && x->cl && x->ol && !kvt_mem_alloc(x->pl, &x->pm) &&
		      !kvt_mem_alloc(x->cl, &x->cm) &&
		      !kvt_mem_alloc(x->ol, &x->om) &&
		      !rt_make_requests(&M_CASE, x->rq),
	      "setup");
	for (k = 0; k < M_NREQ; k++)
		x->rq[k].id = 3900 + k;
	CHECK(!open_agent(KVP_ROLE_PRODUCER, x->pl, x->env->addr0,
			  &x->plog, NULL, &x->p) &&
		      !rt_register_all(x->p, &x->pm) &&
		      !kvp_agent_listen(x->p, x->env->addr0, M_PORT),
	      "producer");
	CHECK(!open_agent(KVP_ROLE_CONSUMER, x->cl,
			  x->env->addr1 ? x->env->addr1 : x->env->addr0,
			  &x->clog, NULL, &x->c) &&
		      !rt_register_all(x->c, &x->cm) &&
		      !kvp_agent_add_engine(x->c, &peer, 1, 20000, &x->eng),
	      "consumer");
	CHECK(!pump_until(x, is_up), "the consumer's engine is not up");
	/* Requests 0-2 in bulk, 3 streamed, 4 never expected. */
	kvt_fill_producer(x->pl, &x->pm, x->rq[0].ids);
	for (k = 0; k < 4; k++)
		CHECK(!kvp_agent_expect(x->p, RT_CONS_ENGINE, x->rq[k].id,
					deadline),
		      "expect %u", k);
	for (k = 0; k < 3; k++)
		CHECK(!kvp_agent_pull_from(x->c, x->eng, x->rq[k].id,
					   x->rq[k].ids),
		      "pull %u", k);
	CHECK(!kvp_agent_pull_stream(x->c, x->eng, x->rq[3].id, x->rq[3].ids),
	      "pull_stream");
	CHECK(!kvp_agent_publish(x->p, RT_CONS_ENGINE, x->rq[3].id, &part),
	      "publish a part");
	for (k = 0; k < 50; k++)
		CHECK(!pump(x), "poll");
	CHECK(!kvp_agent_publish(x->p, RT_CONS_ENGINE, x->rq[3].id, &all),
	      "publish the rest");
	CHECK(!kvp_agent_pull_from(x->c, x->eng, x->rq[4].id, x->rq[4].ids),
	      "pull 4");
	/* The refused: a secret the producer lacks, another model. */
	CHECK(!kvt_mem_alloc(x->cl, &x->c2m) &&
		      !refused_consumer(x, x->cl, &x->c2m, secret, &x->c2),
	      "the consumer with a secret");
	CHECK(!refused_consumer(x, x->ol, &x->om, NULL, &x->c3),
	      "the other model's consumer");
	CHECK(!pump_until(x, all_reported), "not every pull reported");
	CHECK(!pump_until(x, refused_both),
	      "the refused consumers' engines not down (%u, %u)", x->down2,
	      x->down3);
	/* The producer reports its RELEASED events (its records too). */
	for (k = 0; k < 200; k++)
		CHECK(!pump(x), "poll");
	x->ptext = expo(x->p, KVP_METRICS_TEXT);
	x->ctext = expo(x->c, KVP_METRICS_TEXT);
	x->pjson = expo(x->p, KVP_METRICS_JSON);
	x->cjson = expo(x->c, KVP_METRICS_JSON);
	CHECK(x->ptext && x->ctext && x->pjson && x->cjson,
	      "kvp_agent_metrics()");
	ret = 0;
out:
	return ret;
}

static int check(struct run *x, int dump)
{
	struct kvp_agent_stats ps, cs;
	uint64_t counted, refusal_events = 0;
	uint32_t i, k, done = 0, failed = 0;
	char small[10], with[64];
	int ret = -1, n;

	kvp_agent_get_stats(x->p, &ps);
	kvp_agent_get_stats(x->c, &cs);
	for (k = 0; k < M_NREQ; k++) {
		done += x->type[k] == KVP_EV_DONE;
		failed += x->type[k] == KVP_EV_FAILED;
	}
	CHECK(done == 4 && failed == 1 && x->type[4] == KVP_EV_FAILED &&
		      x->status[4] == -ESTALE,
	      "events: %u DONE, %u FAILED, request 4 %s", done, failed,
	      kvp_strerror(x->status[4]));
	/* Every pull counted once, by outcome. */
	counted = sum_samples(x->ctext, "kvpull_pull_duration_seconds_count",
			      NULL);
	if (dump) {
		for (i = 0; i < x->plog.n; i++)
			refusal_events += x->plog.rec[i].r.kind ==
						  KVP_LOG_REFUSED &&
					  x->plog.rec[i].r.reason &&
					  x->plog.rec[i].addr[0];
		printf("== producer.prom\n%s== end\n== consumer.prom\n%s== end\n",
		       x->ptext, x->ctext);
		printf("== producer.json\n%s\n== end\n== consumer.json\n%s\n== end\n",
		       x->pjson, x->cjson);
		dump_log("producer.log", &x->plog);
		dump_log("consumer.log", &x->clog);
		printf("metrics-run: pulls=%llu counted=%llu refusals=%llu refusal_events=%llu\n",
		       (unsigned long long)cs.pulls,
		       (unsigned long long)counted,
		       (unsigned long long)ps.refused,
		       (unsigned long long)refusal_events);
	}
	CHECK(cs.pulls == M_NREQ && counted == M_NREQ,
	      "pulls %llu, counted %llu, want %u", (unsigned long long)cs.pulls,
	      (unsigned long long)counted, M_NREQ);
	CHECK(sum_samples(x->ctext, "kvpull_pull_duration_seconds_count",
			  "mode=\"bulk\",outcome=\"done\"") == 3 &&
		      sum_samples(x->ctext,
				  "kvpull_pull_duration_seconds_count",
				  "mode=\"stream\",outcome=\"done\"") == 1 &&
		      sum_samples(x->ctext,
				  "kvpull_pull_duration_seconds_count",
				  "mode=\"bulk\",outcome=\"failed\"") == 1,
	      "pull histogram by mode and outcome");
	CHECK(sum_samples(x->ctext, "kvpull_pull_duration_seconds_bucket",
			  "le=\"+Inf\"") == M_NREQ,
	      "+Inf buckets");
	CHECK(sum_samples(x->ctext, "kvpull_stream_exposed_seconds_count",
			  NULL) == 1,
	      "exposed time: not the streamed pull alone");
	CHECK(sum_samples(x->ctext, "kvpull_handshake_duration_seconds_count",
			  "side=\"consumer\"") == 1,
	      "consumer handshakes");
	CHECK(sum_samples(x->ptext, "kvpull_handshake_duration_seconds_count",
			  "side=\"producer\"") == cs.qps && cs.qps >= 1,
	      "producer handshakes %llu, the consumer's queue pairs %llu",
	      (unsigned long long)sum_samples(
		      x->ptext, "kvpull_handshake_duration_seconds_count",
		      NULL),
	      (unsigned long long)cs.qps);
	CHECK(sum_samples(x->ptext, "kvpull_producer_poll_duration_seconds_count",
			  NULL) > 0,
	      "producer polls");
	CHECK(sum_samples(x->ctext, "kvpull_read_bytes_total", NULL) ==
			      cs.read_bytes &&
		      cs.read_bytes > 0,
	      "read bytes");
	CHECK(sum_samples(x->ctext, "kvpull_peer_up", NULL) == 1,
	      "peer_up");
	/* Every refusal an event with its reason and address, and counted
	 * by reason. */
	for (i = 0, refusal_events = 0; i < x->plog.n; i++) {
		const struct kvp_log_record *r = &x->plog.rec[i].r;

		if (r->kind != KVP_LOG_REFUSED)
			continue;
		CHECK(r->reason && r->status && x->plog.rec[i].addr[0] &&
			      r->level == KVP_LOG_WARNING,
		      "refusal record without reason or address: %s",
		      x->plog.rec[i].line);
		snprintf(with, sizeof(with), "reason=\"%s\"",
			 r->reason == KVP_REASON_AUTH	 ? "auth" :
			 r->reason == KVP_REASON_MODEL	 ? "model" :
			 r->reason == KVP_REASON_PEER_FULL ? "peer_full" :
							     "?");
		CHECK(sum_samples(x->ptext, "kvpull_refusals_total", with) > 0,
		      "no %s in kvpull_refusals_total", with);
		refusal_events++;
	}
	CHECK(ps.refused >= 2 && refusal_events == ps.refused &&
		      sum_samples(x->ptext, "kvpull_refusals_total", NULL) ==
			      ps.refused,
	      "refusals %llu, refusal records %llu",
	      (unsigned long long)ps.refused,
	      (unsigned long long)refusal_events);
	CHECK(sum_samples(x->ptext, "kvpull_refusals_total",
			  "reason=\"auth\"") >= 1 &&
		      sum_samples(x->ptext, "kvpull_refusals_total",
				  "reason=\"model\"") >= 1,
	      "auth and model refusals");
	/* The consumer's lifecycle records match its events. */
	CHECK(count_kind(&x->clog, KVP_LOG_PULL_STARTED) == M_NREQ &&
		      count_kind(&x->clog, KVP_LOG_PULL_COMPLETED) == 4 &&
		      count_kind(&x->clog, KVP_LOG_PULL_FAILED) == 1 &&
		      count_kind(&x->clog, KVP_LOG_ENGINE_UP) == 1 &&
		      !x->clog.dropped && !x->plog.dropped,
	      "consumer records: %u started, %u completed, %u failed",
	      count_kind(&x->clog, KVP_LOG_PULL_STARTED),
	      count_kind(&x->clog, KVP_LOG_PULL_COMPLETED),
	      count_kind(&x->clog, KVP_LOG_PULL_FAILED));
	for (i = 0; i < x->clog.n; i++) {
		const struct kvp_log_record *r = &x->clog.rec[i].r;

		for (k = 0; k < M_NREQ; k++) {
			if (r->req_id != x->rq[k].id)
				continue;
			if (r->kind == KVP_LOG_PULL_COMPLETED)
				CHECK(r->bytes == x->bytes[k] &&
					      r->reads == x->reads[k] &&
					      r->bytes && r->elapsed_ns &&
					      r->stream == (k == 3),
				      "completed record of %u: %s", k,
				      x->clog.rec[i].line);
			if (r->kind == KVP_LOG_PULL_FAILED)
				CHECK(k == 4 && r->status == -ESTALE &&
					      r->reason == KVP_REASON_LEASE,
				      "failed record: %s",
				      x->clog.rec[i].line);
		}
	}
	CHECK(count_kind(&x->plog, KVP_LOG_RELEASED) == 4,
	      "producer: %u RELEASED records",
	      count_kind(&x->plog, KVP_LOG_RELEASED));
	/* JSON: kept apart; a short buffer: what fits, the length needed. */
	CHECK(!strncmp(x->cjson, "{\"counters\":{\"kvpull_pulls_total\":", 34) &&
		      strstr(x->cjson, "},\"gauges\":{\"kvpull_agent_info\":") &&
		      strstr(x->cjson, "},\"histograms\":{\"kvpull_pull_duration_seconds\":"),
	      "JSON sections");
	memset(small, 'x', sizeof(small));
	n = kvp_agent_metrics(x->c, KVP_METRICS_TEXT, small, 8);
	CHECK(n == (int)strlen(x->ctext) && !memcmp(small, x->ctext, 7) &&
		      !small[7] && small[8] == 'x',
	      "short buffer: %d", n);
	CHECK(kvp_agent_metrics(x->c, 2, NULL, 0) == -EINVAL &&
		      kvp_agent_metrics(x->c, KVP_METRICS_TEXT, NULL, 1) ==
			      -EINVAL &&
		      kvp_agent_metrics(NULL, KVP_METRICS_TEXT, NULL, 0) ==
			      -EINVAL,
	      "-EINVAL");
	ret = 0;
out:
	return ret;
}

int main(int argc, char **argv)
{
	const int dump = argc > 1 && !strcmp(argv[1], "--dump");
	char dir[] = "/tmp/kvp-metrics-XXXXXX", errp[64];
	struct rt_env env;
	struct stat sb;
	struct run *x;
	uint32_t pass = 0, fail = 0;
	double t0;
	int fd2, errf, ok;

	if (rt_start(&env, M_PORT))
		return 1;
	alarm(300);
	x = calloc(1, sizeof(*x));
	if (!x || !mkdtemp(dir))
		return 1;
	x->env = &env;
	t0 = rt_now();
	/* fd 2 into a file while the agents live: it must stay empty. */
	snprintf(errp, sizeof(errp), "%s/stderr", dir);
	fflush(stderr);
	fd2 = dup(2);
	errf = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd2 < 0 || errf < 0 || dup2(errf, 2) < 0)
		return 1;
	ok = !drive(x) && !check(x, dump);
	run_close(x);
	fflush(stderr);
	dup2(fd2, 2);
	if (stat(errp, &sb) || sb.st_size) {
		printf("  the library wrote %lld bytes to stderr\n",
		       (long long)sb.st_size);
		ok = 0;
	}
	if (ok && (promtool(dir, "producer", x->ptext) ||
		   promtool(dir, "consumer", x->ctext)))
		ok = 0;
	rt_report("bulk, streamed, failed and refused: metrics, events, promtool",
		  ok, t0, &pass, &fail);
	printf("%u passed, %u failed\n", pass, fail);
	free(x->ptext);
	free(x->ctext);
	free(x->pjson);
	free(x->cjson);
	free(x);
	return ok ? 0 : 1;
}
