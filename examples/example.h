/* SPDX-License-Identifier: MIT */
/*
 * example.h: what producer.c and consumer.c must agree on, and the helpers
 * both use. Two engines agree on the model; here they also share the
 * layout (TP 1 both), so that the consumer can check what it received
 * page by page. A real pair may differ in TP size, block size and memory
 * layout: the plan maps every byte to the byte of the same identity.
 */
#ifndef KVPULL_EXAMPLE_H
#define KVPULL_EXAMPLE_H

/* clock_gettime(), nanosleep() */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvpull.h>

#define EXAMPLE_PRODUCER_ENGINE 1
#define EXAMPLE_CONSUMER_ENGINE 2
#define EXAMPLE_REQ_ID 1
#define EXAMPLE_BLOCKS 8     /* blocks pulled */
#define EXAMPLE_NUM_BLOCKS 32 /* blocks per region */
#define EXAMPLE_SECRET_ENV "KVPULL_SECRET"

/* Llama-3.1-8B cut to 2 layers (4 regions of 1 MiB: K and V per layer),
 * TP 1, blocks of 16 tokens, FlashAttention HND pages. */
static inline int example_layout(uint64_t engine_id, kvp_layout **out)
{
	struct kvp_model m;
	struct kvp_engine_desc e;
	int err;

	err = kvp_model_preset("llama-3.1-8b", &m);
	if (err)
		return err;
	m.layers = 2;
	memset(&e, 0, sizeof(e));
	e.engine_id = engine_id;
	e.tp_size = 1;
	e.tp_rank = 0;
	e.block_tokens = 16;
	e.num_blocks = EXAMPLE_NUM_BLOCKS;
	e.kv_layout = KVP_KV_FLASH_HND;
	return kvp_layout_build(&m, &e, out);
}

/* The producer's byte at offset `off` of region `region`. */
static inline uint8_t example_byte(uint32_t region, uint64_t off)
{
	return (uint8_t)(region * 31u + off * 7u + (off >> 12));
}

/* The shared secret from the environment, if any: 16 to 256 bytes, the
 * same on both sides (kvp_agent_open() refuses other lengths). */
static inline void example_secret(struct kvp_agent_attr *attr)
{
	const char *s = getenv(EXAMPLE_SECRET_ENV);

	if (s && *s) {
		attr->secret = s;
		attr->secret_len = (uint32_t)strlen(s);
	}
}

/* One rank of the example: its address and port from the command line,
 * its layout, and zeroed memory for every region (mem[i], size[i] bytes). */
struct example {
	const char *prog;
	const char *addr;
	uint16_t port;
	kvp_layout *layout;
	uint32_t nregions;
	uint8_t **mem;
	uint64_t *size;
};

/* Releases what example_init() made; the agent must be closed first (it
 * borrows the memory). */
static inline void example_fini(struct example *ex)
{
	uint32_t i;

	for (i = 0; ex->mem && i < ex->nregions; i++)
		free(ex->mem[i]);
	free(ex->mem);
	free(ex->size);
	kvp_layout_destroy(ex->layout);
	memset(ex, 0, sizeof(*ex));
}

/* Parses "PROG ADDR PORT", builds the layout of engine `engine_id` and
 * allocates its regions. Returns 0, or the exit status after printing why
 * (2: usage, 1: failure). */
static inline int example_init(struct example *ex, const char *prog,
			       uint64_t engine_id, int argc, char **argv)
{
	struct kvp_layout_info info;
	unsigned long port = 0;
	uint32_t i;
	int err;

	memset(ex, 0, sizeof(*ex));
	ex->prog = prog;
	if (argc == 3)
		port = strtoul(argv[2], NULL, 10);
	if (port == 0 || port > 65535) {
		fprintf(stderr, "usage: %s ADDR PORT\n", prog);
		return 2;
	}
	ex->addr = argv[1];
	ex->port = (uint16_t)port;
	err = example_layout(engine_id, &ex->layout);
	if (err) {
		fprintf(stderr, "%s: layout: %s\n", prog, kvp_strerror(err));
		return 1;
	}
	kvp_layout_get_info(ex->layout, &info);
	ex->mem = (uint8_t **)calloc(info.nregions, sizeof(*ex->mem));
	ex->size = (uint64_t *)calloc(info.nregions, sizeof(*ex->size));
	if (!ex->mem || !ex->size)
		goto err_nomem;
	ex->nregions = info.nregions;
	for (i = 0; i < info.nregions; i++) {
		err = kvp_layout_get_region(ex->layout, i, &ex->size[i]);
		if (err) {
			fprintf(stderr, "%s: region %u: %s\n", prog,
				(unsigned)i, kvp_strerror(err));
			example_fini(ex);
			return 1;
		}
		ex->mem[i] = (uint8_t *)calloc(1, (size_t)ex->size[i]);
		if (!ex->mem[i])
			goto err_nomem;
	}
	return 0;
err_nomem:
	fprintf(stderr, "%s: out of memory\n", prog);
	example_fini(ex);
	return 1;
}

/* Registers every region of the layout with agent `a`: each once, before
 * listen or connect. The memory is borrowed until kvp_agent_close().
 * Returns 0 or the error, printed. */
static inline int example_register(const struct example *ex, kvp_agent *a)
{
	uint32_t r;
	int err;

	for (r = 0; r < ex->nregions; r++) {
		err = kvp_agent_register(a, r, ex->mem[r], ex->size[r]);
		if (err) {
			fprintf(stderr, "%s: kvp_agent_register(%u): %s\n",
				ex->prog, (unsigned)r, kvp_strerror(err));
			return err;
		}
	}
	return 0;
}

static inline uint64_t example_now_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		abort(); /* CLOCK_MONOTONIC cannot fail on Linux */
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Between two kvp_agent_poll() calls: an engine would do its own work
 * here, or sleep on kvp_agent_fds() after kvp_agent_arm(). */
static inline void example_pause(void)
{
	struct timespec ts;

	ts.tv_sec = 0;
	ts.tv_nsec = 1000000;
	(void)nanosleep(&ts, NULL); /* a signal only polls sooner */
}

/* Polls agent `a` until the event `want` arrives: ENGINE_UP (a consumer's
 * producer engine), or DONE on a consumer and RELEASED on a producer for
 * EXAMPLE_REQ_ID. Returns 0; -EIO after a FAILED, EXPIRED or ENGINE_DOWN
 * event; -ETIMEDOUT after `timeout_s` seconds; or the error of
 * kvp_agent_poll(). Prints why it failed. */
static inline int example_wait(const struct example *ex, kvp_agent *a,
			       uint32_t want, int timeout_s)
{
	uint64_t deadline = example_now_ns() + timeout_s * 1000000000ull;
	struct kvp_event ev[16];
	int n, i;

	for (;;) {
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0) {
			fprintf(stderr, "%s: kvp_agent_poll: %s\n", ex->prog,
				kvp_strerror(n));
			return n;
		}
		for (i = 0; i < n; i++) {
			if (ev[i].type == want &&
			    (want == KVP_EV_ENGINE_UP ||
			     ev[i].req_id == EXAMPLE_REQ_ID))
				return 0;
			if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				fprintf(stderr, "%s: producer engine down: %s\n",
					ex->prog, kvp_strerror(ev[i].status));
				return -EIO;
			}
			if (ev[i].type == KVP_EV_FAILED ||
			    ev[i].type == KVP_EV_EXPIRED) {
				fprintf(stderr, "%s: request %llu %s: %s\n",
					ex->prog,
					(unsigned long long)ev[i].req_id,
					ev[i].type == KVP_EV_FAILED ?
						"failed" : "expired",
					kvp_strerror(ev[i].status));
				return -EIO;
			}
		}
		if (n > 0)
			continue;
		if (example_now_ns() > deadline) {
			fprintf(stderr, "%s: no event after %d s\n", ex->prog,
				timeout_s);
			return -ETIMEDOUT;
		}
		example_pause();
	}
}

#endif /* KVPULL_EXAMPLE_H */
