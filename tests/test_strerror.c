// SPDX-License-Identifier: MIT
/* kvp_strerror(): the exact message of every code the library returns, and
 * "unknown error" for anything else. tests/check_strerror.sh keeps the list
 * complete: it fails when plan/, verbs/ or the header use a code without a
 * message. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvpull.h"

static const struct {
	int err;
	const char *msg;
} codes[] = {
	{ 0, "success" },
	{ -EINVAL, "invalid argument" },
	{ -ENOMEM, "out of memory" },
	{ -EMSGSIZE, "message too long or truncated" },
	{ -EPROTO, "malformed or incompatible peer data" },
	{ -ERANGE, "block id out of range" },
	{ -ENOSPC, "no space (output arrays too small, or no free engine or connection slot)" },
	{ -ENETDOWN, "network down (the device's port failed)" },
	{ -ECANCELED, "canceled (its engine was removed)" },
	{ -ENOENT, "no such preset, device or entry" },
	{ -ETIMEDOUT, "timed out" },
	{ -EAGAIN, "resource temporarily unavailable; try again" },
	{ -ENODEV, "no RDMA device" },
	{ -ECONNREFUSED, "connection refused" },
	{ -ECONNRESET, "connection reset by peer" },
	{ -ENOTCONN, "not connected" },
	{ -EALREADY, "already in progress" },
	{ -EEXIST, "already exists" },
	{ -EIO, "I/O error (work completion failed)" },
	{ -EBUSY, "busy" },
	{ -EACCES, "access refused (remote access or protection error)" },
	{ -EISCONN, "already connected" },
	{ -ENXIO, "memory regions not registered" },
	{ -EADDRINUSE, "address already in use" },
	{ -EHOSTUNREACH, "host unreachable" },
	{ -ENETUNREACH, "network unreachable (no route through this device)" },
	{ -EADDRNOTAVAIL,
	  "address not available (cannot resolve it on this device)" },
	{ -ECONNABORTED, "connection aborted (connect error)" },
	{ -EFAULT, "bad address (memory registration failed)" },
	{ -EPERM, "authentication failed: wrong or missing shared secret" },
	{ -ENOTSUP, "operation not supported" },
	{ -EOVERFLOW, "value too large (count or size overflow)" },
	{ -EUSERS, "too many connections from this peer or source" },
	{ -E2BIG, "argument list too long (too many ids, ranks or regions)" },
};

#define NCODES (sizeof(codes) / sizeof(codes[0]))

static void test_every_code(void **state)
{
	size_t i, j;

	(void)state;
	for (i = 0; i < NCODES; i++) {
		assert_string_equal(kvp_strerror(codes[i].err), codes[i].msg);
		/* each its own message */
		for (j = 0; j < i; j++)
			assert_true(strcmp(codes[i].msg, codes[j].msg));
	}
}

static void test_unknown(void **state)
{
	static const int other[] = { 1, -1000, EINVAL, -EXDEV, -ESPIPE,
				     INT32_MIN, INT32_MAX };
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(other) / sizeof(other[0]); i++)
		assert_string_equal(kvp_strerror(other[i]), "unknown error");
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_every_code),
		cmocka_unit_test(test_unknown),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
