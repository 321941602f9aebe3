#!/bin/bash
# SPDX-License-Identifier: MIT
#
# kvpull-rdma-bench beside perftest's ib_read_bw (and UCX), in one soft-RoCE
# VM run (or directly on a machine with an RDMA device: KVP_RDMA_DIRECT=1,
# see scripts/README.md).
#
#   scripts/rdma-bench.sh [ROUNDS [REQUESTS]]     defaults: 3 rounds, 32
#
# Both move the same bytes in 64 KiB READs: kvpull as KV-shaped requests
# (128 random blocks x 2 regions per request, 8 requests in flight, one
# agent per engine rank), ib_read_bw as one stream of READs. Rounds
# alternate the two so that drift in the emulator hits both; each round
# prints both throughputs and their ratio, and the last line gives the
# medians.
#
#   scripts/rdma-bench.sh --side-by-side [--rounds N] [--requests N]
#                         [--blocks N] [--pair NAME]... [--ids MODE]...
#   scripts/rdma-bench.sh --side-by-side --devices 1|2 [--rounds N]
#   scripts/rdma-bench.sh --smoke
#   scripts/rdma-bench.sh --stream [CASE]
#   scripts/rdma-bench.sh --python
#   scripts/rdma-bench.sh --storm [N [kvpull-storm options]]
#   scripts/rdma-bench.sh --races [--trials N] [--seed S] [--window W] [--read-window R]
#   scripts/rdma-bench.sh --model [model.py size options]
#   scripts/rdma-bench.sh --inferencex [run_kv.py options]
#
# Side by side on KV-shaped workloads of real model pairs (kvpull-rdma-bench
# --pair; default: llama-3.1-70b-tp8to2-hnd, llama-3.1-70b-tp4to8-nhd,
# nemotron-h-8b-tp2to1-hnd), random and contiguous block ids, medians of
# --rounds rounds (default 3): kvpull with 1, 2 and 4 queue pairs per
# producer rank, kvpull with coalescing off (KVP_PLAN_NO_COALESCE, one READ
# per block per region, as NIXL-style connectors post) at 1, 2 and 4 queue
# pairs, UCX's UCT rc_verbs get zcopy (ucx_perftest) and ib_read_bw with and
# without --post_list 16 and with -q 4, at the message size of kvpull's
# average READ in that row and the same bytes, and ib_read_bw (--post_list
# 16, alone and with -q 4) at no-coalesce's average READ. Prints a line per
# run and a table of medians (MB/s = 10^6 bytes/s) with the ratios kvpull
# best / best other, kvpull best / no-coalesce best, and the best other over
# ib_read_bw at no-coalesce's READ size (what larger READs gain on the
# device itself, for any poster). --smoke: every row once with
# tiny sizes (1 round, 2 requests of 16 blocks); fails unless every
# contender produced a number.
#
# --python: issue 22's two goals for the Python binding (python/kvpull),
# the last line being
#   python: pull_extra_us=X emit_ratio=Y
# emit_ratio (python/bench_emit.py, on the host): emission of the
# llama-3.1-70b TP 8 -> 2 plan for a request of 10,000 blocks from Python
# (plan.emit(..., out=buffers), numpy in and out) over the bare C call
# (kvp_plan_emit() on prepared arguments), interleaved, medians; goal <= 1.2.
# pull_extra_us (python/bench_pull.py): a pull of 128 block ids from Python
# (agent.pull(req_id, [(local, remote)]), numpy int32 arrays) minus the same
# pull from C (kvp_agent_pull() in a loop of python/bench_pull.c, built as
# build/tools/libkvpull_pullbench.so), in one process, on the same consumer
# agent, plan and ids: each call timed alone (clock_gettime(CLOCK_MONOTONIC)
# in C, time.perf_counter_ns() in Python), the producer's expect before and
# the polling until DONE and RELEASED after each call untimed and the same C
# code for both loops, the loops interleaved in rounds, medians; goal <= 2.
# Measured twice: on the host against the host tests' stand-in library
# (tests/python/fakelib.py: the same binding code, with kvp_agent_pull a C
# stub that checks and copies the ids as the real call does before posting,
# and the C loop calling the same stub): the binding's own cost, the figure
# of the last line ("python-host:"); and in the soft-RoCE VM on two real
# agents (producer and consumer in one Python process, a small layout and
# contiguous ids: 2 READs, 16 KiB a pull, since soft-RoCE executes the READs
# inside ibv_post_send()), printed beside it ("python-vm:"), where TCG
# inflates every CPU cost many times. Also printed: the pull through a
# prepared kvpull.Request (pull_extra_req_us), the binding's fastest path.
#
# --storm: issue 23's fleet-scale benchmark (tools/kvpull-storm.c), in one
# VM boot (one rxe device, KVP_VM_MEM 10240 unless set: rxe maps each
# connected consumer rank's queue pairs into its process, ~5 MiB a rank,
# and 6 GiB were not enough for 1024 ranks): one producer agent
# with default attributes against N consumer agents (engines of TP 8, in 8
# processes) released at once, each pulling verified bytes; the cases
# N = 64, 256 and 1024, then 1024 with a QP budget of 512 (--budget 512)
# pulling twice (--rounds 2) so that pulls force evictions and reopens,
# then N = 256 and 1024 streamed (--stream: every rank pulls with
# kvp_agent_pull_stream() while the producer writes and publishes each
# request layer by layer, kvp_agent_publish(): 4 layers, one every
# second from the release). Each case prints its lines and one summary
# line,
#   storm: peers=N qps=Q budget=B all_ready_ms=T p50_ms=A p99_ms=P
#     refused=R timeouts=X worst_poll_ms=W evictions=E reopens=O
#     bytes_per_peer=M wrong_bytes=K
# a streamed case with " mode=stream stalls=S" after it (S: pulls FAILED
# for the stall deadline, KVP_REASON_STALL; counted in X too), and the
# summary lines are repeated at the end. --storm N runs one case of N
# ranks (KVP_VM_MEM 2048 up to 256 ranks), with any further kvpull-storm
# options: --storm 1024 --budget 512 --rounds 2; --storm 64 --stream.
#
# --races: issue 34's benchmark (tools/kvpull-races.c), in one VM boot:
# N trials (default 10000) in which a producer agent lets go of the
# request a consumer agent pulls at random times (expiry, never expected,
# expected for another consumer engine) or holds it (clean, about a
# fifth), every byte of each DONE checked; run twice with the same seed
# (default 34) and --window (trials in flight, 1-8, default 8): as the
# library is, then with the consumer's lease check off (kvpull-races
# --lease-off: KVP_LEASE_OFF=1 in the consumer process only). Each run
# prints its lines; the last line joins the first run's summary with the
# second's median:
#   races: trials=N raced=R done_stale=S failed_stale=F done_clean=D
#     failed_clean=C p50_done_us=X p50_done_us_unchecked=Y
#
# --path [--devices 1|2] [--rounds N] (also --side-by-side --devices 1|2
# [--rounds N]): issue 35's READs in flight, in one
# VM boot (default 2 devices: producer on rxe0, consumer on rxe1, over a
# veth pair; 1 round): READs of 4 KiB and 64 KiB by kvpull-rdma-bench
# (the library's READ window, and none: --window 65535),
# ib_read_bw (-o 16, -o 128, -o 16 -e, -q 2 -o W: kvpull's shape) and
# ucx_perftest (rc_verbs get zcopy), each run twice (an eighth of the
# READs, then all: CPU per GB is the difference, the tools' start
# cancelled out), the rxe hardware counters read around each run
# (scripts/rdma-path-inner.sh says what each field is and its KVP_PATH_*
# knobs); one line per case and round, and a path-goal: line per round
# and size (issue 35's second goal):
#   path: tool=T devices=D size=S inflight=I MBps=X cpu_proc_s_per_GB=P
#     cpu_guest_s_per_GB=G dup_per_1k=U retry_per_1k=R
#
# --metrics: issue 39's operator's window, in one VM boot (2 devices):
# tests/rdma_metrics --dump (a producer and a consumer agent; three bulk
# pulls, one streamed, one FAILED, two consumers refused) prints both
# agents' expositions, written here to build/metrics/ (producer.prom,
# consumer.prom: Prometheus text; producer.json, consumer.json), the text
# ones checked with the host's promtool (nothing to say: ok) and the JSON
# parsed; producer.log, consumer.log: the records their log callbacks got
# (kind, level, line); the last line:
#   metrics: producer_series=N consumer_series=M promtool=ok pulls=P
#     counted=C refusals=R refusal_events=E
# (series: sample lines; counted: the pull histogram's _count lines
# summed; refusal_events: the producer's log records of kind "refused"
# with a reason and the consumer's address).
set -euo pipefail
cd "$(dirname "$0")/.."

# ---------------------------------------------------------- side by side
side_usage() {
	echo "usage: scripts/rdma-bench.sh --side-by-side [--rounds N] [--requests N]" >&2
	echo "                             [--blocks N] [--pair NAME]... [--ids MODE]..." >&2
	echo "       scripts/rdma-bench.sh --side-by-side --devices 1|2 [--rounds N]" >&2
	echo "       scripts/rdma-bench.sh --smoke" >&2
	exit 2
}

side_by_side() {
	local rounds=3 requests=16 blocks=128 smoke=0 pairs=() idss=() cmd="$*"
	local devices=
	while [[ $# -gt 0 ]]; do
		case $1 in
		--side-by-side) shift ;;
		--smoke) smoke=1 rounds=1 requests=2 blocks=16; shift ;;
		--rounds|--requests|--blocks|--pair|--ids|--devices)
			[[ $# -ge 2 ]] || side_usage
			case $1 in
			--devices) devices=$2 ;;
			--rounds) rounds=$2 ;;
			--requests) requests=$2 ;;
			--blocks) blocks=$2 ;;
			--pair) pairs+=("$2") ;;
			--ids) idss+=("$2") ;;
			esac
			shift 2 ;;
		*) side_usage ;;
		esac
	done
	# --devices 1|2: issue 35's cases (the path benchmark), one path:
	# line per case and round.
	if [[ -n $devices ]]; then
		path_bench --path --devices "$devices" --rounds "$rounds"
		return
	fi
	[[ $rounds =~ ^[1-9][0-9]?$ && $requests =~ ^[1-9][0-9]{0,3}$ &&
		$blocks =~ ^[1-9][0-9]{0,3}$ ]] || side_usage
	((${#pairs[@]})) || pairs=(llama-3.1-70b-tp8to2-hnd
		llama-3.1-70b-tp4to8-nhd nemotron-h-8b-tp2to1-hnd)
	((${#idss[@]})) || idss=(random contiguous)
	local p
	for p in "${idss[@]}"; do
		[[ $p == random || $p == contiguous ]] || side_usage
	done

	bash scripts/install-deps.sh
	make -s BUILD=build build/tools/kvpull-rdma-bench
	for p in "${pairs[@]}"; do
		build/tools/kvpull-rdma-bench --help | grep -qw -- "$p" || {
			echo "rdma-bench: unknown pair $p (kvpull-rdma-bench --help)" >&2
			exit 2
		}
	done
	# ucx_perftest dlopens its transports (libuct_ib: rc_verbs) from
	# libucs's directory's ucx/; rxe-vm.sh copies a directory with the
	# libraries of every ELF file in it.
	local ucx ucxmods
	ucx=$(command -v ucx_perftest) || {
		echo "rdma-bench: ucx_perftest not found (ucx-utils)" >&2
		exit 2
	}
	ucxmods=$(dirname "$(ldd "$ucx" | awk '$1 ~ /^libucs\.so/ { print $3 }')")/ucx
	[[ -d $ucxmods ]] || { echo "rdma-bench: no $ucxmods" >&2; exit 2; }

	local log nrow=$((${#pairs[@]} * ${#idss[@]})) t0=$SECONDS rc=0
	log=$(mktemp "${TMPDIR:-/tmp}/kvp-rdma-bench.XXXXXX")
	# The three 70b producers of TP 8 and the consumer's queues want more
	# than the default 512 MiB.
	KVP_VM_MEM=${KVP_VM_MEM:-1024} scripts/rxe-vm.sh -q --devices 1 \
		--timeout $((180 + rounds * nrow * 13 * 30)) \
		--files "$PWD/build/tools/kvpull-rdma-bench $PWD/scripts/rdma-bench-inner.sh $ucx $ucxmods" \
		-- "bash $PWD/scripts/rdma-bench-inner.sh $PWD/build/tools/kvpull-rdma-bench $rounds $requests $blocks '${pairs[*]}' '${idss[*]}'" |
		tee "$log" | awk -F'|' '$1 == "R" { printf "round %s, %s, %s ids, %s: %s MB/s (%s B READs)\n", $2, $3, $4, $5, $6, $7; fflush(); next } { print; fflush() }' ||
		rc=$?
	echo
	echo "rdma-bench: $rounds round(s), $requests requests of $blocks blocks per token group, in $((SECONDS - t0)) s;" \
		"soft-RoCE under QEMU TCG (one rxe device, 2 vCPUs), not hardware; MB/s = 10^6 bytes/s, medians"
	awk -F'|' -v smoke="$smoke" '
	function med(k,   n, i, j, t, v) {
		n = cnt[k]
		if (!n) return -1
		for (i = 1; i <= n; i++) v[i] = val[k, i]
		for (i = 2; i <= n; i++)
			for (j = i; j > 1 && v[j - 1] > v[j]; j--) {
				t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
			}
		return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
	}
	function cell(x) { return x < 0 ? "-" : sprintf("%.1f", x) }
	$1 == "R" {
		row = $3 "|" $4
		if (!(row in seen)) { seen[row] = 1; rows[++nr] = row }
		if ($2 > nround) nround = $2
		if ($6 != "-") { k = row SUBSEP $5; val[k, ++cnt[k]] = $6 }
		if ($5 == "kv1" && $7 != "-" && !(row in size)) size[row] = $7
		if ($5 == "nc1" && $7 != "-" && !(row in nsize)) nsize[row] = $7
	}
	END {
		nc = split("kv1 kv2 kv4 nc1 nc2 nc4 ucx ib ib_pl ib_q4 ib_q4_pl ibn_pl ibn_q4_pl", c, " ")
		print "| pair | ids | READ B | kvpull qps 1 | qps 2 | qps 4 | no-coalesce qps 1 | qps 2 | qps 4 | UCX get zcopy | ib_read_bw | --post_list 16 | -q 4 | -q 4 --post_list 16 | no-coalesce READ B | ib_read_bw there: --post_list 16 | -q 4 --post_list 16 | kvpull / best other | kvpull / no-coalesce | device: larger READs |"
		print "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
		bad = 0
		for (r = 1; r <= nr; r++) {
			split(rows[r], rp, "|")
			line = "| " rp[1] " | " rp[2] " | " (rows[r] in size ? size[rows[r]] : "-")
			kvb = ncb = ob = nb = -1
			for (i = 1; i <= nc; i++) {
				if (c[i] == "ibn_pl")
					line = line " | " (rows[r] in nsize ? nsize[rows[r]] : "-")
				m = med(rows[r] SUBSEP c[i])
				if (m < 0) { bad++; missing = missing " " rp[1] "/" rp[2] "/" c[i] }
				line = line " | " cell(m)
				if (m >= 0 && cnt[rows[r] SUBSEP c[i]] < nround) {
					line = line "*"
					few = 1
				}
				if (c[i] ~ /^kv/) { if (m > kvb) kvb = m }
				else if (c[i] ~ /^nc/) { if (m > ncb) ncb = m }
				else if (c[i] ~ /^ibn/) { if (m > nb) nb = m }
				else if (m > ob) ob = m
			}
			line = line " | " (kvb > 0 && ob > 0 ? sprintf("%.2f", kvb / ob) : "-")
			line = line " | " (kvb > 0 && ncb > 0 ? sprintf("%.2f", kvb / ncb) : "-")
			line = line " | " (ob > 0 && nb > 0 ? sprintf("%.2f", ob / nb) : "-") " |"
			print line
		}
		print ""
		print "kvpull / best other: the best of kvpull qps 1, 2, 4 over the best of UCX and the four ib_read_bw runs (goal >= 1 on every row);"
		print "kvpull / no-coalesce: the best of kvpull over the best of no-coalesce (goal >= 2 where ids are contiguous)."
		print "device: larger READs: the best other at kvpull'"'"'s READ size over the best ib_read_bw at no-coalesce'"'"'s: what merging READs can gain on this device for any poster."
		if (few)
			print "*: median of fewer rounds than " nround " (a run gave no number, even retried; its log is above)."
		if (bad) {
			print "rdma-bench: " bad " contender(s) produced no number:" missing
			exit 1
		}
		if (!nr) { print "rdma-bench: no results"; exit 1 }
	}' "$log" || rc=1
	echo "rerun: bash scripts/rdma-bench.sh $cmd"
	rm -f "$log"
	return "$rc"
}

# ---------------------------------------------------------- streaming
# scripts/rdma-bench.sh --stream [CASE]: kvpull-stream-bench in one VM boot,
# a streamed pull beside a bulk one while the producer simulates a prefill
# at a set pace (see tools/kvpull-stream-bench.c): one "stream: case=..."
# line per case.
stream() {
	local only=${2:-}
	bash scripts/install-deps.sh
	make -s BUILD=build build/tools/kvpull-stream-bench
	KVP_VM_MEM=${KVP_VM_MEM:-2048} exec scripts/rxe-vm.sh --devices 1 \
		--timeout 900 --files "$PWD/build/tools/kvpull-stream-bench" -- \
		"build/tools/kvpull-stream-bench ${only:+--case $only}"
}

# ---------------------------------------------------------- storm
# scripts/rdma-bench.sh --storm [N [kvpull-storm options]]: see the top.
storm() {
	shift
	local bin=$PWD/build/tools/kvpull-storm log rc=0 mem=10240 cmds=()
	if [[ $# -gt 0 ]]; then
		[[ $1 =~ ^[1-9][0-9]*$ ]] || {
			echo "usage: scripts/rdma-bench.sh --storm [N [kvpull-storm options]]" >&2
			exit 2
		}
		cmds=("$bin --ranks $*")
		(($1 > 256)) || mem=2048
	else
		# A port per case: nothing of one case's producer can be
		# mistaken for the next's.
		cmds=("$bin --ranks 64 --port 24800"
			"$bin --ranks 256 --port 24810"
			"$bin --ranks 1024 --port 24820"
			"$bin --ranks 1024 --budget 512 --rounds 2 --port 24830"
			"$bin --ranks 256 --stream --port 24840"
			"$bin --ranks 1024 --stream --port 24850")
	fi
	bash scripts/install-deps.sh
	make -s BUILD=build build/tools/kvpull-storm
	log=$(mktemp "${TMPDIR:-/tmp}/kvp-storm.XXXXXX")
	# Each case bounds itself (setup, rounds, closing: its alarm() is
	# below 20 minutes for 1024 ranks and 2 rounds); the VM bounds all.
	KVP_VM_MEM=${KVP_VM_MEM:-$mem} scripts/rxe-vm.sh -q --devices 1 \
		--timeout 4800 --cmd-timeout 1500 --files "$bin" -- \
		"${cmds[@]}" | tee "$log" || rc=$?
	echo
	echo "storm: summary (soft-RoCE under QEMU TCG, one rxe device, 2 vCPUs; not hardware):"
	grep '^storm: peers=' "$log" || echo "storm: no summary line"
	rm -f "$log"
	return "$rc"
}

# ---------------------------------------------------------- races
# scripts/rdma-bench.sh --races [options]: see the top.
races_usage() {
	echo "usage: scripts/rdma-bench.sh --races [--trials N] [--seed S] [--window W] [--read-window R]" >&2
	exit 2
}

races() {
	shift
	local trials=10000 seed=34 window=8 rwin=0 bin=$PWD/build/tools/kvpull-races
	local log rc=0 t0=$SECONDS tmo checked unchecked
	while [[ $# -gt 0 ]]; do
		[[ $# -ge 2 ]] || races_usage
		case $1 in
		--trials) trials=$2 ;;
		--seed) seed=$2 ;;
		--window) window=$2 ;;
		--read-window) rwin=$2 ;;
		*) races_usage ;;
		esac
		shift 2
	done
	[[ $trials =~ ^[1-9][0-9]{0,5}$ && $seed =~ ^[0-9]{1,9}$ &&
		$window =~ ^[1-8]$ && $rwin =~ ^[0-9]{1,5}$ ]] || races_usage
	bash scripts/install-deps.sh
	make -s BUILD=build build/tools/kvpull-races
	log=$(mktemp "${TMPDIR:-/tmp}/kvp-races.XXXXXX")
	# Each run bounds itself (its --timeout, 300 + N/20 s by default, and
	# an alarm() 180 s later); the VM bounds both.
	tmo=$((300 + trials / 20 + 240))
	KVP_VM_MEM=${KVP_VM_MEM:-1024} scripts/rxe-vm.sh -q --devices 1 \
		--timeout $((2 * tmo + 120)) --cmd-timeout "$tmo" \
		--files "$bin" -- \
		"$bin --trials $trials --seed $seed --window $window --read-window $rwin --port 24900" \
		"$bin --trials $trials --seed $seed --window $window --read-window $rwin --port 24910 --lease-off" |
		tee "$log" || rc=$?
	checked=$(grep '^races: trials=.* check=on$' "$log" | tail -n 1) || true
	unchecked=$(grep '^races: trials=.* check=off$' "$log" | tail -n 1) || true
	rm -f "$log"
	echo
	echo "races: $trials trials twice (lease check on, then off), seed $seed, $window in flight, read window $rwin (0: the library's), in $((SECONDS - t0)) s;" \
		"soft-RoCE under QEMU TCG (one rxe device, 2 vCPUs), not hardware"
	if [[ -z $checked || -z $unchecked ]]; then
		echo "races: a run printed no summary line (its output is above)" >&2
		return 1
	fi
	echo "races: unchecked run: ${unchecked#races: }"
	echo "${checked% check=on} p50_done_us_unchecked=$(sed -n 's/.* p50_done_us=\([^ ]*\).*/\1/p' <<<"$unchecked")"
	return "$rc"
}

# ---------------------------------------------------------- Python
# scripts/rdma-bench.sh --python: bench_emit.py and bench_pull.py --host on
# the host, bench_pull.py --vm in one VM boot (one rxe device; Debian's
# python3, numpy and the package carried in as tests/python_rdma/run-vm.sh
# carries them: tests/python_rdma/vm_files.py), then the python: lines.
python_bench() {
	if [[ $# -ne 1 ]]; then
		echo "usage: scripts/rdma-bench.sh --python" >&2
		exit 2
	fi
	local py=${PYTHON:-/usr/bin/python3} emit host vm files lib helper rc=0
	bash scripts/install-deps.sh
	make -s BUILD=build all build/tools/libkvpull_pullbench.so
	lib=$PWD/build/libkvpull.so.0
	helper=$PWD/build/tools/libkvpull_pullbench.so
	echo "== host: emission from Python and from C (python/bench_emit.py)" >&2
	emit=$(PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1 KVPULL_LIB=$lib \
		"$py" python/bench_emit.py) || { echo "$emit"; exit 1; }
	echo "$emit" | sed 's/^python: /python-emit: /'
	echo "== host: pulls on the stand-in library (python/bench_pull.py --host)" >&2
	host=$(PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1 KVPULL_LIB=$lib \
		"$py" python/bench_pull.py --host --helper "$helper") ||
		{ echo "$host"; exit 1; }
	echo "$host"
	files=$(PYTHONDONTWRITEBYTECODE=1 "$py" tests/python_rdma/vm_files.py "$lib")
	vm=$(KVP_VM_MEM=${KVP_VM_MEM:-1536} scripts/rxe-vm.sh -q --devices 1 \
		--timeout 900 --files "$files $PWD/python/bench_pull.py $helper" \
		--env "KVPULL_LIB=$lib" --env PYTHONDONTWRITEBYTECODE=1 \
		--env "PYTHONPATH=$PWD/python" -- \
		"$py python/bench_pull.py --vm --helper $helper") || rc=$?
	echo "$vm"
	if [[ $rc -ne 0 ]]; then
		echo "rdma-bench: the VM run failed (exit $rc)" >&2
		exit 1
	fi
	local e h v
	e=$(echo "$emit" | sed -n 's/^python: //p')
	h=$(echo "$host" | sed -n 's/^python-host: //p')
	v=$(echo "$vm" | sed -n 's/^python-vm: //p')
	if [[ -z $e || -z $h || -z $v ]]; then
		echo "rdma-bench: a python line is missing" >&2
		exit 1
	fi
	echo
	echo "python-emit: $e"
	echo "python-host: $h"
	echo "python-vm: $v"
	echo "# pull_extra_us below is python-host's (the binding's own cost per pull, host CPU, stand-in library; pull_extra_req_us=$(echo "$h" | sed -n 's/.*pull_extra_req_us=\([^ ]*\).*/\1/p') with a prepared Request); emit_ratio is python-emit's; goals: <= 2 us, <= 1.2"
	echo "python: pull_extra_us=$(echo "$h" | sed -n 's/^pull_extra_us=\([^ ]*\).*/\1/p') emit_ratio=$(echo "$e" | sed -n 's/^emit_ratio=\([^ ]*\).*/\1/p')"
}

# ---------------------------------------------------------- model
# scripts/rdma-bench.sh --model [model.py size options]: issue 36's model
# demo (python/examples/model.py, scripts/rdma-model-inner.sh) in one VM
# boot with two devices (prefill on rxe0, decode on rxe1; Debian's python3,
# numpy, torch and the package carried in as tests/python_rdma/run-vm.sh
# carries them): a prefill process with a TP 2 and a TP 1 engine, a TP 1
# decode process pulling from each a request after its whole prefill
# (bulk), one while it is computed (streamed) and one streamed with a
# prefix-cache hit, every logit checked bit for bit against the same
# prefills and decodes in one process. Prints a model-request: line per
# request and, per prefill engine,
#   model: layers=L prompt_tokens=T decode_tokens=N tp=2->1 match=bitwise
#     prefill_ms=P ttft_bulk_ms=A ttft_stream_ms=B exposed_bulk_ms=X
#     exposed_stream_ms=Y layer_xfer_ms=Z
# (model.py's header says what each figure is).
model_bench() {
	shift
	local py=${PYTHON:-/usr/bin/python3} lib files
	bash scripts/install-deps.sh
	make -s BUILD=build all
	lib=$PWD/build/libkvpull.so.0
	files=$(PYTHONDONTWRITEBYTECODE=1 "$py" tests/python_rdma/vm_files.py "$lib")
	KVP_VM_MEM=${KVP_VM_MEM:-4096} scripts/rxe-vm.sh -q --devices 2 \
		--timeout "${KVP_MODEL_TIMEOUT:-3600}" \
		--files "$files $PWD/scripts/rdma-model-inner.sh" \
		--env "KVPULL_LIB=$lib" --env PYTHONDONTWRITEBYTECODE=1 \
		--env "PYTHONPATH=$PWD/python" -- \
		"sh $PWD/scripts/rdma-model-inner.sh $*"
}

# ---------------------------------------------------------- InferenceX
# scripts/rdma-bench.sh --inferencex [run_kv.py options]: issue 37, the
# kvpull backend in InferenceX's kv-transfer suite (docs/inferencex.md), in
# one VM boot (KVP_IX_DEVICES devices, default 2: target on rxe0,
# initiator on rxe1, over a veth pair, where the READ window bounds the
# READs in flight; 1: both on rxe0, a loopback queue pair with no window,
# where a burst of 8 x 9,786 READs once held the producer's liveness probe
# past its 5 s; KVP_VM_MEM 7168 unless set: two ranks' pools of 1.8 GiB at
# 32k tokens, batch 8). The suite's bench/run_kv.py runs unchanged ($INFERENCEX_KV, else
# ../shared/third_party/inferencex-kv) through
# python/kvpull/integrations/inferencex_run.py (scripts/rdma-inferencex-
# inner.sh in the guest): kv-dsv4 fp8, ISL 8192 and 32768, pages 16 and 64,
# bursts 1, 4 and 8, op pull, 1 warm-up and 2 timed bursts per row, plus the
# bulk rows; options given are appended (the last of an option wins). The
# suite's result file is kept as build/inferencex/result-<time>.json, the
# run's output as build/inferencex/run-<time>.log; one line per row:
#   inferencex: isl=I page=P batch=B descs=D reads=R prep_ms=X p50_ms=Y
#     gbps=Z verify=ok
# (descs: the suite's descriptors for the burst; reads: kvpull's READs for
# it, from the DONE events; prep_ms: per request; bulk rows: page=bulk,
# verify=none, the suite verifying none).
inferencex_bench() {
	shift
	local py=${PYTHON:-/usr/bin/python3} lib files suite out stamp log
	local rc=0 cmd
	suite=${INFERENCEX_KV:-$(cd .. && pwd)/shared/third_party/inferencex-kv}
	[[ -f $suite/bench/run_kv.py ]] || {
		echo "rdma-bench: the suite is not at $suite (INFERENCEX_KV)" >&2
		exit 2
	}
	bash scripts/install-deps.sh
	make -s BUILD=build all
	lib=$PWD/build/libkvpull.so.0
	files=$(PYTHONDONTWRITEBYTECODE=1 "$py" tests/python_rdma/vm_files.py "$lib")
	out=build/inferencex
	stamp=$(date -u +%Y%m%dT%H%M%SZ)
	log=$out/run-$stamp.log
	mkdir -p "$out"
	cmd=$(printf ' %q' --workload-name kv-dsv4 --precision fp8 \
		--isl-ladder "8192 32768" --page-tokens "16 64" \
		--batch-sizes "1 4 8" --ops pull --warmup 1 --reps 2 --trials 1 \
		--runner rxe-vm "$@")
	KVP_VM_MEM=${KVP_VM_MEM:-7168} scripts/rxe-vm.sh -q \
		--devices "${KVP_IX_DEVICES:-2}" --timeout "${KVP_IX_TIMEOUT:-7200}" \
		--files "$files $suite/bench $suite/configs $PWD/scripts/rdma-inferencex-inner.sh" \
		--env "KVPULL_LIB=$lib" --env PYTHONDONTWRITEBYTECODE=1 \
		--env "PYTHONPATH=$PWD/python" --env "INFERENCEX_KV=$suite" -- \
		"sh $PWD/scripts/rdma-inferencex-inner.sh$cmd" >"$log" || rc=$?
	awk '$0 == "== result.json" { on = 1; next } $0 == "== end" { on = 0 }
		on' "$log" >"$out/result-$stamp.json"
	sed -n '/^== result.json$/,/^== end$/!p' "$log" | grep -v '^inferencex: '
	grep '^inferencex: ' "$log" || rc=1
	echo "# kept: $out/result-$stamp.json (the suite's result file), $log"
	return "$rc"
}

# ---------------------------------------------------------- path
# scripts/rdma-bench.sh --path [--devices 1|2] [--rounds N]: see the top.
path_bench() {
	local devices=2 rounds=1 ucx ucxmods
	shift
	while [[ $# -ge 2 ]]; do
		case $1 in
		--devices) devices=$2 ;;
		--rounds) rounds=$2 ;;
		*) break ;;
		esac
		shift 2
	done
	[[ $# -eq 0 && $devices =~ ^[12]$ && $rounds =~ ^[1-9]$ ]] || {
		echo "usage: scripts/rdma-bench.sh --path [--devices 1|2] [--rounds N]" >&2
		exit 2
	}
	bash scripts/install-deps.sh
	make -s BUILD=build build/tools/kvpull-rdma-bench
	ucx=$(command -v ucx_perftest) || ucx=
	ucxmods=
	[[ -n $ucx ]] && ucxmods=$(dirname "$(ldd "$ucx" | awk '$1 ~ /^libucs\.so/ { print $3 }')")/ucx
	[[ -d $ucxmods ]] || ucxmods=
	# rdma-path-inner.sh's knobs, when set (its header): sizes, cases,
	# READs per run, perf profiles.
	local envs=() v perf=
	for v in KVP_PATH_SIZES KVP_PATH_CASES KVP_PATH_READS KVP_PATH_PERF; do
		[[ -n ${!v:-} ]] && envs+=(--env "$v=${!v}")
	done
	[[ ${KVP_PATH_PERF:-0} == 1 ]] && perf=$(command -v perf || true)
	KVP_VM_MEM=${KVP_VM_MEM:-1024} scripts/rxe-vm.sh -q --devices "$devices" \
		--timeout $((300 + rounds * 900)) "${envs[@]}" \
		--files "$PWD/build/tools/kvpull-rdma-bench $PWD/scripts/rdma-path-inner.sh $ucx $ucxmods $perf" \
		-- "bash $PWD/scripts/rdma-path-inner.sh $PWD/build/tools/kvpull-rdma-bench $devices $rounds"
}

# ---------------------------------------------------------- metrics
# scripts/rdma-bench.sh --metrics: see the top.
metrics_bench() {
	local bin=$PWD/build/tests/rdma_metrics out=build/metrics log rc=0
	local f n tool=ok run ps cs
	bash scripts/install-deps.sh
	make -s BUILD=build build/tests/rdma_metrics
	command -v promtool >/dev/null || {
		echo "metrics: promtool is not installed (scripts/install-deps.sh)" >&2
		return 1
	}
	mkdir -p "$out"
	log=$(mktemp "${TMPDIR:-/tmp}/kvp-metrics.XXXXXX")
	scripts/rxe-vm.sh -q --devices 2 --timeout 300 \
		--files "$bin /usr/bin/promtool" -- "$bin --dump" >"$log" || rc=$?
	# the test's own lines, then each exposition into its file
	awk '/^== end$/ { on = 0; next } /^== / { on = 1; next } !on' "$log"
	for f in producer.prom consumer.prom producer.json consumer.json \
		producer.log consumer.log; do
		awk -v n="$f" '$0 == "== " n { on = 1; next } /^== end$/ { on = 0 }
			on' "$log" >"$out/$f"
		[[ -s $out/$f ]] || {
			echo "metrics: no $f in the VM's output" >&2
			rm -f "$log"
			return 1
		}
	done
	run=$(grep '^metrics-run: ' "$log" | tail -n 1) || true
	rm -f "$log"
	for f in producer consumer; do
		promtool check metrics <"$out/$f.prom" >"$out/$f.promtool" 2>&1 &&
			! [[ -s $out/$f.promtool ]] || {
			tool=failed
			echo "metrics: promtool check metrics $out/$f.prom:" >&2
			cat "$out/$f.promtool" >&2
		}
		python3 -c 'import json, sys; json.load(open(sys.argv[1]))' \
			"$out/$f.json" || tool=failed
	done
	ps=$(grep -cv -e '^#' -e '^$' "$out/producer.prom") || true
	cs=$(grep -cv -e '^#' -e '^$' "$out/consumer.prom") || true
	[[ -n $run ]] || { echo "metrics: the run printed no summary" >&2; return 1; }
	echo "metrics: producer_series=$ps consumer_series=$cs promtool=$tool ${run#metrics-run: }"
	[[ $tool == ok ]] || return 1
	return "$rc"
}

case ${1:-} in
--metrics) metrics_bench; exit ;;
--path) path_bench "$@"; exit ;;
--side-by-side|--smoke) side_by_side "$@"; exit ;;
--stream) stream "$@"; exit ;;
--python) python_bench "$@"; exit ;;
--model) model_bench "$@"; exit ;;
--inferencex) inferencex_bench "$@"; exit ;;
--storm) storm "$@"; exit ;;
--races) races "$@"; exit ;;
esac
rounds=${1:-3}
requests=${2:-32}
[[ $rounds =~ ^[1-9][0-9]?$ && $requests =~ ^[1-9][0-9]{0,3}$ ]] || {
	echo "usage: scripts/rdma-bench.sh [ROUNDS 1-99 [REQUESTS 1-9999]]" >&2
	echo "       scripts/rdma-bench.sh --side-by-side [--rounds N] [--requests N]" >&2
	echo "                             [--blocks N] [--pair NAME]... [--ids MODE]..." >&2
	echo "       scripts/rdma-bench.sh --smoke" >&2
	echo "       scripts/rdma-bench.sh --python" >&2
	echo "       scripts/rdma-bench.sh --model [model.py size options]" >&2
	echo "       scripts/rdma-bench.sh --inferencex [run_kv.py options]" >&2
	echo "       scripts/rdma-bench.sh --stream [CASE]" >&2
	echo "       scripts/rdma-bench.sh --storm [N [kvpull-storm options]]" >&2
	echo "       scripts/rdma-bench.sh --races [--trials N] [--seed S] [--window W] [--read-window R]" >&2
	echo "       scripts/rdma-bench.sh --path [--devices 1|2] [--rounds N]" >&2
	echo "       scripts/rdma-bench.sh --metrics" >&2
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
