#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The side-by-side run of scripts/rdma-bench.sh, inside the soft-RoCE VM
# (or on a host with an RDMA device). Not meant to be run by hand: the
# arguments are rdma-bench.sh's.
#
#   rdma-bench-inner.sh BENCH ROUNDS REQUESTS BLOCKS 'PAIR ...' 'IDS ...'
#
# For each round and each row (pair x ids), runs every contender once and
# prints one line per run:
#   R|round|pair|ids|contender|mbps|read_bytes
# (mbps: 10^6 bytes/s; "-" when the run failed, with its log on stderr).
# Odd rounds run the contenders in one order, even rounds in the reverse,
# so that drift in the emulator hits all of them. ib_read_bw and
# ucx_perftest use the message size of kvpull's average READ in that row
# (from round 1, where kvpull runs first) and move the same bytes. Two
# more ib_read_bw runs (--post_list 16, and -q 4 with it) use the average
# READ of kvpull with coalescing off (no-coalesce, qps 1, round 1): what
# the device gives a poster that does no merging, so that the table can say
# how much any poster gains from larger READs there.
set -u

bench=$1 rounds=$2 requests=$3 blocks=$4
read -r -a pairs <<<"$5"
read -r -a idss <<<"$6"
kv=(kv1 kv2 kv4 nc1 nc2 nc4)
others=(ucx ib ib_pl ib_q4 ib_q4_pl ibn_pl ibn_q4_pl)
declare -A size=() bytes=() nsize=()
declare -A ibx=([ib]="" [ib_pl]="--post_list 16" [ib_q4]="-q 4"
	[ib_q4_pl]="-q 4 --post_list 16" [ibn_pl]="--post_list 16"
	[ibn_q4_pl]="-q 4 --post_list 16")
rev=()

# perftest and UCX time with rdtsc, and the guest finds the vCPUs' TSCs
# unsynchronised under TCG: pin each side to one vCPU (as rxe-vm.sh's
# self-test does).
cpu0() { taskset -c 0 "$@"; }
cpu1() { if [ "$(nproc)" -gt 1 ]; then taskset -c 1 "$@"; else "$@"; fi; }

# serve PORT LOG CMD...: starts the server CMD on vCPU 0, its output in
# LOG, and waits until it listens on TCP port PORT (hex): the clients do
# not retry. Returns 1 (server killed, its log on stderr) if it never does.
serve() {
	local port=$1 log=$2 i=0 pid
	shift 2
	cpu0 timeout 120 "$@" >"$log" 2>&1 &
	pid=$!
	until grep -q ":$port 00000000:0000 0A" /proc/net/tcp; do
		((++i < 200)) && kill -0 "$pid" 2>/dev/null && sleep 0.1 &&
			continue
		echo "$1's server never listened" >&2
		cat "$log" >&2
		kill "$pid" 2>/dev/null
		wait
		return 1
	done
}

# MiB/s (perftest's and UCX's MB/sec, checked against their message
# rates) to 10^6 bytes/s; nothing unless a positive number.
mib() {
	awk -v v="$1" 'BEGIN { if (v ~ /^[0-9]+(\.[0-9]+)?$/ && v + 0 > 0)
		printf "%.2f", v * 1.048576 }'
}

# run_kv PAIR IDS CONTENDER: prints mbps and avg_read, or nothing.
run_kv() {
	local q=${3#??} nc=()
	[[ $3 == nc* ]] && nc=(--no-coalesce)
	timeout 300 "$bench" --pair "$1" --ids "$2" --qps "$q" ${nc[@]+"${nc[@]}"} \
		--requests "$requests" --blocks "$blocks" >/tmp/kv.log 2>&1 ||
		{ cat /tmp/kv.log >&2; return 0; }
	sed -n 's/^result: bytes=\([0-9]*\) .* mbps=\([0-9.]*\) .* avg_read=\([0-9]*\)$/\2 \3 \1/p' \
		/tmp/kv.log
}

# run_ib SIZE BYTES EXTRA...: ib_read_bw, same bytes over all its QPs.
run_ib() {
	local s=$1 n q=1 a
	shift
	[[ " $* " == *" -q 4 "* ]] && q=4
	n=$(($1 / s / q))
	((n >= 16)) || n=16
	# perftest wants a multiple of the post list (16); the same for all.
	n=$(((n + 15) / 16 * 16))
	serve 4853 /tmp/ib_srv.log ib_read_bw -d "$KVP_DEV0" -x "$KVP_GIDX0" -F \
		-s "$s" -n "$n" "${@:2}" || return 0
	cpu1 timeout 120 ib_read_bw -d "$KVP_DEV0" -x "$KVP_GIDX0" -F -s "$s" \
		-n "$n" "${@:2}" "$KVP_ADDR0" >/tmp/ib.log 2>&1
	wait
	a=$(mib "$(awk -v s="$s" '$1 == s && NF >= 5 { print $4 }' /tmp/ib.log)")
	[[ -n $a ]] || { cat /tmp/ib.log /tmp/ib_srv.log >&2; return 0; }
	echo "$a $s"
}

# run_ucx SIZE BYTES: UCT rc_verbs get zcopy, 64 outstanding.
run_ucx() {
	local s=$1 n a o=(-d "$KVP_DEV0:1" -x rc_verbs -t get -D zcopy -O 64 -w 100 -f)
	n=$(($2 / s))
	((n >= 100)) || n=100
	serve 3419 /tmp/ucx_srv.log ucx_perftest "${o[@]}" -s "$s" -n "$n" ||
		return 0
	cpu1 timeout 120 ucx_perftest "$KVP_ADDR0" "${o[@]}" -s "$s" -n "$n" \
		>/tmp/ucx.log 2>&1
	wait
	# -f: iterations, 3 latencies, bandwidth average and overall, ...
	a=$(mib "$(awk -v n="$n" '$1 == n && NF >= 8 { print $6 }' /tmp/ucx.log |
		tail -n1)")
	[[ -n $a ]] || { cat /tmp/ucx.log /tmp/ucx_srv.log >&2; return 0; }
	echo "$a $s"
}

# run ROUND PAIR IDS CONTENDER: prints mbps and the READ size, or nothing.
run() {
	local k=$2/$3
	case $4 in
	kv*|nc*) run_kv "$2" "$3" "$4" ;;
	ucx) run_ucx "${size[$k]}" "${bytes[$k]}" ;;
	ibn*) run_ib "${nsize[$k]}" "${bytes[$k]}" ${ibx[$4]} ;;
	*) run_ib "${size[$k]}" "${bytes[$k]}" ${ibx[$4]} ;;
	esac
}

# one ROUND PAIR IDS CONTENDER
one() {
	local r=$1 p=$2 i=$3 c=$4 out k=$2/$3
	out=$(run "$@")
	if [[ -z $out ]]; then
		# perftest gives up on the guest's clock now and then
		# ("Correlation coefficient r^2 < 0.9": 0.00 MB/s): one retry,
		# said on stderr.
		echo "round $r, $p, $i ids, $c: no number, retrying once" >&2
		out=$(run "$@")
	fi
	set -- $out
	# The message size comes from kvpull's first coalesced run, which
	# also says what was cut to fit the VM.
	if [[ $c == kv* && -n ${2:-} && -z ${size[$k]:-} ]]; then
		size[$k]=$2 bytes[$k]=$3
		grep -E "^pair |^  cut to fit" /tmp/kv.log
	fi
	[[ $c == nc1 && -n ${2:-} && -z ${nsize[$k]:-} ]] && nsize[$k]=$2
	echo "R|$r|$p|$i|$c|${1:--}|${2:--}"
}

for ((r = 1; r <= rounds; r++)); do
	order=("${kv[@]}" "${others[@]}")
	if ((r % 2 == 0)); then
		for ((j = ${#order[@]} - 1; j >= 0; j--)); do rev+=("${order[j]}"); done
		order=("${rev[@]}")
		rev=()
	fi
	for p in "${pairs[@]}"; do
		for i in "${idss[@]}"; do
			for c in "${order[@]}"; do
				if [[ ($c == ibn* && -z ${nsize[$p/$i]:-}) ||
					($c != kv* && $c != nc* && -z ${size[$p/$i]:-}) ]]; then
					echo "R|$r|$p|$i|$c|-|-"
					echo "$p $i: no kvpull READ size, $c skipped" >&2
					continue
				fi
				one "$r" "$p" "$i" "$c"
			done
		done
	done
done
