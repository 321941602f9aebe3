// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for kvp_meta_decode(). Checks, beyond what the
 * sanitizers catch: a failed decode leaves *out untouched and returns
 * -EPROTO or -EMSGSIZE (or -ENOMEM); a successful one yields a layout that
 * encodes back to exactly the input bytes (one encoding per layout).
 *
 *   make fuzz
 *   mkdir -p corpus && KVP_WIRE_SEED_DIR=corpus build/tests/test_wire
 *   build/fuzz/fuzz_meta -max_total_time=60 corpus
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpull.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvp_layout *l = (kvp_layout *)(uintptr_t)1;
	size_t len = 0, len2 = 0;
	uint8_t *buf;
	int err;

	err = kvp_meta_decode(data, size, &l);
	if (err) {
		if (l != (kvp_layout *)(uintptr_t)1 ||
		    (err != -EPROTO && err != -EMSGSIZE && err != -ENOMEM))
			abort();
		return 0;
	}
	if (kvp_meta_encode(l, NULL, 0, &len) != -EMSGSIZE || len != size)
		abort();
	buf = malloc(len);
	if (!buf)
		abort();
	if (kvp_meta_encode(l, buf, len, &len2) || len2 != size ||
	    memcmp(buf, data, size))
		abort();
	free(buf);
	kvp_layout_destroy(l);
	return 0;
}
