#!/usr/bin/env bash
# The whole kvpull test suite, on a fresh Debian 12 machine as root:
#   bash scripts/test.sh [-v]
# Installs what it needs (scripts/install-deps.sh), then builds with gcc and
# clang (-Werror), runs the unit tests (cmocka; they replay the fuzz
# targets' reproducers and regression corpus too), checks that no files of
# plan/, tools/plan/ or verbs/ call each other in a cycle, and that
# verbs/'s consumer and producer sides never call each other
# (tests/check_floors.sh),
# runs the tool tests, the build configuration and install checks
# (tests/check_build_dirs.sh), the unit tests again under ASan+UBSan with
# gcc and with clang (their sanitizers catch different bugs), the libFuzzer
# targets in their deterministic mode (scripts/fuzz.sh: fixed seeds and
# inputs, a fixed number of executions, so the same tree gives the same
# result every time; the randomized runs are `scripts/fuzz.sh --long`, not
# run here), the RDMA loopback tests on soft-RoCE in a VM
# (scripts/rxe-vm.sh; directly on a machine with an RDMA device), and the
# Python binding's transport tests (pytest) in another VM boot
# (tests/python_rdma/run-vm.sh: Debian's python3, numpy, pytest and torch,
# which install-deps.sh installs, carried into the initramfs). Last, the
# test counts tests/README.md states are checked against this run's logs
# (tests/check_doc_counts.sh).
#
# Each configuration builds in its own directory (see the Makefile), so the
# stages need no `make clean` and leave build/ usable by scripts/main.sh.
#
# Quiet by default: one line per stage (result, wall time, test counts), a
# line when a long stage starts, and the end of the log of a stage that
# fails. Every stage's full output is kept in build/test-logs/<NN-stage>.log.
# -v or KVP_VERBOSE=1 shows every stage's output as it runs.
# The last line counts test cases: "N passed, N failed".
#
# Environment:
#   KVP_SKIP_SANITIZE=1 / KVP_SKIP_FUZZ=1 / KVP_SKIP_RDMA=1 leave out those
#     stages (for quick local runs; CI runs everything)
#   KVP_JOBS  parallel make jobs (default: the number of CPUs)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

verbose=${KVP_VERBOSE:-0}
case ${1:-} in
-v | --verbose) verbose=1 ;;
"") ;;
*) echo "usage: bash scripts/test.sh [-v]" >&2; exit 2 ;;
esac
export KVP_JOBS=${KVP_JOBS:-$(nproc 2>/dev/null || echo 2)}
mk=(make -j"$KVP_JOBS")

logs=build/test-logs
rm -rf "$logs"
mkdir -p "$logs" || exit 1
pass=0
fail=0
n=0
failed_stages=()
t_start=$SECONDS

# 75 -> "1 min 15 s", 9 -> "9 s"
dur() {
	if (($1 >= 60)); then
		printf '%d min %d s' $(($1 / 60)) $(($1 % 60))
	else
		printf '%d s' "$1"
	fi
}

# stage [--long ESTIMATE] NAME COMMAND...: runs one stage, its output in
# $logs/NN-name.log, and adds its test counts: cmocka's
# "[  PASSED  ] N test(s)" / "[  FAILED  ] N test(s)" lines and our own
# "N passed, N failed" lines. A stage that fails without counting a failure
# counts as one failed test. A long stage announces itself when it starts.
# the next stage's log, $logs/NN-name.log (NN: n + 1; the caller counts it)
stage_log() {
	echo "$logs/$(printf '%02d' $((n + 1)))-$(tr -c 'a-zA-Z0-9+\n' - <<<"$1" |
		tr -s - | sed 's/-$//' | tr '[:upper:]' '[:lower:]').log"
}

stage() {
	local long="" name out st t0
	if [[ $1 == --long ]]; then
		long=$2
		shift 2
	fi
	name=$1
	shift
	out=$(stage_log "$name")
	n=$((n + 1))
	t0=$SECONDS
	if ((verbose)); then
		echo "==== $name"
		"$@" 2>&1 | tee "$out"
		st=${PIPESTATUS[0]}
	else
		[[ -n $long ]] && printf '..    %-44s started %s, %s (%s)\n' \
			"$name" "$(date +%H:%M:%S)" "$long" "$out"
		"$@" >"$out" 2>&1
		st=$?
	fi
	stage_report "$name" "$out" "$st" $((SECONDS - t0))
}

# stage_report NAME LOG STATUS SECONDS: counts a finished stage and prints
# its line (and, failed, the end of its log).
stage_report() {
	local name=$1 out=$2 st=$3 t=$4 p f counts lines
	p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\..*/\1/p; s/^\([0-9][0-9]*\) passed, [0-9][0-9]* failed.*/\1/p' "$out" |
		awk '{s+=$1} END {print s+0}')
	f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s), listed below:.*/\1/p; s/^[0-9][0-9]* passed, \([0-9][0-9]*\) failed.*/\1/p' "$out" |
		awk '{s+=$1} END {print s+0}')
	if [[ $st -ne 0 && $f -eq 0 ]]; then
		f=1
	fi
	pass=$((pass + p))
	fail=$((fail + f))
	counts=""
	((p + f > 0)) && counts="$p passed, $f failed"
	if [[ $st -eq 0 ]]; then
		printf 'ok    %-44s %10s  %s\n' "$name" "$(dur $t)" "$counts"
		return 0
	fi
	failed_stages+=("$name")
	printf 'FAIL  %-44s %10s  %s (exit %d)\n' "$name" "$(dur $t)" "$counts" "$st"
	if ((!verbose)); then
		lines=$(wc -l <"$out")
		if ((lines <= 80)); then
			echo "---- $out"
			cat "$out"
		else
			echo "---- $out (last 60 of $lines lines)"
			tail -n 60 "$out"
		fi
		echo "----"
	fi
}

((verbose)) || echo "test.sh: one line per stage; full logs in $logs/ (-v: show them as they run)"

stage "install dependencies" bash scripts/install-deps.sh
stage "build with gcc (-Werror)" "${mk[@]}" WERROR=1 all
stage "unit tests" "${mk[@]}" WERROR=1 unit
stage "floors: no call cycles between files" "${mk[@]}" WERROR=1 check-floors
if [[ -f tests/test_tool.sh ]]; then
	stage "tool tests" "${mk[@]}" WERROR=1 check-tool
fi
stage "Python binding (pytest)" "${mk[@]}" WERROR=1 check-python
stage "build with clang (-Werror)" "${mk[@]}" CC=clang CXX=clang++ WERROR=1 all tests
stage "examples (C and C++) and man pages" "${mk[@]}" WERROR=1 check-docs
stage --long "two renders in headless Chromium" "kvpull-plan --svg" \
	"${mk[@]}" WERROR=1 check-svg
# stage_pair NAME1 NAME2 -- CMD1... -- CMD2...: two stages at once (on
# two CPUs, two stages that each keep about one busy), reported as stage()
# reports them, each with the pair's time; one after the other with -v.
stage_pair() {
	local n1=$1 n2=$2 c1=() c2=() o1 o2 p1 p2 s1 s2 t0
	shift 3
	while [[ $1 != -- ]]; do
		c1+=("$1")
		shift
	done
	shift
	c2=("$@")
	if ((verbose)); then
		stage "$n1" "${c1[@]}"
		stage "$n2" "${c2[@]}"
		return
	fi
	o1=$(stage_log "$n1")
	n=$((n + 1))
	o2=$(stage_log "$n2")
	n=$((n + 1))
	printf '..    %-44s started %s, with the next\n' "$n1" "$(date +%H:%M:%S)"
	t0=$SECONDS
	"${c1[@]}" >"$o1" 2>&1 &
	p1=$!
	"${c2[@]}" >"$o2" 2>&1 &
	p2=$!
	wait "$p1"
	s1=$?
	wait "$p2"
	s2=$?
	stage_report "$n1" "$o1" "$s1" $((SECONDS - t0))
	stage_report "$n2" "$o2" "$s2" $((SECONDS - t0))
}

# KVP_QUICK: the sanitized unit tests are built there, run below. The
# deterministic fuzz runs meanwhile (a CPU; fixed inputs and counts, so
# sharing the machine changes nothing but its time).
if [[ ${KVP_SKIP_FUZZ:-0} != 1 ]]; then
	stage_pair "build directories, make install, kvpull.pc" \
		"fuzz (libFuzzer, deterministic)" -- \
		env KVP_QUICK=1 bash tests/check_build_dirs.sh -- \
		bash scripts/fuzz.sh
else
	stage --long "about 1 min" "build directories, make install, kvpull.pc" \
		env KVP_QUICK=1 bash tests/check_build_dirs.sh
fi
if [[ ${KVP_SKIP_SANITIZE:-0} != 1 ]]; then
	# gcc's and clang's sanitized unit tests at once: a CPU each
	stage_pair "unit tests under ASan+UBSan" \
		"unit tests under clang ASan+UBSan" -- \
		"${mk[@]}" SANITIZE=1 unit -- \
		"${mk[@]}" CC=clang CXX=clang++ SANITIZE=1 unit
fi
if [[ ${KVP_SKIP_RDMA:-0} != 1 ]] && grep -q '^check-rdma:' Makefile; then
	stage --long "a VM boot, about 1 min" "RDMA loopback tests (soft-RoCE)" \
		"${mk[@]}" WERROR=1 check-rdma
	stage --long "a VM boot, about 30 s" "examples: producer and consumer (soft-RoCE)" \
		"${mk[@]}" WERROR=1 check-examples-rdma
	if [[ ${KVP_SKIP_SANITIZE:-0} != 1 ]]; then
		# Each RDMA program under one sanitizer, to keep CI under
		# 20 minutes: clang's the ones named here, gcc's the rest
		# (a new program among them).
		# (rdma_fail and rdma_engines run 1.2-3.5x faster under
		# clang's: 39 s and 94 s against 140 s and 117 s.)
		clang_rdma="rdma_hostile rdma_meta rdma_both rdma_dump rdma_memory rdma_sleep rdma_fail rdma_engines"
		gcc_rdma=$(ls tests/rdma_*.c | sed 's|tests/||; s|\.c$||' |
			   grep -vxF -e "${clang_rdma// /$'\n'}" | tr '\n' ' ')
		# gcc's: the layout matrix of rdma_loopback (whole
		# in the plain run above, here a subset that still reaches
		# every code path of the transport: striping, credit reads,
		# MRs in pieces and the dma-buf fallback, READ slices, traffic
		# class, kernel blocks and SQ wrap, layout conversion, MLA,
		# Mamba2 conv transposes, GDN), the streamed pulls.
		stage --long "a VM boot, about 3 min" "RDMA tests under ASan+UBSan" \
			"${mk[@]}" SANITIZE=1 check-rdma \
			RDMA_SKIP="$clang_rdma" \
			RDMA_VM_FLAGS="--env KVP_QUICK_CASES=1"
		# clang's UBSan sees what gcc's misses: the peer-facing
		# programs under it (the hostile peers, carried metadata, one
		# agent in both roles, the dump, memory, sleeping engines, the
		# killed peers, the engines coming and going).
		stage --long "a VM boot, about 4 min" "RDMA tests under clang ASan+UBSan" \
			"${mk[@]}" CC=clang CXX=clang++ SANITIZE=1 \
			RDMA_SKIP="$gcc_rdma" check-rdma
	fi
	# the Python binding over real verbs (tests/python_rdma): its own VM
	# boot, the interpreter, numpy and torch carried in (a 235 MB
	# initramfs), one point of InferenceX's kv-transfer suite among them
	stage --long "a VM boot, about 4 min" "Python binding in the VM (soft-RoCE)" \
		sh tests/python_rdma/run-vm.sh
fi

# what tests/README.md says the stages above count, against what they counted
stage "docs: tests/README.md's test counts" sh tests/check_doc_counts.sh "$logs"

if [[ ${#failed_stages[@]} -gt 0 ]]; then
	printf 'failed stages: %s\n' "${failed_stages[*]}"
fi
echo "total $(dur $((SECONDS - t_start))); logs in $logs/"
echo "$pass passed, $fail failed"
[[ $fail -eq 0 && ${#failed_stages[@]} -eq 0 ]]
