#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The --path run of scripts/rdma-bench.sh, inside the soft-RoCE VM (or on
# a host with RDMA devices). Not meant to be run by hand: the arguments
# are rdma-bench.sh's.
#
#   rdma-path-inner.sh BENCH DEVICES ROUNDS
#
# Issue 35's cases: READs of 4 KiB and 64 KiB between a producer on the
# first device and a consumer on the second (DEVICES 2: rxe0 and rxe1 over
# a veth pair) or on the same one (DEVICES 1), for kvpull-rdma-bench with
# the library's READ window (tool=kvpull), without one (tool=kvpull-nowindow:
# --window 65535 --window-bytes 1 GiB, the send queue the only bound, as
# the library posted before the window); ib_read_bw with 16 and 128 READs
# outstanding (-o; ib_read_bw-e: -o 16 -e, asleep on its completion
# channel; ib_read_bw-q2: kvpull's shape, 2 queue pairs with kvpull's
# window as -o each, the device holding the rest in its send queue); and
# UCX's UCT rc_verbs get zcopy (ucx_perftest, 64 outstanding); the same
# READs each. Every case runs twice, with READS/8 and READS READs, the rxe
# hardware counters of every device and the CPU read around each run.
# One line per case:
#   path: tool=T devices=D size=S inflight=I MBps=X cpu_proc_s_per_GB=P
#     cpu_guest_s_per_GB=G dup_per_1k=U retry_per_1k=R
# inflight: READs in flight per queue pair at most (kvpull: its window in
# READs at that size, 2 queue pairs, or its send queue where there is no
# window: on one device, a loopback; ib_read_bw: -o, one queue pair but
# for -q2); MBps: 10^6 bytes/s as the tool reports it, the long run's;
# cpu_proc: user + system CPU of the tool's processes (both sides),
# cpu_guest: the whole guest's busy CPU time (/proc/stat: user, nice,
# system, irq, softirq; soft-RoCE runs in the kernel), each the long
# run's minus the short run's over the difference of their bytes (10^9):
# the CPU of the bytes moved, each tool's start (processes, memory,
# registration, connection, kvpull's warm-up request) cancelled out, as
# it is about 1-2 CPU-s a run, half of what a run of 2,048 READs of
# 64 KiB costs; dup: the responders' duplicate_request, retry: the
# requesters' completer_retry_err, the long run's, each per 1,000 READs
# (kvpull's untimed warm-up request's counted). "-" when a run failed
# (its log on stderr). Then
#   path-whole: ... the long run's whole CPU per GB, start included, and
#     the start's CPU seconds (kvpull: the per-READ counters follow);
# and per round and size,
#   path-goal: round=R size=S kvpull_MBps=X best_MBps=Y(T) ...
#     kvpull_cpu_guest=G best_cpu_guest=H(T) met=yes|no
# issue 35's second goal: kvpull's cpu_guest_s_per_GB at most the lowest
# of the other tools', its MBps at least the highest of theirs.
#
# Environment (rdma-bench.sh passes them; defaults are the full run):
#   KVP_PATH_SIZES  READ sizes [4096 65536]
#   KVP_PATH_CASES  tools, of: kvpull kvpull-sleep (--consumer-sleep 1)
#                   kvpull-qps4 (--qps 4) kvpull-2x (twice the window)
#                   kvpull-wN (--window N, N READs' bytes)
#                   kvpull-nowindow ib16 ib128 ib16e ibk ucx [kvpull
#                   kvpull-nowindow ib16 ib128 ib16e ibk ucx]
#   KVP_PATH_READS  READs per run at 64 KiB (4x that at 4 KiB) [2048]
#   KVP_PATH_PERF   1: after the rounds, each case once more under
#                   `perf record -a` (guest-wide, kernel and user), its
#                   top symbols printed [0]
set -u

bench=$1 ndev=$2 rounds=$3
sizes=${KVP_PATH_SIZES:-4096 65536}
cases=${KVP_PATH_CASES:-kvpull kvpull-nowindow ib16 ib128 ib16e ibk ucx}
reads64=${KVP_PATH_READS:-2048}
if [[ $ndev == 2 ]]; then
	cdev=$KVP_DEV1 cgid=$KVP_GIDX1 src=(--src "$KVP_ADDR1")
else
	cdev=$KVP_DEV0 cgid=$KVP_GIDX0 src=()
fi
port=0

# Sum of one hardware counter over every rxe device.
hw() {
	local s=0 f
	for f in /sys/class/infiniband/*/ports/1/hw_counters/"$1"; do
		[[ -r $f ]] && s=$((s + $(<"$f")))
	done
	echo "$s"
}
# Busy ticks of the whole guest (USER_HZ).
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
# Children's user + system seconds, from bash's `times` second line (in
# this shell: a command substitution would be a subshell of no children).
kids() { times >/tmp/path_times; }
kids_now() {
	awk 'NR == 2 { gsub(/[ms]/, " "); print $1 * 60 + $2 + $3 * 60 + $4 }' \
		/tmp/path_times
}

# kv SIZE READS [kvpull-rdma-bench options]: prints "mbps reads", reads
# counting the untimed warm-up request's too (its CPU and counters are in
# the run's).
kv() {
	local s=$1 n=$2 kib=$(($1 / 1024)) blocks=256 req
	shift 2
	((s == 65536)) && blocks=128
	req=$((n / blocks / 2))
	((req > 0)) || req=1 # a short run of few READs: one request
	timeout 300 "$bench" --addr "$KVP_ADDR0" "${src[@]}" \
		--port $((19500 + 10 * port++)) --page-kib "$kib" \
		--blocks "$blocks" --inflight 8 --requests "$req" "$@" \
		>/tmp/path.log 2>&1 || { cat /tmp/path.log >&2; return 0; }
	awk '/warm-up request/ { for (i = 1; i <= NF; i++) if ($i == "READs") w = $(i + 1) + 0 }
		/^result: / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			print v["mbps"], v["reads"] + w }' /tmp/path.log
}

# ib SIZE READS [client options]: prints "mbps reads". With -q Q (queue
# pairs), -n is per queue pair: READS / Q each.
ib() {
	local s=$1 n=$2 a q=1 o
	shift 2
	for o in "$@"; do
		[[ ${prev:-} == -q ]] && q=$o
		local prev=$o
	done
	timeout 300 ib_read_bw -d "$KVP_DEV0" -x "$KVP_GIDX0" -F -s "$s" \
		-n $((n / q)) "$@" >/tmp/path_srv.log 2>&1 &
	sleep 1
	timeout 300 ib_read_bw -d "$cdev" -x "$cgid" -F -s "$s" -n $((n / q)) \
		"$@" "$KVP_ADDR0" >/tmp/path.log 2>&1
	wait
	a=$(awk -v s="$s" '$1 == s && NF >= 5 { print $4 * 1.048576 }' /tmp/path.log)
	[[ -n $a ]] || { cat /tmp/path.log /tmp/path_srv.log >&2; return 0; }
	echo "$a $n"
}

# ucx SIZE READS: prints "mbps reads".
ucx() {
	local s=$1 n=$2 a o=(-x rc_verbs -t get -D zcopy -O 64 -w 100 -f)
	timeout 300 ucx_perftest -d "$KVP_DEV0:1" "${o[@]}" -s "$s" -n "$n" \
		>/tmp/path_srv.log 2>&1 &
	sleep 1
	timeout 300 ucx_perftest "$KVP_ADDR0" -d "$cdev:1" "${o[@]}" -s "$s" \
		-n "$n" >/tmp/path.log 2>&1
	wait
	a=$(awk -v n="$n" '$1 == n && NF >= 8 { print $6 * 1.048576 }' /tmp/path.log |
		tail -n1)
	[[ -n $a ]] || { cat /tmp/path.log /tmp/path_srv.log >&2; return 0; }
	echo "$a $n"
}

# measure FN SIZE READS [args]: runs `FN SIZE READS args`; prints "mbps
# reads dup retry busy_ticks proc_s" ("-" for mbps when it failed).
measure() {
	local fn=$1 s=$2 n=$3 d0 r0 b0 k0 d1 r1 b1 k1 out
	shift 3
	d0=$(hw duplicate_request) r0=$(hw completer_retry_err)
	b0=$(busy)
	kids
	k0=$(kids_now)
	"$fn" "$s" "$n" "$@" >/tmp/path_out
	d1=$(hw duplicate_request) r1=$(hw completer_retry_err)
	b1=$(busy)
	kids
	k1=$(kids_now)
	out=$(</tmp/path_out)
	set -- $out
	if [[ -z ${1:-} || -z ${2:-} || $2 == 0 ]]; then
		echo "- 0 0 0 0 0"
		return
	fi
	echo "$1 $2 $((d1 - d0)) $((r1 - r0)) $((b1 - b0)) $(awk -v a="$k0" -v b="$k1" 'BEGIN { print b - a }')"
}

# one TOOL SIZE READS INFLIGHT FN [args]: the case run twice, with READS/8
# and READS READs; one path line. MBps and the counters are the long
# run's; CPU per GB is the difference of the two runs' CPU over the
# difference of their bytes: what the tool spends per byte moved, its
# setup (processes, memory, registration, connection) cancelled out. A
# second line (path-whole:) gives the long run's whole CPU per GB, setup
# included, and the setup's CPU seconds.
one() {
	local tool=$1 s=$2 n=$3 inf=$4 fn=$5 m0 m1
	shift 5
	m0=$(measure "$fn" "$s" $((n / 8)) "$@")
	m1=$(measure "$fn" "$s" "$n" "$@")
	awk -v t="$tool" -v d="$ndev" -v s="$s" -v i="$inf" -v a="$m0" \
		-v b="$m1" 'BEGIN {
		split(a, x, " "); split(b, y, " ")
		if (x[1] == "-" || y[1] == "-" || y[2] <= x[2]) {
			printf "path: tool=%s devices=%s size=%s inflight=%s MBps=- cpu_proc_s_per_GB=- cpu_guest_s_per_GB=- dup_per_1k=- retry_per_1k=-\n", t, d, s, i
			exit
		}
		gb = (y[2] - x[2]) * s / 1e9
		pp = (y[6] - x[6]) / gb
		pg = (y[5] - x[5]) / 100 / gb
		printf "path: tool=%s devices=%s size=%s inflight=%s MBps=%.1f cpu_proc_s_per_GB=%.2f cpu_guest_s_per_GB=%.2f dup_per_1k=%.2f retry_per_1k=%.2f\n",
			t, d, s, i, y[1], pp, pg, y[3] * 1000 / y[2],
			y[4] * 1000 / y[2]
		g = y[2] * s / 1e9
		sp = y[6] - (y[6] - x[6]) * y[2] / (y[2] - x[2])
		sg = (y[5] - (y[5] - x[5]) * y[2] / (y[2] - x[2])) / 100
		printf "path-whole: tool=%s size=%s reads=%d whole_cpu_proc_s_per_GB=%.2f whole_cpu_guest_s_per_GB=%.2f setup_cpu_proc_s=%.2f setup_cpu_guest_s=%.2f short_run_MBps=%s short_dup=%d short_retry=%d\n",
			t, s, y[2], y[6] / g, y[5] / 100 / g, sp, sg, x[1],
			x[3], x[4]
	}'
}

# run CASE SIZE: one case at one READ size.
run() {
	local c=$1 s=$2 n w
	n=$((reads64 * 4))
	((s == 65536)) && n=$reads64
	# kvpull's default window at this size: 16 READs, 64 KiB; none on
	# one device (a loopback queue pair: the send queue).
	w=$((65536 / s))
	((w > 16)) && w=16
	((ndev == 1)) && w=4095
	case $c in
	kvpull) one kvpull "$s" "$n" "$w" kv ;;
	kvpull-sleep) one kvpull-sleep "$s" "$n" "$w" kv --consumer-sleep 1 ;;
	kvpull-qps4) one kvpull-qps4 "$s" "$n" "$w" kv --qps 4 ;;
	kvpull-2x) one kvpull-2x "$s" "$n" $((w * 2)) kv --window 32 \
		--window-bytes $((s * w * 2)) ;;
	kvpull-w[1-9]*) one "$c" "$s" "$n" "${c#kvpull-w}" kv \
		--window "${c#kvpull-w}" --window-bytes $((s * ${c#kvpull-w})) ;;
	kvpull-nowindow) one kvpull-nowindow "$s" "$n" 4095 kv \
		--window 65535 --window-bytes 1073741824 ;;
	ib16) one ib_read_bw "$s" "$n" 16 ib -o 16 ;;
	ib128) one ib_read_bw "$s" "$n" 128 ib -o 128 ;;
	ib16e) one ib_read_bw-e "$s" "$n" 16 ib -o 16 -e ;;
	# kvpull's shape: 2 queue pairs, kvpull's window in READs each as
	# the QP's max_rd_atomic (-o): the device holds the rest in its send
	# queue, where kvpull's agent holds them.
	ibk) one ib_read_bw-q2 "$s" "$n" "$w" ib -q 2 -o "$w" ;;
	ucx) one ucx "$s" "$n" 64 ucx ;;
	*) echo "rdma-path-inner: unknown case $c" >&2 ;;
	esac
	[[ $c == kvpull* ]] &&
		grep -E "doorbells|consumer loop" /tmp/path.log | sed "s/^/  $c: /"
	return 0
}

# goal ROUND SIZE: issue 35's second goal for this round and size, from
# the path lines in /tmp/path_round: kvpull's cpu_guest_s_per_GB at most
# the lowest of the other tools' (ib_read_bw, ucx; kvpull-* are kvpull),
# its MBps at least the highest of theirs.
goal() {
	awk -v r="$1" -v s="$2" '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		if (v["MBps"] == "-") next
		if (v["tool"] == "kvpull") { km = v["MBps"]; kc = v["cpu_guest_s_per_GB"]; next }
		if (v["tool"] ~ /^kvpull/) next
		if (om == "" || v["MBps"] + 0 > om + 0) { om = v["MBps"]; ot = v["tool"] "/" v["inflight"] }
		if (oc == "" || v["cpu_guest_s_per_GB"] + 0 < oc + 0) { oc = v["cpu_guest_s_per_GB"]; ct = v["tool"] "/" v["inflight"] }
	} END {
		if (km == "" || om == "") { print "path-goal: round=" r " size=" s " met=-"; exit }
		printf "path-goal: round=%s size=%s kvpull_MBps=%s best_MBps=%s(%s) kvpull_cpu_guest=%s best_cpu_guest=%s(%s) met=%s\n",
			r, s, km, om, ot, kc, oc, ct,
			(km + 0 >= om + 0 && kc + 0 <= oc + 0) ? "yes" : "no"
	}' /tmp/path_round
}

for ((r = 1; r <= rounds; r++)); do
	for s in $sizes; do
		: >/tmp/path_round
		for c in $cases; do
			# Not in a pipe: run counts ports in this shell.
			run "$c" "$s" >/tmp/path_one
			cat /tmp/path_one
			cat /tmp/path_one >>/tmp/path_round
		done
		grep '^path: ' /tmp/path_round >/tmp/path_round.p
		mv /tmp/path_round.p /tmp/path_round
		goal "$r" "$s"
	done
done
# Where the guest's CPU goes: each case once more with perf sampling the
# whole guest (cpu-clock: TCG has no PMU), its top symbols and commands.
if [[ ${KVP_PATH_PERF:-0} == 1 ]] && command -v perf >/dev/null; then
	for s in $sizes; do
		for c in $cases; do
			perf record -q -a -g -F 499 -o /tmp/perf.data \
				>/dev/null 2>&1 &
			p=$!
			sleep 1
			run "$c" "$s" >/tmp/path_one
			sed "s/^/perf-run: /" /tmp/path_one
			kill -INT $p
			wait $p
			echo "perf: case=$c size=$s: by command and object"
			perf report -i /tmp/perf.data --stdio --no-children \
				--sort comm,dso -g none 2>/dev/null |
				grep -v '^#' | grep -v '^$' | head -n 12
			echo "perf: case=$c size=$s: by symbol"
			perf report -i /tmp/perf.data --stdio --no-children \
				--sort sym -g none 2>/dev/null |
				grep -v '^#' | grep -v '^$' | head -n 40
		done
	done
fi
