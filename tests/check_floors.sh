#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Floors: no call cycle between the files of a directory. For each DIR, the
# object files $BUILD/DIR/*.o (BUILD: build) give the edges: object A calls
# B when one of A's undefined symbols is a global that B defines. Prints
# every edge with the names it rests on, then the floors (files that call
# nothing of DIR first) or a cycle, which fails the directory.
# A rule --never 'DIR:A,B>C,D' also fails DIR when one of its files A, B
# calls one of C, D (for instance two sides that must not call each other,
# or a lower floor that must not name them).
# Usage: BUILD=build bash tests/check_floors.sh [--never RULE]... DIR...
# The last line counts directories: "N passed, N failed".
set -uo pipefail
build=${BUILD:-build}
dirs=()
rules=()
while (($#)); do
	case $1 in
	--never)
		[[ ${2:-} == *:*'>'* ]] || {
			echo "check_floors: --never DIR:A,B>C,D" >&2
			exit 2
		}
		rules+=("$2")
		shift 2
		;;
	*)
		dirs+=("$1")
		shift
		;;
	esac
done
if ((${#dirs[@]} == 0)); then
	echo "usage: BUILD=build bash tests/check_floors.sh [--never DIR:A,B>C,D]... DIR..." >&2
	exit 2
fi

pass=0
fail=0
for dir in "${dirs[@]}"; do
	# only objects whose source is still there: a stale one would add
	# edges no build has
	objs=()
	for o in "$build/$dir"/*.o; do
		[[ -e $o && (! -d $dir || -e $dir/$(basename "$o" .o).c) ]] &&
			objs+=("$o")
	done
	if ((${#objs[@]} == 0)); then
		echo "$dir: no object files in $build/$dir (build them first)"
		fail=$((fail + 1))
		continue
	fi
	# "file symbol" lines: globals each object defines, names it needs
	defs=$(for o in "${objs[@]}"; do
		basename "$o" .o
		nm -P --defined-only "$o" | awk -v f="$(basename "$o" .o)" \
			'$2 ~ /^[A-Z]$/ { print f, $1 }'
	done)
	uses=$(for o in "${objs[@]}"; do
		nm -P -u "$o" | awk -v f="$(basename "$o" .o)" '{ print f, $1 }'
	done)
	# this directory's rules, "A,B>C,D" separated by ";"
	never=""
	for r in "${rules[@]}"; do
		[[ ${r%%:*} == "$dir" ]] && never="$never${never:+;}${r#*:}"
	done
	# the edges and the names under each, sorted; then a depth-first
	# search for a cycle, and the floors (longest path down to a file
	# calling nothing)
	awk -v dir="$dir" -v never="$never" '
	FNR == NR && NF == 1 { files[$1] = 1; nfiles++; next }
	FNR == NR { owner[$2] = $1; next }
	($2 in owner) && owner[$2] != $1 {
		e = $1 SUBSEP owner[$2]
		if (e in syms)
			syms[e] = syms[e] " " $2
		else
			syms[e] = $2
	}
	END {
		n = 0
		for (e in syms) {
			split(e, p, SUBSEP)
			if (p[1] in out)
				out[p[1]] = out[p[1]] " " p[2]
			else
				out[p[1]] = p[2]
			n++
		}
		printf "%s: %d files, %d edges\n", dir, nfiles, n
		# print edges in a stable order
		m = 0
		for (e in syms) {
			split(e, p, SUBSEP)
			line[++m] = sprintf("  %s -> %s: %s", p[1], p[2], syms[e])
		}
		for (i = 2; i <= m; i++)
			for (j = i; j > 1 && line[j - 1] > line[j]; j--) {
				t = line[j]; line[j] = line[j - 1]; line[j - 1] = t
			}
		for (i = 1; i <= m; i++)
			print line[i]
		# the rules: no edge from a file of the left list to one of
		# the right
		bad = 0
		nr = split(never, rule, ";")
		for (i = 1; i <= nr; i++) {
			split(rule[i], side, ">")
			delete from
			delete to
			nl = split(side[1], l, ",")
			for (j = 1; j <= nl; j++)
				from[l[j]] = 1
			nl = split(side[2], l, ",")
			for (j = 1; j <= nl; j++)
				to[l[j]] = 1
			for (e in syms) {
				split(e, p, SUBSEP)
				if ((p[1] in from) && (p[2] in to)) {
					printf "%s: %s must not call %s (rule %s): %s\n",
					       dir, p[1], p[2], rule[i], syms[e]
					bad = 1
				}
			}
		}
		if (bad)
			exit 1
		cyc = ""
		for (f in files)
			if (!cyc && !(f in color))
				visit(f)
		if (cyc) {
			printf "%s: CYCLE %s\n", dir, cyc
			exit 1
		}
		# floor of a file: 0 if it calls nothing here, else 1 + the
		# highest floor it calls
		for (f in files)
			fl = floor_of(f)
		top = 0
		for (f in files)
			if (level[f] > top)
				top = level[f]
		for (k = 0; k <= top; k++) {
			s = ""
			for (f in files)
				if (level[f] == k)
					s = s " " f
			nf = split(s, a, " ")
			for (i = 2; i <= nf; i++)
				for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
					t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
				}
			s = ""
			for (i = 1; i <= nf; i++)
				s = s " " a[i]
			printf "  floor %d:%s\n", k, s
		}
		printf "%s: no cycle\n", dir
	}
	# grey (1) while on the path, black (2) when done; a grey callee
	# closes a cycle, printed from that callee back to itself
	function visit(f,    k, c, nc, i) {
		color[f] = 1
		path[++depth] = f
		nc = split(out[f], c, " ")
		for (k = 1; k <= nc && !cyc; k++) {
			if ((c[k] in color) && color[c[k]] == 1) {
				for (i = 1; path[i] != c[k]; i++)
					;
				for (; i <= depth; i++)
					cyc = cyc path[i] " -> "
				cyc = cyc c[k]
			} else if (!(c[k] in color)) {
				visit(c[k])
			}
		}
		depth--
		color[f] = 2
	}
	function floor_of(f,    k, c, nc, x, best) {
		if (f in level)
			return level[f]
		best = 0
		nc = split(out[f], c, " ")
		for (k = 1; k <= nc; k++) {
			x = floor_of(c[k]) + 1
			if (x > best)
				best = x
		}
		level[f] = best
		return best
	}' <(printf '%s\n' "$defs") <(printf '%s\n' "$uses")
	if (($? == 0)); then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
	fi
done
echo "$pass passed, $fail failed"
((fail == 0))
