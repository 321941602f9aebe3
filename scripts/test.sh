#!/usr/bin/env bash
# The whole kvpull test suite, on a fresh Debian 12 machine as root:
#   bash scripts/test.sh
# Installs what it needs (scripts/install-deps.sh), then builds with gcc and
# clang (-Werror), runs the unit tests (cmocka), the tool tests, the unit
# tests again under ASan+UBSan with gcc and with clang (their sanitizers
# catch different bugs), the libFuzzer targets for a bounded time each
# (scripts/fuzz.sh; KVP_FUZZ_SECONDS per target, 50 here), and the
# RDMA loopback tests on soft-RoCE in a VM (scripts/rxe-vm.sh; directly on a
# machine with an RDMA device).
# The last line counts test cases: "N passed, N failed".
# KVP_SKIP_SANITIZE=1 / KVP_SKIP_FUZZ=1 / KVP_SKIP_RDMA=1 leave out those
# stages (for quick local runs; CI runs everything).
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
pass=0
fail=0
failed_stages=()

# Runs one stage, shows its output, and adds its test counts: cmocka's
# "[  PASSED  ] N test(s)" / "[  FAILED  ] N test(s)" lines and our own
# "N passed, N failed" lines. A stage that fails without counting a failure
# counts as one failed test.
stage() {
	local name=$1 out="$log/stage" p f st
	shift
	echo "==== $name"
	"$@" 2>&1 | tee "$out"
	st=${PIPESTATUS[0]}
	p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\..*/\1/p; s/^\([0-9][0-9]*\) passed, [0-9][0-9]* failed.*/\1/p' "$out" |
		awk '{s+=$1} END {print s+0}')
	f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s), listed below:.*/\1/p; s/^[0-9][0-9]* passed, \([0-9][0-9]*\) failed.*/\1/p' "$out" |
		awk '{s+=$1} END {print s+0}')
	if [[ $st -ne 0 && $f -eq 0 ]]; then
		f=1
	fi
	if [[ $st -ne 0 ]]; then
		failed_stages+=("$name")
	fi
	pass=$((pass + p))
	fail=$((fail + f))
	echo "==== $name: exit $st ($p passed, $f failed)"
}

stage "install dependencies" bash scripts/install-deps.sh
stage "build with gcc (-Werror)" make clean all WERROR=1
stage "unit tests" make WERROR=1 unit
if [[ -f tests/test_tool.sh ]]; then
	stage "tool tests" make WERROR=1 check-tool
fi
stage "build with clang (-Werror)" bash -c 'make clean && make CC=clang CXX=clang++ WERROR=1 all tests'
if [[ ${KVP_SKIP_SANITIZE:-0} != 1 ]]; then
	stage "unit tests under ASan+UBSan" bash -c 'make clean && make SANITIZE=1 unit'
	stage "unit tests under clang ASan+UBSan" bash -c 'make clean && make CC=clang CXX=clang++ SANITIZE=1 unit'
fi
if [[ ${KVP_SKIP_FUZZ:-0} != 1 ]]; then
	# 3 targets x 50 s plus the build: about 3 minutes
	stage "fuzz (libFuzzer, bounded)" env KVP_FUZZ_SECONDS="${KVP_FUZZ_SECONDS:-50}" bash scripts/fuzz.sh
fi
if [[ ${KVP_SKIP_RDMA:-0} != 1 ]] && grep -q '^check-rdma:' Makefile; then
	stage "RDMA loopback tests (soft-RoCE)" bash -c 'make clean && make WERROR=1 check-rdma'
	if [[ ${KVP_SKIP_SANITIZE:-0} != 1 ]]; then
		stage "RDMA loopback tests under ASan+UBSan" bash -c 'make clean && make SANITIZE=1 check-rdma'
	fi
fi

if [[ ${#failed_stages[@]} -gt 0 ]]; then
	printf 'failed stages: %s\n' "${failed_stages[*]}"
fi
echo "$pass passed, $fail failed"
[[ $fail -eq 0 && ${#failed_stages[@]} -eq 0 ]]
