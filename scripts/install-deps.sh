#!/usr/bin/env bash
# Installs, as root on Debian 12, everything kvpull needs to build, test and
# boot its soft-RoCE VM (scripts/rxe-vm.sh). Idempotent: installs only what is
# missing and runs `apt-get update` only if the package lists are older than
# an hour. Quiet on success; on failure prints apt's output and exits non-zero.
#
# It upgrades nothing it does not have to. Only missing packages are named
# to apt-get install, which never upgrades an installed package unless a new
# package needs it: a dependency of the new packages that must be newer
# (libfoo-dev Depends: libfoo1 (= same version)), or, rarely, an installed
# package whose old version that upgraded dependency Breaks. Before
# installing, the script simulates the install (apt-get -s) and prints what
# it would do; it refuses if apt would remove anything (--no-remove) or
# install a package that is not in the dependency closure of the missing
# ones. It does not pass --no-upgrade: that flag only keeps packages *named
# on the command line* from being upgraded if already installed, and we
# name only missing ones, so it would change nothing. --only-upgrade is the
# opposite of what we want (it skips new packages).
#
#   bash scripts/install-deps.sh              install what is missing
#   bash scripts/install-deps.sh --dry-run [PKG...]
#       print what installing the missing packages (or PKG...) would do and
#       check it as above; installs nothing, needs no root
#
# Environment:
#   KVP_APT_LOCK_TIMEOUT  seconds to wait for another apt/dpkg (default 600)
set -euo pipefail

PKGS=(
	# build; libclang-rt: clang's sanitizer and libFuzzer runtimes;
	# pkg-config: tests/check_build_dirs.sh builds against the installed .pc
	build-essential gcc clang libclang-rt-14-dev make pkg-config binutils
	# docs and figures: man page lint (mandoc -Tlint), the SVG check
	# (headless chromium renders it to PNG)
	mandoc chromium
	# xmllint checks the SVG; jsonschema checks kvpull-plan --json against
	# its schema (tests/test_tool.sh)
	libxml2-utils python3-jsonschema
	# the Python binding's tests (tests/check_python.sh)
	python3-numpy python3-pytest
	# torch (CPU) for the engine-shaped tests and the InferenceX lane
	# (python/README.md); promtool (prometheus) checks the metrics exposition
	python3-torch prometheus
	# libraries and unit tests
	libcmocka-dev libibverbs-dev librdmacm-dev ibverbs-providers rdma-core
	# RDMA tools used in the VM and in direct mode
	ibverbs-utils rdmacm-utils perftest iproute2 ucx-utils
	# the VM harness
	qemu-system-x86 busybox-static cpio gzip xz-utils kmod coreutils libc-bin
	dpkg apt
)

die() { echo "install-deps: $*" >&2; exit 1; }

dry=0
if [[ ${1:-} == --dry-run ]]; then
	dry=1
	shift
	[[ $# -gt 0 ]] && PKGS=("$@")
elif [[ $# -gt 0 ]]; then
	die "usage: bash scripts/install-deps.sh [--dry-run [PKG...]]"
fi

((dry)) || [[ $(id -u) -eq 0 ]] || die "must run as root"
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

# The install, simulated: what apt would install, upgrade and remove. Fails
# (and says why) if it would remove anything or install a package outside
# the dependency closure of the missing ones; prints the plan on one line.
simulate() {
	local sim=$log.sim closure=$log.closure new=() up=() knock=() stray=() p
	if ! apt-get "${apt_opts[@]}" -s install --no-install-recommends \
		--no-remove "${missing[@]}" >"$sim" 2>&1; then
		cat "$sim" >&2
		return 1
	fi
	if grep -q '^Remv ' "$sim"; then
		grep '^Remv ' "$sim" >&2
		echo "install-deps: apt would remove packages: refused" >&2
		return 1
	fi
	# every package the missing ones depend on, recursively (names and
	# the providers of virtual ones)
	apt-cache depends --recurse --no-recommends --no-suggests \
		--no-conflicts --no-breaks --no-replaces --no-enhances \
		"${missing[@]}" 2>/dev/null | awk '{ print $NF }' |
		sed 's/[<>]//g; s/:.*//' | sort -u >"$closure"
	while read -r p; do
		new+=("$p")
		grep -qxF "$p" "$closure" || stray+=("$p")
	done < <(sed -n 's/^Inst \([^ ]*\) (.*/\1/p' "$sim" | sed 's/:.*//')
	# upgrades: of a dependency that must be newer, or of an installed
	# package whose old version an upgraded dependency Breaks
	while read -r p; do
		if grep -qxF "$p" "$closure"; then up+=("$p"); else knock+=("$p"); fi
	done < <(sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' "$sim" | sed 's/:.*//')
	echo "install-deps: plan: install ${#missing[@]} missing (${missing[*]})" \
		"and $((${#new[@]} - ${#missing[@]})) new dependencies, upgrade ${#up[@]}" \
		"dependencies${up[*]:+ (${up[*]})} and ${#knock[@]} packages that" \
		"the old versions would break${knock[*]:+ (${knock[*]})}, remove none"
	if [[ ${#stray[@]} -gt 0 ]]; then
		echo "install-deps: apt would install packages that no missing" \
			"package depends on: ${stray[*]}: refused" >&2
		return 1
	fi
}

if ((dry)); then
	simulate
	exit
fi

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

simulate || die "the simulated install was refused"
echo "install-deps: installing ${missing[*]}"
install=(apt-get "${apt_opts[@]}" install -y --no-install-recommends --no-remove "${missing[@]}")
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
