#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks, in a temporary copy of the source tree (the files git tracks or
# would track, as they are now: uncommitted changes included, build/ left
# out), that the build configurations live in their own directories and that
# `make install` writes a kvpull.pc for the PREFIX it is given:
#   - make SANITIZE=1 unit, then make: build/tools/kvpull-plan --help works,
#     the sanitized unit tests are still built and up to date;
#   - make CC=clang, then make: both succeed, and the second has nothing to
#     do (clang's objects went to build/clang/);
#   - make install PREFIX=/opt/x DESTDIR=TMP: TMP/opt/x/lib/pkgconfig/kvpull.pc
#     says prefix=/opt/x; a program built with `pkg-config --cflags --libs
#     kvpull` against it (PKG_CONFIG_SYSROOT_DIR=TMP) runs and calls
#     kvp_version().
# Prints one line per check and ends with "N passed, N failed".
# Usage: bash tests/check_build_dirs.sh [srcdir]   (default: the repository)
#   KVP_JOBS    parallel make jobs (default 2)
#   KVP_QUICK=1 build the sanitized unit tests (make SANITIZE=1 tests)
#               instead of running them (make SANITIZE=1 unit): the same
#               objects in build/asan/; scripts/test.sh runs them anyway
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd) || exit 1
jobs=${KVP_JOBS:-2}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

pass=0
fail=0
log=$tmp/log
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() {
	echo "FAILED: $*"
	[[ -s $log ]] && tail -n 30 "$log" | sed 's/^/  | /'
	fail=$((fail + 1))
}
# check DESCRIPTION COMMAND...: runs COMMAND in the copy, output in $log.
check() {
	local what=$1
	shift
	if (cd "$tmp/src" && "$@") >"$log" 2>&1; then ok "$what"; else bad "$what"; fi
}

# The copy: tracked and untracked-but-not-ignored files that exist.
mkdir -p "$tmp/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
	(cd "$src" && git ls-files -z -co --exclude-standard |
		while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
		tar --null -T - -cf -) | tar -C "$tmp/src" -xf - ||
		{ echo "check_build_dirs: cannot copy $src"; echo "0 passed, 1 failed"; exit 1; }
else
	(cd "$src" && tar --exclude=./build -cf - .) | tar -C "$tmp/src" -xf - ||
		{ echo "check_build_dirs: cannot copy $src"; echo "0 passed, 1 failed"; exit 1; }
fi
m=(make -j"$jobs" --no-print-directory)

# 1. a sanitized build, then the plain one
if [[ ${KVP_QUICK:-0} == 1 ]]; then
	check "make SANITIZE=1 tests" "${m[@]}" SANITIZE=1 tests
else
	check "make SANITIZE=1 unit" "${m[@]}" SANITIZE=1 unit
fi
check "make (after make SANITIZE=1 ...)" "${m[@]}"
check "build/tools/kvpull-plan --help" build/tools/kvpull-plan --help
check "the sanitized unit tests are in build/asan/tests/" \
	test -x build/asan/tests/test_compile
check "make SANITIZE=1 tests: up to date after make" \
	"${m[@]}" -q SANITIZE=1 build/asan/tests/test_compile

# 2. clang, then plain again
if command -v clang >/dev/null; then
	check "make CC=clang" "${m[@]}" CC=clang CXX=clang++
	check "build/clang/tools/kvpull-plan --help" \
		build/clang/tools/kvpull-plan --help
	check "make (after make CC=clang)" "${m[@]}"
	check "make: nothing to do after make CC=clang" "${m[@]}" -q all
	check "build/tools/kvpull-plan is gcc's" \
		sh -c '! grep -q clang build/config'
else
	bad "clang not installed"
fi

# 3. install with a PREFIX that the build did not see
dest=$tmp/dest
check "make install PREFIX=/opt/x DESTDIR=..." \
	"${m[@]}" install PREFIX=/opt/x DESTDIR="$dest"
pc=$dest/opt/x/lib/pkgconfig/kvpull.pc
check "kvpull.pc says prefix=/opt/x" grep -qx 'prefix=/opt/x' "$pc"
check "kvpull.pc has no /usr/local" sh -c "test -f '$pc' && ! grep -q /usr/local '$pc'"
cat >"$tmp/v.c" <<'EOF'
#include <stdio.h>
#include <kvpull.h>

int main(void)
{
	unsigned v = kvp_version();

	printf("kvp_version %u\n", v);
	return v == 0;
}
EOF
if flags=$(PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$dest/opt/x/lib/pkgconfig \
	PKG_CONFIG_LIBDIR=$dest/opt/x/lib/pkgconfig \
	pkg-config --cflags --libs kvpull 2>"$log"); then
	ok "pkg-config --cflags --libs kvpull: $flags"
	# shellcheck disable=SC2086 # pkg-config's words
	check "cc v.c \$(pkg-config --cflags --libs kvpull)" \
		cc -std=gnu11 -Wall -Werror -o "$tmp/v" "$tmp/v.c" $flags
	check "the program runs against the installed libkvpull.so" \
		env LD_LIBRARY_PATH="$dest/opt/x/lib" "$tmp/v"
	grep -h kvp_version "$log" 2>/dev/null | sed 's/^/  /'
else
	bad "pkg-config --cflags --libs kvpull"
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
