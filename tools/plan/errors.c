// SPDX-License-Identifier: MIT
/* kvpull-plan: the errors that end the program, and the checked
 * allocation and accessors every other piece calls (it calls none). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dump.h"

__attribute__((format(printf, 1, 0))) static void vreport(const char *fmt,
							 va_list ap)
{
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
}

void usage_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '" PROG " --help'.\n");
	exit(2);
}

void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p)
		die("%s", kvp_strerror(-ENOMEM));
	return p;
}

void checked(int err, const char *what, uint32_t i)
{
	if (err)
		die("%s %u: unreadable", what, i);
}
