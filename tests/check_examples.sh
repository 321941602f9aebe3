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
# 3. Every ```c block of README.md that follows a line
#    "<!-- quote: examples/FILE -->" appears, line for line, in FILE.
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

# README quotes.
nq=0
awk -v dir="$out" '
	/^<!-- quote: examples\/[^ ]* -->$/ { file = $3; next }
	file != "" && /^```c$/ { n++; f = dir "/quote." n; print file > (dir "/quote." n ".src"); inq = 1; next }
	inq && /^```$/ { inq = 0; file = ""; close(f); next }
	inq { print > f; next }
	file != "" && !/^$/ { file = "" }
' README.md
for q in "$out"/quote.*.src; do
	[ -e "$q" ] || break
	nq=$((nq + 1))
	src=$(cat "$q")
	block=${q%.src}
	if [ ! -f "$src" ]; then
		ko "README quotes $src, which does not exist"
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
		ko "README quote $(basename "$block") ($(head -n 1 "$block")...) is not in $src"
	fi
done
[ $nq -gt 0 ] || ko "README.md quotes no example (<!-- quote: examples/FILE -->)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
