/* SPDX-License-Identifier: MIT */
/*
 * producer.c: one producer (prefill) rank. Fills its KV cache with a known
 * pattern, listens, expects one request from the consumer engine and polls
 * until the consumer has read it (RELEASED) or its deadline passed
 * (EXPIRED). Run consumer.c against it.
 *
 *   producer ADDR PORT     ADDR: a numeric IP address of an RDMA device
 *
 * Optional shared secret (16 to 256 bytes, the same for both programs) in
 * the environment variable KVPULL_SECRET. Exit status 0 when the request
 * was released, 1 otherwise, 2 for bad usage.
 */
#include "example.h"

#define DEADLINE_S 60

int main(int argc, char **argv)
{
	struct example ex;
	struct kvp_agent_attr attr;
	kvp_agent *a = NULL;
	uint64_t k;
	uint32_t r;
	int err, ret = 1;

	err = example_init(&ex, "producer", EXAMPLE_PRODUCER_ENGINE, argc,
			   argv);
	if (err)
		return err;
	for (r = 0; r < ex.nregions; r++)
		for (k = 0; k < ex.size[r]; k++)
			ex.mem[r][k] = example_byte(r, k);

	memset(&attr, 0, sizeof(attr));
	attr.role = KVP_ROLE_PRODUCER;
	attr.layout = ex.layout; /* copied */
	example_secret(&attr);
	err = kvp_agent_open(&attr, &a);
	if (err) {
		fprintf(stderr, "producer: kvp_agent_open: %s\n",
			kvp_strerror(err));
		goto out;
	}
	if (example_register(&ex, a))
		goto out;
	err = kvp_agent_listen(a, ex.addr, ex.port);
	if (err) {
		fprintf(stderr, "producer: kvp_agent_listen(%s, %u): %s\n",
			ex.addr, (unsigned)ex.port, kvp_strerror(err));
		goto out;
	}
	/* The request's blocks stay untouched until RELEASED or EXPIRED.
	 * Requests are keyed by (consumer engine, req_id). */
	err = kvp_agent_expect(a, EXAMPLE_CONSUMER_ENGINE, EXAMPLE_REQ_ID,
			       example_now_ns() + DEADLINE_S * 1000000000ull);
	if (err) {
		fprintf(stderr, "producer: kvp_agent_expect: %s\n",
			kvp_strerror(err));
		goto out;
	}
	printf("producer: listening on %s port %u\n", ex.addr,
	       (unsigned)ex.port);
	fflush(stdout);

	/* Handshakes happen inside kvp_agent_poll(): keep polling. */
	if (example_wait(&ex, a, KVP_EV_RELEASED, DEADLINE_S + 5))
		goto out;
	printf("producer: request %d released: its blocks may be reused\n",
	       EXAMPLE_REQ_ID);
	ret = 0;
out:
	kvp_agent_close(a);
	example_fini(&ex);
	return ret;
}
