// SPDX-License-Identifier: MIT
/*
 * The log callback (kvp_agent_attr.log_fn): records of what an operator
 * can act on, made only when the level filter lets them through, and the
 * counts kvp_agent_metrics() keeps of the refusals. A floor below every
 * side: the event queue (event.c), the consumer's pulls and the
 * producer's admission call in; it calls nothing of verbs/ but the
 * rdma-core wrappers. The callback is the user's: the library never
 * prints.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define LOG_LINE 256
#define LOG_KINDS (KVP_LOG_EXPIRED + 1)

static const char *const kind_names[LOG_KINDS] = {
	[KVP_LOG_REFUSED] = "refused",
	[KVP_LOG_EVICTED] = "evicted",
	[KVP_LOG_IDLE_CLOSED] = "idle_closed",
	[KVP_LOG_PULL_STARTED] = "pull_started",
	[KVP_LOG_PULL_COMPLETED] = "pull_completed",
	[KVP_LOG_PULL_FAILED] = "pull_failed",
	[KVP_LOG_PULL_ARRIVED] = "pull_arrived",
	[KVP_LOG_ENGINE_UP] = "engine_up",
	[KVP_LOG_ENGINE_DOWN] = "engine_down",
	[KVP_LOG_DISCONNECTED] = "disconnected",
	[KVP_LOG_RELEASED] = "released",
	[KVP_LOG_EXPIRED] = "expired",
};

const char *kvp_log_kind_str(uint32_t k)
{
	return k < LOG_KINDS && kind_names[k] ? kind_names[k] :
							  "unknown";
}

/* Short names of the reasons, for metric labels and log lines: the
 * enum's names in lower case. */
static const char *const reason_names[KVP_REASON_COUNT] = {
	[KVP_REASON_NONE] = "none",
	[KVP_REASON_MALFORMED] = "malformed",
	[KVP_REASON_TP_SIZE] = "tp_size",
	[KVP_REASON_RANK] = "rank",
	[KVP_REASON_ENGINE_ID] = "engine_id",
	[KVP_REASON_MODEL] = "model",
	[KVP_REASON_LAYOUT] = "layout",
	[KVP_REASON_PLAN_COST] = "plan_cost",
	[KVP_REASON_CARRIED] = "carried",
	[KVP_REASON_AUTH] = "auth",
	[KVP_REASON_PEER_FULL] = "peer_full",
	[KVP_REASON_MR_WINDOW] = "mr_window",
	[KVP_REASON_UNREACHABLE] = "unreachable",
	[KVP_REASON_TIMEOUT] = "timeout",
	[KVP_REASON_PEER_REFUSED] = "peer_refused",
	[KVP_REASON_TRANSPORT] = "transport",
	[KVP_REASON_STALL] = "stall",
	[KVP_REASON_CLOSED] = "closed",
	[KVP_REASON_REMOVED] = "removed",
	[KVP_REASON_DEVICE] = "device",
	[KVP_REASON_ARGS] = "args",
	[KVP_REASON_IDS_UNEVEN] = "ids_uneven",
	[KVP_REASON_IDS_MAX] = "ids_max",
	[KVP_REASON_IDS_TOKENS] = "ids_tokens",
	[KVP_REASON_IDS_RANGE] = "ids_range",
	[KVP_REASON_NO_ENGINE] = "no_engine",
	[KVP_REASON_IN_FLIGHT] = "in_flight",
	[KVP_REASON_BUSY] = "busy",
	[KVP_REASON_NOT_UP] = "not_up",
	[KVP_REASON_OTHER_ENGINE] = "other_engine",
	[KVP_REASON_EVICTED] = "evicted",
	[KVP_REASON_LEASE] = "lease",
	[KVP_REASON_VERSION] = "version",
};

const char *kvp__reason_name(uint32_t r)
{
	return r < KVP_REASON_COUNT && reason_names[r] ? reason_names[r] :
							  "other";
}

/* The 16-byte address (IPv4 mapped into IPv6) as text; "" when unset. */
static void addr_text(const uint8_t src[16], char *out, size_t n)
{
	static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff,
					0xff };
	static const uint8_t zero[16];

	out[0] = 0;
	if (!memcmp(src, zero, 16))
		return;
	if (!memcmp(src, v4, sizeof(v4)))
		(void)inet_ntop(AF_INET, src + 12, out, (socklen_t)n);
	else
		(void)inet_ntop(AF_INET6, src, out, (socklen_t)n);
}

static void rec_init(struct kvp_log_record *r, uint32_t kind, uint32_t level)
{
	memset(r, 0, sizeof(*r));
	r->kind = kind;
	r->level = level;
	r->time_ns = kvp__now_ns();
	r->rank = UINT32_MAX;
	r->peer_addr = "";
}

static void emit(kvp_agent *a, struct kvp_log_record *r)
{
	a->obs.log_fn(a->obs.log_user, r);
}

/* A device's failure is an error, anything else that went wrong a
 * warning. */
static uint32_t fail_level(int32_t status)
{
	return status == -EIO || status == -ENETDOWN || status == -ENODEV ?
		       KVP_LOG_ERROR :
		       KVP_LOG_WARNING;
}

void kvp__log_event(kvp_agent *a, const struct kvp_event *ev)
{
	struct kvp_log_record r;
	char line[LOG_LINE];
	uint32_t kind, level;
	const struct kvp_req *q = NULL;

	switch (ev->type) {
	case KVP_EV_DONE:
		kind = KVP_LOG_PULL_COMPLETED;
		level = KVP_LOG_DEBUG;
		break;
	case KVP_EV_FAILED:
		kind = KVP_LOG_PULL_FAILED;
		level = fail_level(ev->status);
		break;
	case KVP_EV_ARRIVED:
		kind = KVP_LOG_PULL_ARRIVED;
		level = KVP_LOG_DEBUG;
		break;
	case KVP_EV_RELEASED:
		kind = KVP_LOG_RELEASED;
		level = KVP_LOG_DEBUG;
		break;
	case KVP_EV_EXPIRED:
		kind = KVP_LOG_EXPIRED;
		level = KVP_LOG_WARNING;
		break;
	case KVP_EV_ENGINE_UP:
		kind = KVP_LOG_ENGINE_UP;
		level = KVP_LOG_INFO;
		break;
	case KVP_EV_ENGINE_DOWN:
		kind = KVP_LOG_ENGINE_DOWN;
		level = fail_level(ev->status);
		break;
	case KVP_EV_DISCONNECTED:
		kind = KVP_LOG_DISCONNECTED;
		level = ev->status ? fail_level(ev->status) : KVP_LOG_INFO;
		break;
	default:
		return;
	}
	if (!kvp__log_on(a, level))
		return;
	rec_init(&r, kind, level);
	r.status = ev->status;
	r.reason = ev->reason;
	r.peer_reason = ev->peer_reason;
	r.engine_id = ev->engine_id;
	r.engine = ev->engine;
	r.line = line;
	switch (ev->type) {
	case KVP_EV_DONE:
	case KVP_EV_FAILED:
		/* Until delivered, a request event's rank is its slot. */
		q = &a->reqs[ev->rank];
		r.req_id = ev->req_id;
		r.stream = q->stream;
		r.elapsed_ns = r.time_ns - q->t0;
		if (ev->type == KVP_EV_DONE) {
			r.bytes = ev->bytes;
			r.reads = ev->reads;
			snprintf(line, sizeof(line),
				 "pull %llu from engine %llu done: %llu bytes in %u READs, %llu us",
				 (unsigned long long)ev->req_id,
				 (unsigned long long)ev->engine_id,
				 (unsigned long long)ev->bytes, ev->reads,
				 (unsigned long long)(r.elapsed_ns / 1000));
		} else {
			snprintf(line, sizeof(line),
				 "pull %llu from engine %llu failed: %s (%s)",
				 (unsigned long long)ev->req_id,
				 (unsigned long long)ev->engine_id,
				 kvp_reason_str(ev->reason),
				 kvp_strerror(ev->status));
		}
		break;
	case KVP_EV_ARRIVED:
		r.req_id = ev->req_id;
		r.stream = 1;
		r.reads = ev->layers;
		snprintf(line, sizeof(line),
			 "pull %llu from engine %llu: layers [0, %u) landed",
			 (unsigned long long)ev->req_id,
			 (unsigned long long)ev->engine_id, ev->layers);
		break;
	case KVP_EV_RELEASED:
	case KVP_EV_EXPIRED:
		r.req_id = ev->req_id;
		snprintf(line, sizeof(line), "request %llu of engine %llu %s%s%s",
			 (unsigned long long)ev->req_id,
			 (unsigned long long)ev->engine_id,
			 ev->type == KVP_EV_RELEASED ? "released" : "expired",
			 ev->reason ? ": " : "",
			 ev->reason ? kvp_reason_str(ev->reason) : "");
		break;
	case KVP_EV_DISCONNECTED:
		r.rank = ev->rank;
		snprintf(line, sizeof(line),
			 "engine %llu rank %u disconnected: %s (%s)",
			 (unsigned long long)ev->engine_id, ev->rank,
			 kvp_reason_str(ev->reason), kvp_strerror(ev->status));
		break;
	default: /* ENGINE_UP, ENGINE_DOWN */
		snprintf(line, sizeof(line), "engine %llu (handle %u) %s%s%s%s",
			 (unsigned long long)ev->engine_id, ev->engine,
			 ev->type == KVP_EV_ENGINE_UP ? "up" : "down: ",
			 ev->type == KVP_EV_ENGINE_UP ?
				 "" :
				 kvp_reason_str(ev->reason),
			 ev->peer_reason ? ", the producer's: " : "",
			 ev->peer_reason ? kvp_reason_str(ev->peer_reason) :
					   "");
		break;
	}
	emit(a, &r);
}

void kvp__log_pull(kvp_agent *a, const struct kvp_req *q, uint64_t engine_id,
		   uint32_t engine)
{
	struct kvp_log_record r;
	char line[LOG_LINE];

	rec_init(&r, KVP_LOG_PULL_STARTED, KVP_LOG_DEBUG);
	r.req_id = q->req_id;
	r.engine_id = engine_id;
	r.engine = engine;
	r.stream = q->stream;
	r.line = line;
	snprintf(line, sizeof(line), "pull %llu from engine %llu started (%s)",
		 (unsigned long long)q->req_id, (unsigned long long)engine_id,
		 q->stream ? "stream" : "bulk");
	emit(a, &r);
}

void kvp__obs_refused(kvp_agent *a, struct rdma_cm_id *id,
		      const struct kvp_conn *c, int err, uint32_t reason,
		      uint32_t retry_ms)
{
	struct kvp_log_record r;
	char line[LOG_LINE], addr[INET6_ADDRSTRLEN], who[64];
	uint8_t src[16];

	a->obs.refusals[reason < KVP_REASON_COUNT ? reason : 0]++;
	if (!kvp__log_on(a, KVP_LOG_WARNING))
		return;
	rec_init(&r, KVP_LOG_REFUSED, KVP_LOG_WARNING);
	r.status = err;
	r.reason = reason;
	if (c) {
		memcpy(src, c->src, sizeof(src));
		r.engine_id = c->engine_id;
		r.rank = c->rank;
	} else if (!id || kvp__peer_addr(id, src)) {
		memset(src, 0, sizeof(src));
	}
	addr_text(src, addr, sizeof(addr));
	r.peer_addr = addr;
	who[0] = 0;
	if (c)
		snprintf(who, sizeof(who), " engine %llu rank %u",
			 (unsigned long long)c->engine_id, c->rank);
	r.line = line;
	snprintf(line, sizeof(line), "refused %s%s: %s, %s (%s)%s%.0u%s",
		 addr[0] ? addr : "a consumer", who, kvp__reason_name(reason),
		 kvp_reason_str(reason), kvp_strerror(err),
		 retry_ms ? ", retry in " : "", retry_ms, retry_ms ? " ms" : "");
	emit(a, &r);
}

void kvp__obs_closed(kvp_agent *a, const struct kvp_conn *c, uint32_t kind)
{
	struct kvp_log_record r;
	char line[LOG_LINE], addr[INET6_ADDRSTRLEN];

	if (!kvp__log_on(a, KVP_LOG_INFO))
		return;
	rec_init(&r, kind, KVP_LOG_INFO);
	r.engine_id = c->engine_id;
	r.rank = c->rank;
	addr_text(c->src, addr, sizeof(addr));
	r.peer_addr = addr;
	if (kind == KVP_LOG_EVICTED) {
		r.status = -ECONNRESET;
		r.reason = KVP_REASON_EVICTED;
	} else {
		r.status = -ETIMEDOUT;
		r.reason = KVP_REASON_TIMEOUT;
	}
	r.line = line;
	snprintf(line, sizeof(line), "%s %s engine %llu rank %u: %s",
		 kind == KVP_LOG_EVICTED ? "evicted" : "closed idle",
		 addr[0] ? addr : "a consumer",
		 (unsigned long long)c->engine_id, c->rank,
		 kind == KVP_LOG_EVICTED ?
			 "its slots make room for a newcomer" :
			 "nothing sent within idle_ms");
	emit(a, &r);
}
