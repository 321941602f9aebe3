/* SPDX-License-Identifier: MIT */
/*
 * The credit rules of a producer's shared receive queue, as arithmetic:
 * no verbs call, no allocation, so tests/test_credit.c runs them against
 * a simulated queue. srq.c applies them to the real one.
 *
 * A consumer connection may fill `hold` of the queue's buffers:
 *   own   its own, never lent to anyone else: KVP_CREDIT_OWN on a rank's
 *         first queue pair (the one that carries notifications, TABLE and
 *         FOLLOW: a streamed pull's first step needs TABLE and FOLLOW
 *         together, so two), 1 on the others (their BYE);
 *   extra lent from a pool shared by the first queue pairs, each at most
 *         its fair share (pool / borrowers, and rq_depth in all).
 * The queue holds every connection's own buffers and the pool, so it never
 * runs dry while every consumer keeps to its credit.
 *
 * Credit moves one way on the wire: the producer counts what it gives in
 * a counter the consumer READs (`given`); the consumer counts what it
 * sends. For each message taken, the producer gives its credit back, lends
 * one more (below the fair share), or takes a loan back (above it), and a
 * rank that goes quiet hands its loans back with GIVE (a message that
 * returns n credits beyond its own). So a loan never stays with a rank
 * that no longer uses it, and a busy rank keeps at most its share.
 *
 * The abuse rule is exact. What the producer gives during a poll is
 * published (written to the counter) only when the poll ends, so a message
 * taken during a poll was sent by a consumer that knew at most the counter
 * published before it: a compliant consumer's messages never number more
 * than go + given (GO's credits and the published counter), and one
 * message past that is a consumer that ignored its credit. A GIVE may
 * return only loans it holds.
 */
#ifndef KVP_VERBS_CREDIT_H
#define KVP_VERBS_CREDIT_H

#include <stdint.h>

/* A first queue pair's own buffers: TABLE and FOLLOW at once. */
#define KVP_CREDIT_OWN 2
/* The most a first queue pair borrows at GO (more comes as it sends). */
#define KVP_CREDIT_GO_LOAN 8

struct kvp_credit_pool {
	uint32_t pool;	/* buffers that may be lent */
	uint32_t free;	/* of them, not lent */
	uint32_t depth; /* most one connection may hold (rq_depth) */
	uint32_t nbor;	/* connections that may borrow: first QPs past GO */
};

struct kvp_credit {
	uint64_t go;	/* credits at GO */
	uint64_t given; /* given since GO, published (the counter) */
	uint64_t owed;	/* given since GO, published at the poll's end */
	uint64_t used;	/* messages taken since GO (a GIVE n: 1 + n) */
	uint32_t own;	/* its own buffers */
	uint32_t extra; /* lent from the pool */
	uint8_t first;	/* a rank's first queue pair: it may borrow */
	uint8_t live;	/* between GO and gone */
};

/* A pool of `pool` buffers to lend, depth at most per connection. */
void kvp__credit_pool_init(struct kvp_credit_pool *p, uint32_t pool,
			   uint32_t depth);
/* Buffers a queue needs for n connection slots: each slot's own (as if
 * every one were a first queue pair) and the pool. */
uint64_t kvp__credit_bufs(uint32_t nslots, uint32_t pool);
/* The loan a borrower may hold now. */
uint32_t kvp__credit_share(const struct kvp_credit_pool *p);
/* GO for connection c (first: a rank's first queue pair): c starts; the
 * credits GO announces (own, and a first loan). */
uint32_t kvp__credit_go(struct kvp_credit_pool *p, struct kvp_credit *c,
			int first);
/* A message taken from c; give: a GIVE returning n beyond its own
 * credit (0 for any other message). 0, or -EPROTO: c sent past any credit
 * it could know of, or returned more than it borrowed (nothing changed;
 * the caller drops c). */
int kvp__credit_msg(struct kvp_credit_pool *p, struct kvp_credit *c,
		    int give, uint32_t n);
/* The poll ends: what c was given is published; the counter's value. */
uint64_t kvp__credit_publish(struct kvp_credit *c);
/* c is gone: its loans back to the pool. */
void kvp__credit_gone(struct kvp_credit_pool *p, struct kvp_credit *c);
/* What c may fill now (own + extra while live). */
static inline uint64_t kvp__credit_hold(const struct kvp_credit *c)
{
	return c->go + c->given + c->owed - c->used;
}

#endif
