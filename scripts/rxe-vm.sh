#!/usr/bin/env bash
# rxe-vm.sh - boot a throwaway qemu guest running Debian's stock kernel with
# Soft-RoCE (rdma_rxe) and run a binary inside it against a real rxe0 device.
# Tested on Debian 12 (bookworm) x86_64, 2 cores, no /dev/kvm usable (TCG), as root.
# Used by scripts/softroce-test (the project's Soft-RoCE test tier); usable on its own, e.g.
#   scripts/rxe-vm.sh                        # smoke tests only (ibv_rc_pingpong, perftest, rping)
#   scripts/rxe-vm.sh target/release/rpc-perf --transport rdma
# Needs root for apt-get (or RXE_VM_NO_APT=1 with the packages below installed). No KVM needed.
#
# Usage:  rxe-vm.sh [BINARY [ARGS...]]
#   BINARY (any host executable or #!/bin/sh script) is copied, with the shared libs
#   ldd finds, into an initramfs and run inside the guest as root, cwd=/work, with:
#     RXE_DEV=rxe0 RXE_NETDEV=dummy0 RXE_GID_IDX=<RoCEv2 GID index, normally 0>
#     RXE_IP6=fe80::..%dummy0 RXE_IP6_ADDR=fe80::.. RXE_IFINDEX=<dummy0 ifindex>  (for rdma_cm)
#     RDMAV_FORK_SAFE=1, RLIMIT_MEMLOCK unlimited
#   Exit code: BINARY's exit code; 1 if a smoke test failed; 124 guest timeout;
#   3 boot/setup failure (no result marker on the console).
#   With no BINARY only the smoke tests run.
#
# Environment knobs (all optional):
#   RXE_VM_WORK=~/.cache/rpc-softroce  scratch dir (kernel .deb + extract, initramfs, console.log);
#                                  the kernel is downloaded once and kept there
#   RXE_VM_SMOKE=0|1               ibv_devinfo, ibv_rc_pingpong, ib_send_lat, ib_write_bw, rping
#                                  (default: 1 without BINARY, 0 with BINARY; costs ~10 s under TCG)
#   RXE_VM_EXTRA_BINS="..."        extra host executables to copy in (with ldd deps), e.g. "/bin/bash"
#   RXE_VM_EXTRA_FILES="..."       extra host files/dirs copied to the same path in the guest
#   RXE_VM_KERNEL_PKG=...          Debian kernel package (default: what linux-image-amd64 depends on)
#   RXE_VM_ACCEL=tcg|kvm           default tcg (this machine's /dev/kvm is kvm-pvm: stock kernels hang)
#   RXE_VM_SMP=2  RXE_VM_MEM=1024  RXE_VM_TIMEOUT=900 (seconds for the whole guest run)
#   RXE_VM_OUT=DIR                 attach a scratch virtio disk; what the guest leaves in /out is
#                                  written to it (tar) at the end and unpacked into DIR on the host
#                                  (RXE_VM_OUT_MB=512: its size; sparse)
#   RXE_VM_NO_APT=1                skip the apt-get install step
set -euo pipefail

WORK=${RXE_VM_WORK:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/rpc-softroce}
if [ $# -gt 0 ]; then SMOKE=${RXE_VM_SMOKE:-0}; else SMOKE=${RXE_VM_SMOKE:-1}; fi
ACCEL=${RXE_VM_ACCEL:-tcg}
SMP=${RXE_VM_SMP:-2}
MEM=${RXE_VM_MEM:-1024}
TIMEOUT=${RXE_VM_TIMEOUT:-900}
SECONDS=0
log() { echo "[rxe-vm +${SECONDS}s] $*" >&2; }

# ---------------------------------------------------------------- 1. packages
PKGS="qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev
      rdmacm-utils perftest busybox-static iproute2 kmod cpio xz-utils tcpdump"
if [ -z "${RXE_VM_NO_APT:-}" ]; then
  missing=""
  for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    log "apt-get install$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi

# ---------------------------------------------------------------- 2. kernel (extracted, not installed)
mkdir -p "$WORK"
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=${RXE_VM_KERNEL_PKG:-$(kpkg)}
[ -n "$KPKG" ] || { apt-get update -qq; KPKG=$(kpkg); }
[ -n "$KPKG" ] || { echo "cannot resolve the kernel package behind linux-image-amd64" >&2; exit 3; }
KROOT=$WORK/kernel-$KPKG
if [ ! -d "$KROOT/boot" ]; then
  log "downloading + extracting $KPKG"
  rm -rf "$KROOT" && mkdir -p "$KROOT"
  (cd "$WORK" && rm -f "$KPKG"_*.deb && apt-get download -qq -o APT::Sandbox::User=root "$KPKG")
  dpkg-deb -x "$WORK/$KPKG"_*.deb "$KROOT"
fi
VMLINUZ=$(ls "$KROOT"/boot/vmlinuz-* | head -1)
KV=${VMLINUZ##*/vmlinuz-}
MODROOT=$KROOT                         # usr-merged packages put modules under usr/lib/modules
[ -d "$KROOT/lib/modules/$KV" ] || { [ -d "$KROOT/usr/lib/modules/$KV" ] && MODROOT=$KROOT/usr; }
[ -f "$MODROOT/lib/modules/$KV/modules.dep" ] || depmod -b "$MODROOT" "$KV"
log "kernel $KV"

# ---------------------------------------------------------------- 3. initramfs
R=$WORK/initramfs
rm -rf "$R"
mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,proc,sys,dev,tmp,run,etc,work,modules}
ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"

copy_file() {  # copy host file to the same (canonical, usr-merged) path in the initramfs
  local src=$1 real dst
  real=$(readlink -f "$src")
  dst=$(readlink -f "$(dirname "$src")")/$(basename "$src")   # canonical dir, original name
  dst=${dst#/}; case "$dst" in bin/*|sbin/*|lib/*|lib64/*) dst=usr/$dst;; esac
  if [ -e "$R/$dst" ]; then return 0; fi
  mkdir -p "$R/$(dirname "$dst")"
  cp -L "$real" "$R/$dst"
}
copy_bin() {  # binary + all shared libs it needs
  local b=$1 lib
  copy_file "$b"
  for lib in $(ldd "$b" 2>/dev/null | grep -oE '/[^ ]+' | sort -u); do copy_file "$lib"; done
}

cp /bin/busybox "$R/usr/bin/busybox"
for b in /usr/bin/rdma /usr/sbin/ip /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong \
         /usr/bin/ibv_ud_pingpong /usr/bin/ib_send_lat /usr/bin/ib_write_bw /usr/bin/ib_read_lat /usr/bin/rping /usr/bin/tcpdump \
         /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so \
         /usr/lib/x86_64-linux-gnu/librdmacm.so.1 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 ${RXE_VM_EXTRA_BINS:-}; do
  if [ -e "$b" ]; then copy_bin "$b"; fi
done
mkdir -p "$R/etc/libibverbs.d" && cp /etc/libibverbs.d/rxe.driver /etc/libibverbs.d/siw.driver "$R/etc/libibverbs.d/"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$R/etc/hosts"
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'hosts: files' > "$R/etc/nsswitch.conf"
for f in ${RXE_VM_EXTRA_FILES:-}; do mkdir -p "$R/$(dirname "$f")"; cp -a "$f" "$R/$f"; done

# kernel modules: rdma_rxe + deps, crc32 (rxe's ICRC uses crypto "crc32"), dummy and veth netdevs
# (veth: softroce-test's two-host phase), virtio-blk (the RXE_VM_OUT disk), siw if the kernel has it
: > "$R/modules/load.list"
WANT="crc32_generic crc32_pclmul dummy veth virtio_pci virtio_blk rdma_rxe rdma_ucm siw"
for m in $WANT; do
  modprobe -d "$MODROOT" -S "$KV" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}' || true
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko"); name=${name%%.ko*}
  case "$ko" in
    *.ko)     cp "$ko" "$R/modules/$name.ko" ;;
    *.ko.xz)  xz -dc "$ko" > "$R/modules/$name.ko" ;;
    *.ko.zst) zstd -qdc "$ko" > "$R/modules/$name.ko" ;;
    *.ko.gz)  gzip -dc "$ko" > "$R/modules/$name.ko" ;;
  esac
  echo "$name" >> "$R/modules/load.list"
done
log "modules: $(tr '\n' ' ' < "$R/modules/load.list")"

# the binary under test
if [ $# -gt 0 ]; then
  TB=$(readlink -f "$1"); shift
  copy_bin "$TB"
  { echo '#!/bin/sh'; printf 'exec %q' "$TB"; for a in "$@"; do printf ' %q' "$a"; done; echo; } > "$R/run-test.sh"
  chmod +x "$R/run-test.sh"
fi

cat > "$R/init" <<EOF
#!/bin/busybox sh
SMOKE=$SMOKE
EOF
cat >> "$R/init" <<'EOF'
/bin/busybox --install -s /bin 2>/dev/null
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev   # rootfs (initramfs) is already writable; no tmpfs over /tmp (would hide copied files)
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm   # the software NIC's host segments (the same-host path)
echo "@@INIT uptime=$(cut -d' ' -f1 /proc/uptime)"
finish() {  # /out (if any) goes to the RXE_VM_OUT disk as a tar, then the result marker
  if [ -d /out ] && [ -b /dev/vda ]; then tar -cf - -C /out . | dd of=/dev/vda bs=1M conv=fsync 2>/dev/null \
    || echo "rxe-vm: writing /out to /dev/vda failed"; fi
  echo "@@RXE_VM_EXIT=$1@@"; sync; poweroff -f; sleep 5; }
for m in $(cat /modules/load.list); do insmod /modules/$m.ko 2>/dev/null || echo "insmod $m failed (ok if builtin/loaded)"; done
ip link set lo up
ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0 || { echo "rdma link add failed"; finish 3; }
ulimit -l unlimited
n=0; v=""   # wait (max ~5s) for the first GID (derived from the netdev MAC / IPv6 link-local) to appear
while [ $n -lt 50 ]; do read -r v < /sys/class/infiniband/rxe0/ports/1/gids/0 2>/dev/null
  case "$v" in ""|0000:0000:0000:0000:0000:0000:0000:0000) n=$((n+1)); sleep 0.1;; *) break;; esac; done
# pick the RoCEv2 GID of the link-local IPv6 address (no IPv4 address needed, traffic never leaves the guest)
GID_IDX=""
P=/sys/class/infiniband/rxe0/ports/1
for i in 0 1 2 3 4 5 6 7; do   # shell builtins only: every fork costs ms under TCG
  v=""; t=""; read -r v < $P/gids/$i 2>/dev/null; read -r t < $P/gid_attrs/types/$i 2>/dev/null
  case "$v" in 0000:0000:0000:0000:0000:0000:0000:0000|"") continue;; esac
  echo "gid[$i]=$v type=$t"; [ -z "$GID_IDX" ] && GID_IDX=$i
done
[ -n "$GID_IDX" ] || { echo "no GID on rxe0"; finish 3; }
# rdma_cm needs an address on the rxe netdev (127.0.0.1/::1 do NOT work: "rdma_resolve_route: No such device");
# use dummy0's IPv6 link-local address with scope: RXE_IP6=fe80::...%dummy0
RXE_IP6_ADDR=$(ip -6 addr show dev dummy0 | awk '/inet6 fe80/{split($2,a,"/"); print a[1]; exit}')
read -r RXE_IFINDEX < /sys/class/net/dummy0/ifindex
RXE_IP6="$RXE_IP6_ADDR%dummy0"
export RXE_DEV=rxe0 RXE_NETDEV=dummy0 RXE_GID_IDX=$GID_IDX RXE_IP6 RXE_IP6_ADDR RXE_IFINDEX RDMAV_FORK_SAFE=1
echo "@@RXE_READY uptime=$(cut -d' ' -f1 /proc/uptime) gid_idx=$GID_IDX ip6=$RXE_IP6"
rdma link show
SMOKE_FAIL=0
smoke() {  # smoke NAME "SERVER CMD" "CLIENT CMD": server in background, client against it, both time-limited
  echo "== $1"
  timeout 60 sh -c "$2" > /tmp/srv.log 2>&1 & spid=$!
  sleep 1
  timeout 60 sh -c "$3"; crc=$?
  wait $spid; src=$?
  if [ $crc != 0 ] || [ $src != 0 ]; then SMOKE_FAIL=1; echo "-- server log:"; cat /tmp/srv.log; fi
  echo "@@SMOKE $1 client_rc=$crc server_rc=$src"
}
if [ "$SMOKE" = 1 ]; then
  ibv_devices; ibv_devinfo -d rxe0 || SMOKE_FAIL=1
  G=$GID_IDX
  smoke ibv_rc_pingpong "ibv_rc_pingpong -d rxe0 -g $G -n 1000" "ibv_rc_pingpong -d rxe0 -g $G -n 1000 127.0.0.1"
  smoke ib_send_lat "ib_send_lat -d rxe0 -x $G -n 1000" "ib_send_lat -d rxe0 -x $G -n 1000 127.0.0.1"
  smoke ib_write_bw "ib_write_bw -d rxe0 -x $G -n 1000" "ib_write_bw -d rxe0 -x $G -n 1000 127.0.0.1"
  smoke rping "rping -s -a $RXE_IP6 -C 10 -v" "rping -c -a $RXE_IP6 -C 10 -v > /tmp/cli.log 2>&1; r=\$?; tail -2 /tmp/cli.log; exit \$r"
fi
rc=0
if [ -x /run-test.sh ]; then
  echo "@@TEST_START uptime=$(cut -d' ' -f1 /proc/uptime)"
  cd /work && /run-test.sh; rc=$?
  echo "@@TEST_END uptime=$(cut -d' ' -f1 /proc/uptime) rc=$rc"
fi
[ $rc = 0 ] && [ $SMOKE_FAIL = 1 ] && rc=1
finish $rc
EOF
chmod +x "$R/init"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) > "$WORK/initramfs.cpio"
log "initramfs $(du -h "$WORK/initramfs.cpio" | cut -f1)"

# ---------------------------------------------------------------- 4. boot
case "$ACCEL" in
  kvm) ACC="-accel kvm -cpu host,-arch-capabilities" ;;   # plain -cpu host/max aborts here: "failed to set MSR 0x10a"
  *)   ACC="-accel tcg,thread=multi -cpu max" ;;
esac
OUTDISK=""
if [ -n "${RXE_VM_OUT:-}" ]; then   # a raw disk the guest writes /out to (tar), unpacked into RXE_VM_OUT
  rm -f "$WORK/out.img"; truncate -s "${RXE_VM_OUT_MB:-512}M" "$WORK/out.img"
  OUTDISK="-drive file=$WORK/out.img,format=raw,if=virtio"
fi
log "booting qemu ($ACCEL, smp=$SMP, mem=${MEM}M)"
CONSOLE=$WORK/console.log
set +e
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 $ACC -smp "$SMP" -m "$MEM" \
  -nographic -no-reboot -nodefaults -serial stdio -net none \
  -kernel "$VMLINUZ" -initrd "$WORK/initramfs.cpio" $OUTDISK \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" </dev/null 2>&1 \
  | stdbuf -o0 tr -d '\r' | tee "$CONSOLE"
qrc=${PIPESTATUS[0]}
set -e
log "qemu exited rc=$qrc"
if [ -n "$OUTDISK" ]; then
  mkdir -p "$RXE_VM_OUT"
  tar -xf "$WORK/out.img" -C "$RXE_VM_OUT" 2>/dev/null || log "no /out archive on the output disk"
  rm -f "$WORK/out.img"
fi
if grep -aqE 'BUG:|Oops|WARNING: CPU|Kernel panic|general protection' "$CONSOLE"; then
  echo "rxe-vm: WARNING: the guest kernel logged a BUG/Oops/WARNING/panic (see $CONSOLE)" >&2
fi
rc=$(grep -aoE '@@RXE_VM_EXIT=[0-9]+@@' "$CONSOLE" | tail -1 | grep -oE '[0-9]+' || true)
if [ -z "$rc" ]; then
  [ "$qrc" = 124 ] && { echo "guest timed out after ${TIMEOUT}s" >&2; exit 124; }
  echo "guest did not report a result (qemu rc=$qrc)" >&2; exit 3
fi
exit "$rc"
