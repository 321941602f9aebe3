#!/bin/sh
# check_doc_counts.sh: the test counts tests/README.md states are the ones
# the test command just ran.
#
#   sh tests/check_doc_counts.sh LOGDIR [FILE]
#
# LOGDIR holds scripts/test.sh's stage logs (build/test-logs). Each figure
# below is read from its stage's log and looked for, as written, in FILE
# (tests/README.md, the test catalogue): a figure that differs, or a phrase
# the file no longer holds, fails. A stage whose log is absent (KVP_SKIP_RDMA=1, say) is
# reported and not counted.
#   unit tests       "cmocka, N cases in M programs"    (cmocka's summaries)
#   tool tests       "(`make check-tool`, N checks"
#   Python binding   "(`make check-python`, N tests"
#   examples, man    "(`make check-docs`, N checks)"
#   kvpull-plan --svg "(`make check-svg`, N checks)"
#   RDMA, plain      "in the VM: N cases in M programs"
#   Python in the VM "(`sh tests/python_rdma/run-vm.sh`, N tests"
# Prints "N passed, N failed"; exit status 0 when nothing failed.
set -u
logs=${1:?usage: check_doc_counts.sh LOGDIR [FILE]}
readme=${2:-$(dirname "$0")/README.md}
pass=0
fail=0

# log NAME: the stage log whose name ends in NAME.log, or nothing
log() {
	for f in "$logs"/*-"$1".log; do
		[ -f "$f" ] && { echo "$f"; return; }
	done
}

# passed FILE: the sum of its "N passed, N failed" lines' N
passed() {
	sed -n 's/^\([0-9][0-9]*\) passed, [0-9][0-9]* failed.*/\1/p' "$1" |
		awk '{s+=$1} END {print s+0}'
}

# want WHAT PHRASE REGEX: the file holds PHRASE, as written (REGEX finds
# what it says instead)
want() {
	if grep -qF -- "$2" "$readme"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL: $1: $readme says $(grep -oE -- "$3" "$readme" |
			head -1 || true); this run: \"$2\"" >&2
	fi
}

skip() { echo "check_doc_counts: $1: no stage log in $logs, not checked"; }

f=$(log unit-tests)
if [ -n "$f" ]; then
	n=$(sed -n 's/^\[==========\] \([0-9]*\) test(s) run\..*/\1/p' "$f" |
		awk '{s+=$1} END {print s+0}')
	m=$(grep -c '^\[==========\] [0-9]* test(s) run\.' "$f")
	want "unit tests" "cmocka, $n cases in $m programs" \
		'cmocka, [0-9,]+ cases in [0-9]+ programs'
else skip "unit tests"; fi

f=$(log tool-tests)
if [ -n "$f" ]; then
	want "tool tests" "(\`make check-tool\`, $(passed "$f") checks" \
		'`make check-tool`, [0-9,]+ checks'
else skip "tool tests"; fi

f=$(log python-binding-pytest)
if [ -n "$f" ]; then
	want "Python binding" "(\`make check-python\`, $(passed "$f") tests" \
		'`make check-python`, [0-9,]+ tests'
else skip "Python binding"; fi

f=$(log examples-c-and-c++-and-man-pages)
if [ -n "$f" ]; then
	want "examples and man pages" "(\`make check-docs\`, $(passed "$f") checks)" \
		'`make check-docs`, [0-9,]+ checks'
else skip "examples and man pages"; fi

f=$(log kvpull-plan-svg)
if [ -n "$f" ]; then
	want "kvpull-plan --svg" "(\`make check-svg\`, $(passed "$f") checks)" \
		'`make check-svg`, [0-9,]+ checks'
else skip "kvpull-plan --svg"; fi

f=$(log rdma-loopback-tests-soft-roce)
if [ -n "$f" ]; then
	m=$(grep -c '^KVP-BEGIN ' "$f")
	want "RDMA tests" "in the VM: $(passed "$f") cases in $m programs" \
		'in the VM: [0-9,]+ cases in [0-9]+ programs'
else skip "RDMA tests"; fi

f=$(log python-binding-in-the-vm-soft-roce)
if [ -n "$f" ]; then
	want "Python binding in the VM" \
		"(\`sh tests/python_rdma/run-vm.sh\`, $(passed "$f") tests" \
		'`sh tests/python_rdma/run-vm.sh`, [0-9,]+ tests'
else skip "Python binding in the VM"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
