#!/bin/bash
# SPDX-License-Identifier: MIT
#
# kvpull-rdma-bench beside perftest's ib_read_bw, in one soft-RoCE VM run
# (or directly on a machine with an RDMA device: KVP_RDMA_DIRECT=1, see
# scripts/README.md). Both move the same bytes in 64 KiB READs: kvpull as
# KV-shaped requests (128 random blocks x 2 regions per request, 8 requests
# in flight, one agent per engine rank), ib_read_bw as one stream of READs.
# Rounds alternate the two so that drift in the emulator hits both; each
# round prints both throughputs and their ratio, and the last line gives
# the medians.
#
#   scripts/rdma-bench.sh [ROUNDS [REQUESTS]]     defaults: 3 rounds, 32
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-3}
requests=${2:-32}
[[ $rounds =~ ^[1-9][0-9]?$ && $requests =~ ^[1-9][0-9]{0,3}$ ]] || {
	echo "usage: scripts/rdma-bench.sh [ROUNDS 1-99 [REQUESTS 1-9999]]" >&2
	exit 2
}
reads=$((requests * 128 * 2))

bash scripts/install-deps.sh
make -s BUILD=build build/tools/kvpull-rdma-bench

# Runs inside the VM (bash, busybox awk). ib_read_bw's server and client
# share rxe0; kvpull's producer and consumer do too.
inner='
set -e
ib=() kv=()
for r in $(seq 1 '"$rounds"'); do
	ib_read_bw -d $KVP_DEV0 -x $KVP_GIDX0 -s 65536 -n '"$reads"' -F \
		>/tmp/ib_srv.log 2>&1 &
	sleep 1
	ib_read_bw -d $KVP_DEV0 -x $KVP_GIDX0 -s 65536 -n '"$reads"' -F \
		$KVP_ADDR0 >/tmp/ib.log 2>&1
	wait
	build/tools/kvpull-rdma-bench --requests '"$requests"' >/tmp/kv.log
	a=$(awk "\$1 == 65536 { print \$4 }" /tmp/ib.log)
	b=$(sed -n "s/.*throughput: .* = \([0-9.]*\) MB\/s.*/\1/p" /tmp/kv.log)
	[ -n "$a" ] && [ -n "$b" ] || { cat /tmp/ib.log /tmp/kv.log; exit 1; }
	ib+=("$a") kv+=("$b")
	awk -v r=$r -v a=$a -v b=$b "BEGIN { printf \"round %d: kvpull %.1f MB/s, ib_read_bw %.1f MB/s, ratio %.2f\n\", r, b, a, b / a }"
	grep -E "READs|post path|wall|emission" /tmp/kv.log | sed "s/^/  /"
done
med() { printf "%s\n" "$@" | sort -n | awk "{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }"; }
a=$(med "${ib[@]}") b=$(med "${kv[@]}")
awk -v a=$a -v b=$b -v n='"$rounds"' "BEGIN { printf \"median of %d rounds, %d x 64 KiB READs each: kvpull %.1f MB/s, ib_read_bw %.1f MB/s, ratio %.2f\n\", n, '"$reads"', b, a, b / a }"
'

exec scripts/rxe-vm.sh --devices 1 --timeout $((120 + rounds * 120)) \
	--files "$PWD/build/tools/kvpull-rdma-bench" -- "$inner"
