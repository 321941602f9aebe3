#!/bin/sh
# run-pair.sh: runs examples/producer.c and examples/consumer.c against each
# other on one RDMA device: starts the producer, waits until it listens,
# runs the consumer, and exits 0 only if both exit 0.
#
#   run-pair.sh PRODUCER CONSUMER [ADDR [PORT]]
#
# ADDR defaults to $KVP_ADDR0 (set by scripts/rxe-vm.sh), PORT to 18900.
# KVPULL_SECRET, if set, is passed to both.
set -u
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
	echo "usage: run-pair.sh PRODUCER CONSUMER [ADDR [PORT]]" >&2
	exit 2
fi
prod=$1 cons=$2 addr=${3:-${KVP_ADDR0:-}} port=${4:-18900}
if [ -z "$addr" ]; then
	echo "run-pair.sh: no address (give ADDR or set KVP_ADDR0)" >&2
	exit 2
fi
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT

"$prod" "$addr" "$port" >"$log" &
pid=$!
i=0
until grep -q '^producer: listening' "$log"; do
	if ! kill -0 "$pid" 2>/dev/null || [ $i -ge 300 ]; then
		cat "$log"
		echo "run-pair.sh: the producer did not start listening" >&2
		kill "$pid" 2>/dev/null
		wait "$pid"
		exit 1
	fi
	sleep 0.1
	i=$((i + 1))
done
"$cons" "$addr" "$port"
crc=$?
wait "$pid"
prc=$?
cat "$log"
echo "run-pair.sh: producer exit $prc, consumer exit $crc"
# One case: the pair, counted by scripts/test.sh.
if [ $prc -eq 0 ] && [ $crc -eq 0 ]; then
	echo "1 passed, 0 failed"
	exit 0
fi
echo "0 passed, 1 failed"
exit 1
