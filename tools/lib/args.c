// SPDX-License-Identifier: MIT
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "kvpull.h"
#include "names.h"

static int parse_u32(const char *s, uint32_t *v)
{
	char *e;
	unsigned long x;

	/* strtoul accepts "-1" and leading blanks: digits only. */
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	x = strtoul(s, &e, 10);
	if (errno || *e || x > UINT32_MAX)
		return -1;
	*v = (uint32_t)x;
	return 0;
}

int tool_bad_arg(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(see %s --help)\n", prog);
	return 2;
}

/* Stores `val` for option o; returns 0, or 2 after saying what is wrong. */
static int set_opt(const char *prog, const struct tool_opt *o,
		   const char *val)
{
	uint32_t v, i, max;

	switch (o->arg) {
	case TOOL_STR:
		*(const char **)o->val = val;
		return 0;
	case TOOL_FLAG:
		*(uint32_t *)o->val = 1;
		return 0;
	case TOOL_U32:
		if (parse_u32(val, &v))
			return tool_bad_arg(prog, "%s: '%s' is not a number",
					    o->name, val);
		if (o->max && v > o->max)
			return tool_bad_arg(prog, "%s: %u is out of range "
					    "(0-%u)", o->name, v, o->max);
		*(uint32_t *)o->val = v;
		return 0;
	case TOOL_COUNT:
		if (parse_u32(val, &v))
			return tool_bad_arg(prog, "%s: '%s' is not a number",
					    o->name, val);
		if (!o->max && !v)
			return tool_bad_arg(prog, "%s: must be at least 1",
					    o->name);
		if (!v || (o->max && v > o->max))
			return tool_bad_arg(prog, "%s: %u is out of range "
					    "(1-%u)", o->name, v, o->max);
		*(uint32_t *)o->val = v;
		return 0;
	case TOOL_PORT:
		max = o->max ? o->max : 65535;
		if (parse_u32(val, &v))
			return tool_bad_arg(prog, "%s: '%s' is not a number",
					    o->name, val);
		if (v > max)
			return tool_bad_arg(prog, "%s: %u is out of range "
					    "(0-%u)", o->name, v, max);
		*(uint16_t *)o->val = (uint16_t)v;
		return 0;
	case TOOL_LAYOUT:
		if (TOOL_NAME_INDEX(tool_layout_names, val) < 0) {
			char names[128] = "";
			size_t n = 0;

			for (i = 0; i < TOOL_NELEM(tool_layout_names) &&
				    n < sizeof(names); i++)
				n += (size_t)snprintf(names + n,
						      sizeof(names) - n, "%s%s",
						      i ? "|" : "",
						      tool_layout_names[i]);
			return tool_bad_arg(prog, "%s: '%s' is not a layout "
					    "(%s)", o->name, val, names);
		}
		*(uint32_t *)o->val =
			(uint32_t)TOOL_NAME_INDEX(tool_layout_names, val);
		return 0;
	}
	return tool_bad_arg(prog, "%s: internal error", o->name);
}

int tool_parse_args(int argc, char **argv, const char *prog,
		    const struct tool_opt *opts)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *val, *eq;
		const struct tool_opt *o;
		size_t len;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return TOOL_ARGS_HELP;
		if (!strcmp(a, "--version")) {
			printf("%s %d.%d.%d\n", prog, KVP_VERSION_MAJOR,
			       KVP_VERSION_MINOR, KVP_VERSION_PATCH);
			return TOOL_ARGS_VERSION;
		}
		eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
		len = eq ? (size_t)(eq - a) : strlen(a);
		for (o = opts; o->name; o++)
			if (strlen(o->name) == len && !strncmp(a, o->name, len))
				break;
		if (!o->name) {
			tool_bad_arg(prog, "unknown option '%.*s'", (int)len, a);
			return TOOL_ARGS_BAD;
		}
		if (o->arg == TOOL_FLAG) {
			if (eq) {
				tool_bad_arg(prog, "%s takes no value",
					     o->name);
				return TOOL_ARGS_BAD;
			}
			val = "";
		} else if (eq) {
			val = eq + 1;
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			tool_bad_arg(prog, "%s needs a value", o->name);
			return TOOL_ARGS_BAD;
		}
		if (set_opt(prog, o, val))
			return TOOL_ARGS_BAD;
	}
	return 0;
}
