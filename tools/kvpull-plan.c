// SPDX-License-Identifier: MIT
/*
 * kvpull-plan: compiles the transfer plan of one consumer rank against a
 * producer engine and prints it, as a readable summary or as one JSON
 * document (schema: tools/kvpull-plan.schema.json, described in
 * tools/README.md). Optionally emits one request and prints its work
 * requests, and draws the plan as an SVG picture (--svg). Public API only; the pieces are in tools/plan/.
 *
 * Exit status: 0 done, 1 the library refused (layout, spec, plan, request)
 * or a file could not be read, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "plan/dump.h"

int main(int argc, char **argv)
{
	struct opts o;
	struct dump d;

	parse_opts(argc, argv, &o);
	build_sides(&o);
	memset(&d, 0, sizeof(d));
	compute(&o, &d);
	if (o.svg)
		write_svg(&d);
	if (o.json)
		print_json(&d);
	else
		print_text(&d);
	if (fflush(stdout) || ferror(stdout))
		die("write error");
	free_dump(&d);
	free_opts(&o);
	return 0;
}
