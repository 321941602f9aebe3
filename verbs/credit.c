// SPDX-License-Identifier: MIT
/*
 * The shared receive queue's credit rules (credit.h): arithmetic only.
 */
#include <errno.h>

#include "credit.h"

void kvp__credit_pool_init(struct kvp_credit_pool *p, uint32_t pool,
			   uint32_t depth)
{
	p->pool = pool;
	p->free = pool;
	p->depth = depth;
	p->nbor = 0;
}

uint64_t kvp__credit_bufs(uint32_t nslots, uint32_t pool)
{
	return (uint64_t)nslots * KVP_CREDIT_OWN + pool;
}

uint32_t kvp__credit_share(const struct kvp_credit_pool *p)
{
	const uint32_t cap = p->depth > KVP_CREDIT_OWN ?
				     p->depth - KVP_CREDIT_OWN : 0;
	uint32_t share = p->nbor ? p->pool / p->nbor : p->pool;

	return share < cap ? share : cap;
}

uint32_t kvp__credit_go(struct kvp_credit_pool *p, struct kvp_credit *c,
			int first)
{
	uint32_t loan = 0;

	c->given = c->owed = c->used = 0;
	c->own = first ? KVP_CREDIT_OWN : 1;
	c->first = first != 0;
	c->live = 1;
	if (first) {
		p->nbor++;
		loan = kvp__credit_share(p);
		if (loan > KVP_CREDIT_GO_LOAN)
			loan = KVP_CREDIT_GO_LOAN;
		if (loan > p->free)
			loan = p->free;
		p->free -= loan;
	}
	c->extra = loan;
	c->go = c->own + loan;
	return (uint32_t)c->go;
}

int kvp__credit_msg(struct kvp_credit_pool *p, struct kvp_credit *c,
		    int give, uint32_t n)
{
	const uint64_t k = give ? 1 + (uint64_t)n : 1;
	uint32_t share;

	/* Past what was published when it could have sent it; a GIVE of
	 * more than its loans. */
	if (!c->live || c->used + k > c->go + c->given ||
	    (give && k > c->extra))
		return -EPROTO;
	c->used += k;
	if (give) {
		c->extra -= (uint32_t)k;
		p->free += (uint32_t)k;
		return 0;
	}
	share = kvp__credit_share(p);
	if (c->extra > share) {
		/* Above its share (others came since): one back. */
		c->extra--;
		p->free++;
		return 0;
	}
	c->owed++;
	if (c->first && c->extra < share && p->free) {
		c->extra++;
		p->free--;
		c->owed++;
	}
	return 0;
}

uint64_t kvp__credit_publish(struct kvp_credit *c)
{
	c->given += c->owed;
	c->owed = 0;
	return c->given;
}

void kvp__credit_gone(struct kvp_credit_pool *p, struct kvp_credit *c)
{
	if (c->live) {
		p->free += c->extra;
		if (c->first && p->nbor)
			p->nbor--;
	}
	c->go = c->given = c->owed = c->used = 0;
	c->own = c->extra = 0;
	c->first = c->live = 0;
}
