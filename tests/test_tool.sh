#!/bin/sh
# SPDX-License-Identifier: MIT
# Checks build/tools/kvpull-plan from the outside: exit codes, the summary,
# the JSON document, spec files, and the rejection of bad input.
#
#   sh tests/test_tool.sh [path/to/kvpull-plan]
#
# Needs only a POSIX shell; the JSON is parsed with `python3 -m json.tool`
# when python3 exists (that check is skipped otherwise). Exits 0 when every
# check passes, 1 otherwise.
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
plan=${1:-${KVPULL_PLAN:-$top/build/tools/kvpull-plan}}
if [ ! -x "$plan" ]; then
	echo "test_tool: $plan not found; run 'make' first" >&2
	exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpull-tool.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

if command -v python3 >/dev/null 2>&1; then
	have_python=1
else
	have_python=0
	echo "test_tool: no python3: skipping the JSON parse checks"
fi

# run NAME WANT_RC ARGS...: runs the tool, output in $tmp/NAME.{out,err}.
run() {
	name=$1 want=$2
	shift 2
	"$plan" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
	rc=$?
	if [ "$rc" -eq "$want" ]; then
		ok
	else
		bad "$name: exit $rc, want $want ($*)"
		sed 's/^/  | /' "$tmp/$name.err" >&2
	fi
}

# has NAME FILE TEXT: FILE ($tmp/NAME.out or .err) holds TEXT.
has() {
	if grep -qF -- "$3" "$tmp/$1.$2"; then
		ok
	else
		bad "$1: no '$3' in $2"
	fi
}

json_ok() {
	[ "$have_python" = 1 ] || return 0
	if python3 -m json.tool "$tmp/$1.out" >/dev/null 2>"$tmp/$1.jerr"; then
		ok
	else
		bad "$1: JSON does not parse: $(cat "$tmp/$1.jerr")"
	fi
}

# --- summaries and JSON for two model pairs -----------------------------

run llama 0 --model llama-3.1-8b --remote-tp 2 --local-tp 1 --no-timing
has llama out "source ranks (read from): 0 1"
has llama out "notifications each producer rank expects per request: 0:1 1:1"
has llama out "group 0: full"
has llama out "total: 2097152 bytes per local block (2.00 MiB)"

run llama_json 0 --model llama-3.1-8b --remote-tp 2 --local-tp 1 --json
json_ok llama_json
has llama_json out '"version": 1'
has llama_json out '"request": null'

run deepseek 0 --model deepseek-v3 --remote-tp 4 --local-tp 2 \
	--request 8 --hit 2 --no-timing
has deepseek out "group 0: mla"
has deepseek out "local ids 2-7 (6), remote ids 0-7 (8), 128 tokens"
has deepseek out "total: 61 READs (one descriptor per block per region: 366)"

run deepseek_json 0 --model deepseek-v3 --remote-tp 4 --local-tp 2 \
	--request 8 --hit 2 --json
json_ok deepseek_json
has deepseek_json out '"naive_wrs": 366'
has deepseek_json out '"local_ids": [2, 3, 4, 5, 6, 7]'
# One line per READ, in the same count as the summary's.
n=$(grep -c '^      {"group": [0-9]*, "src": ' "$tmp/deepseek_json.out")
if [ "$n" -eq 61 ]; then ok; else bad "deepseek_json: $n READs, want 61"; fi

# Output is deterministic without timing.
run again 0 --model deepseek-v3 --remote-tp 4 --local-tp 2 \
	--request 8 --hit 2 --json
if cmp -s "$tmp/deepseek_json.out" "$tmp/again.out"; then ok; else
	bad "two --json runs differ"
fi

# --- spec files: a model-form spec plans like the preset ----------------

cat >"$tmp/local.spec" <<'EOF'
# consumer: llama-3.1-8b, one GPU
model = llama-3.1-8b
block_tokens = 16
num_blocks = 1024
EOF
cat >"$tmp/remote.spec" <<'EOF'
model = llama-3.1-8b
tp_size = 2
block_tokens = 16
num_blocks = 1024
EOF
run spec 0 --local-spec "$tmp/local.spec" --remote-spec "$tmp/remote.spec" \
	--request 4 --json
run preset 0 --model llama-3.1-8b --remote-tp 2 --request 4 --json
sed -n '/^  "plan"/,$p' "$tmp/spec.out" >"$tmp/spec.plan"
sed -n '/^  "plan"/,$p' "$tmp/preset.out" >"$tmp/preset.plan"
if [ -s "$tmp/spec.plan" ] && cmp -s "$tmp/spec.plan" "$tmp/preset.plan"; then
	ok
else
	bad "spec files and the preset give different plans"
fi

# --- errors --------------------------------------------------------------

run help 0 --help
has help out "tools/README.md"

run no_engine 2
has no_engine err "give --model NAME"
run bad_option 2 --model llama-3.1-8b --bogus
run bad_number 2 --model llama-3.1-8b --local-tp x
has bad_number err "--local-tp: 'x' is not a number"
run bad_model 2 --model no-such-model
has bad_model err "unknown preset 'no-such-model'"
run bad_layout 2 --model llama-3.1-8b --local-layout nhd
run bad_rank 2 --model llama-3.1-8b --local-tp 2 --rank 2
run bad_ids 2 --model llama-3.1-8b --request 4 --local-ids 1,,2
run bad_hit 2 --model llama-3.1-8b --request 4 --hit 5
run spec_and_tp 2 --local-spec "$tmp/local.spec" --model llama-3.1-8b \
	--local-tp 2
run extra_arg 2 --model llama-3.1-8b stray

# The library refuses: exit 1 with its reason.
run no_layout 1 --model llama-3.1-8b --local-tp 3
has no_layout err "invalid argument"
run no_plan 1 --model llama-3.1-8b --local-block 1 --remote-block 65537 --num-blocks 4
has no_plan err "cannot plan: malformed or incompatible peer data: group 0: block sizes 1 and 65537 have no usable common period"
# Block sizes that do not nest plan over their common period.
run no_nest 0 --model llama-3.1-8b --local-block 16 --remote-block 7 --layers 1
has no_nest out "period 112 tokens = 7 local : 16 remote"
run out_of_range 1 --model llama-3.1-8b --num-blocks 4 --request 8
has out_of_range err "block id out of range"
printf 'model = llama-3.1-8b\nlayrs = 2\n' >"$tmp/bad.spec"
run bad_spec 1 --local-spec "$tmp/bad.spec" --model llama-3.1-8b
has bad_spec err "bad.spec: line 2: unknown key 'layrs' (invalid argument)"
run no_file 1 --local-spec "$tmp/missing.spec" --model llama-3.1-8b

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
