// SPDX-License-Identifier: MIT
/*
 * Plan compilation, the hash map of view shapes, shape pairs and gather
 * sets (struct imap, compile.h): its growth and release. Its lookup is
 * inline in compile.h, so that each caller's equality test inlines into
 * it. Calls nothing else of plan/.
 */
#include <errno.h>
#include <stdlib.h>

#include "compile.h"

/* Makes room for one more entry (load stays at most one half). */
int kvp__imap_reserve(struct imap *m)
{
	uint32_t n = m->n ? m->n * 2 : 64, i, s;
	uint32_t *slot, *hash;

	if ((m->used + 1) * 2 <= m->n)
		return 0;
	slot = calloc(n, sizeof(*slot));
	hash = malloc(n * sizeof(*hash));
	if (!slot || !hash) {
		free(slot);
		free(hash);
		return -ENOMEM;
	}
	for (i = 0; i < m->n; i++) {
		if (!m->slot[i])
			continue;
		for (s = m->hash[i] & (n - 1); slot[s]; s = (s + 1) & (n - 1))
			;
		slot[s] = m->slot[i];
		hash[s] = m->hash[i];
	}
	free(m->slot);
	free(m->hash);
	m->slot = slot;
	m->hash = hash;
	m->n = n;
	return 0;
}

void kvp__imap_free(struct imap *m)
{
	free(m->slot);
	free(m->hash);
}
