#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz/fuzz_*.c, ASan+UBSan), built by
# `make fuzz` with clang in build/fuzz/ (FUZZ_BUILD), apart from every other
# configuration. Three modes:
#
#   bash scripts/fuzz.sh                            deterministic
#   bash scripts/fuzz.sh --long [SECONDS] [TARGET...]   randomized
#   bash scripts/fuzz.sh --update-corpus [TARGET...]
#
# TARGET is meta, plan, spec or inbox (or fuzz_meta ...); default all.
#
# Deterministic (what scripts/test.sh runs): the reproducers of
# tests/fuzz/crashes/ (<target>-*) are replayed first, then each target runs
# a fixed number of executions (RUNS below, not a time) from a fixed seed
# (SEED), single process, on its inputs in a fixed order: the seed corpus
# made from the presets (build/fuzz/seeds; fuzz_inbox has none), the
# regression corpus tests/fuzz/corpus/<target>/ and the reproducers, each
# sorted by name and passed with -seed_inputs (libFuzzer shuffles them with
# its seeded generator, so the order it gets them in matters and must not
# be the directory's).
# Mutations from the operands of compares are off (-use_cmp=0) and the
# targets are built without the stack-depth feature: both depended on where
# ASLR put the stack and the heap. The same tree gives the same executions,
# coverage, corpus and result on every run; about 2 min 30 s with the build
# on 2 cores.
#
# --long: each target in turn with a random seed (printed) for SECONDS of
# wall time (default KVP_FUZZ_SECONDS, else 600), on the same inputs. The
# corpus it grows is kept in $FUZZ_BUILD/long/<target>/ (emptied first).
# Crash inputs go to the artifacts directory: minimize one with
# `build/fuzz/fuzz_<target> -minimize_crash=1 -runs=100000 FILE`, keep it as
# tests/fuzz/crashes/<target>-<what> and describe it in the README there.
#
# --update-corpus: rewrites tests/fuzz/corpus/<target>/ as a small set of
# inputs of the long run's corpus and of the present regression corpus that
# reach every edge they reach beyond the seed corpus (libFuzzer
# -set_cover_merge=1 into the seeds, edges without hit counts:
# -use_counters=0; with hit counts the set is 3-4 times larger). Run it
# after --long, review the change (git status tests/fuzz/corpus) and commit
# it.
#
# Prints executions, crashes and coverage per target and ends with
# "N passed, N failed" (one per target); libFuzzer's own output is kept in
# $FUZZ_BUILD/logs/<target>.log.
#
# Environment:
#   KVP_FUZZ_SECONDS    seconds per target of --long (default 600)
#   KVP_FUZZ_ARTIFACTS  where crash inputs go (default $FUZZ_BUILD/artifacts)
#   FUZZ_BUILD          the build directory of the targets (default build/fuzz)
#   FUZZ_CC             the compiler (default clang)
#   KVP_JOBS            make -j (default 2)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# Executions and seed per target of the deterministic mode: about 25 s,
# 55 s, 35 s and 40 s on the 2-core development machine (executions per second
# from these inputs: meta ~120 k, plan ~1.1 k, spec ~35 k; inbox, a whole
# producer agent per input, ~250).
declare -A RUNS=([meta]=3000000 [plan]=60000 [spec]=1200000 [inbox]=10000)
declare -A SEED=([meta]=1 [plan]=2 [spec]=3 [inbox]=4)
MAX_LEN=16384

usage() {
	echo "usage: bash scripts/fuzz.sh [--long [SECONDS] | --update-corpus] [TARGET...]" >&2
	exit 2
}

mode=det
secs=${KVP_FUZZ_SECONDS:-600}
case ${1:-} in
--long)
	mode=long
	shift
	if [[ ${1:-} =~ ^[0-9]+$ ]]; then
		secs=$1
		shift
	fi
	;;
--update-corpus)
	mode=update
	shift
	;;
-*) usage ;;
esac
want=()
for t in "$@"; do
	t=${t#fuzz_}
	[[ -f tests/fuzz/fuzz_$t.c ]] || usage
	want+=("$t")
done

fb=${FUZZ_BUILD:-build/fuzz}
art=${KVP_FUZZ_ARTIFACTS:-$fb/artifacts}
make -s -j"${KVP_JOBS:-2}" fuzz FUZZ_BUILD="$fb" || { echo "fuzz: make fuzz failed"; echo "0 passed, 1 failed"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$art" "$fb/logs"
"$fb/seeds" "$work/seeds" >/dev/null || { echo "0 passed, 1 failed"; exit 1; }

# inputs SHORT: the target's inputs, one path a line, in a fixed order (the
# seeds, the regression corpus, the reproducers; each sorted by name)
inputs() {
	local d
	for d in "$work/seeds/$1" "tests/fuzz/corpus/$1"; do
		[[ -d $d ]] && find "$d" -type f | LC_ALL=C sort
	done
	find tests/fuzz/crashes -type f -name "$1-*" | LC_ALL=C sort
}

# final_stat LOG NAME: a final statistic of libFuzzer's log
final_stat() {
	sed -n "s/^stat::$2: *//p" "$1" | tail -n 1
}

# update SHORT BIN
update() {
	local out=$work/merge-$1 dirs=() kept n
	mkdir -p "$out"
	[[ -d $work/seeds/$1 ]] && cp -r "$work/seeds/$1"/. "$out"
	[[ -d tests/fuzz/corpus/$1 ]] && dirs+=("tests/fuzz/corpus/$1")
	[[ -d $fb/long/$1 ]] && dirs+=("$fb/long/$1")
	if ((${#dirs[@]} == 0)); then
		echo "fuzz_$1: no corpus to merge (run --long first)"
		return 0
	fi
	"$2" -set_cover_merge=1 -use_counters=0 -max_len=$MAX_LEN -timeout=10 \
		-rss_limit_mb=2048 "$out" "${dirs[@]}" >"$work/merge-$1.log" 2>&1 || {
		tail -n 20 "$work/merge-$1.log"
		return 1
	}
	kept=$work/kept-$1
	mkdir -p "$kept"
	for f in "$out"/*; do
		[[ -e $work/seeds/$1/${f##*/} ]] || cp "$f" "$kept/"
	done
	rm -rf "tests/fuzz/corpus/$1"
	mkdir -p "tests/fuzz/corpus/$1"
	cp "$kept"/. "tests/fuzz/corpus/$1" -r
	n=$(find "tests/fuzz/corpus/$1" -type f | wc -l)
	echo "fuzz_$1: tests/fuzz/corpus/$1: $n inputs, $(cat "$kept"/* 2>/dev/null | wc -c) bytes (from ${dirs[*]})"
}

pass=0
fail=0
for bin in "$fb"/fuzz_*; do
	[[ -x $bin ]] || continue
	name=${bin##*/}
	short=${name#fuzz_}
	if ((${#want[@]})) && [[ " ${want[*]} " != *" $short "* ]]; then
		continue
	fi
	if [[ $mode == update ]]; then
		if update "$short" "$bin"; then
			pass=$((pass + 1))
		else
			fail=$((fail + 1))
		fi
		continue
	fi
	log=$fb/logs/$name.log
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
	inputs "$short" | paste -sd, >"$work/inputs-$short"
	nin=$(inputs "$short" | wc -l)
	# The deterministic mode: -use_cmp=0, as the operands of compares
	# (UBSan's pointer-overflow checks compare addresses) would bring
	# ASLR's addresses into the mutations; a slow input fails only when it
	# hangs (60 s: a result that depended on the machine's load would not
	# repeat). The long mode reports inputs taking over 10 s.
	if [[ $mode == det ]]; then
		corpus=$work/corpus-$short
		bound=(-seed="${SEED[$short]:-1}" -runs="${RUNS[$short]:-100000}"
			-use_cmp=0 -timeout=60)
	else
		corpus=$fb/long/$short
		rm -rf "$corpus"
		bound=(-max_total_time="$secs" -timeout=10)
	fi
	mkdir -p "$corpus"
	t0=$SECONDS
	"$bin" "${bound[@]}" -max_len=$MAX_LEN -rss_limit_mb=2048 \
		-reload=0 -print_final_stats=1 -artifact_prefix="$art/$name-" \
		-seed_inputs=@"$work/inputs-$short" "$corpus" >"$log" 2>&1
	st=$?
	t=$((SECONDS - t0))
	execs=$(final_stat "$log" number_of_executed_units)
	seed=$(sed -n 's/^INFO: Seed: //p' "$log" | head -n 1)
	last=$(grep -E '^#[0-9]+[[:space:]].* cov: ' "$log" | tail -n 1)
	cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
	ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
	crashes=$(grep -cE '^==[0-9]+==ERROR|runtime error|^SUMMARY: libFuzzer' "$log")
	if [[ $st -ne 0 ]]; then
		ok=0
		grep -E 'runtime error|ERROR|SUMMARY|Test unit written' "$log" | head -n 20
	fi
	echo "$name: ${execs:-0} executions in $t s (seed $seed, $nin inputs), $crashes crashes, cov ${cov:-?} ft ${ft:-?}, corpus $(find "$corpus" -type f | wc -l) inputs (exit $st)"
	if ((ok)); then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "$name: FAILED (crash inputs in $art/)"
	fi
done
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
