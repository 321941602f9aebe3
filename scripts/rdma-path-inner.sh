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
# the library posted before the window), and
# ib_read_bw with 16 and 128 READs outstanding (-o) and UCX's UCT rc_verbs
# get zcopy (ucx_perftest, 64 outstanding), the same READs each. The rxe
# hardware counters of every device are read before and after each run.
# One line per run:
#   path: tool=T devices=D size=S inflight=I MBps=X cpu_proc_s_per_GB=P
#     cpu_guest_s_per_GB=G dup_per_1k=U retry_per_1k=R
# inflight: READs in flight per queue pair at most (kvpull: its window in
# READs at that size, 2 queue pairs, or its send queue where there is no
# window: on one device, a loopback; ib_read_bw: -o, one queue pair);
# MBps: 10^6 bytes/s as the tool reports it; cpu_proc: user + system CPU
# of the tool's processes (both sides) per 10^9 bytes; cpu_guest: the
# whole guest's busy CPU time (/proc/stat: user, nice, system, irq,
# softirq; soft-RoCE runs in the kernel) per 10^9 bytes; dup: the
# responders' duplicate_request, retry: the requesters'
# completer_retry_err, each per 1,000 READs. "-" when the run failed (its
# log on stderr).
set -u

bench=$1 ndev=$2 rounds=$3
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

# kv SIZE READS [window options]: prints "mbps reads".
kv() {
	local s=$1 n=$2 kib=$(($1 / 1024)) blocks=256 req
	shift 2
	((s == 65536)) && blocks=128
	req=$((n / blocks / 2))
	timeout 300 "$bench" --addr "$KVP_ADDR0" "${src[@]}" \
		--port $((19500 + 10 * port++)) --page-kib "$kib" \
		--blocks "$blocks" --inflight 8 --requests "$req" "$@" \
		>/tmp/path.log 2>&1 || { cat /tmp/path.log >&2; return 0; }
	sed -n 's/^result: .* mbps=\([0-9.]*\) reads=\([0-9]*\) .*/\1 \2/p' \
		/tmp/path.log
}

# ib SIZE READS OUTS: prints "mbps reads".
ib() {
	local s=$1 n=$2 o=$3 a
	timeout 120 ib_read_bw -d "$KVP_DEV0" -x "$KVP_GIDX0" -F -s "$s" \
		-n "$n" -o "$o" >/tmp/path_srv.log 2>&1 &
	sleep 1
	timeout 120 ib_read_bw -d "$cdev" -x "$cgid" -F -s "$s" -n "$n" \
		-o "$o" "$KVP_ADDR0" >/tmp/path.log 2>&1
	wait
	a=$(awk -v s="$s" '$1 == s && NF >= 5 { print $4 * 1.048576 }' /tmp/path.log)
	[[ -n $a ]] || { cat /tmp/path.log /tmp/path_srv.log >&2; return 0; }
	echo "$a $n"
}

# ucx SIZE READS: prints "mbps reads".
ucx() {
	local s=$1 n=$2 a o=(-x rc_verbs -t get -D zcopy -O 64 -w 100 -f)
	timeout 120 ucx_perftest -d "$KVP_DEV0:1" "${o[@]}" -s "$s" -n "$n" \
		>/tmp/path_srv.log 2>&1 &
	sleep 1
	timeout 120 ucx_perftest "$KVP_ADDR0" -d "$cdev:1" "${o[@]}" -s "$s" \
		-n "$n" >/tmp/path.log 2>&1
	wait
	a=$(awk -v n="$n" '$1 == n && NF >= 8 { print $6 * 1.048576 }' /tmp/path.log |
		tail -n1)
	[[ -n $a ]] || { cat /tmp/path.log /tmp/path_srv.log >&2; return 0; }
	echo "$a $n"
}

# one TOOL SIZE READS INFLIGHT CMD...
one() {
	local tool=$1 s=$2 n=$3 inf=$4 d0 r0 b0 k0 d1 r1 b1 k1 out
	shift 4
	d0=$(hw duplicate_request) r0=$(hw completer_retry_err)
	b0=$(busy)
	kids
	k0=$(kids_now)
	"$@" >/tmp/path_out
	d1=$(hw duplicate_request) r1=$(hw completer_retry_err)
	b1=$(busy)
	kids
	k1=$(kids_now)
	out=$(</tmp/path_out)
	set -- $out
	if [[ -z ${1:-} || -z ${2:-} || $2 == 0 ]]; then
		echo "path: tool=$tool devices=$ndev size=$s inflight=$inf MBps=- cpu_proc_s_per_GB=- cpu_guest_s_per_GB=- dup_per_1k=- retry_per_1k=-"
		return
	fi
	awk -v t="$tool" -v d="$ndev" -v s="$s" -v i="$inf" -v m="$1" \
		-v n="$2" -v dp=$((d1 - d0)) -v rt=$((r1 - r0)) \
		-v bt=$((b1 - b0)) -v kp="$k0" -v kq="$k1" 'BEGIN {
		gb = n * s / 1e9
		printf "path: tool=%s devices=%s size=%s inflight=%s MBps=%.1f cpu_proc_s_per_GB=%.2f cpu_guest_s_per_GB=%.2f dup_per_1k=%.2f retry_per_1k=%.2f\n",
			t, d, s, i, m, (kq - kp) / gb, bt / 100 / gb,
			dp * 1000 / n, rt * 1000 / n
	}'
}

for ((r = 1; r <= rounds; r++)); do
	for s in 4096 65536; do
		n=8192
		((s == 65536)) && n=2048
		# kvpull's default window at this size: 16 READs, 64 KiB;
		# none on one device (a loopback queue pair: the send queue).
		w=$((65536 / s))
		((w > 16)) && w=16
		((ndev == 1)) && w=4095
		one kvpull "$s" "$n" "$w" kv "$s" "$n"
		one kvpull-nowindow "$s" "$n" 4095 kv "$s" "$n" --window 65535 \
			--window-bytes 1073741824
		one ib_read_bw "$s" "$n" 16 ib "$s" "$n" 16
		one ib_read_bw "$s" "$n" 128 ib "$s" "$n" 128
		one ucx "$s" "$n" 64 ucx "$s" "$n"
	done
done
