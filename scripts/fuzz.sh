#!/usr/bin/env bash
# Builds the libFuzzer targets (make fuzz, clang) and runs each for a bounded
# time on seed corpora made from the model presets (build/fuzz/seeds), after
# replaying the committed reproducers of tests/fuzz/crashes/ (<target>-*).
# The targets build in build/fuzz/ (FUZZ_BUILD), apart from every other
# configuration.
# Prints executions and crashes per target and ends with
# "N passed, N failed" (one per target).
#
# Environment:
#   KVP_FUZZ_SECONDS    seconds per target (default 60)
#   KVP_FUZZ_ARTIFACTS  where crash inputs go (default $FUZZ_BUILD/artifacts)
#   FUZZ_BUILD          the build directory of the targets (default build/fuzz)
#   FUZZ_CC             the compiler (default clang)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

secs=${KVP_FUZZ_SECONDS:-60}
fb=${FUZZ_BUILD:-build/fuzz}
art=${KVP_FUZZ_ARTIFACTS:-$fb/artifacts}
make -s -j"${KVP_JOBS:-2}" fuzz FUZZ_BUILD="$fb" || { echo "fuzz: make fuzz failed"; echo "0 passed, 1 failed"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$art"
"$fb/seeds" "$work/seeds" || { echo "0 passed, 1 failed"; exit 1; }

pass=0
fail=0
for bin in "$fb"/fuzz_*; do
	[[ -x $bin ]] || continue
	name=${bin##*/}
	short=${name#fuzz_}
	corpus=$work/corpus-$short
	log=$work/$name.log
	mkdir -p "$corpus"
	[[ -d $work/seeds/$short ]] && cp "$work/seeds/$short"/. "$corpus" -r
	ok=1
	# the committed reproducers must not crash any more
	repros=(tests/fuzz/crashes/"$short"-*)
	if [[ -e ${repros[0]} ]]; then
		if ! "$bin" -runs=1 "${repros[@]}" >"$log" 2>&1; then
			ok=0
			echo "$name: a reproducer of tests/fuzz/crashes/ still fails:"
			tail -n 20 "$log"
		fi
	fi
	"$bin" -max_total_time="$secs" -max_len=16384 -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$art/$name-" "$corpus" >"$log" 2>&1
	st=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	crashes=$(grep -cE '^==[0-9]+==ERROR|runtime error|^SUMMARY: libFuzzer' "$log")
	if [[ $st -ne 0 ]]; then
		ok=0
		grep -E 'runtime error|ERROR|SUMMARY|Test unit written' "$log" | head -n 20
	fi
	echo "$name: ${execs:-0} executions in ${secs} s, $crashes crashes, corpus $(ls "$corpus" | wc -l) inputs (exit $st)"
	if ((ok)); then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "$name: FAILED (crash inputs in $art/)"
	fi
done
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
