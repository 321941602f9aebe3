// SPDX-License-Identifier: MIT
/*
 * The shared receive queue's credit rules (verbs/credit.c, compiled in
 * here: it calls no verbs function), against a simulated queue: consumers
 * that keep to their credit, read the producer's counter when they like
 * and send when they may; a producer that takes what arrived, a poll at a
 * time, at times it chooses (long pauses among them). Checked at every
 * step: the queue never holds more messages than it has buffers, a
 * compliant consumer is never called an abuser, any connected rank can
 * send TABLE and FOLLOW at once, loans come back from ranks that went
 * quiet, and a consumer that sends one message past its credit is caught.
 * Randomness from a fixed seed: the same run every time.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/credit.c"

#define MAXC 1024
#define MAXQ 65536

/* A consumer connection, as the consumer sees it. */
struct sim_cons {
	uint64_t go, seen, sent;
	int first, up;
};

struct sim {
	struct kvp_credit_pool p;
	struct kvp_credit cr[MAXC];
	struct sim_cons cs[MAXC];
	uint32_t n;
	/* Messages arrived, not yet taken: (connection, give, n). */
	struct {
		uint32_t c, n;
		int give;
	} q[MAXQ];
	uint32_t qh, qt;
	uint64_t bufs;	   /* the queue's buffers */
	uint64_t in_q[MAXC]; /* per connection, arrived and not taken */
	uint64_t abuses, taken, most;
	uint64_t rng;
};

static uint32_t rnd(struct sim *s, uint32_t n)
{
	s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(s->rng >> 33) % n;
}

static void sim_init(struct sim *s, uint32_t n, uint32_t pool,
		     uint32_t depth, uint64_t seed)
{
	memset(s, 0, sizeof(*s));
	kvp__credit_pool_init(&s->p, pool, depth);
	s->n = n;
	s->bufs = kvp__credit_bufs(n, pool);
	s->rng = seed;
}

static void sim_up(struct sim *s, uint32_t i, int first)
{
	s->cs[i].go = kvp__credit_go(&s->p, &s->cr[i], first);
	s->cs[i].seen = s->cs[i].sent = 0;
	s->cs[i].first = first;
	s->cs[i].up = 1;
}

static uint64_t view(const struct sim *s, uint32_t i)
{
	const struct sim_cons *c = &s->cs[i];

	return c->go + c->seen - c->sent;
}

static void sim_send(struct sim *s, uint32_t i, int give, uint32_t n)
{
	uint64_t held = 0;
	uint32_t j;

	s->q[s->qt % MAXQ].c = i;
	s->q[s->qt % MAXQ].give = give;
	s->q[s->qt % MAXQ].n = n;
	s->qt++;
	s->cs[i].sent += give ? 1 + (uint64_t)n : 1;
	s->in_q[i]++;
	for (j = 0; j < s->n; j++)
		held += s->in_q[j];
	if (held > s->most)
		s->most = held;
	/* The queue never runs dry. */
	assert_true(held <= s->bufs);
}

/* A compliant consumer's send: only with credit. */
static int sim_try(struct sim *s, uint32_t i)
{
	if (!s->cs[i].up || !view(s, i))
		return 0;
	sim_send(s, i, 0, 0);
	return 1;
}

/* A quiet consumer's GIVE: everything beyond its own buffers. */
static int sim_give(struct sim *s, uint32_t i)
{
	const uint64_t v = view(s, i);
	const uint32_t own = s->cs[i].first ? KVP_CREDIT_OWN : 1;

	if (!s->cs[i].up || v < own + 2u)
		return 0;
	sim_send(s, i, 1, (uint32_t)(v - own - 1));
	return 1;
}

static void sim_read(struct sim *s, uint32_t i)
{
	s->cs[i].seen = s->cr[i].given;
}

/* One producer poll: takes up to k messages, then publishes. Returns the
 * abuses seen. */
static uint32_t sim_poll(struct sim *s, uint32_t k)
{
	uint32_t j, bad = 0;

	for (; k && s->qh != s->qt; k--, s->qh++) {
		uint32_t c = s->q[s->qh % MAXQ].c;

		s->in_q[c]--;
		if (kvp__credit_msg(&s->p, &s->cr[c], s->q[s->qh % MAXQ].give,
				    s->q[s->qh % MAXQ].n))
			bad++;
		s->taken++;
	}
	for (j = 0; j < s->n; j++)
		(void)kvp__credit_publish(&s->cr[j]);
	s->abuses += bad;
	return bad;
}

static void check_pool(const struct sim *s)
{
	uint64_t lent = 0;
	uint32_t j;

	for (j = 0; j < s->n; j++) {
		lent += s->cr[j].extra;
		if (s->cr[j].live)
			assert_int_equal(kvp__credit_hold(&s->cr[j]),
					 s->cr[j].own + s->cr[j].extra);
	}
	assert_int_equal(lent + s->p.free, s->p.pool);
}

/* GO's credits: own buffers always, a loan while the pool has one. */
static void test_go(void **st)
{
	struct kvp_credit_pool p;
	struct kvp_credit c[3];

	(void)st;
	kvp__credit_pool_init(&p, 16, 128);
	assert_int_equal(kvp__credit_go(&p, &c[0], 1),
			 KVP_CREDIT_OWN + KVP_CREDIT_GO_LOAN);
	/* Two borrowers: a share of 8 each, 8 left. */
	assert_int_equal(kvp__credit_go(&p, &c[1], 1), KVP_CREDIT_OWN + 8);
	assert_int_equal(p.free, 0);
	/* Not a first queue pair: its BYE's buffer. */
	assert_int_equal(kvp__credit_go(&p, &c[2], 0), 1);
	assert_int_equal(p.nbor, 2);
	kvp__credit_gone(&p, &c[0]);
	assert_int_equal(p.free, 8);
	assert_int_equal(p.nbor, 1);
	kvp__credit_gone(&p, &c[0]); /* twice: nothing more */
	assert_int_equal(p.free, 8);
	assert_int_equal(kvp__credit_bufs(1024, 512), 2048 + 512);
}

/* Issue 33, item 2: with the pool lent out (rq_depth 128: pool 512) the
 * 49th rank got one credit at GO and a streamed pull's TABLE + FOLLOW
 * never went out. Now every one of 1,024 ranks can send both at once,
 * with no credit READ between. */
static void test_table_follow_at_scale(void **st)
{
	static struct sim s;
	uint32_t i;

	(void)st;
	sim_init(&s, 1024, 512, 128, 1);
	for (i = 0; i < 1024; i++) {
		sim_up(&s, i, 1);
		assert_true(view(&s, i) >= 2);
		assert_true(sim_try(&s, i)); /* TABLE */
		assert_true(sim_try(&s, i)); /* FOLLOW */
	}
	assert_int_equal(sim_poll(&s, MAXQ), 0);
	check_pool(&s);
	assert_int_equal(s.taken, 2048);
}

/* Item 4: loans do not stay with the first busy ranks. One rank busy
 * alone borrows up to rq_depth; 63 more arrive; as it goes on sending it
 * comes down to its share, and the pool goes to the others. */
static void test_fair_share(void **st)
{
	static struct sim s;
	uint32_t i, r;

	(void)st;
	sim_init(&s, 64, 512, 128, 2);
	sim_up(&s, 0, 1);
	for (r = 0; r < 2000; r++) {
		while (sim_try(&s, 0))
			;
		assert_int_equal(sim_poll(&s, MAXQ), 0);
		sim_read(&s, 0);
	}
	assert_int_equal(s.cr[0].extra, 128 - KVP_CREDIT_OWN);
	for (i = 1; i < 64; i++)
		sim_up(&s, i, 1);
	for (r = 0; r < 2000; r++) {
		for (i = 0; i < 64; i++)
			while (sim_try(&s, i))
				;
		assert_int_equal(sim_poll(&s, MAXQ), 0);
		for (i = 0; i < 64; i++)
			sim_read(&s, i);
		check_pool(&s);
	}
	for (i = 0; i < 64; i++)
		assert_int_equal(s.cr[i].extra, 512 / 64);
	assert_int_equal(s.p.free, 0);
}

/* Loans return when a rank goes quiet: its GIVE hands back all but its
 * own buffers, and the next rank borrows them. */
static void test_quiet_gives_back(void **st)
{
	static struct sim s;
	uint32_t r;

	(void)st;
	sim_init(&s, 2, 64, 128, 3);
	sim_up(&s, 0, 1);
	for (r = 0; r < 200; r++) {
		while (sim_try(&s, 0))
			;
		assert_int_equal(sim_poll(&s, MAXQ), 0);
		sim_read(&s, 0);
	}
	assert_int_equal(s.cr[0].extra, 64);
	assert_int_equal(s.p.free, 0);
	/* Quiet: it reads its counter, then gives back. */
	sim_read(&s, 0);
	assert_true(sim_give(&s, 0));
	assert_int_equal(sim_poll(&s, MAXQ), 0);
	assert_int_equal(s.cr[0].extra, 0);
	assert_int_equal(view(&s, 0), KVP_CREDIT_OWN);
	assert_int_equal(s.p.free, 64);
	/* A newcomer borrows again (its share: 32 of 64). */
	sim_up(&s, 1, 1);
	for (r = 0; r < 200; r++) {
		while (sim_try(&s, 1))
			;
		assert_int_equal(sim_poll(&s, MAXQ), 0);
		sim_read(&s, 1);
	}
	assert_int_equal(s.cr[1].extra, 32);
	check_pool(&s);
}

/* Item 3: a producer that does not poll for a long while (500 ms in the
 * VM case; here 10,000 messages) as 4 compliant ranks send at their
 * credit, reading its counter whenever they like: none is an abuser, and
 * the queue never holds more than its buffers. Then many random
 * schedules of 256 ranks, short polls and long pauses. */
static void run_compliant(uint32_t n, uint32_t pool, uint64_t seed,
			  uint32_t steps)
{
	static struct sim s;
	uint32_t i, t;

	sim_init(&s, n, pool, 128, seed);
	for (i = 0; i < n; i++)
		sim_up(&s, i, i % 4 != 3); /* some not first QPs */
	for (t = 0; t < steps; t++) {
		uint32_t w = rnd(&s, 100);

		i = rnd(&s, n);
		if (w < 60)
			(void)sim_try(&s, i);
		else if (w < 80)
			sim_read(&s, i);
		else if (w < 83)
			(void)sim_give(&s, i);
		else if (w < 99)
			(void)sim_poll(&s, 1 + rnd(&s, 64));
		else
			(void)sim_poll(&s, MAXQ);
		assert_int_equal(s.abuses, 0);
	}
	(void)sim_poll(&s, MAXQ);
	assert_int_equal(s.abuses, 0);
	check_pool(&s);
}

static void test_compliant_never_dropped(void **st)
{
	static struct sim s;
	uint64_t before;
	uint32_t i, r;

	(void)st;
	sim_init(&s, 4, 512, 128, 4);
	for (i = 0; i < 4; i++)
		sim_up(&s, i, 1);
	/* Warm: loans taken. */
	for (r = 0; r < 100; r++) {
		for (i = 0; i < 4; i++)
			while (sim_try(&s, i))
				;
		(void)sim_poll(&s, MAXQ);
		for (i = 0; i < 4; i++)
			sim_read(&s, i);
	}
	/* The producer stops polling: they send all they may, reading
	 * the counter between sends; then one poll takes everything. */
	before = s.taken;
	for (r = 0; r < 10000; r++) {
		i = r % 4;
		sim_read(&s, i);
		(void)sim_try(&s, i);
	}
	assert_int_equal(sim_poll(&s, MAXQ), 0);
	assert_true(s.taken - before > 0);
	for (r = 0; r < 10000; r++) {
		i = r % 4;
		sim_read(&s, i);
		if (!sim_try(&s, i))
			(void)sim_poll(&s, 1 + r % 7); /* polls that end
							 * mid-backlog */
	}
	assert_int_equal(sim_poll(&s, MAXQ), 0);
	assert_int_equal(s.abuses, 0);
	check_pool(&s);

	for (r = 0; r < 20; r++)
		run_compliant(256, 512, 100 + r, 20000);
	run_compliant(1024, 512, 7, 50000);
	run_compliant(3, 2, 8, 50000); /* a pool smaller than the ranks */
}

/* One message past the credit it could have known of is caught, at that
 * message, whatever the producer's timing; a GIVE of more than it
 * borrowed too; nothing changes when refused. */
static void test_abuser_caught(void **st)
{
	static struct sim s;
	struct kvp_credit before;
	uint32_t k;

	(void)st;
	sim_init(&s, 2, 64, 128, 5);
	sim_up(&s, 0, 1);
	sim_up(&s, 1, 1);
	/* Its credit, then one more: the extra one is the abuse. */
	for (k = view(&s, 0); k; k--)
		sim_send(&s, 0, 0, 0);
	sim_send(&s, 0, 0, 0);
	assert_int_equal(sim_poll(&s, MAXQ), 1);
	/* A flood read against what a poll gives: within one poll nothing
	 * new is published, so a flood is caught in the poll it starts. */
	sim_init(&s, 1, 64, 128, 6);
	sim_up(&s, 0, 1);
	for (k = 0; k < 1000; k++)
		s.q[s.qt++ % MAXQ].c = 0;
	s.in_q[0] = 1000;
	assert_int_equal(sim_poll(&s, MAXQ), 1000 - view(&s, 0));
	/* A GIVE of more than its loans. */
	sim_init(&s, 1, 64, 128, 7);
	sim_up(&s, 0, 1);
	before = s.cr[0];
	assert_int_equal(kvp__credit_msg(&s.p, &s.cr[0], 1,
					 s.cr[0].extra),
			 -EPROTO);
	assert_memory_equal(&before, &s.cr[0], sizeof(before));
	assert_int_equal(kvp__credit_msg(&s.p, &s.cr[0], 1,
					 s.cr[0].extra - 1),
			 0);
	assert_int_equal(s.cr[0].extra, 0);
	/* Gone: anything after is refused. */
	kvp__credit_gone(&s.p, &s.cr[0]);
	assert_int_equal(kvp__credit_msg(&s.p, &s.cr[0], 0, 0), -EPROTO);
}

/* An rq_depth below the own buffers lends nothing and wraps nothing. */
static void test_tiny_depth(void **st)
{
	struct kvp_credit_pool p;
	struct kvp_credit c;

	(void)st;
	kvp__credit_pool_init(&p, 4, 1);
	assert_int_equal(kvp__credit_share(&p), 0);
	assert_int_equal(kvp__credit_go(&p, &c, 1), KVP_CREDIT_OWN);
	assert_int_equal(kvp__credit_msg(&p, &c, 0, 0), 0);
	assert_int_equal(kvp__credit_publish(&c), 1);
	assert_int_equal(c.extra, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_go),
		cmocka_unit_test(test_table_follow_at_scale),
		cmocka_unit_test(test_fair_share),
		cmocka_unit_test(test_quiet_gives_back),
		cmocka_unit_test(test_compliant_never_dropped),
		cmocka_unit_test(test_abuser_caught),
		cmocka_unit_test(test_tiny_depth),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
