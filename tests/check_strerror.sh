#!/bin/sh
# SPDX-License-Identifier: MIT
# Every negative errno that plan/, verbs/ or the public header use (returned,
# assigned or documented) must have its own kvp_strerror() message. Collects
# each -E<NAME> in their sources, builds a small program against
# plan/util.c and checks that none of them reads "unknown error".
# Usage: sh tests/check_strerror.sh [srcdir]   (CC is honoured)
set -u
top=${1:-.}
cc=${CC:-cc}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

names=$(find "$top/plan" "$top/verbs" "$top/include" -name '*.[ch]' \
		2>/dev/null | sort | xargs grep -ohE -- '-E[A-Z0-9]+\b' |
	sed 's/^-//' | sort -u)
if [ -z "$names" ]; then
	echo "check_strerror: no errno found under $top: wrong directory?"
	exit 1
fi

{
	printf '#include <errno.h>\n#include <stdio.h>\n#include <string.h>\n'
	printf '#include "kvpull.h"\n\n'
	printf 'static int pass, fail;\n\n'
	printf 'static void check(int err, const char *name)\n{\n'
	printf '\tif (!strcmp(kvp_strerror(err), "unknown error")) {\n'
	printf '\t\tprintf("check_strerror: -%%s has no message\\n", name);\n'
	printf '\t\tfail++;\n\t} else {\n\t\tpass++;\n\t}\n}\n\n'
	printf 'int main(void)\n{\n'
	for n in $names; do
		printf '#ifdef %s\n\tcheck(-%s, "%s");\n#else\n' "$n" "$n" "$n"
		printf '\tprintf("check_strerror: -%s is no errno\\n");\n' "$n"
		printf '\tfail++;\n#endif\n'
	done
	printf '\tprintf("check_strerror: %%d passed, %%d failed\\n", pass, fail);\n'
	printf '\treturn fail != 0;\n}\n'
} >"$tmp/check.c"

if ! $cc -std=gnu11 -I"$top/include" -I"$top/plan" -o "$tmp/check" \
	"$tmp/check.c" "$top/plan/util.c" >"$tmp/cc.log" 2>&1; then
	cat "$tmp/cc.log"
	echo "check_strerror: could not build the check"
	exit 1
fi
"$tmp/check"
