#!/bin/sh
# check_man.sh: the man pages are lint clean and complete.
#
#   sh tests/check_man.sh [MANDIR [LIB]]     MANDIR [man]; LIB: a built
#                                           libkvpull.so whose exported
#                                           symbols are checked too
# 1. mandoc -Tlint -Wwarning passes on every page (warnings fail; style
#    notes such as references to pages of other packages do not).
# 2. Every function declared KVP_API in include/kvpull.h, and every kvp_
#    symbol LIB exports (kvpull.map: kvp_*), has a section 3 page named
#    after it or is a name (.Nm) of one (make install-man links it).
# 3. Every .Nm of a section 3 page is declared in the header (no stale
#    names), every tool (tools/*.c) has a section 1 page, kvpull.7 exists,
#    and every .Xr to a kvp_ or kvpull page resolves.
# 4. kvpull.7's SEE ALSO names every page of sections 1 and 3.
# Prints "N passed, N failed"; exit status 0 when nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
man=${1:-man}
lib=${2:-}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAILED: $*"; }

if ! command -v mandoc >/dev/null 2>&1; then
	echo "check_man.sh: mandoc not found (apt-get install mandoc)" >&2
	exit 2
fi
pages=$(ls "$man"/man1/*.1 "$man"/man3/*.3 "$man"/man7/*.7 2>/dev/null)
[ -n "$pages" ] || { echo "check_man.sh: no pages in $man" >&2; exit 2; }

# 1. lint
for p in $pages; do
	if mandoc -Tlint -Wwarning "$p"; then ok; else ko "mandoc -Tlint: $p"; fi
done

# Names a page provides: the file's name and its .Nm lines.
names() { # section
	for p in "$man"/man$1/*.$1; do
		basename "$p" ".$1"
		sed -n 's/^\.Nm \([A-Za-z0-9_.-]*\).*/\1/p' "$p"
	done | sort -u
}
have3=$(names 3)
declared=$(tr '\n' ' ' <include/kvpull.h | grep -o 'KVP_API[^;{]*(' |
	sed 's/($//; s/.*[ *]//' | sort -u)
[ -n "$declared" ] || ko "no KVP_API function found in include/kvpull.h"

# 2. every symbol has a page
syms=$declared
if [ -n "$lib" ]; then
	exported=$(nm -D --defined-only "$lib" | awk '$3 ~ /^kvp_/ { sub(/@.*/, "", $3); print $3 }' | sort -u)
	[ -n "$exported" ] || ko "$lib exports no kvp_ symbol"
	syms=$(printf '%s\n%s\n' "$declared" "$exported" | sort -u)
fi
for s in $syms; do
	if printf '%s\n' "$have3" | grep -qx "$s"; then ok; else ko "no page for $s"; fi
done

# 3. no stale names, tools, kvpull.7, cross-references
for n in $have3; do
	if printf '%s\n' "$declared" | grep -qx "$n"; then ok; else ko "man3 names $n, not in include/kvpull.h"; fi
done
for t in tools/*.c; do
	t=$(basename "$t" .c)
	if [ -f "$man/man1/$t.1" ]; then ok; else ko "no page for the tool $t"; fi
done
if [ -f "$man/man7/kvpull.7" ]; then ok; else ko "no kvpull.7"; fi
all=$( (names 1 | sed 's/$/(1)/'; names 3 | sed 's/$/(3)/'; names 7 | sed 's/$/(7)/') )
refs=$(cat $pages | sed -n 's/^\.Xr \(kvp[A-Za-z0-9_.-]*\) \([0-9]\).*/\1(\2)/p' | sort -u)
for r in $refs; do
	if printf '%s\n' "$all" | grep -qxF "$r"; then ok; else ko "reference to a missing page: $r"; fi
done

# 4. kvpull(7)'s SEE ALSO
if [ -f "$man/man7/kvpull.7" ]; then
	seealso=$(sed -n '/^\.Sh SEE ALSO/,/^\.Sh /s/^\.Xr \([A-Za-z0-9_.-]*\) \([0-9]\).*/\1(\2)/p' \
		"$man/man7/kvpull.7")
	for p in "$man"/man1/*.1 "$man"/man3/*.3; do
		[ -e "$p" ] || continue
		b=$(basename "$p")
		r="${b%.*}(${b##*.})"
		if printf '%s\n' "$seealso" | grep -qxF "$r"; then ok; else
			ko "kvpull.7: SEE ALSO does not name $r"
		fi
	done
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
