#!/bin/sh
# check_doc_outputs.sh: what the docs show a tool printing is what it
# prints today.
#
#   sh tests/check_doc_outputs.sh [TOOLDIR [FILE...]]
#
# TOOLDIR holds the built tools [build/tools]; FILE: the markdown files to
# check [those of README.md, docs/*.md, tools/README.md, scripts/README.md
# and tests/README.md that hold a marker; given files must hold one]. Each command runs with TOOLDIR first
# in PATH (so `kvpull-plan` is the built one), LC_ALL=C, in an empty
# directory of its own (files it writes stay there), on the host: only
# commands whose output does not depend on time or on an RDMA device are
# marked. Two markers, each an HTML comment alone on its lines right
# before the block it checks (a fenced block, or else the lines up to the
# next blank line: a paragraph, a table):
#
# 1. <!-- doc-output: COMMAND -->
#    The block is COMMAND's standard output (COMMAND may go on over
#    several lines up to "-->": it is a shell script). A line "..." in the
#    block stands for any number of lines of the output, so a block may
#    show a part of it; every other line must be the output's line,
#    exactly and in order. With no COMMAND (<!-- doc-output -->) the
#    block's first line is "$ COMMAND" (continued by lines ending in "\")
#    and the rest is its output.
# 2. <!-- doc-text: COMMAND
#    STRING
#    ... -->
#    For a figure quoted in prose or a table: each STRING (one a line) is
#    in COMMAND's standard output, and in the block, whose lines are
#    joined with single spaces and whose numbers may have thousands
#    separators (1,024 reads as 1024).
#
# Each marker is one check. Prints "N passed, N failed"; exit status 0 when
# nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
tools=${1:-build/tools}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- $(grep -l '^<!-- doc-\(output\|text\)' README.md \
	docs/*.md tools/README.md scripts/README.md tests/README.md 2>/dev/null)
if [ ! -x "$tools/kvpull-plan" ]; then
	echo "check_doc_outputs.sh: $tools/kvpull-plan not found (make)" >&2
	exit 2
fi
tools=$(cd "$tools" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpull-docout.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAILED: $*"; }

# Markers to files: $tmp/N.where (FILE:LINE), N.kind, N.cmd, N.want (the
# block), N.strings (doc-text).
n=0
for md in "$@"; do
	if [ ! -f "$md" ]; then
		ko "$md: no such file"
		continue
	fi
	m=$(awk -v dir="$tmp" -v md="$md" -v n="$n" '
		function out(name) { return dir "/" n "." name }
		function bad(msg) { print md ":" start ": " msg >"/dev/stderr"; err = 1 }
		state == 0 && /^<!-- doc-(output|text)(:| *-->|$)/ {
			n++; start = NR; kind = $0; hascmd = 0
			sub(/^<!-- doc-/, "", kind); sub(/[: ].*/, "", kind)
			print md ":" NR >out("where"); print kind >out("kind")
			line = $0; sub(/^<!-- doc-[a-z]*:? */, "", line)
			state = 1; first = 1
		}
		state == 1 {
			if (!first) line = $0
			end = sub(/ *--> *$/, "", line)
			if (kind == "text" && !first) {
				if (line != "") print line >out("strings")
			} else if (line != "") {
				print line >out("cmd"); hascmd = 1
			}
			first = 0
			if (end) state = 2
			next
		}
		state == 2 && /^```/ { state = 3; dollar = kind == "output" && !hascmd; cont = 0; next }
		state == 2 && /^$/ { bad("doc-" kind ": no block after the marker"); state = 0; next }
		state == 2 { state = 4 }
		state == 3 && /^```$/ { state = 0; next }
		state == 3 && dollar && (cont || /^\$ /) {
			# the block: its "$ COMMAND" line, continued by lines ending in a backslash
			c = $0; if (!cont) sub(/^\$ /, "", c)
			print c >out("cmd")
			cont = /\\$/; if (!cont) dollar = 0
			next
		}
		state == 3 { dollar = 0; print >out("want"); next }
		state == 4 && /^$/ { state = 0; next }
		state == 4 { print >out("want"); next }
		END {
			if (state == 1 || state == 3) bad("doc-" kind ": unterminated")
			print n
			exit err
		}' "$md") || ko "$md: a marker is malformed (above)"
	m=${m:-$n}
	[ "$m" -gt "$n" ] || ko "$md: no <!-- doc-output --> or <!-- doc-text --> marker"
	n=$m
done

# match WANT GOT: GOT is WANT, each "..." line of WANT standing for any
# number of lines; prints why not.
match() {
	awk 'NR == FNR { w[++nw] = $0; next } { g[++ng] = $0 }
	function seg_at(s, e, j,   i) {
		for (i = s; i <= e; i++)
			if (j + i - s > ng || g[j + i - s] != w[i])
				return 0
		return 1
	}
	END {
		pos = 1
		for (s = 1; s <= nw; s = e + 2) {
			while (s <= nw && w[s] == "...") s++
			if (s > nw) exit 0
			for (e = s; e < nw && w[e + 1] != "..."; e++)
				;
			len = e - s + 1
			if (s == 1) {
				j = 1
			} else if (e == nw) {
				j = ng - len + 1
				if (j < pos) j = -1
			} else {
				for (j = pos; j + len - 1 <= ng && !seg_at(s, e, j); j++)
					;
			}
			if (j < 1 || j + len - 1 > ng || !seg_at(s, e, j)) {
				if (s == 1 || e == nw) {
					for (i = s; i <= e && j >= 1 && g[j + i - s] == w[i]; i++)
						;
					printf "  block line %d: want \"%s\"\n  output line %d: \"%s\"\n",
						i, w[i], j + i - s, (j >= 1 && j + i - s <= ng) ? g[j + i - s] : "(none)"
				} else {
					printf "  block lines %d-%d (\"%s\" ...) are not in the output after its line %d\n",
						s, e, w[s], pos - 1
				}
				exit 1
			}
			pos = j + len
		}
		if (nw == 0 || (w[nw] != "..." && pos != ng + 1)) {
			printf "  the output has %d lines, the block %d\n", ng, nw
			exit 1
		}
	}' "$1" "$2"
}

# norm: lines joined by single spaces, thousands separators dropped.
norm() {
	tr '\n\t' '  ' | tr -s ' ' | sed -e 's/^ //; s/ $//' \
		-e ':a' -e 's/\([0-9]\),\([0-9][0-9][0-9]\)\([^0-9]\)/\1\2\3/' -e 'ta' \
		-e 's/\([0-9]\),\([0-9][0-9][0-9]\)$/\1\2/'
}

# show CMDFILE: the command, its first lines
show() {
	sed -n '1,4s/^/  $ /p' "$1"
	[ "$(wc -l <"$1")" -le 4 ] || echo "  $ ... ($(wc -l <"$1") lines)"
}

i=0
while [ $i -lt "$n" ]; do
	i=$((i + 1))
	where=$(cat "$tmp/$i.where")
	kind=$(cat "$tmp/$i.kind")
	[ -f "$tmp/$i.want" ] || : >"$tmp/$i.want"
	if [ ! -s "$tmp/$i.cmd" ]; then
		ko "$where: doc-$kind: no command"
		continue
	fi
	mkdir "$tmp/run.$i"
	(cd "$tmp/run.$i" && PATH="$tools:$PATH" LC_ALL=C sh "$tmp/$i.cmd") \
		>"$tmp/$i.got" 2>"$tmp/$i.err"
	if [ "$kind" = output ]; then
		if match "$tmp/$i.want" "$tmp/$i.got" >"$tmp/$i.why"; then
			ok
		else
			ko "$where: the block is not what this prints:"
			show "$tmp/$i.cmd"
			cat "$tmp/$i.why"
			sed 's/^/  stderr: /' "$tmp/$i.err" | head -n 5
		fi
		continue
	fi
	if [ ! -s "$tmp/$i.strings" ]; then
		ko "$where: doc-text: no string to look for"
		continue
	fi
	block=$(norm <"$tmp/$i.want")
	bad=
	while IFS= read -r s; do
		grep -qF -- "$s" "$tmp/$i.got" || bad="$bad
  not printed: \"$s\""
		case $block in
		*"$(printf '%s\n' "$s" | norm)"*) ;;
		*) bad="$bad
  not in the block: \"$s\"" ;;
		esac
	done <"$tmp/$i.strings"
	if [ -z "$bad" ]; then
		ok
	else
		ko "$where: doc-text:$bad"
		show "$tmp/$i.cmd"
		sed 's/^/  stderr: /' "$tmp/$i.err" | head -n 5
	fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
