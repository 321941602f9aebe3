/* SPDX-License-Identifier: MIT */
/*
 * "--name value" arguments for the tools: one table per tool, errors that
 * name the option, --help and --version handled alike everywhere.
 */
#ifndef KVP_TOOL_ARGS_H
#define KVP_TOOL_ARGS_H

#include <stdint.h>

enum tool_arg {
	TOOL_STR,    /* const char *: the argument itself */
	TOOL_U32,    /* uint32_t, decimal, at most `max` (0: UINT32_MAX) */
	TOOL_COUNT,  /* uint32_t, decimal, 1 to `max` (0: UINT32_MAX) */
	TOOL_PORT,   /* uint16_t, decimal, at most `max` (0: 65535) */
	TOOL_LAYOUT, /* uint32_t: enum kvp_kv_layout, by name (names.h) */
	TOOL_FLAG,   /* uint32_t set to 1; takes no value */
};

struct tool_opt {
	const char *name; /* "--name" */
	enum tool_arg arg;
	void *val;
	uint32_t max;
};

#define TOOL_ARGS_HELP 1    /* --help or -h: print the usage, exit 0 */
#define TOOL_ARGS_VERSION 2 /* --version: printed already, exit 0 */
#define TOOL_ARGS_BAD (-2)  /* unknown option, missing or bad value */

/* Parses argv[1..] into the table `opts` (ended by a NULL name); every
 * option but a TOOL_FLAG takes a value, as "--name value" or "--name=value".
 * Returns 0; TOOL_ARGS_HELP; TOOL_ARGS_VERSION after printing
 * "<prog> MAJOR.MINOR.PATCH" (kvpull.h's KVP_VERSION_*) on stdout; or
 * TOOL_ARGS_BAD after printing on stderr what is wrong, naming the option
 * ("<prog>: unknown option '--foo'", "<prog>: --tp: 'x' is not a number")
 * and pointing at --help. Values parsed before a bad one are stored. */
int tool_parse_args(int argc, char **argv, const char *prog,
		    const struct tool_opt *opts);

/* Prints "<prog>: <what>\n(see <prog> --help)" on stderr and returns 2,
 * for checks after parsing: return tool_bad_arg("kvpull-demo",
 * "--requests: 0 is out of range (1-64)"). */
int tool_bad_arg(const char *prog, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
