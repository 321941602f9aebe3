// SPDX-License-Identifier: MIT
/*
 * kvp_agent_metrics(): the agent's counters, gauges and histograms, by
 * Prometheus' conventions, written with expo.c into the caller's buffer.
 * An entry point above both sides: it reads the agent (its stats, its
 * engines, its consumer engines, the histograms log.c and the hooks keep)
 * and calls kvp_agent_get_stats() and kvp_agent_engine_info(); nothing
 * calls it. docs/metrics.md lists what it writes.
 */
#include <limits.h>
#include <stddef.h>

#include "internal.h"
#include "expo.h"

enum { SIDE_P = 1, SIDE_C = 2, SIDE_PC = 3 };

/* The counters of struct kvp_agent_stats, by the sides they count on. */
struct stat_counter {
	const char *name;
	uint32_t off;
	uint32_t sides;
	const char *help;
};

#define ST(f) (uint32_t)offsetof(struct kvp_agent_stats, f)
static const struct stat_counter counters[] = {
	{ "kvpull_pulls_total", ST(pulls), SIDE_C, "Pulls accepted." },
	{ "kvpull_reads_total", ST(reads), SIDE_C, "RDMA READs posted." },
	{ "kvpull_read_bytes_total", ST(read_bytes), SIDE_C,
	  "Bytes the RDMA READs posted move." },
	{ "kvpull_doorbells_total", ST(doorbells), SIDE_C,
	  "ibv_post_send() calls on the data path." },
	{ "kvpull_queued_work_requests_total", ST(queued), SIDE_C,
	  "Work requests that waited for send queue room." },
	{ "kvpull_notifications_sent_total", ST(notes_sent), SIDE_C,
	  "Notifications posted to producer ranks." },
	{ "kvpull_notifications_received_total", ST(notes_recv), SIDE_P,
	  "Notifications received from consumer ranks." },
	{ "kvpull_notifications_dropped_total", ST(notes_dropped), SIDE_P,
	  "Notifications dropped: malformed, duplicate, orphaned or over capacity." },
	{ "kvpull_peer_connects_total", ST(connects), SIDE_PC,
	  "Peer ranks connected." },
	{ "kvpull_peer_disconnects_total", ST(disconnects), SIDE_PC,
	  "Peer ranks lost." },
	{ "kvpull_transport_failures_total", ST(transport_failures), SIDE_C,
	  "Producer ranks lost to errors or disconnects." },
	{ "kvpull_stalls_total", ST(stalls), SIDE_C,
	  "Engines and streamed pulls failed after stall_ms without progress." },
	{ "kvpull_handshake_failures_total", ST(handshake_failures), SIDE_C,
	  "Engine handshakes that failed." },
	{ "kvpull_reconnects_total", ST(reconnects), SIDE_C,
	  "Engine handshakes after an engine's first." },
	{ "kvpull_credit_waits_total", ST(credit_waits), SIDE_C,
	  "Times notifications waited for a producer rank's receive credit." },
	{ "kvpull_plan_compiles_total", ST(plan_compiles), SIDE_C,
	  "Engine handshakes that compiled a plan." },
	{ "kvpull_plan_cache_hits_total", ST(plan_hits), SIDE_C,
	  "Engine handshakes that reused a cached plan." },
	{ "kvpull_probes_total", ST(probes), SIDE_P,
	  "Liveness probes answered by consumer ranks." },
	{ "kvpull_rnr_timer_unset_total", ST(rnr_timer_unset), SIDE_P,
	  "Connections whose RNR timer the provider would not change." },
	{ "kvpull_striped_total", ST(striped), SIDE_C,
	  "Requests whose READs from one producer rank went over several queue pairs." },
	{ "kvpull_dmabuf_fallbacks_total", ST(dmabuf_fallbacks), SIDE_PC,
	  "dma-buf registrations that registered the address instead." },
	{ "kvpull_async_errors_total", ST(async_errors), SIDE_PC,
	  "Device events that failed connections." },
	{ "kvpull_publishes_total", ST(publishes), SIDE_P,
	  "Progresses published." },
	{ "kvpull_follows_total", ST(follows), SIDE_P,
	  "Consumer ranks that followed a request." },
	{ "kvpull_progress_writes_total", ST(progress_writes), SIDE_P,
	  "Progress records written to followers." },
	{ "kvpull_progress_seen_total", ST(progress_seen), SIDE_C,
	  "New progresses read." },
	{ "kvpull_arrivals_total", ST(arrivals), SIDE_C,
	  "ARRIVED events reported." },
	{ "kvpull_evictions_total", ST(evictions), SIDE_PC,
	  "Producer: consumer ranks disconnected to make room; consumer: engines closed to make room within max_qps." },
	{ "kvpull_idle_closes_total", ST(idle_closes), SIDE_P,
	  "Consumer ranks disconnected after idle_ms." },
	{ "kvpull_credit_abuses_total", ST(credit_abuses), SIDE_P,
	  "Connections dropped for sending beyond their credit." },
	{ "kvpull_credit_gives_total", ST(credit_gives), SIDE_PC,
	  "GIVE messages sent (consumer) or taken (producer)." },
	{ "kvpull_lease_reads_total", ST(lease_reads), SIDE_C,
	  "Lease READs posted." },
	{ "kvpull_lease_failures_total", ST(lease_fails), SIDE_C,
	  "Pulls failed because a producer rank did not hold the request." },
	{ "kvpull_unheld_reads_total", ST(unheld), SIDE_P,
	  "Consumer ranks that read a request this producer did not hold." },
	{ "kvpull_lease_full_total", ST(lease_full), SIDE_P,
	  "kvp_agent_expect() calls refused with a full lease bucket." },
};

/* Per producer engine (consumer side), from struct kvp_engine_info. */
#define EI(f) (uint32_t)offsetof(struct kvp_engine_info, f)
static const struct stat_counter eng_counters[] = {
	{ "kvpull_peer_pulls_total", EI(pulls), SIDE_C,
	  "Pulls accepted, per producer engine." },
	{ "kvpull_peer_reads_total", EI(reads), SIDE_C,
	  "RDMA READs posted, per producer engine." },
	{ "kvpull_peer_read_bytes_total", EI(read_bytes), SIDE_C,
	  "Bytes read, per producer engine." },
	{ "kvpull_peer_transport_failures_total", EI(transport_failures), SIDE_C,
	  "Producer ranks lost, per producer engine." },
	{ "kvpull_peer_stalls_total", EI(stalls), SIDE_C,
	  "Stalls, per producer engine." },
	{ "kvpull_peer_handshake_failures_total", EI(handshake_failures),
	  SIDE_C, "Handshakes that failed, per producer engine." },
	{ "kvpull_peer_reconnects_total", EI(reconnects), SIDE_C,
	  "Handshakes after the first, per producer engine." },
};

/* The reasons a producer refuses with, written even at 0 (any other
 * reason once counted). */
static const uint32_t refusal_reasons[] = {
	KVP_REASON_MALFORMED, KVP_REASON_TP_SIZE, KVP_REASON_MODEL,
	KVP_REASON_LAYOUT,    KVP_REASON_AUTH,	  KVP_REASON_PEER_FULL,
	KVP_REASON_VERSION,
};

static const char *const role_names[KVP_ROLE_COUNT] = { "producer",
							 "consumer", "both" };

static uint64_t field(const void *base, uint32_t off)
{
	return *(const uint64_t *)((const char *)base + off);
}

static uint32_t sides(const kvp_agent *a)
{
	return (a->producer ? SIDE_P : 0) | (a->consumer ? SIDE_C : 0);
}

/* A consumer's engines in use, one at a time: *i from 0; 1 and *info
 * while there is one, with its labels' text in id[] and h[]. */
static int next_engine(const kvp_agent *a, uint32_t *i,
		       struct kvp_engine_info *info, char *id, char *h)
{
	for (; a->consumer && a->engs && *i < a->max_peers; (*i)++) {
		const struct kvp_eng *e = &a->engs[*i];
		uint32_t handle;

		if (!e->state)
			continue;
		handle = kvp__engine_handle(a, e);
		if (kvp_agent_engine_info(a, handle, info))
			continue;
		id[kvp__fmt_u64(id, e->engine_id)] = 0;
		h[kvp__fmt_u64(h, handle)] = 0;
		(*i)++;
		return 1;
	}
	return 0;
}

/* Two samples, labels l[0..nl) and outcome="o1" (v1), then "o2" (v2). */
static void outcomes(struct kvp_expo *w, struct kvp_label *l, uint32_t nl,
		     const char *o1, uint64_t v1, const char *o2, uint64_t v2)
{
	l[nl].name = "outcome";
	l[nl].value = o1;
	kvp__expo_value(w, l, nl + 1, v1);
	l[nl].value = o2;
	kvp__expo_value(w, l, nl + 1, v2);
}

static void counter_families(const kvp_agent *a, struct kvp_expo *w,
			     const struct kvp_agent_stats *st)
{
	struct kvp_engine_info info;
	struct kvp_label l[3];
	char id[24], h[24];
	uint32_t i, k, r;

	for (k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
		if (!(counters[k].sides & sides(a)))
			continue;
		kvp__expo_family(w, counters[k].name, KVP_MT_COUNTER,
				 counters[k].help);
		kvp__expo_value(w, NULL, 0, field(st, counters[k].off));
	}
	if (a->consumer) {
		kvp__expo_family(w, "kvpull_pulls_completed_total",
				 KVP_MT_COUNTER,
				 "Pulls reported, by outcome (DONE or FAILED).");
		outcomes(w, l, 0, "done", st->done, "failed", st->failed);
	}
	if (a->producer) {
		kvp__expo_family(w, "kvpull_requests_reported_total",
				 KVP_MT_COUNTER,
				 "Expected requests reported, by outcome (RELEASED or EXPIRED).");
		outcomes(w, l, 0, "released", st->released, "expired",
			 st->expired);
		kvp__expo_family(w, "kvpull_refusals_total", KVP_MT_COUNTER,
				 "Connect requests and handshakes refused, by reason.");
		l[0].name = "reason";
		for (r = 0; r < KVP_REASON_COUNT; r++) {
			int listed = 0;

			for (k = 0; k < sizeof(refusal_reasons) /
						sizeof(refusal_reasons[0]);
			     k++)
				listed |= refusal_reasons[k] == r;
			if (!listed && !a->obs.refusals[r])
				continue;
			l[0].value = kvp__reason_name(r);
			kvp__expo_value(w, l, 1, a->obs.refusals[r]);
		}
	}
	if (!a->consumer)
		return;
	l[0].name = "peer_engine";
	l[1].name = "handle";
	for (k = 0; k < sizeof(eng_counters) / sizeof(eng_counters[0]); k++) {
		kvp__expo_family(w, eng_counters[k].name, KVP_MT_COUNTER,
				 eng_counters[k].help);
		for (i = 0; next_engine(a, &i, &info, id, h);) {
			l[0].value = id;
			l[1].value = h;
			kvp__expo_value(w, l, 2,
					field(&info, eng_counters[k].off));
		}
	}
	kvp__expo_family(w, "kvpull_peer_pulls_completed_total",
			 KVP_MT_COUNTER,
			 "Pulls reported, per producer engine and outcome.");
	for (i = 0; next_engine(a, &i, &info, id, h);) {
		l[0].value = id;
		l[1].value = h;
		outcomes(w, l, 2, "done", info.done, "failed", info.failed);
	}
}

static void gauge(struct kvp_expo *w, const char *name, const char *help,
		  uint64_t v)
{
	kvp__expo_family(w, name, KVP_MT_GAUGE, help);
	kvp__expo_value(w, NULL, 0, v);
}

static void gauge_families(const kvp_agent *a, struct kvp_expo *w,
			   const struct kvp_agent_stats *st)
{
	struct kvp_engine_info info;
	struct kvp_label l[4];
	char id[24], h[24], rk[16], tp[16], eid[24];
	uint32_t i, j, r;

	kvp__expo_family(w, "kvpull_agent_info", KVP_MT_GAUGE,
			 "This agent: its role, engine id, TP rank and size (always 1).");
	eid[kvp__fmt_u64(eid, a->li.engine_id)] = 0;
	rk[kvp__fmt_u64(rk, a->li.tp_rank)] = 0;
	tp[kvp__fmt_u64(tp, a->li.tp_size)] = 0;
	l[0] = (struct kvp_label){ "role", role_names[a->role] };
	l[1] = (struct kvp_label){ "engine", eid };
	l[2] = (struct kvp_label){ "rank", rk };
	l[3] = (struct kvp_label){ "tp_size", tp };
	kvp__expo_value(w, l, 4, 1);
	gauge(w, "kvpull_memory_bytes",
	      "Memory the agent allocated for its peers and data path (not the registered memory).",
	      st->mem_bytes);
	gauge(w, "kvpull_peer_ranks", "Peer ranks connected now.", st->peers);
	gauge(w, "kvpull_queue_pairs", "Queue pairs open now, any state.",
	      st->qps);
	gauge(w, "kvpull_events_queued",
	      "Events waiting for kvp_agent_poll().",
	      a->ev_tail - a->ev_head);
	if (a->consumer)
		gauge(w, "kvpull_pulls_in_flight",
		      "Pulls accepted and not yet reported.",
		      st->pulls - st->done - st->failed);
	if (a->producer) {
		gauge(w, "kvpull_requests_held",
		      "Expected requests not yet reported RELEASED or EXPIRED.",
		      a->nheld);
		gauge(w, "kvpull_srq_buffers",
		      "Buffers in the shared receive queue (0: a receive queue per queue pair).",
		      st->srq_bufs);
		kvp__expo_family(w, "kvpull_peer_connections", KVP_MT_GAUGE,
				 "Connections of each consumer engine connected now.");
		l[0].name = "peer_engine";
		for (i = 0; a->peng && i < a->prod_peers; i++) {
			if (!a->peng[i].nconns)
				continue;
			id[kvp__fmt_u64(id, a->peng[i].engine_id)] = 0;
			l[0].value = id;
			kvp__expo_value(w, l, 1, a->peng[i].nconns);
		}
	}
	if (!a->consumer)
		return;
	l[0].name = "peer_engine";
	l[1].name = "handle";
	kvp__expo_family(w, "kvpull_peer_up", KVP_MT_GAUGE,
			 "1 when the producer engine can be pulled from, else 0.");
	for (i = 0; next_engine(a, &i, &info, id, h);) {
		l[0].value = id;
		l[1].value = h;
		kvp__expo_value(w, l, 2, info.state == KVP_ENGINE_UP);
	}
	kvp__expo_family(w, "kvpull_peer_plan_bytes", KVP_MT_GAUGE,
			 "Size of the producer engine's plan (shared by engines of one geometry).");
	for (i = 0; next_engine(a, &i, &info, id, h);) {
		l[0].value = id;
		l[1].value = h;
		kvp__expo_value(w, l, 2, info.plan_bytes);
	}
	kvp__expo_family(w, "kvpull_peer_rank_up", KVP_MT_GAUGE,
			 "1 when the producer rank's first queue pair is ready, else 0.");
	l[2].name = "peer_rank";
	for (i = 0; next_engine(a, &i, &info, id, h);) {
		const struct kvp_eng *e = &a->engs[i - 1];

		l[0].value = id;
		l[1].value = h;
		for (r = 0; e->rank_conn && r < e->n; r++) {
			j = e->rank_conn[r * e->nq];
			if (j == NO_CONN)
				continue; /* a rank the plan does not need */
			rk[kvp__fmt_u64(rk, r)] = 0;
			l[2].value = rk;
			kvp__expo_value(w, l, 3,
					a->conns[j].state == CS_READY);
		}
	}
}

static void hist_families(const kvp_agent *a, struct kvp_expo *w)
{
	static const char *const mode[2] = { "bulk", "stream" };
	static const char *const outcome[2] = { "done", "failed" };
	struct kvp_label l[2];
	uint32_t m, o;

	if (a->consumer) {
		kvp__expo_family(w, "kvpull_pull_duration_seconds",
				 KVP_MT_HISTOGRAM,
				 "Pulls from the pull call to DONE or FAILED, by mode and outcome.");
		for (m = 0; m < 2; m++)
			for (o = 0; o < 2; o++) {
				l[0] = (struct kvp_label){ "mode", mode[m] };
				l[1] = (struct kvp_label){ "outcome",
							   outcome[o] };
				kvp__expo_hist(w, l, 2, &a->obs.pull[m][o]);
			}
	}
	kvp__expo_family(w, "kvpull_handshake_duration_seconds",
			 KVP_MT_HISTOGRAM,
			 "Handshakes that succeeded: a producer's consumer connections from accept to ready, a consumer's engines from add or reconnect to UP.");
	l[0].name = "side";
	if (a->producer) {
		l[0].value = "producer";
		kvp__expo_hist(w, l, 1, &a->obs.handshake[OBS_HS_PRODUCER]);
	}
	if (a->consumer) {
		l[0].value = "consumer";
		kvp__expo_hist(w, l, 1, &a->obs.handshake[OBS_HS_CONSUMER]);
		kvp__expo_family(w, "kvpull_stream_exposed_seconds",
				 KVP_MT_HISTOGRAM,
				 "Streamed pulls DONE: from the last producer rank's final progress seen to DONE.");
		kvp__expo_hist(w, NULL, 0, &a->obs.exposed);
	}
	if (a->producer) {
		kvp__expo_family(w, "kvpull_producer_poll_duration_seconds",
				 KVP_MT_HISTOGRAM,
				 "A producer's kvp_agent_poll() calls that took completions or returned events.");
		kvp__expo_hist(w, NULL, 0, &a->obs.poll);
	}
}

int kvp_agent_metrics(const kvp_agent *a, uint32_t format, char *buf,
		      size_t cap)
{
	struct kvp_agent_stats st;
	struct kvp_expo w;
	size_t len;

	if (!a || format > KVP_METRICS_JSON || (!buf && cap))
		return -EINVAL;
	kvp_agent_get_stats(a, &st);
	kvp__expo_init(&w, buf, cap, format == KVP_METRICS_JSON);
	counter_families(a, &w, &st);
	gauge_families(a, &w, &st);
	hist_families(a, &w);
	len = kvp__expo_end(&w);
	return len > INT_MAX ? -EMSGSIZE : (int)len;
}
