/* SPDX-License-Identifier: MIT */
/*
 * consumer.c: one consumer (decode) rank. Connects to the producer engine
 * (one rank, producer.c), pulls one request of EXAMPLE_BLOCKS blocks into
 * other block ids of its own, polls until DONE and checks every byte of
 * its memory: the pulled pages hold the producer's pages, the rest is
 * still zero.
 *
 *   consumer ADDR PORT     where producer.c listens
 *
 * Optional shared secret in KVPULL_SECRET, as for the producer. Exit
 * status 0 when every byte is right, 1 otherwise, 2 for bad usage.
 */
#include "example.h"

#define CONNECT_MS 30000
#define DONE_S 60

/* What the consumer's memory must hold: zero, except the pulled pages of
 * every view, which hold the producer's page of the same view (the two
 * layouts are the same here). Returns the number of wrong bytes. */
static uint64_t check(const struct example *ex, const uint32_t *lids,
		      const uint32_t *rids, uint32_t n)
{
	struct kvp_layout_info info;
	struct kvp_view_desc v;
	uint64_t bad = 0, k, lo, ro;
	uint32_t r, i, j;
	uint8_t *want;

	kvp_layout_get_info(ex->layout, &info);
	for (r = 0; r < ex->nregions; r++) {
		want = (uint8_t *)calloc(1, (size_t)ex->size[r]);
		if (!want)
			return ex->size[r];
		for (j = 0; j < info.nviews; j++) {
			if (kvp_layout_get_view(ex->layout, j, &v) != 0 ||
			    v.region != r)
				continue;
			for (i = 0; i < n; i++) {
				lo = v.offset + lids[i] * v.stride;
				ro = v.offset + rids[i] * v.stride;
				for (k = 0; k < v.stride; k++)
					want[lo + k] = example_byte(r, ro + k);
			}
		}
		for (k = 0; k < ex->size[r]; k++)
			bad += want[k] != ex->mem[r][k];
		free(want);
	}
	return bad;
}

int main(int argc, char **argv)
{
	struct example ex;
	struct kvp_agent_attr attr;
	struct kvp_peer peer;
	struct kvp_ids ids;
	kvp_agent *a = NULL;
	uint32_t lids[EXAMPLE_BLOCKS], rids[EXAMPLE_BLOCKS], i, engine;
	uint64_t bad;
	int err, ret = 1;

	err = example_init(&ex, "consumer", EXAMPLE_CONSUMER_ENGINE, argc,
			   argv);
	if (err)
		return err;
	memset(&attr, 0, sizeof(attr));
	attr.role = KVP_ROLE_CONSUMER;
	attr.layout = ex.layout;
	attr.max_ids = EXAMPLE_BLOCKS; /* the longest id list of a pull */
	example_secret(&attr);
	err = kvp_agent_open(&attr, &a);
	if (err) {
		fprintf(stderr, "consumer: kvp_agent_open: %s\n",
			kvp_strerror(err));
		goto out;
	}
	if (example_register(&ex, a))
		goto out;
	/* peers[i]: where producer rank i listens; the producer has TP 1.
	 * No carried blob (meta NULL): it comes in-band. Adding an engine
	 * does not block: its handshake runs in kvp_agent_poll(), which
	 * reports ENGINE_UP (or ENGINE_DOWN and why). An agent may add any
	 * number of producer engines and pull from each by its handle. */
	memset(&peer, 0, sizeof(peer));
	peer.addr = ex.addr;
	peer.port = ex.port;
	err = kvp_agent_add_engine(a, &peer, 1, CONNECT_MS, &engine);
	if (err) {
		fprintf(stderr, "consumer: kvp_agent_add_engine(%s, %u): %s\n",
			ex.addr, (unsigned)ex.port, kvp_strerror(err));
		goto out;
	}
	if (example_wait(&ex, a, KVP_EV_ENGINE_UP, CONNECT_MS / 1000))
		goto out;

	/* The producer's blocks 0..7 hold the sequence; they land in our
	 * blocks 20..27. One group (full attention): ids[0]. */
	for (i = 0; i < EXAMPLE_BLOCKS; i++) {
		rids[i] = i;
		lids[i] = 20 + i;
	}
	memset(&ids, 0, sizeof(ids));
	ids.local = lids;
	ids.nlocal = EXAMPLE_BLOCKS;
	ids.remote = rids;
	ids.nremote = EXAMPLE_BLOCKS;
	err = kvp_agent_pull_from(a, engine, EXAMPLE_REQ_ID, &ids);
	if (err) {
		fprintf(stderr, "consumer: kvp_agent_pull_from: %s\n",
			kvp_strerror(err));
		goto out;
	}
	/* Exactly one DONE or FAILED follows; the local blocks must not be
	 * read before. */
	if (example_wait(&ex, a, KVP_EV_DONE, DONE_S))
		goto out;

	bad = check(&ex, lids, rids, EXAMPLE_BLOCKS);
	if (bad) {
		fprintf(stderr, "consumer: %llu wrong bytes\n",
			(unsigned long long)bad);
		goto out;
	}
	printf("consumer: request %d done: %d blocks x %u regions, every "
	       "byte checked\n", EXAMPLE_REQ_ID, EXAMPLE_BLOCKS,
	       (unsigned)ex.nregions);
	ret = 0;
out:
	kvp_agent_close(a);
	example_fini(&ex);
	return ret;
}
