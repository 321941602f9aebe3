#!/usr/bin/env bash
# Installs, as root on Debian 12, everything kvpull needs to build, test and
# boot its soft-RoCE VM (scripts/rxe-vm.sh). Idempotent: installs only what is
# missing and runs `apt-get update` only if the package lists are older than
# an hour. Quiet on success; on failure prints apt's output and exits non-zero.
#
# Environment:
#   KVP_APT_LOCK_TIMEOUT  seconds to wait for another apt/dpkg (default 600)
set -euo pipefail

PKGS=(
	# build; libclang-rt: clang's sanitizer and libFuzzer runtimes
	build-essential gcc clang libclang-rt-14-dev make pkg-config binutils
	# libraries and unit tests
	libcmocka-dev libibverbs-dev librdmacm-dev ibverbs-providers rdma-core
	# RDMA tools used in the VM and in direct mode
	ibverbs-utils rdmacm-utils perftest iproute2
	# the VM harness
	qemu-system-x86 busybox-static cpio gzip xz-utils kmod coreutils libc-bin
	dpkg apt
)

die() { echo "install-deps: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
command -v apt-get >/dev/null || die "apt-get not found (Debian 12 expected)"

export DEBIAN_FRONTEND=noninteractive
lock_timeout=${KVP_APT_LOCK_TIMEOUT:-600}
apt_opts=(-q -o "DPkg::Lock::Timeout=${lock_timeout}" -o Dpkg::Use-Pty=0)

missing=()
for p in "${PKGS[@]}"; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[[ $st == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
	echo "install-deps: all ${#PKGS[@]} packages present"
	exit 0
fi

log=$(mktemp /tmp/kvp-install-deps.XXXXXX)
trap 'rm -f "$log"' EXIT

run() {
	if ! timeout 1800 "$@" >"$log" 2>&1; then
		cat "$log" >&2
		die "failed: $*"
	fi
}

updated=0
update() {
	echo "install-deps: apt-get update"
	run apt-get "${apt_opts[@]}" update
	updated=1
}
# Fresh lists = an InRelease file touched within the last 60 minutes.
if [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*InRelease' \
	-mmin -60 2>/dev/null | head -n1) ]]; then
	update
fi

echo "install-deps: installing ${missing[*]}"
install=(apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}")
if ! timeout 1800 "${install[@]}" >"$log" 2>&1; then
	if ((updated)); then
		cat "$log" >&2
		die "failed: ${install[*]}"
	fi
	# Recent but stale lists (a superseded version 404s): update, retry.
	update
	run "${install[@]}"
fi

for p in "${missing[@]}"; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[[ $st == "install ok installed" ]] || die "$p still not installed"
done
echo "install-deps: done"
