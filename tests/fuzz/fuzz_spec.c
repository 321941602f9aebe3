// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for kvp_layout_parse() on arbitrary text. Checks, beyond
 * what the sanitizers catch: only the documented errors (-EINVAL, -ENOMEM,
 * -ENOENT); on error *out untouched and the message NUL-terminated within
 * msglen (bytes past it untouched); on success a layout whose metadata blob
 * decodes into a layout with the same blob. The text is copied into a
 * buffer of exactly its length, without a NUL, so ASan sees any read past
 * text[len]. The message buffer's length comes from the first input byte.

 * tests/fuzz/crashes/spec-* (a `field` line without `dims`, once undefined
 * behaviour in spec.c) are replayed by scripts/fuzz.sh.
 *
 *   make fuzz && build/fuzz/seeds corpus
 *   build/fuzz/fuzz_spec -max_total_time=60 corpus/spec
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpull.h"

#define SENTINEL ((kvp_layout *)(uintptr_t)0x5a5a5a5a)
#define CANARY 0xa5

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The layout's blob, malloc'ed, or NULL if it does not encode. */
static uint8_t *blob_of(const kvp_layout *l, size_t *len)
{
	uint8_t *buf;
	size_t n = 0;

	if (kvp_meta_encode(l, NULL, 0, &n) != -EMSGSIZE)
		return NULL;
	buf = malloc(n);
	if (!buf)
		abort();
	if (kvp_meta_encode(l, buf, n, len) || *len != n)
		abort();
	return buf;
}

static void check_round_trip(const kvp_layout *l)
{
	kvp_layout *back = SENTINEL;
	uint8_t *a, *b;
	size_t na = 0, nb = 0;

	a = blob_of(l, &na);
	if (!a)
		abort(); /* a parsed layout always has a blob */
	if (kvp_meta_decode(a, na, &back))
		abort();
	b = blob_of(back, &nb);
	if (!b || na != nb || memcmp(a, b, na))
		abort();
	free(a);
	free(b);
	kvp_layout_destroy(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvp_layout *l = SENTINEL;
	char msg[260];
	size_t msglen, i;
	char *text;
	int err;

	if (!size)
		return 0;
	msglen = data[0]; /* 0..255: 0 and 1 are the edge cases */
	text = malloc(size - 1 ? size - 1 : 1);
	if (!text)
		abort();
	memcpy(text, data + 1, size - 1);
	memset(msg, CANARY, sizeof(msg));
	err = kvp_layout_parse(text, size - 1, &l, msg, msglen);
	if (err) {
		if (l != SENTINEL ||
		    (err != -EINVAL && err != -ENOMEM && err != -ENOENT))
			abort();
		if (msglen && !memchr(msg, 0, msglen))
			abort();
		for (i = msglen; i < sizeof(msg); i++)
			if ((unsigned char)msg[i] != CANARY)
				abort();
	} else {
		check_round_trip(l);
		kvp_layout_destroy(l);
	}
	free(text);
	return 0;
}
