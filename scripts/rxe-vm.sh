#!/usr/bin/env bash
# rxe-vm.sh: run shell command lines against soft-RoCE (rdma_rxe) devices.
#
# The host kernel has no RDMA, so this boots Debian's stock kernel under
# qemu with a generated initramfs that loads rdma_rxe, creates rxe0 (and
# rxe1), runs each command line and reports its exit status on the console.
# See scripts/README.md and scripts/soft-roce-in-qemu.md.
set -euo pipefail

prog=rxe-vm
usage() {
	cat <<'EOF'
Usage: scripts/rxe-vm.sh [options] -- 'command line 1' ['command line 2' ...]
       scripts/rxe-vm.sh [--devices 1|2] --self-test

Runs each command line (with bash -c, under `timeout`) in a qemu VM that has
soft-RoCE devices, or directly on the host if it has RDMA devices.

Options:
  --devices 1|2        1: rxe0 on dummy0 (10.77.0.1/24)            [1]
                       2: rxe0 on veth0 (10.77.1.1), rxe1 on veth1 (10.77.1.2)
  --mtu BYTES          netdev MTU under the rxe devices: 9000 gives an rxe
                       active_mtu of 4096 (2-4x faster), 1500 gives 1024 [9000]
  --timeout SECS       bound on the whole VM run (boot included)     [300]
  --cmd-timeout SECS   bound on each command line          [timeout - 20]
  --files 'P1 P2 ...'  host files or directories to copy into the VM at the
                       same path, with the ldd closure of every ELF file in
                       them (repeatable; paths split on whitespace)
  --env NAME=VALUE     set a variable for the commands (repeatable)
  --self-test          run the built-in checks instead of commands:
                       ibv_devinfo, ib_read_bw at 4 KiB/64 KiB/1 MiB (server
                       on dev0, client on dev1 if any) and rping
  -q, --quiet          print only what the commands print (no console
                       boot lines, markers, kernel messages or timing), plus
                       a progress line per step on stderr; on failure the
                       harness's report and the guest console log follow
  -h, --help           this text

Inside the commands:
  KVP_DEV0 KVP_ADDR0 KVP_GIDX0 KVP_NETDEV0   first device, its IPv4 address,
                                            RoCE v2 IPv4 GID index, netdev
  KVP_DEV1 KVP_ADDR1 KVP_GIDX1 KVP_NETDEV1   second device (--devices 2)
  KVP_NDEVS (number of devices), KVP_IN_VM (1 in the VM, 0 on the host)
The working directory is the caller's if it exists in the VM, else /.

Environment:
  KVP_RDMA_DIRECT=1  run on the host (no VM); =0 forces the VM. Unset: the
                     host is used if /dev/infiniband/uverbs0 exists and
                     ibv_devices lists a device. KVP_DEVn etc. already set
                     in the environment are kept.
  KVP_CACHE          kernel cache directory [/var/cache/kvpull-vm, or
                     ~/.cache/kvpull-vm if that is not writable]
  KVP_VM_MEM         guest memory in MiB [512]
  KVP_VM_SMP         guest vCPUs [2]
  KVP_VM_ACCEL       tcg|kvm [tcg; KVM guests hang on these machines]
  KVP_VM_APPEND      extra kernel command line
  KVP_KEEP=1         keep the work directory (initramfs, console log)

Exit status: 0 every command passed (some may have been skipped), 77 all
commands were skipped (exit 77), 1 a command failed or its marker is
missing (VM crash or timeout), 2 usage or setup error.
EOF
}

die() { echo "$prog: error: $*" >&2; exit 2; }
# The harness's own lines. --quiet holds them in $work/notes and prints
# them only when something failed.
note() {
	if ((quiet)) && [[ -n ${work:-} ]]; then
		echo "$prog: $*" >>"$work/notes"
	else
		echo "$prog: $*" >&2
	fi
}
# A step that takes seconds: said under --quiet only (the notes say it
# otherwise).
progress() { if ((quiet)); then echo "== $*" >&2; fi; }

# ---------------------------------------------------------------- options
devices=1
mtu=9000
vm_timeout=300
cmd_timeout=
files=()
envs=()
cmds=()
self_test=0
quiet=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--devices) [[ $# -ge 2 ]] || die "--devices needs a value"
		devices=$2; shift 2 ;;
	--devices=*) devices=${1#*=}; shift ;;
	--mtu) [[ $# -ge 2 ]] || die "--mtu needs a value"
		mtu=$2; shift 2 ;;
	--mtu=*) mtu=${1#*=}; shift ;;
	--timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"
		vm_timeout=$2; shift 2 ;;
	--timeout=*) vm_timeout=${1#*=}; shift ;;
	--cmd-timeout) [[ $# -ge 2 ]] || die "--cmd-timeout needs a value"
		cmd_timeout=$2; shift 2 ;;
	--cmd-timeout=*) cmd_timeout=${1#*=}; shift ;;
	--files) [[ $# -ge 2 ]] || die "--files needs a value"
		read -r -a f <<<"$2"; files+=("${f[@]}"); shift 2 ;;
	--files=*) read -r -a f <<<"${1#*=}"; files+=("${f[@]}"); shift ;;
	--env) [[ $# -ge 2 ]] || die "--env needs a value"
		envs+=("$2"); shift 2 ;;
	--env=*) envs+=("${1#*=}"); shift ;;
	--self-test) self_test=1; shift ;;
	-q|--quiet) quiet=1; shift ;;
	-h|--help) usage; exit 0 ;;
	--) shift; cmds=("$@"); break ;;
	*) usage >&2; die "unknown argument: $1" ;;
	esac
done

[[ $devices == 1 || $devices == 2 ]] || die "--devices must be 1 or 2"
[[ $vm_timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer"
[[ $mtu =~ ^[0-9]+$ ]] && ((mtu >= 1280 && mtu <= 65535)) || die "--mtu must be 1280..65535"
if [[ -z $cmd_timeout ]]; then
	cmd_timeout=$((vm_timeout > 30 ? vm_timeout - 20 : vm_timeout))
fi
[[ $cmd_timeout =~ ^[1-9][0-9]*$ ]] || die "--cmd-timeout must be a positive integer"
work=$(mktemp -d "${TMPDIR:-/tmp}/kvp-rxe-vm.XXXXXX")
cleanup() {
	if [[ ${KVP_KEEP:-0} == 1 ]]; then
		note "kept $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ((self_test)); then
	[[ ${#cmds[@]} -eq 0 ]] || die "--self-test takes no command lines"
	# Copied into the VM at the same path (see files below).
	st=$work/selftest.sh
	cat >"$st" <<'EOS'
# perftest times with rdtsc and the guest kernel finds the vCPUs' TSCs
# unsynchronised under TCG: a client that migrates can report 0.00 MB/s (seen
# 2 times in ~30 runs). Pin each side to one vCPU.
cpu0() { taskset -c 0 "$@"; }
cpu1() { if [ "$(nproc)" -gt 1 ]; then taskset -c 1 "$@"; else "$@"; fi; }
# bw SIZE ITERS: ib_read_bw, server on dev0, client on dev1 if any.
bw() {
	cpu0 ib_read_bw -d "$KVP_DEV0" -x "$KVP_GIDX0" -F -s "$1" -n "$2" \
		>/tmp/bw-server.log 2>&1 &
	local s=$! i=0
	# perftest's client does not retry: wait for the TCP port 18515.
	until grep -q ':4853 00000000:0000 0A' /proc/net/tcp; do
		((++i < 100)) || return 1
		sleep 0.1
	done
	if ! cpu1 ib_read_bw -d "${KVP_DEV1:-$KVP_DEV0}" -x "${KVP_GIDX1:-$KVP_GIDX0}" \
		-F -s "$1" -n "$2" "$KVP_ADDR0" >/tmp/bw-client.log 2>&1; then
		cat /tmp/bw-client.log /tmp/bw-server.log
		return 1
	fi
	wait "$s" || return 1
	awk -v s="$1" -v d="$KVP_DEV0<-${KVP_DEV1:-$KVP_DEV0}" '$1 == s {
		printf "ib_read_bw %s %7d B x %4d: %s MB/s\n", d, $1, $2, $4 }' \
		/tmp/bw-client.log
}
EOS
	files+=("$st")
	cmds=(
		'ibv_devinfo -d $KVP_DEV0 | grep -E "hca_id|state|active_mtu" && ibv_devinfo -v -d $KVP_DEV0 | grep -E "GID\[ *$KVP_GIDX0\]"'
		". $st && bw 4096 2000"
		". $st && bw 65536 2000"
		". $st && bw 1048576 100"
		'rping -s -a $KVP_ADDR0 -C 3 & s=$!; sleep 1; rping -c -a $KVP_ADDR0 -I ${KVP_ADDR1:-$KVP_ADDR0} -C 3 -V -v && wait $s'
	)
fi
[[ ${#cmds[@]} -gt 0 ]] || { usage >&2; die "no command lines given (after --)"; }
for e in ${envs[@]+"${envs[@]}"}; do
	[[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE: $e"
done
ncmds=${#cmds[@]}

# Marker lines carry a per-run id so stale or echoed text cannot pass.
run_id=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')

# ------------------------------------------------- shared guest/host code
# POSIX sh, used by the guest's /init (busybox ash) and in direct mode.
# kvp_gid_v4 DEV: prints "GID_INDEX IPV4 NETDEV" for DEV's first RoCE v2
# GID that maps an IPv4 address, or fails.
read -r -d '' discover_sh <<'EOF' || true
kvp_gid_v4() {
	_p=/sys/class/infiniband/$1/ports/1
	[ -d "$_p/gids" ] || return 1
	for _g in "$_p"/gids/*; do
		_i=${_g##*/}
		_gid=$(cat "$_g" 2>/dev/null) || continue
		case $_gid in
		0000:0000:0000:0000:0000:ffff:*) ;;
		*) continue ;;
		esac
		_t=$(cat "$_p/gid_attrs/types/$_i" 2>/dev/null) || continue
		case $_t in *[vV]2*) ;; *) continue ;; esac
		_nd=$(cat "$_p/gid_attrs/ndevs/$_i" 2>/dev/null) || _nd=
		_h=${_gid#0000:0000:0000:0000:0000:ffff:}
		_a=${_h%%:*}
		_b=${_h#*:}
		echo "$_i $((0x${_a%??})).$((0x${_a#??})).$((0x${_b%??})).$((0x${_b#??})) $_nd"
		return 0
	done
	return 1
}
# kvp_export N DEV: sets KVP_DEVn KVP_ADDRn KVP_GIDXn KVP_NETDEVn unless set.
kvp_export() {
	_r=$(kvp_gid_v4 "$2") || _r=
	set -- "$1" "$2" $_r
	eval ": \${KVP_DEV$1:=\$2}; export KVP_DEV$1"
	if [ -n "${3:-}" ]; then
		eval ": \${KVP_GIDX$1:=\$3} \${KVP_ADDR$1:=\$4} \${KVP_NETDEV$1:=\${5:-}}"
		eval "export KVP_GIDX$1 KVP_ADDR$1 KVP_NETDEV$1"
	fi
}
EOF

# Prints the result marker and counts; used by both modes.
pass=0 fail=0 skip=0
declare -a results=()
record() { # idx rc secs
	local st
	case $2 in
	0) st=PASS; pass=$((pass + 1)) ;;
	77) st=SKIP; skip=$((skip + 1)) ;;
	*) st=FAIL; fail=$((fail + 1)) ;;
	esac
	results[$1]="$st rc=$2 ${3}s"
	# bash/GNU timeout says 124, busybox timeout leaves SIGTERM's 143.
	if [[ $2 == 124 || $2 == 143 ]] &&
		awk -v a="$3" -v b="$cmd_timeout" 'BEGIN { exit !(a >= b - 0.5) }'; then
		results[$1]+=" (timed out after --cmd-timeout $cmd_timeout)"
	fi
}

short() { # first line of a command, at most 100 characters
	local c=${1%%$'\n'*}
	[[ $c == "$1" ]] || c+=" ..."
	((${#c} <= 100)) || c="${c:0:96} ..."
	printf '%s' "$c"
}

final_report() { # missing
	local i missing=$1
	if ((quiet)); then
		# All passed: nothing more to say. Else the held notes and,
		# from a VM, the guest console, then the report below.
		((fail > 0 || missing > 0 || skip > 0)) || exit 0
		quiet=0
		[[ -f $work/notes ]] && cat "$work/notes" >&2
		if ((fail > 0 || missing > 0)) && [[ -n ${log:-} && -f $log ]]; then
			note "guest console log, last 200 of $(wc -l <"$log") lines:"
			tail -n 200 "$log" | sed 's/^/  | /' >&2
		fi
	fi
	for ((i = 1; i <= ncmds; i++)); do
		note "[$i/$ncmds] ${results[$i]:-MISSING (no marker)}: $(short "${cmds[i - 1]}")"
	done
	note "result: pass=$pass fail=$fail skip=$skip missing=$missing of $ncmds"
	if ((fail > 0 || missing > 0)); then exit 1; fi
	if ((skip == ncmds)); then exit 77; fi
	exit 0
}

# --------------------------------------------------------- direct mode
host_has_rdma() {
	[[ -e /dev/infiniband/uverbs0 ]] || return 1
	command -v ibv_devices >/dev/null || return 1
	local n
	n=$(timeout 10 ibv_devices 2>/dev/null | awk 'NR > 2 && NF' | wc -l) || return 1
	[[ $n -gt 0 ]]
}

run_direct() {
	note "direct mode: running on the host (KVP_RDMA_DIRECT=${KVP_RDMA_DIRECT:-auto})"
	eval "$discover_sh"
	local n=0 d
	for d in /sys/class/infiniband/*; do
		[[ -e $d ]] || continue
		kvp_export "$n" "${d##*/}"
		n=$((n + 1))
	done
	export KVP_NDEVS=${KVP_NDEVS:-$n} KVP_IN_VM=0
	local e
	for e in ${envs[@]+"${envs[@]}"}; do export "${e?}"; done
	env | grep -E '^KVP_(DEV|ADDR|GIDX|NETDEV|NDEVS)' | sort | sed "s/^/$prog: /" >&2 || true

	local i rc pid t0 t1
	for ((i = 1; i <= ncmds; i++)); do
		((quiet)) || echo "KVP-BEGIN $i/$ncmds: $(short "${cmds[i - 1]}")"
		t0=$(date +%s.%N)
		# timeout leads its own process group: kill leftovers (servers
		# started with &) once the command line is done.
		timeout -k 5 "$cmd_timeout" bash -c "${cmds[i - 1]}" </dev/null &
		pid=$!
		rc=0
		wait "$pid" || rc=$?
		kill -KILL -- "-$pid" 2>/dev/null || true
		t1=$(date +%s.%N)
		((quiet)) || echo "KVP-RESULT $i/$ncmds rc=$rc id=$run_id"
		record "$i" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')"
	done
	final_report 0
}

if [[ ${KVP_RDMA_DIRECT:-} == 1 ]] || { [[ ${KVP_RDMA_DIRECT:-} != 0 ]] && host_has_rdma; }; then
	run_direct
fi

# ---------------------------------------------------------------- VM mode
for t in qemu-system-x86_64 dpkg-deb apt-get apt-cache ldd flock gzip; do
	command -v "$t" >/dev/null || die "$t not found: run scripts/install-deps.sh"
done
busybox=$(command -v busybox) || die "busybox not found: install busybox-static"
if ldd "$busybox" >/dev/null 2>&1; then
	die "$busybox is dynamically linked: install busybox-static"
fi

if [[ -n ${KVP_CACHE:-} ]]; then
	cache=$KVP_CACHE
elif mkdir -p /var/cache/kvpull-vm 2>/dev/null && [[ -w /var/cache/kvpull-vm ]]; then
	cache=/var/cache/kvpull-vm
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvpull-vm
fi
mkdir -p "$cache" && [[ -w $cache ]] || die "cannot write cache $cache (set KVP_CACHE)"


# ------------------------------------------------------------- the kernel
# Modules wanted; their depends= closure is added and ordered. crc32_generic
# is no depends= of rdma_rxe but `rdma link add` fails without it.
want_mods=(crc32_generic rdma_rxe rdma_ucm dummy veth)
# Their dependencies on 6.1, extracted in the same pass when present (each
# pass reads the whole 70 MB package); the real closure is still computed.
hint_mods=(ib_core ib_uverbs udp_tunnel ip6_udp_tunnel ib_cm iw_cm configfs rdma_cm)

kpkg=
resolve_kpkg() {
	kpkg=$(timeout 60 apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }') || kpkg=
}
resolve_kpkg
if [[ -z $kpkg && $(id -u) -eq 0 ]]; then
	note "apt-cache knows no linux-image-amd64: apt-get update"
	timeout 600 apt-get -qq update >/dev/null 2>&1 || true
	resolve_kpkg
fi
if [[ -z $kpkg ]]; then
	# Offline or no lists: fall back to the newest cached kernel.
	kdir=$(ls -d "$cache"/kernel-*/ 2>/dev/null | sort -V | tail -n1) || kdir=
	[[ -n $kdir && -f $kdir/.complete ]] ||
		die "cannot resolve linux-image-amd64 and no cached kernel (run scripts/install-deps.sh)"
	kdir=${kdir%/}
	note "using cached ${kdir##*/} (apt-cache could not resolve the kernel)"
else
	kdir=$cache/kernel-${kpkg#linux-image-}
fi

mod_depends() { # file.ko -> comma-separated depends
	if command -v modinfo >/dev/null; then
		modinfo -F depends "$1"
	else
		objcopy -O binary --only-section=.modinfo "$1" /dev/stdout |
			tr '\0' '\n' | sed -n 's/^depends=//p'
	fi
}

prepare_kernel() {
	local debdir=$cache/debs deb x listing name p
	mkdir -p "$debdir"
	deb=$(ls "$debdir/${kpkg}"_*.deb 2>/dev/null | sort -V | tail -n1) || deb=
	if [[ -z $deb ]]; then
		note "downloading $kpkg into $debdir"
		progress "downloading the kernel package $kpkg (70 MB, once)"
		local sandbox=()
		# as root, apt's _apt user could not write into the cache
		[[ $(id -u) -ne 0 ]] || sandbox=(-o APT::Sandbox::User=root)
		(cd "$debdir" && timeout 900 apt-get -q ${sandbox[@]+"${sandbox[@]}"} \
			download "$kpkg" >/dev/null) || die "apt-get download $kpkg failed"
		deb=$(ls "$debdir/${kpkg}"_*.deb 2>/dev/null | sort -V | tail -n1) ||
			die "download of $kpkg left no .deb"
	fi
	# Older kernels' packages are dead weight.
	find "$debdir" -maxdepth 1 -name 'linux-image-*.deb' ! -name "${kpkg}_*" -delete

	x=$(mktemp -d "$cache/.extract.XXXXXX")
	listing=$x/listing
	timeout 300 dpkg-deb -c "$deb" | awk '{ print $NF }' >"$listing" ||
		die "cannot list $deb"
	local vmlinuz
	vmlinuz=$(grep -m1 '^\./boot/vmlinuz-' "$listing") || die "no vmlinuz in $deb"

	declare -A path=() seen=() deps=()
	while read -r p; do
		case $p in
		*.ko) name=${p##*/}; name=${name%.ko} ;;
		*.ko.xz|*.ko.zst|*.ko.gz)
			name=${p##*/}; name=${name%.ko.*} ;;
		*) continue ;;
		esac
		path[${name//-/_}]=$p
	done <"$listing"

	local pending=("${want_mods[@]}") batch m d
	for m in "${hint_mods[@]}"; do
		[[ -n ${path[$m]:-} ]] && pending+=("$m")
	done
	local -a pats=("$vmlinuz")
	while [[ ${#pending[@]} -gt 0 ]]; do
		batch=()
		for m in "${pending[@]}"; do
			[[ -n ${seen[$m]:-} ]] && continue
			[[ -n ${path[$m]:-} ]] || die "module $m not in $kpkg"
			seen[$m]=1
			batch+=("$m")
			pats+=("${path[$m]}")
		done
		pending=()
		[[ ${#batch[@]} -gt 0 ]] || break
		timeout 300 dpkg-deb --fsys-tarfile "$deb" |
			tar -x -C "$x" "${pats[@]}" || die "extracting from $deb failed"
		pats=()
		for m in "${batch[@]}"; do
			p=$x/${path[$m]#./}
			case $p in
			*.xz) xz -d "$p" || die "xz needed for $p"; p=${p%.xz} ;;
			*.zst) zstd -q -d --rm "$p" || die "zstd needed for $p"; p=${p%.zst} ;;
			*.gz) gzip -d "$p"; p=${p%.gz} ;;
			esac
			path[$m]=$p
			deps[$m]=$(mod_depends "$p" | tr ',' ' ')
			for d in ${deps[$m]}; do
				[[ -n ${seen[$d]:-} ]] || pending+=("$d")
			done
		done
	done

	# Dependencies first, in the order of want_mods.
	local -a order=()
	declare -A placed=()
	visit() {
		local m=$1 d
		[[ -n ${placed[$m]:-} ]] && return 0
		placed[$m]=1
		for d in ${deps[$m]}; do visit "$d"; done
		order+=("$m")
	}
	for m in "${want_mods[@]}"; do visit "$m"; done

	local stage=$x/kernel
	mkdir -p "$stage/modules"
	mv "$x/${vmlinuz#./}" "$stage/vmlinuz"
	for m in "${order[@]}"; do mv "${path[$m]}" "$stage/modules/$m.ko"; done
	printf '%s\n' "${order[@]}" >"$stage/modules.order"
	echo "$kpkg $(basename "$deb")" >"$stage/source"
	touch "$stage/.complete"
	rm -rf "$kdir"
	mv -T "$stage" "$kdir"
	rm -rf "$x"
}

# vmlinuz is a bzImage: find the compressed payload and unpack the ELF
# vmlinux (with its PVH note) next to it. No vmlinux: boot the bzImage.
extract_vmlinux() {
	local z=$kdir/vmlinuz out=$kdir/vmlinux.tmp spec magic dec off
	for spec in '\xfd7zXZ\x00:xz -dc' '\x28\xb5\x2f\xfd:zstd -dcq' \
		'\x1f\x8b\x08:gzip -dc' '\x02\x21\x4c\x18:lz4 -dc'; do
		magic=${spec%%:*}
		dec=${spec#*:}
		command -v "${dec%% *}" >/dev/null || continue
		for off in $(LC_ALL=C grep -obUaP "$magic" "$z" | cut -d: -f1); do
			tail -c "+$((off + 1))" "$z" | $dec >"$out" 2>/dev/null || true
			if [[ $(head -c4 "$out" | od -An -c | tr -d ' ') == '177ELF' ]]; then
				mv "$out" "$kdir/vmlinux"
				return 0
			fi
		done
	done
	rm -f "$out"
	return 1
}

t_prep=$(date +%s.%N)
progress "preparing the VM: Debian kernel with rdma_rxe (soft-RoCE), initramfs"
(
	# One extraction at a time per cache; others wait and reuse it.
	exec 9>"$cache/.lock"
	flock -w 900 9 || die "cache $cache locked for 900 s"
	if [[ ! -f $kdir/.complete ]]; then
		prepare_kernel
		note "cached $(cat "$kdir/source") in $kdir"
		# Superseded kernels (after a Debian kernel update) go too.
		for old in "$cache"/kernel-*; do
			[[ $old == "$kdir" ]] || rm -rf "$old"
		done
	fi
	if [[ ! -f $kdir/vmlinux && ! -f $kdir/.no-vmlinux ]]; then
		extract_vmlinux || { touch "$kdir/.no-vmlinux"; note "no vmlinux in vmlinuz: booting the bzImage (slower)"; }
	fi
)
mapfile -t modules <"$kdir/modules.order"

# ----------------------------------------------------------- the initramfs
root=$work/root
mkdir -p "$root"/{proc,sys,dev,tmp,run,etc,kvp/modules,root,var/tmp} \
	"$root"/usr/{bin,sbin,lib,lib64}
# Mirror the host's merged-/usr symlinks so ldd's paths resolve as on the host.
for d in bin sbin lib lib64; do
	if [[ -L /$d ]]; then
		ln -s "$(readlink "/$d")" "$root/$d"
	else
		mkdir -p "$root/$d"
	fi
done

declare -A copied=()
is_elf() { [[ -f $1 && $(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == '177ELF' ]]; }

copy_libs() { # ELF file: copy its ldd closure
	local out line lib
	out=$(ldd "$1" 2>&1) || return 0 # static or not a dynamic object
	if grep -q 'not found' <<<"$out"; then
		echo "$out" >&2
		die "$1: libraries not found"
	fi
	while read -r line; do
		case $line in
		*'=> /'*) lib=${line#*=> }; lib=${lib%% (*} ;;
		/*) lib=${line%% (*} ;;
		*) continue ;;
		esac
		copy_file "$lib"
	done <<<"$out"
}

copy_file() { # absolute host path -> same path in the initramfs (+ closure)
	local p=$1
	[[ -n ${copied[$p]:-} ]] && return 0
	copied[$p]=1
	[[ -e $p ]] || die "no such file: $p"
	if [[ -d $p ]]; then
		cp -rL --parents "$p" "$root" || die "copying $p"
		local f
		while IFS= read -r -d '' f; do
			is_elf "$f" && copy_libs "$f"
		done < <(find -L "$p" -type f -print0)
	else
		cp -L --parents "$p" "$root" || die "copying $p"
		is_elf "$p" && copy_libs "$p"
	fi
	return 0
}

tool_path() { # name -> absolute path or empty
	command -v "$1" 2>/dev/null || { [[ -x /usr/sbin/$1 ]] && echo "/usr/sbin/$1"; } || true
}

ip_bin=$(tool_path ip)
rdma_bin=$(tool_path rdma)
[[ -n $ip_bin && -n $rdma_bin ]] || die "ip/rdma (iproute2) not found"
is_elf "$(readlink -f "$ip_bin")" || die "$ip_bin is not iproute2's ip"
bash_bin=$(command -v bash)
copy_file "$ip_bin"
copy_file "$rdma_bin"
copy_file "$bash_bin"

# libibverbs provider for rxe (dlopened: ldd cannot see it) and libgcc_s,
# which glibc dlopens when librdmacm's threads exit.
libdir=$(dirname "$(ldd "$rdma_bin" | awk '$1 == "libc.so.6" { print $3 }')")
rxe_prov=$(ls "$libdir"/libibverbs/librxe-rdmav*.so 2>/dev/null | head -n1) ||
	die "librxe-rdmav*.so not found: install ibverbs-providers"
copy_file "$rxe_prov"
[[ -f /etc/libibverbs.d/rxe.driver ]] || die "/etc/libibverbs.d/rxe.driver missing"
copy_file /etc/libibverbs.d/rxe.driver
[[ -f $libdir/libgcc_s.so.1 ]] && copy_file "$libdir/libgcc_s.so.1"

# Handy tools when installed: perftest, ibverbs-utils, rdmacm-utils.
for t in ib_read_bw ib_read_lat ib_write_bw ib_write_lat ib_send_bw \
	ib_send_lat ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong \
	rping ucmatose rdma_server rdma_client; do
	p=$(command -v "$t" 2>/dev/null) || continue
	copy_file "$p"
done

for p in ${files[@]+"${files[@]}"}; do
	p=$(realpath -s -- "$p")
	copy_file "$p"
done

# busybox applets wherever nothing real was copied.
cp "$busybox" "$root/usr/bin/busybox"
while read -r a; do
	[[ -e $root/$a || -L $root/$a ]] && continue
	ln -s /usr/bin/busybox "$root/$a"
done < <("$busybox" --list-full)

for m in "${modules[@]}"; do cp "$kdir/modules/$m.ko" "$root/kvp/modules/"; done
printf '%s\n' "${modules[@]}" >"$root/kvp/modules.order"

printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"

for ((i = 1; i <= ncmds; i++)); do
	printf '%s\n' "${cmds[i - 1]}" >"$root/kvp/cmd.$i"
done
{
	printf 'NCMDS=%d\nDEVICES=%d\nMTU=%d\nCMD_TIMEOUT=%d\nRUN_ID=%s\n' \
		"$ncmds" "$devices" "$mtu" "$cmd_timeout" "$run_id"
	printf 'IP=%q\nRDMA=%q\nBASH=%q\nHOST_PWD=%q\n' \
		"$ip_bin" "$rdma_bin" "$bash_bin" "$PWD"
} >"$root/kvp/config"
for e in ${envs[@]+"${envs[@]}"}; do printf 'export %q\n' "$e"; done >"$root/kvp/env"
printf '%s\n' "$discover_sh" >"$root/kvp/discover.sh"

cat >"$root/init" <<'EOF'
#!/bin/sh
# Generated by scripts/rxe-vm.sh.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t tmpfs tmpfs /dev/shm
# / is the unpacked initramfs, already in RAM: /tmp stays as is so that
# --files under /tmp remain visible.
chmod 1777 /tmp /var/tmp
exec </dev/null >/dev/console 2>&1
. /kvp/config
. /kvp/discover.sh

up() { cut -d' ' -f1 /proc/uptime; }
# Markers go to the console and to ttyS1, a file on the host that kernel
# messages cannot interleave with; closing the tty waits for it to drain.
mark() {
	echo "$*"
	echo "$*" >/dev/ttyS1
}
finish() {
	mark "KVP-SUMMARY total=$NCMDS pass=$pass fail=$fail skip=$skip uptime=$(up) id=$RUN_ID"
	sync
	poweroff -f
	sleep 10
}
setup_failed() {
	mark "KVP-SETUP-FAILED $* id=$RUN_ID"
	pass=0 fail=$NCMDS skip=0
	finish
}
echo "KVP-INIT uptime=$(up)"

for m in $(cat /kvp/modules.order); do
	insmod "/kvp/modules/$m.ko" || setup_failed "insmod $m"
done

$IP link set lo up || setup_failed "lo up"
# The default 1000 drops bursts of large read responses.
echo 10000 >/proc/sys/net/core/netdev_max_backlog
if [ "$DEVICES" = 1 ]; then
	$IP addr add 10.77.0.1/24 dev dummy0 || setup_failed "dummy0 address"
	$IP link set dummy0 mtu "$MTU" up || setup_failed "dummy0 mtu $MTU up"
	$RDMA link add rxe0 type rxe netdev dummy0 || setup_failed "rxe0"
	rxe_devs=rxe0
else
	# Two addresses of one namespace are both "local": without per-device
	# routes traffic never crosses the veth and QP setup fails.
	$IP link add veth0 type veth peer name veth1 || setup_failed "veth"
	$IP addr add 10.77.1.1/24 dev veth0 || setup_failed "veth0 address"
	$IP addr add 10.77.1.2/24 dev veth1 || setup_failed "veth1 address"
	for c in all default veth0 veth1; do
		echo 1 >/proc/sys/net/ipv4/conf/$c/accept_local
		echo 0 >/proc/sys/net/ipv4/conf/$c/rp_filter
	done
	$IP link set veth0 mtu "$MTU" up || setup_failed "veth0 mtu $MTU up"
	$IP link set veth1 mtu "$MTU" up || setup_failed "veth1 mtu $MTU up"
	$IP route add 10.77.1.0/24 dev veth0 src 10.77.1.1 table 100 &&
	$IP route add 10.77.1.0/24 dev veth1 src 10.77.1.2 table 101 &&
	$IP rule add pref 5 oif veth0 to 10.77.1.1 lookup local &&
	$IP rule add pref 6 oif veth1 to 10.77.1.2 lookup local &&
	$IP rule add pref 10 oif veth0 lookup 100 &&
	$IP rule add pref 11 oif veth1 lookup 101 &&
	$IP rule add pref 100 lookup local &&
	$IP rule del pref 0 lookup local || setup_failed "policy routing"
	$RDMA link add rxe0 type rxe netdev veth0 || setup_failed "rxe0"
	$RDMA link add rxe1 type rxe netdev veth1 || setup_failed "rxe1"
	rxe_devs="rxe0 rxe1"
fi

# The IPv4 GID appears once the netdev is up with its address.
n=0
for d in $rxe_devs; do
	t=0
	until kvp_gid_v4 "$d" >/dev/null; do
		t=$((t + 1))
		[ $t -le 100 ] || setup_failed "no IPv4 RoCE v2 GID on $d"
		sleep 0.1
	done
	kvp_export $n "$d"
	n=$((n + 1))
done
export KVP_NDEVS=$n KVP_IN_VM=1 HOME=/root TMPDIR=/tmp
. /kvp/env
env | grep '^KVP_' | sort
$RDMA link show
echo "KVP-READY uptime=$(up)"

cd "$HOST_PWD" 2>/dev/null || cd /
pass=0 fail=0 skip=0
i=1
while [ $i -le $NCMDS ]; do
	echo "KVP-BEGIN $i/$NCMDS: $(head -n1 /kvp/cmd.$i)"
	t0=$(up)
	timeout "$CMD_TIMEOUT" "$BASH" -c "$(cat /kvp/cmd.$i)" </dev/null
	rc=$?
	# Leftover background processes (servers) must not leak into the
	# next command: kill everything but init.
	kill -KILL -1 2>/dev/null
	case $rc in
	0) pass=$((pass + 1)) ;;
	77) skip=$((skip + 1)) ;;
	*) fail=$((fail + 1)) ;;
	esac
	mark "KVP-RESULT $i/$NCMDS rc=$rc start=$t0 end=$(up) id=$RUN_ID"
	i=$((i + 1))
done
finish
EOF
chmod +x "$root/init"

# /dev/console must exist before /init runs or it has no stdout.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true

initrd=$work/initramfs.gz
if command -v cpio >/dev/null; then cpio_cmd=(cpio --quiet); else cpio_cmd=("$busybox" cpio); fi
(cd "$root" && find . | LC_ALL=C sort | "${cpio_cmd[@]}" -o -H newc) |
	gzip -1 >"$initrd" || die "building the initramfs failed"
t_built=$(date +%s.%N)

# ------------------------------------------------------------------- boot
# TCG by default: on these machines /dev/kvm opens but a KVM guest never
# prints a line. Multi-threaded TCG with 2 vCPUs keeps busy-polling peers fast.
case ${KVP_VM_ACCEL:-tcg} in
kvm) accel_args=(-accel kvm -cpu host) ;;
tcg) accel_args=(-accel "tcg,thread=multi") ;;
*) die "KVP_VM_ACCEL must be tcg or kvm" ;;
esac
# The uncompressed vmlinux boots through its PVH entry and skips ~6 s of
# bzImage self-decompression under TCG.
kernel=$kdir/vmlinux
[[ -f $kernel ]] || kernel=$kdir/vmlinuz

qemu=(qemu-system-x86_64 "${accel_args[@]}" -smp "${KVP_VM_SMP:-2}"
	-m "${KVP_VM_MEM:-512}" -kernel "$kernel" -initrd "$initrd"
	-append "console=ttyS0 quiet panic=-1 ${KVP_VM_APPEND:-}"
	-nodefaults -no-user-config -nic none -display none -serial stdio
	-serial "file:$work/markers.log" -monitor none -no-reboot)

note "$(du -h "$initrd" | cut -f1) initramfs, ${#modules[@]} modules from ${kdir##*/}, $devices device(s), $ncmds command(s), accel ${accel_args[*]}"
log=$work/console.log
progress "booting the VM (QEMU, TCG emulation; the first command starts after ~5-15 s)"
t_boot=$(date +%s.%N)
t_init="" t_ready=""
set +e
shopt -s lastpipe
# stdin is /dev/null so qemu never puts a terminal into raw mode.
# --quiet shows a command's own lines only: between its KVP-BEGIN and
# KVP-RESULT, without kernel messages ("[   30.48] reboot: Power down").
show=$((!quiet))
timeout -k 5 "$vm_timeout" "${qemu[@]}" </dev/null 2>&1 |
	while IFS= read -r line || [[ -n $line ]]; do
		line=${line%$'\r'}
		printf '%s\n' "$line" >>"$log"
		case $line in
		*KVP-INIT*) t_init=$(date +%s.%N) ;;
		*KVP-READY*) t_ready=$(date +%s.%N) ;;
		esac
		if ((quiet)); then
			case $line in
			KVP-BEGIN\ [0-9]*/[0-9]*:*) show=1; continue ;;
			KVP-RESULT\ [0-9]*/[0-9]*\ rc=*) show=0; continue ;;
			\[*) [[ $line =~ ^\[\ *[0-9]+\.[0-9]+\]\  ]] && continue ;;
			esac
		fi
		((show)) && printf '%s\n' "$line"
	done
qst=("${PIPESTATUS[@]}")
set -e
t_end=$(date +%s.%N)

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
if [[ ${qst[0]} -eq 124 || ${qst[0]} -eq 137 ]]; then
	note "VM killed after --timeout $vm_timeout s"
elif [[ ${qst[0]} -ne 0 ]]; then
	note "qemu exited with ${qst[0]}"
fi
note "timing: prepare $(secs "$t_prep" "$t_built") s, /init at ${t_init:+$(secs "$t_boot" "$t_init")} s, rxe ready at ${t_ready:+$(secs "$t_boot" "$t_ready")} s, VM total $(secs "$t_boot" "$t_end") s"
touch "$work/markers.log"
markers() { cat "$work/markers.log" "$log" | tr -d '\r'; }
markers | grep -a "KVP-SETUP-FAILED.*id=$run_id" | head -n1 | sed "s/^/$prog: /" >&2 || true

missing=0
for ((i = 1; i <= ncmds; i++)); do
	m=$(markers | grep -a -o "KVP-RESULT $i/$ncmds rc=[0-9]* start=[0-9.]* end=[0-9.]* id=$run_id" |
		head -n1) || m=
	if [[ -z $m ]]; then
		missing=$((missing + 1))
		continue
	fi
	rc=${m#*rc=}; rc=${rc%% *}
	s=${m#*start=}; s=${s%% *}
	e=${m#*end=}; e=${e%% *}
	record "$i" "$rc" "$(secs "$s" "$e")"
done
markers | grep -aq "KVP-SUMMARY total=$ncmds .*id=$run_id" || note "no summary marker from the guest"
[[ ${KVP_KEEP:-0} == 1 ]] && note "console log: $log"
final_report "$missing"
