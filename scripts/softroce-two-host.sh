#!/bin/sh
# softroce-two-host.sh - the two-host phase of scripts/softroce-test, run INSIDE the Soft-RoCE guest
# (busybox sh) after the loopback tests, by the runner softroce-test generates (sourced: it adds
# to the runner's TOTAL_P / TOTAL_F).
#
# The "two hosts": a veth pair vethA <-> vethB, 10.77.0.1/24 on vethA and 10.77.0.2/24 on vethB,
# an rxe device on each end (rxeA, rxeB), so the two endpoints have distinct IP addresses and
# GIDs (the IPv4-mapped RoCE v2 GIDs ::ffff:10.77.0.1 and ::ffff:10.77.0.2 are what select_gid
# picks). Servers run on rxeA, clients on rxeB: every RoCE packet crosses the veth wire.
#
# Why not two network namespaces: Debian 12's kernel (6.1) rxe opens its UDP socket and routes in
# init_net only (rxe_net.c: rxe_find_route4(&init_net, ..), rxe_setup_udp_tunnel(&init_net, ..));
# an rxe on a netdev moved to another namespace creates QPs but cannot send (tried: "local QP
# operation error"). So both ends stay in init_net and policy routing makes them two hosts:
# locally generated packets to the peer's address are routed out of this end's veth (rules 10/11,
# tried before the `local` table, which moves from pref 0 to 100), a packet arriving on the other
# end is delivered locally (`local` table), accept_local=1 and rp_filter=0 let a packet whose
# source is a local address in, and static neighbour entries replace ARP. The TCP handshakes
# (rpc-perf's out-of-band exchange, the runtime's control channel) take the same wire.
#
# Each test runs its server (background, rxeA) and its client (rxeB) under `timeout`, with
# tcpdump capturing UDP 4791 on vethA (headers only, -s 128) into /out/twohost-NAME.pcap; the
# host decodes those with tshark after the guest exits (scripts/softroce-test). Per test it prints
# `@@BIN twohost:NAME: P passed, F failed` (pass = client and server both exit 0).
#
# Needs: $TWOHOST_BIN (dir with rpc-perf, hello-server, hello-client, kv-server, kv-client),
# /usr/sbin/ip (iproute2: busybox ip has no rule/veth support), rdma, tcpdump.

TH_IP=/usr/sbin/ip
TH_TIMEOUT=${TWOHOST_TIMEOUT:-300}
TH_A=10.77.0.1
TH_B=10.77.0.2

twohost_setup() {
  $TH_IP link add vethA type veth peer name vethB || return 1
  $TH_IP addr add $TH_A/24 dev vethA && $TH_IP addr add $TH_B/24 dev vethB || return 1
  $TH_IP link set vethA up && $TH_IP link set vethB up || return 1
  for c in all default vethA vethB; do
    echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local; echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
  done
  read -r ma < /sys/class/net/vethA/address; read -r mb < /sys/class/net/vethB/address
  $TH_IP neigh replace $TH_B lladdr "$mb" dev vethA nud permanent || return 1
  $TH_IP neigh replace $TH_A lladdr "$ma" dev vethB nud permanent || return 1
  $TH_IP route add $TH_B dev vethA src $TH_A table 10 && $TH_IP route add $TH_A dev vethB src $TH_B table 11 || return 1
  $TH_IP rule add pref 10 iif lo to $TH_B lookup 10 && $TH_IP rule add pref 11 iif lo to $TH_A lookup 11 || return 1
  $TH_IP rule add pref 100 lookup local && $TH_IP rule del pref 0 || return 1
  $TH_IP route get $TH_B from $TH_A | grep -q 'dev vethA' || { echo "two-host: $TH_B is not routed out of vethA"; return 1; }
  rdma link add rxeA type rxe netdev vethA && rdma link add rxeB type rxe netdev vethB || return 1
  n=0   # wait (max ~5 s) for the IPv4-mapped GIDs
  while [ $n -lt 50 ]; do
    if grep -q 'ffff:0a4d:0001' /sys/class/infiniband/rxeA/ports/1/gids/* 2>/dev/null \
       && grep -q 'ffff:0a4d:0002' /sys/class/infiniband/rxeB/ports/1/gids/* 2>/dev/null; then break; fi
    n=$((n + 1)); sleep 0.1
  done
  for d in rxeA rxeB; do
    for i in 0 1 2 3; do
      v=""; t=""; read -r v < /sys/class/infiniband/$d/ports/1/gids/$i 2>/dev/null
      read -r t < /sys/class/infiniband/$d/ports/1/gid_attrs/types/$i 2>/dev/null
      case "$v" in ""|0000:0000:0000:0000:0000:0000:0000:0000) ;; *) echo "two-host: $d gid[$i]=$v type=$t";; esac
    done
  done
  rdma link show
  mkdir -p /out
}

# twohost_wait_port PORT: waits (max ~60 s) until a TCP socket listens on PORT
twohost_wait_port() {
  hex=$(printf '%04X' "$1"); n=0
  while [ $n -lt 600 ]; do
    grep -q ":$hex 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    n=$((n + 1)); sleep 0.1
  done
  return 1
}

# twohost_run NAME EXPECT PORT "SERVER CMD" "CLIENT CMD"
#   EXPECT (small|bulk) is what the host asserts on the capture: small = SENDs and no WRITE,
#   bulk = RDMA WRITEs; both: no RDMA READ (see scripts/softroce-test)
twohost_run() {
  name=$1; echo "@@WIRE_EXPECT $name $2"; shift 2; set -- "$name" "$@"
  echo "@@BIN_START twohost:$1"
  tcpdump -Z root -i vethA -n -s 128 -U --immediate-mode -w "/out/twohost-$1.pcap" udp port 4791 > "/tmp/tcpdump.$1" 2>&1 &
  tpid=$!
  n=0; while [ $n -lt 50 ] && ! grep -q listening "/tmp/tcpdump.$1"; do n=$((n + 1)); sleep 0.1; done
  timeout "$TH_TIMEOUT" sh -c "$3" > "/tmp/srv.$1" 2>&1 &
  spid=$!
  if twohost_wait_port "$2"; then
    timeout "$TH_TIMEOUT" sh -c "$4" > "/tmp/cli.$1" 2>&1; crc=$?
  else
    echo "server did not listen on TCP port $2" > "/tmp/cli.$1"; crc=99
  fi
  case "$1" in rpc_*) ;; *) kill "$spid" 2>/dev/null;; esac   # the examples' servers serve until killed
  wait "$spid"; src=$?
  case "$1" in rpc_*) ;; *) [ $crc = 0 ] && src=0;; esac       # killed on purpose
  sleep 1; kill "$tpid" 2>/dev/null; wait "$tpid"   # --immediate-mode: no packet left in an unretired ring block
  echo "-- GIDs chosen (select_gid, server then client):"
  grep -h 'local address chosen' "/tmp/srv.$1" "/tmp/cli.$1"
  echo "-- client ($4):"; tail -n 25 "/tmp/cli.$1"
  echo "-- server ($3):"; tail -n 15 "/tmp/srv.$1"
  echo "-- tcpdump: $(grep -E 'captured|dropped' "/tmp/tcpdump.$1" | tr '\n' ' ')"
  if [ $crc = 0 ] && [ $src = 0 ]; then p=1; f=0; else p=0; f=1; fi
  echo "@@BIN twohost:$1: $p passed, $f failed (client rc=$crc, server rc=$src)"
  TOTAL_P=$((TOTAL_P + p)); TOTAL_F=$((TOTAL_F + f))
}

echo "@@TWOHOST_START uptime=$(cut -d' ' -f1 /proc/uptime)"
if ! twohost_setup; then
  echo "@@BIN twohost:setup: 0 passed, 1 failed"
  TOTAL_F=$((TOTAL_F + 1))
else
  B=$TWOHOST_BIN
  PERF_S="$B/rpc-perf --transport rdma -d rxeA --poll yield --no-progress"
  PERF_C="$B/rpc-perf $TH_A --transport rdma -d rxeB --poll yield --no-progress --warmup 10"
  twohost_run rpc_lat_32 small 18515 "$PERF_S" "$PERF_C --test rpc_lat -s 32 -n 300"
  twohost_run rpc_bw_32 small 18515 "$PERF_S" "$PERF_C --test rpc_bw -s 32 -n 300"
  twohost_run rpc_lat_64k bulk 18515 "$PERF_S" "$PERF_C --test rpc_lat -s 64K -n 50"
  twohost_run rpc_bw_64k bulk 18515 "$PERF_S" "$PERF_C --test rpc_bw -s 64K -n 50 -c 4"
  twohost_run hello small 50051 "$B/hello-server --transport rdma -d rxeA --addr 0.0.0.0:50051" \
    "$B/hello-client --transport rdma -d rxeB --addr $TH_A:50051"
  twohost_run kv bulk 50052 "$B/kv-server --transport rdma -d rxeA --addr 0.0.0.0:50052" \
    "$B/kv-client --transport rdma -d rxeB --addr $TH_A:50052"
fi
echo "@@TWOHOST_END uptime=$(cut -d' ' -f1 /proc/uptime)"
