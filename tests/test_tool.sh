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

# Debian's interpreter first: it has Debian's python3-jsonschema
# (scripts/install-deps.sh), a python3 earlier in PATH may not.
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
if command -v $py >/dev/null 2>&1; then
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
	if $py -m json.tool "$tmp/$1.out" >/dev/null 2>"$tmp/$1.jerr"; then
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

# The documents follow tools/kvpull-plan.schema.json (the file --help names
# once installed), when python3 has jsonschema.
schema_ok() {
	[ "$have_python" = 1 ] || return 0
	if ! $py -c 'import jsonschema' 2>/dev/null; then
		bad "$1: no python3 jsonschema to check it (apt-get install python3-jsonschema)"
		return 0
	fi
	if $py -c 'import json, sys, jsonschema
jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])))' \
		"$tmp/$1.out" "$top/tools/kvpull-plan.schema.json" \
		2>"$tmp/$1.serr"; then
		ok
	else
		bad "$1: not valid by the schema: $(tail -1 "$tmp/$1.serr")"
	fi
}
schema_ok llama_json
schema_ok deepseek_json
run hybrid_json 0 --model nemotron-h-8b --remote-tp 2 --request 2 --json
schema_ok hybrid_json

# Output is deterministic without timing.
run again 0 --model deepseek-v3 --remote-tp 4 --local-tp 2 \
	--request 8 --hit 2 --json
if cmp -s "$tmp/deepseek_json.out" "$tmp/again.out"; then ok; else
	bad "two --json runs differ"
fi

# --- spec files: a model-form spec plans like the preset ----------------

# (A spec's kv_layout defaults to flash_hnd, as the tool's presets and
# kvpull-demo do: the local spec leaves it out.)
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
kv_layout = flash_hnd
EOF
run spec 0 --local-spec "$tmp/local.spec" --remote-spec "$tmp/remote.spec" \
	--request 4 --json
run preset 0 --model llama-3.1-8b --remote-tp 2 --request 4 --json
schema_ok spec
sed -n '/^  "plan"/,$p' "$tmp/spec.out" >"$tmp/spec.plan"
sed -n '/^  "plan"/,$p' "$tmp/preset.out" >"$tmp/preset.plan"
if [ -s "$tmp/spec.plan" ] && cmp -s "$tmp/spec.plan" "$tmp/preset.plan"; then
	ok
else
	bad "spec files and the preset give different plans"
fi

# --- errors --------------------------------------------------------------

run help 0 --help

run no_engine 2
has no_engine err "give --model NAME"
run bad_option 2 --model llama-3.1-8b --bogus
run bad_number 2 --model llama-3.1-8b --local-tp x
has bad_number err "--local-tp: 'x' is not a number"
run bad_model 2 --model no-such-model
has bad_model err "unknown preset 'no-such-model'"
has bad_model err "(presets: llama-3.1-8b, llama-3.1-70b,"
run bad_layout 2 --model llama-3.1-8b --local-layout nhd
has bad_layout err "--local-layout: unknown value 'nhd' (valid: flash_nhd, flash_hnd, flashinfer, packed)"
run bad_conv 2 --model nemotron-h-8b --remote-conv-layout x
has bad_conv err "--remote-conv-layout: unknown value 'x' (valid: ds, sd)"
run bad_rank 2 --model llama-3.1-8b --local-tp 2 --rank 2
run bad_hit 2 --model llama-3.1-8b --request 4 --hit 5
run spec_and_tp 2 --local-spec "$tmp/local.spec" --model llama-3.1-8b \
	--local-tp 2
run extra_arg 2 --model llama-3.1-8b stray

# --range: one part's READs; the parts of a partition add up to the whole
# request's bytes (2 layers: 524288 bytes, 4 x 64 KiB per layer)
run range_all 0 --model llama-3.1-8b --layers 2 --request 4 --brief --no-timing
has range_all out "total: 4 READs (one descriptor per block per region: 16), 524288 bytes"
run range_l0 0 --model llama-3.1-8b --layers 2 --request 4 --brief \
	--no-timing --range 0:1
has range_l0 out "total: 2 READs (one descriptor per block per region: 16), 262144 bytes"
has range_l0 out "range: layers [0, 1), tokens (0, end]"
run range_l1 0 --model llama-3.1-8b --layers 2 --request 4 --brief \
	--no-timing --range 1:2
has range_l1 out "262144 bytes"
run range_t0 0 --model llama-3.1-8b --layers 2 --request 4 --brief \
	--no-timing --range 0:2:0:32
has range_t0 out "total: 4 READs (one descriptor per block per region: 16), 262144 bytes"
has range_t0 out "range: layers [0, 2), tokens (0, 32]"
run range_t1 0 --model llama-3.1-8b --layers 2 --request 4 --brief \
	--no-timing --range 0:2:32:end
has range_t1 out "262144 bytes"
run range_bad 2 --model llama-3.1-8b --request 4 --range 0:x
has range_bad err "--range 0:x: want L0:L1 or L0:L1:T0:T1 (numbers; T1 may be 'end')"
run range_back 2 --model llama-3.1-8b --request 4 --range 2:1
has range_back err "--range 2:1: layers [2, 1) or tokens (0, end] run backwards"

# Which option and which rule: one message each, exactly.
# exact NAME TEXT: $tmp/NAME.err is TEXT, then (for usage errors) the hint.
exact() {
	if [ "$(sed -n 1p "$tmp/$1.err")" = "$2" ]; then ok; else
		bad "$1: stderr '$(sed -n 1p "$tmp/$1.err")', want '$2'"
	fi
}
run tp0 2 --model llama-3.1-8b --remote-tp 0
exact tp0 "kvpull-plan: --remote-tp 0: TP size must be at least 1"
run ltp0 2 --model llama-3.1-8b --local-tp 0
exact ltp0 "kvpull-plan: --local-tp 0: TP size must be at least 1"
run rank_tp 2 --model llama-3.1-8b --local-tp 2 --rank 2
exact rank_tp "kvpull-plan: --rank 2: rank is not below the local TP size 2"
run block0 2 --model llama-3.1-8b --local-block 0
exact block0 "kvpull-plan: --local-block 0: block size must be at least 1 token"
run kblock 2 --model llama-3.1-8b --remote-kernel-block 5
exact kblock "kvpull-plan: --remote-kernel-block 5: kernel block does not divide the block size 16"
run layers0 2 --model llama-3.1-8b --layers 0
exact layers0 "kvpull-plan: --layers 0: llama-3.1-8b has no state layers; it needs at least 1 layer"
run sliding 2 --model gemma-3-12b --layers 8
exact sliding "kvpull-plan: --layers 8: gemma-3-12b has 40 sliding-window layers"
run nblocks0 2 --model llama-3.1-8b --num-blocks 0
exact nblocks0 "kvpull-plan: --num-blocks 0: num_blocks must be at least 1"
run dtype0 2 --model llama-3.1-8b --dtype-bytes 0
exact dtype0 "kvpull-plan: --dtype-bytes 0: dtype_bytes must be at least 1"
run heads0 2 --model llama-3.1-8b --kv-heads 0
exact heads0 "kvpull-plan: --kv-heads 0: kv_heads must be at least 1"
run hdim0 2 --model llama-3.1-8b --head-dim 0
exact hdim0 "kvpull-plan: --head-dim 0: head_dim must be at least 1"
# Rules between numbers: the library's message, the side and the model.
run no_layout 1 --model llama-3.1-8b --local-tp 3
exact no_layout "kvpull-plan: --local-tp 3: TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ... (llama-3.1-8b)"
run no_layout_gdn 1 --model qwen3-next-80b-a3b --remote-tp 64 --kv-heads 3
exact no_layout_gdn "kvpull-plan: --remote-tp 64: TP 64 does not divide and is not divided by 3 KV heads; they allow TP 1, 3, 6, 9, ... (qwen3-next-80b-a3b)"
run no_layout_many 1 --model llama-3.1-8b --kv-heads 96 --remote-tp 5
exact no_layout_many "kvpull-plan: --remote-tp 5: TP 5 does not divide and is not divided by 96 KV heads; they allow TP 1, 2, 3, 4, 6, 8, ..., 96, 192, 288, ... (llama-3.1-8b)"
run no_layout_ssm 1 --model nemotron-h-8b --num-blocks 4
exact no_layout_ssm "kvpull-plan: local layout: num_blocks 4 is below the 33 attention pages one state page spans (nemotron-h-8b)"
run no_layout_size 1 --model llama-3.1-8b --head-dim 16777216
exact no_layout_size "kvpull-plan: local layout: a kernel page of 8 heads x 16 tokens x 16777216 x 2 bytes is 4 GiB or more (llama-3.1-8b)"
printf 'block_tokens = 16\nnum_blocks = 8\nmodel = foo\n' >"$tmp/foo.spec"
run spec_preset 1 --local-spec "$tmp/foo.spec" --model llama-3.1-8b
exact spec_preset "kvpull-plan: $tmp/foo.spec: line 3: unknown preset 'foo' (see kvpull-plan --list)"
printf 'model = llama-3.1-8b\ntp_size = 3\nblock_tokens = 16\nnum_blocks = 8\n' \
	>"$tmp/tp3.spec"
run spec_tp 1 --local-spec "$tmp/tp3.spec" --model llama-3.1-8b
exact spec_tp "kvpull-plan: $tmp/tp3.spec: line 2: TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ..."
# Group kinds by name in the plan's reason.
cat >"$tmp/full.spec" <<'SPEC'
engine tp_size=1
group kind=full block_tokens=16
region size=64K
view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=4K
field view=0 kind=k elem=2 dims=token:16:256,dim:128:2
SPEC
sed 's/kind=full/kind=sliding/' "$tmp/full.spec" >"$tmp/sliding.spec"
run kinds 1 --local-spec "$tmp/full.spec" --remote-spec "$tmp/sliding.spec"
exact kinds "kvpull-plan: cannot plan: malformed or incompatible peer data: group 0 kind differs: local full, remote sliding"

# The title line: what the plan was made with. By default an agent's
# max_sge and READ cap (kvpull.h: KVP_DEFAULT_MAX_SGE, KVP_DEFAULT_MAX_READ)
# and kvpull-demo's layout (tools/lib/defaults.h).
# first NAME TEXT: the first line of $tmp/NAME.out is TEXT.
first() {
	if [ "$(sed -n 1p "$tmp/$1.out")" = "$2" ]; then ok; else
		bad "$1: first line '$(sed -n 1p "$tmp/$1.out")', want '$2'"
	fi
}
first llama "kvpull-plan: llama-3.1-8b, producer TP 2 (flash_hnd) -> consumer TP 1 rank 0 (flash_hnd); max_sge 16, READ cap 2 GiB: an agent's defaults"
has llama out "       TP 1 rank 0, engine id 0, block 16 tokens (kernel 16), flash_hnd, 1024 blocks"
has llama out "plan: consumer rank 0 of TP 1 pulling from TP 2, max_sge 16"
run title_set 0 --model llama-3.1-8b --remote-tp 2 --local-tp 2 --rank 1 \
	--max-sge 4 --max-read 1048576 --local-layout flash_nhd --no-timing
first title_set "kvpull-plan: llama-3.1-8b, producer TP 2 (flash_hnd) -> consumer TP 2 rank 1 (flash_nhd); max_sge 4, READ cap 1 MiB (an agent's defaults: max_sge 16, READ cap 2 GiB)"
first deepseek "kvpull-plan: deepseek-v3, producer TP 4 (MLA) -> consumer TP 2 rank 0 (MLA); max_sge 16, READ cap 2 GiB: an agent's defaults"
run title_spec 0 --local-spec "$tmp/local.spec" --model llama-3.1-8b \
	--remote-tp 2 --max-read 1000000 --no-timing
first title_spec "kvpull-plan: producer llama-3.1-8b TP 2 (flash_hnd) -> consumer spec $tmp/local.spec, TP 1 rank 0; max_sge 16, READ cap 1000000 B (an agent's defaults: max_sge 16, READ cap 2 GiB)"
has llama_json out '"title": "llama-3.1-8b, producer TP 2 (flash_hnd) -> consumer TP 1 rank 0 (flash_hnd); max_sge 16, READ cap 2 GiB: an agent'"'"'s defaults",'
has llama_json out '"remote_tp": 2, "max_sge": 16, "max_len": 2147483648, "bytes": '
run max_read 2 --model llama-3.1-8b --max-read 2147483649
exact max_read "kvpull-plan: --max-read 2147483649: above 2147483648 (2^31, IB's largest message)"

# The READs an agent with default attributes posts: tests/rdma_dump.c pulls
# these three requests on soft-RoCE and checks that each DONE event reports
# exactly these READs and bytes.
dump="--model llama-3.1-8b --layers 2 --remote-tp 2 --num-blocks 64 --brief --no-timing"
run dump_a 0 $dump --remote-ids 0-19 --local-ids 10-17,30,32-39,50-52
has dump_a out "  total: 16 READs (one descriptor per block per region: 160), 2621440 bytes (2.50 MiB)"
run dump_b 0 $dump --remote-ids 20-29 --local-ids 40-47 --tokens 150
has dump_b out "  total: 8 READs (one descriptor per block per region: 64), 1048576 bytes (1.00 MiB)"
run dump_c 0 $dump --remote-ids 30-39 --local-ids 0-9
has dump_c out "  total: 8 READs (one descriptor per block per region: 80), 1310720 bytes (1.25 MiB)"

# A bad id list: what is wrong, and at which character.
ids() { # NAME LIST MESSAGE
	run "$1" 2 --model llama-3.1-8b --request 4 --local-ids "$2"
	exact "$1" "kvpull-plan: --local-ids $2: $3 (want ids and ranges a-b separated by commas, e.g. 4,9,10-13)"
}
ids ids_empty '1,,2' "character 3: empty entry"
ids ids_lead ',1' "character 1: empty entry"
ids ids_digit '1,x' "character 3: 'x' is not a digit"
ids ids_back '5-3' "character 1: range 5-3 runs backwards"
ids ids_open '1-' "character 1: range 1- has no end"
ids ids_sep '1;2' "character 2: ';' after id 1 is not ',' or '-'"
ids ids_dash '1-2-3' "character 4: '-' after range 1-2 is not ','"
ids ids_comma '1,2,' "character 4: trailing comma"
ids ids_big '99999999999' "character 1: id 99999999999 is above 4294967295"
ids ids_long '0-16777216' "character 1: range 0-16777216 holds 16777217 ids, more than 16777216"
run ids_none 2 --model llama-3.1-8b --request 4 --local-ids ''
exact ids_none "kvpull-plan: --local-ids: empty id list (want ids and ranges a-b separated by commas, e.g. 4,9,10-13)"
# An id out of range: the id, where it is, and the bound (out_of_range
# below: the default local ids).
run range_remote 1 --model llama-3.1-8b --num-blocks 8 --remote-ids 0-3,9 \
	--local-ids 0-4
exact range_remote "kvpull-plan: cannot emit the request: block id out of range: group 0: remote id 9 (entry 5 of --remote-ids) is not below 8, the remote engine's blocks in group 0"
run range_state 1 --model nemotron-h-8b --remote-tp 2 --num-blocks 66 \
	--request 3 --local-ids 40-42
exact range_state "kvpull-plan: cannot emit the request: block id out of range: group 1: local id 2 (entry 3 of the default local ids) is not below 2, the local engine's state pages in group 1"
run state_len 2 --model nemotron-h-8b --remote-tp 2 --request 2 \
	--local-ids 40-41 --local-ids 0,1,2
exact state_len "kvpull-plan: group 1 (state): 3 local ids and 2 remote ids: a state group pairs them one to one"
# A spec field's shard: the numbers.
cat >"$tmp/shard.spec" <<'SPEC'
engine tp_size=4
group kind=full block_tokens=16
region size=64K
view group=0 region=0 layer=0 num_blocks=4 stride=16K
field view=0 kind=k elem=2 shard=1 total=8 dims=token:16:256,head:4:2
SPEC
run shard_len 1 --local-spec "$tmp/shard.spec" --remote-spec "$tmp/shard.spec"
exact shard_len "kvpull-plan: $tmp/shard.spec: line 5: field rejected: the sharded dim's size 4 is not this rank's shard length 2 (total 8 over tp_size 4, rank 0)"
sed 's/total=8/total=6/' "$tmp/shard.spec" >"$tmp/shard6.spec"
run shard_total 1 --local-spec "$tmp/shard6.spec" --remote-spec "$tmp/shard6.spec"
exact shard_total "kvpull-plan: $tmp/shard6.spec: line 5: field rejected: total 6 is neither a multiple nor a divisor of tp_size 4"

# kvpull-demo (beside kvpull-plan; built by `make all`): the same defaults,
# and the library's rule for a TP it refuses. --dry-run needs no RDMA.
demo=$(dirname "$plan")/kvpull-demo
if [ -x "$demo" ]; then
	# drun NAME WANT_RC ARGS...: as run, for kvpull-demo --dry-run.
	drun() {
		name=$1 want=$2
		shift 2
		"$demo" --dry-run --addr 10.0.0.1 "$@" >"$tmp/$name.out" \
			2>"$tmp/$name.err"
		rc=$?
		if [ "$rc" -eq "$want" ]; then ok; else
			bad "$name: exit $rc, want $want (kvpull-demo $*)"
		fi
	}
	"$demo" --help >"$tmp/demo_help.out" 2>&1
	has demo_help out "  --max-sge S            local SGEs per READ [16, an agent's default]"
	has demo_help out "  --prefill-layout L     flash_nhd|flash_hnd|flashinfer|packed [flash_hnd]"
	has demo_help out "  --block B              block size in tokens, both engines [16]"
	drun demo_dry 0
	first demo_dry "== kvpull-demo: llama-3.1-8b, prefill TP 2 (flash_hnd) -> decode TP 1 (flash_hnd), 8 requests pulled with RDMA READs"
	drun demo_tp 2 --decode-tp 3
	exact demo_tp "kvpull-demo: cannot plan llama-3.1-8b: --decode-tp 3: TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ..."
	drun demo_ptp 2 --prefill-tp 6
	exact demo_ptp "kvpull-demo: cannot plan llama-3.1-8b: --prefill-tp 6: TP 6 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ..."
	drun demo_blocks 2 --model nemotron-h-8b --num-blocks 4
	exact demo_blocks "kvpull-demo: cannot plan nemotron-h-8b: prefill engine: num_blocks 4 is below the 33 attention pages one state page spans"
else
	bad "$demo not built (make check-tool builds it)"
fi

# kvpull-stream-bench: --runs is 1-9 (the runs' times sit in 9-entry
# arrays), and a producer rank that cannot start says why, not a bare
# exit status 1. Arguments are checked before any device is opened.
sbench=$(dirname "$plan")/kvpull-stream-bench
if [ -x "$sbench" ]; then
	# srun NAME WANT_RC ARGS...: as run, for kvpull-stream-bench.
	srun() {
		name=$1 want=$2
		shift 2
		"$sbench" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
		rc=$?
		if [ "$rc" -eq "$want" ]; then ok; else
			bad "$name: exit $rc, want $want (kvpull-stream-bench $*)"
			sed 's/^/  | /' "$tmp/$name.err" >&2
		fi
	}
	srun sbench_runs10 2 --runs 10 --addr 127.0.0.1
	exact sbench_runs10 "kvpull-stream-bench: --runs: 10 is out of range (1-9)"
	srun sbench_runs0 2 --runs 0 --addr 127.0.0.1
	exact sbench_runs0 "kvpull-stream-bench: --runs: 0 is out of range (1-9)"
	srun sbench_runsx 2 --runs 4294967296 --addr 127.0.0.1
	exact sbench_runsx "kvpull-stream-bench: --runs: '4294967296' is not a number"
	if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
		srun sbench_nodev 1 --case dense-layerwise --runs 1 \
			--addr 127.0.0.1
		exact sbench_nodev "stream-bench: dense-layerwise: producer rank 0: open: no RDMA device"
		has sbench_nodev err "stream-bench: dense-layerwise: the producer ranks did not start"
		# the first case that cannot start ends the run
		srun sbench_nodev_all 1 --runs 1 --addr 127.0.0.1
		n=$(wc -l <"$tmp/sbench_nodev_all.err")
		[ "$n" -eq 2 ] && ok ||
			bad "sbench_nodev_all: $n lines on stderr, want 2"
	else
		echo "test_tool: an RDMA device is present: kvpull-stream-bench's no-device checks skipped"
	fi
else
	bad "$sbench not built (make check-tool builds it)"
fi

# --version, --list
run version 0 --version
if [ "$(cat "$tmp/version.out")" = "kvpull-plan 0.2.0" ]; then ok; else
	bad "version: '$(cat "$tmp/version.out")'"
fi
run list 0 --list
has list out "llama-3.1-70b         80 layers, 8 KV heads x 128"
has list out "nemotron-h-8b          4 layers, 8 KV heads x 128, 24 mamba2 state layers (128 heads)"
has help out "/share/kvpull/kvpull-plan.schema.json"

# --svg: the file is written, the summary still printed (tests/check_svg.sh
# renders it).
run svg 0 --model llama-3.1-70b --remote-tp 8 --local-tp 2 --brief \
	--svg "$tmp/p.svg"
has svg out "group 0: full"
if grep -qF '>producer rank 3</text>' "$tmp/p.svg" &&
	grep -qF 'head 3 of 8, layers 0-79: 160 READs, 10.00 MiB' "$tmp/p.svg"; then
	ok
else
	bad "svg: no producer rank 3 row with its head, layers and READs"
fi
run svg_req0 2 --model llama-3.1-8b --svg "$tmp/q.svg" --svg-request 0
exact svg_req0 "kvpull-plan: --svg-request 0: a request needs at least 1 block"
run svg_dir 1 --model llama-3.1-8b --svg "$tmp/no/such/dir.svg"
has svg_dir err "--svg $tmp/no/such/dir.svg: No such file or directory"
# The legend, in every picture.
for want in "READs from one producer rank: its heads (or channels), layers, and the request's READs and bytes" \
	"replica: several consumer ranks read the same producer bytes, or some of them (GQA: consumer TP above the KV heads; MLA)"; do
	grep -qF "$want" "$tmp/p.svg" && ok || bad "svg: no legend '$want'"
done
# GQA: 8 KV heads on consumer TP 16, so consumer ranks 0 and 1 hold head 0
# and both read it from producer rank 0: that arrow is a replica.
run svg_gqa 0 --model llama-3.1-8b --remote-tp 2 --local-tp 16 --brief \
	--svg "$tmp/gqa.svg"
for want in "consumer holds head 0 of 8 (field k), replicated on consumer ranks 0-1 (GQA); 1024 READs for 16 blocks" \
	"head 0 of 8, layers 0-31: 1024 READs, 4.00 MiB" \
	">replica: consumer ranks 0-1 read the same producer bytes</text>"; do
	grep -qF "$want" "$tmp/gqa.svg" && ok || bad "svg_gqa: no '$want'"
done
n=$(grep -c '<line class="read replica"' "$tmp/gqa.svg")
[ "$n" -eq 1 ] && ok || bad "svg_gqa: $n replica arrows, want 1"
# Producer TP 16 holds each head twice; the consumers spread over the
# copies, so no bytes are read twice: no replica arrow.
run svg_copies 0 --model llama-3.1-8b --remote-tp 16 --local-tp 4 --brief \
	--svg "$tmp/copies.svg"
has_svg() { grep -qF "$2" "$tmp/$1.svg" && ok || bad "$1: no '$2' in the SVG"; }
has_svg copies "head 1 of 8 (held by producer ranks 2-3), layers 0-31: 64 READs, 4.00 MiB"
n=$(grep -c 'class="read replica"' "$tmp/copies.svg")
[ "$n" -eq 0 ] && ok || bad "svg_copies: $n replica arrows, want 0"
# MLA from one producer rank: every consumer rank reads the same latents.
run svg_mla 0 --model deepseek-v3 --remote-tp 1 --local-tp 4 --rank 2 \
	--brief --svg "$tmp/mla.svg"
has_svg mla ">replica: consumer ranks 0-3 read the same producer bytes</text>"
# --svg-all-ranks: a panel per consumer rank, each with its replica.
run svg_all 0 --model llama-3.1-8b --remote-tp 2 --local-tp 16 --brief \
	--svg "$tmp/all.svg" --svg-all-ranks
has_svg all "<title>llama-3.1-8b, producer TP 2 (flash_hnd) -&gt; consumer TP 16 ranks 0-15 (flash_hnd); max_sge 16, READ cap 2 GiB: an agent's defaults</title>"
has_svg all "16 consumer ranks, a panel each"
has_svg all ">consumer rank 15 of TP 16: 1 producer rank read from, 1024 READs, 4.00 MiB</text>"
has_svg all ">replica: consumer ranks 14-15 read the same producer bytes</text>"
n=$(grep -c '^<g id="rank-[0-9]*">$' "$tmp/all.svg")
[ "$n" -eq 16 ] && ok || bad "svg_all: $n panels, want 16"
n=$(grep -c '<line class="read replica"' "$tmp/all.svg")
[ "$n" -eq 16 ] && ok || bad "svg_all: $n replica arrows, want 16"
# The same from a spec file (tp_size 16): other ranks' layouts come from
# the spec's, and the panels are the preset's.
printf 'model = llama-3.1-8b\ntp_size = 16\ntp_rank = 5\nblock_tokens = 16\nnum_blocks = 1024\nkv_layout = flash_hnd\n' \
	>"$tmp/tp16.spec"
run svg_all_spec 0 --local-spec "$tmp/tp16.spec" --model llama-3.1-8b \
	--remote-tp 2 --brief --svg "$tmp/all_spec.svg" --svg-all-ranks
sed -n '/^<g id="rank-0">$/,$p' "$tmp/all.svg" >"$tmp/all.panels"
sed -n '/^<g id="rank-0">$/,$p' "$tmp/all_spec.svg" >"$tmp/all_spec.panels"
if [ -s "$tmp/all.panels" ] && cmp -s "$tmp/all.panels" "$tmp/all_spec.panels"; then
	ok
else
	bad "svg_all_spec: the spec's panels differ from the preset's"
fi
run svg_all_big 2 --model llama-3.1-8b --local-tp 32 --svg "$tmp/big.svg" \
	--svg-all-ranks
exact svg_all_big "kvpull-plan: --svg-all-ranks: consumer TP 32 is above 16, the most ranks one picture draws; draw one rank with --rank R"
[ ! -e "$tmp/big.svg" ] && ok || bad "svg_all_big: wrote the SVG"
run svg_all_nosvg 2 --model llama-3.1-8b --svg-all-ranks
exact svg_all_nosvg "kvpull-plan: --svg-all-ranks: give --svg FILE to draw the picture"
run no_plan 1 --model llama-3.1-8b --local-block 1 --remote-block 65537 --num-blocks 4
has no_plan err "cannot plan: malformed or incompatible peer data: group 0: block sizes 1 and 65537 have no usable common period"
# Block sizes that do not nest plan over their common period.
run no_nest 0 --model llama-3.1-8b --local-block 16 --remote-block 7 --layers 1
has no_nest out "period 112 tokens = 7 local : 16 remote"
run out_of_range 1 --model llama-3.1-8b --num-blocks 4 --request 8
exact out_of_range "kvpull-plan: cannot emit the request: block id out of range: group 0: local id 4 (entry 5 of the default local ids) is not below 4, the local engine's blocks in group 0"
printf 'model = llama-3.1-8b\nlayrs = 2\n' >"$tmp/bad.spec"
run bad_spec 1 --local-spec "$tmp/bad.spec" --model llama-3.1-8b
exact bad_spec "kvpull-plan: $tmp/bad.spec: line 2: unknown key 'layrs'"
run no_file 1 --local-spec "$tmp/missing.spec" --model llama-3.1-8b

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
