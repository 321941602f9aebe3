#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Instructions per READ of the consumer's post path, measured with
# valgrind's callgrind (user space, deterministic) inside one soft-RoCE VM
# boot: kvpull-rdma-bench runs twice under callgrind, with N and 2N timed
# requests, collecting only inside kvp_agent_pull_from() (the check of the
# ids and their copy into the request slot, emission into the send
# queues' work requests, ibv_post_send). The difference between the two
# runs, divided by the difference in READs, is the marginal cost of a READ
# with the agent's setup and the warm-up request cancelled out. The
# instructions are split by object: kvpull's own code (the statically
# linked library), the verbs provider (librxe: building WQEs, the doorbell
# system call) and the C library. The script fails when a READ was posted
# outside kvp_agent_pull_from() (from kvp_agent_poll(), for want of send
# queue room): the figure would then miss it.
#
#   scripts/pull-cost.sh [N [-- kvpull-rdma-bench options]]   N: 8
#
# Defaults: llama-3.1-8b TP 1 -> 1 FLASH_HND, 64 blocks of 64 KiB pages per
# request, random ids (one READ per page, one SGE each), 1 request in
# flight, no READ window (--window 65535 --window-bytes 4294967295; the
# default has none on one device, a loopback, but across two devices or
# on hardware its 64 KiB per queue pair would leave all but a READ per
# queue pair to be posted from kvp_agent_poll(), outside what is
# measured, by the same code).
# Pass "-- --ids contiguous" for coalesced READs.
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:-8}
[[ $n =~ ^[1-9][0-9]?$ ]] || {
	echo "usage: scripts/pull-cost.sh [N 1-99 [-- bench options]]" >&2
	exit 2
}
shift || true
[[ ${1:-} == -- ]] && shift
extra="$*"

bash scripts/install-deps.sh
make -s BUILD=build build/tools/kvpull-rdma-bench
command -v callgrind_annotate >/dev/null || {
	echo "pull-cost: valgrind is not installed" >&2
	exit 1
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[[ -n ${KVP_PULL_COST_KEEP:-} ]] && trap - EXIT && echo "pull-cost: keeping $out" >&2

bench=$PWD/build/tools/kvpull-rdma-bench
inner='
set -e
cd /tmp
for r in '"$n"' '"$((2 * n))"'; do
	VALGRIND_LIB=/usr/libexec/valgrind valgrind.bin --tool=callgrind \
		--toggle-collect=kvp_agent_pull_from \
		--callgrind-out-file=/tmp/cg.$r.%p '"$bench"' --blocks 64 \
		--inflight 1 --window 65535 --window-bytes 4294967295 \
		--requests $r '"$extra"' >/tmp/bench.$r 2>/tmp/vg.$r
	echo "== bench $r"
	cat /tmp/bench.$r
	# The consumer is the process whose profile collected anything.
	for f in /tmp/cg.$r.*; do
		grep -q "^summary: [1-9]" $f || continue
		echo "== profile $r"
		cat $f
		echo "== end"
	done
done
'
KVP_VM_MEM=${KVP_VM_MEM:-2048} scripts/rxe-vm.sh --devices 1 --timeout 900 \
	--files "/usr/bin/valgrind.bin /usr/libexec/valgrind $bench" \
	-- "$inner" >"$out/vm.log" 2>&1 || {
	tail -40 "$out/vm.log"
	exit 1
}
for r in $n $((2 * n)); do
	awk -v r=$r '$0 == "== profile " r { f = 1; next } /^== end/ { f = 0 }
		f' "$out/vm.log" >"$out/cg.$r"
	awk -v r=$r '$0 == "== bench " r { f = 1; next } /^== / { f = 0 }
		f' "$out/vm.log" >"$out/bench.$r"
	[[ -s $out/cg.$r && -s $out/bench.$r ]] || {
		tail -40 "$out/vm.log"
		exit 1
	}
done

# Self instructions per object: kvpull (the bench binary, which links
# libkvpull.a), the provider, libc, the rest.
split() {
	callgrind_annotate --auto=no --threshold=100 --show-percs=no "$1" 2>/dev/null |
		awk -v bin="$bench" '
		/^ *[0-9,]+  / && /\[/ {
			v = $1; gsub(",", "", v)
			if (index($0, "[" bin "]")) k += v
			else if ($0 ~ /librxe|libibverbs|libmlx|rdmav/) p += v
			else if ($0 ~ /libc\.so/) c += v
			else o += v
		}
		END { printf "%d %d %d %d\n", k, p, c, o }'
}
reads() { sed -n 's/^ *READs \([0-9]*\).*/\1/p' "$1"; }
queued() { sed -n 's/.*waited for SQ room \([0-9]*\).*/\1/p' "$1"; }
for r in $n $((2 * n)); do
	[[ $(queued "$out/bench.$r") == 0 ]] || {
		echo "pull-cost: READs waited for send queue room (posted from" \
			"kvp_agent_poll): raise --sq or lower --inflight" >&2
		cat "$out/bench.$r" >&2
		exit 1
	}
done
read -r k1 p1 c1 o1 < <(split "$out/cg.$n")
read -r k2 p2 c2 o2 < <(split "$out/cg.$((2 * n))")
r1=$(reads "$out/bench.$n") r2=$(reads "$out/bench.$((2 * n))")
head -2 "$out/bench.$n"
awk -v k1=$k1 -v k2=$k2 -v p1=$p1 -v p2=$p2 -v c1=$c1 -v c2=$c2 \
	-v o1=$o1 -v o2=$o2 -v r1=$r1 -v r2=$r2 'BEGIN {
	d = r2 - r1
	if (d <= 0) { print "pull-cost: no READs between the runs"; exit 1 }
	printf "instructions per READ (callgrind, inside kvp_agent_pull_from, %d READs marginal):\n", d
	printf "  kvpull %.1f, verbs provider %.1f, libc %.1f, other %.1f\n",
		(k2 - k1) / d, (p2 - p1) / d, (c2 - c1) / d, (o2 - o1) / d
}'
echo "functions, the run with $((2 * n)) requests (self instructions):"
callgrind_annotate --auto=no --threshold=99 --show-percs=no "$out/cg.$((2 * n))" 2>/dev/null |
	grep -E '^ *[0-9,]+  .*\[' | sed "s|\[$bench\]|[kvpull]|" | head -16
