#!/bin/sh
# check_examples.sh: the examples build and the README quotes them right.
#
#   sh tests/check_examples.sh [LIBDIR]     LIBDIR holds libkvpull.a [build]
#
# 1. Every examples/*.c compiles and links as C11 with gcc and clang and as
#    C++11 with g++ and clang++, -Wall -Wextra -Werror (compilers not
#    installed are reported and skipped; at least one C and one C++ must be).
# 2. plan runs and emits fewer WRs than one per block per region, and more
#    than none.
# 3. Every ```c block of README.md and docs/*.md that follows a line
#    "<!-- quote: examples/FILE -->" appears, line for line, in FILE; the
#    README quotes at least one.
# 4. Every ```python block of README.md and docs/*.md that follows a line
#    "<!-- run: python -->" runs with exit status 0 and prints what its
#    "# -> TEXT" comments say (each TEXT a line of its output, in order),
#    on LIBDIR's libkvpull.so (python3 with numpy; skipped and reported
#    when either is missing).
# Prints "N passed, N failed"; exit status 0 when nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
lib=${1:-build}
out=$(mktemp -d) || exit 2
trap 'rm -rf "$out"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAILED: $*"; }

if [ ! -f "$lib/libkvpull.a" ]; then
	echo "check_examples.sh: $lib/libkvpull.a not found (make build/libkvpull.a)" >&2
	exit 2
fi
libs="$lib/libkvpull.a -lrdmacm -libverbs -lpthread"
nc=0
ncxx=0
for cc in gcc clang g++ clang++; do
	if ! command -v $cc >/dev/null 2>&1; then
		echo "skip: $cc not installed"
		continue
	fi
	case $cc in
	*++) lang="-x c++ -std=c++11"; ncxx=$((ncxx + 1)) ;;
	*) lang="-x c -std=c11"; nc=$((nc + 1)) ;;
	esac
	for src in examples/*.c; do
		name=$(basename "$src" .c)
		# shellcheck disable=SC2086
		if $cc $lang -Wall -Wextra -Werror -Iinclude -o "$out/$name-$cc" \
			"$src" -x none $libs; then
			ok
		else
			ko "$cc $lang $src"
		fi
	done
done
[ $nc -gt 0 ] || ko "no C compiler (gcc, clang)"
[ $ncxx -gt 0 ] || ko "no C++ compiler (g++, clang++)"

# plan: "request: B blocks -> N WRs, S SGEs (one per block per region: M)"
plan=$(ls "$out"/plan-* 2>/dev/null | head -n 1)
if [ -z "$plan" ]; then
	ko "no plan binary to run"
elif ! "$plan" >"$out/plan.out" 2>&1; then
	cat "$out/plan.out"
	ko "plan exited non-zero"
else
	set -- $(sed -n 's/^request: \([0-9]*\) blocks -> \([0-9]*\) WRs.*region: \([0-9]*\))$/\1 \2 \3/p' "$out/plan.out")
	if [ $# -eq 3 ] && [ "$2" -gt 0 ] && [ "$2" -lt "$3" ]; then
		ok
		echo "plan: $1 blocks, $2 WRs (one per block per region: $3)"
	else
		cat "$out/plan.out"
		ko "plan: no sane WR count"
	fi
fi

# README and docs quotes.
nq=0
nr=0
for md in README.md docs/*.md; do
	[ -f "$md" ] || continue
	awk -v dir="$out" -v n="$(ls "$out" | grep -c '^quote\..*\.src$')" '
		/^<!-- quote: examples\/[^ ]* -->$/ { file = $3; next }
		file != "" && /^```c$/ { n++; f = dir "/quote." n; print file > (dir "/quote." n ".src"); inq = 1; next }
		inq && /^```$/ { inq = 0; file = ""; close(f); next }
		inq { print > f; next }
		file != "" && !/^$/ { file = "" }
	' "$md"
	[ "$md" = README.md ] && nr=$(ls "$out" | grep -c '^quote\..*\.src$')
done
for q in "$out"/quote.*.src; do
	[ -e "$q" ] || break
	nq=$((nq + 1))
	src=$(cat "$q")
	block=${q%.src}
	if [ ! -f "$src" ]; then
		ko "a quote names $src, which does not exist"
		continue
	fi
	# The block's lines must appear contiguously, in order, in the file.
	if awk 'NR == FNR { b[++nb] = $0; next }
		{ f[++nf] = $0 }
		END {
			for (i = 1; i + nb - 1 <= nf; i++) {
				for (j = 1; j <= nb && f[i + j - 1] == b[j]; j++)
					;
				if (j > nb)
					exit 0
			}
			exit 1
		}' "$block" "$src"; then
		ok
	else
		ko "quote $(basename "$block") ($(head -n 1 "$block")...) is not in $src"
	fi
done
[ "$nr" -gt 0 ] || ko "README.md quotes no example (<!-- quote: examples/FILE -->)"

# Python blocks that run.
so=$(cd "$lib" 2>/dev/null && pwd)/libkvpull.so
pyb=${PYTHON:-/usr/bin/python3}
if ! "$pyb" -c 'import numpy' 2>/dev/null; then
	echo "skip: $pyb with numpy not installed: README's Python blocks not run"
elif [ ! -f "$so" ]; then
	echo "skip: $so not built (make $lib/libkvpull.so): README's Python blocks not run"
else
	for md in README.md docs/*.md; do
		[ -f "$md" ] || continue
		rm -f "$out"/py.*
		awk -v dir="$out" '
			/^<!-- run: python -->$/ { want = 1; next }
			want && /^```python$/ { n++; f = dir "/py." n; inq = 1; want = 0; next }
			inq && /^```$/ { inq = 0; close(f); next }
			inq { print > f; next }
			want && !/^$/ { want = 0 }
		' "$md"
		for py in "$out"/py.*; do
			[ -e "$py" ] || break
			name="$md: python block ${py##*.}"
			if ! KVPULL_LIB=$so PYTHONPATH=python "$pyb" "$py" >"$py.out" 2>&1; then
				sed 's/^/  /' "$py.out" | tail -n 5
				ko "$name exited non-zero"
				continue
			fi
			sed -n 's/.*# -> //p' "$py" >"$py.want"
			if awk 'NR == FNR { w[++nw] = $0; next }
				i < nw && $0 == w[i + 1] { i++ }
				END { exit i < nw }' "$py.want" "$py.out"; then
				ok
			else
				sed 's/^/  printed: /' "$py.out" | head -n 5
				ko "$name does not print what its \"# ->\" comments say"
			fi
		done
	done
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
