#!/bin/sh
# Runs inside a privileged ParaCell container (test_guest_kernel.py puts it
# at /usr/local/bin/kfeat): each scenario uses a guest kernel feature the way
# real containers do, with Debian's own tools, and prints "KEY value" lines
# that the test checks. Every namespace, interface and address is made here,
# inside the VM, which has no interface but lo: nothing leaves the guest.
# usage: dash kfeat links | netfilter legacy|nft|nftables | overlay | fuse
# Under dash, not busybox's sh: that one runs its own applets (ip, nsenter,
# unshare) ahead of the iproute2 and util-linux programs on PATH.
set -eu

# Bounded wait: runs "$@" until it succeeds, at most 50 times, 0.1 s apart.
retry() {
    local i=0
    until "$@"; do
        i=$((i + 1))
        if [ "$i" -ge 50 ]; then
            echo "gave up: $*" >&2
            return 1
        fi
        usleep 100000
    done
}

netns_of() {
    readlink "/proc/$1/ns/net"
}

left_netns() {  # left_netns PID NS: PID is no longer in namespace NS
    [ "$(netns_of "$1")" != "$2" ]
}

# Prints the pid of a process that holds a new, empty network namespace.
newns() {
    local pid
    unshare -n sleep 600 </dev/null >/dev/null 2>&1 &
    pid=$!
    retry left_netns "$pid" "$(netns_of $$)"
    echo "$pid"
}

# inns PID CMD...: CMD in that process's network namespace.
inns() {
    local pid=$1
    shift
    nsenter -t "$pid" -n "$@"
}

# The bridge, veth, TAP/TUN and VXLAN that CNI-in-pod setups make: two
# namespaces on one bridge reach each other, then over a VXLAN on top.
links() {
    brctl addbr brctl0
    [ -d /sys/class/net/brctl0/bridge ] && echo "brctl brctl0"
    ip link add br0 type bridge
    ip link add v0 type veth peer name v0p
    ip link add v1 type veth peer name v1p
    ip tuntap add dev tap0 mode tap
    ip tuntap add dev tun0 mode tun
    for port in v0 v1 tap0; do ip link set "$port" master br0; done
    for dev in br0 v0 v1 tap0 tun0; do ip link set "$dev" up; done
    echo "ports $(ls /sys/class/net/br0/brif | tr '\n' ' ')"
    echo "tun_flags tap0=$(cat /sys/class/net/tap0/tun_flags) tun0=$(cat /sys/class/net/tun0/tun_flags)"
    a=$(newns)
    b=$(newns)
    ip link set v0p netns "$a"
    ip link set v1p netns "$b"
    inns "$a" ip addr add 10.50.0.1/24 dev v0p
    inns "$b" ip addr add 10.50.0.2/24 dev v1p
    inns "$a" ip link set v0p up
    inns "$b" ip link set v1p up
    retry inns "$a" ping -c 1 -W 1 10.50.0.2 >/dev/null && echo "bridged-ping ok"
    inns "$a" ip link add vx0 type vxlan id 42 local 10.50.0.1 remote 10.50.0.2 dstport 4789 dev v0p
    inns "$b" ip link add vx0 type vxlan id 42 local 10.50.0.2 remote 10.50.0.1 dstport 4789 dev v1p
    inns "$a" ip addr add 10.60.0.1/24 dev vx0
    inns "$b" ip addr add 10.60.0.2/24 dev vx0
    inns "$a" ip link set vx0 up
    inns "$b" ip link set vx0 up
    echo "vxlan $(inns "$a" ip -d -o link show vx0 | grep -o 'vxlan id [0-9]*')"
    retry inns "$a" ping -c 1 -W 1 10.60.0.2 >/dev/null && echo "vxlan-ping ok"
}

# socat on every connection runs this: what the accepted socket says.
CONNINFO=/usr/local/bin/conninfo

listen() {  # listen NAME PORT [socat options]: IPv4 and IPv6 listeners in the background
    local name=$1 port=$2
    shift 2
    socat "TCP4-LISTEN:$port,reuseaddr,fork$*" "EXEC:$CONNINFO $name" &
    socat "TCP6-LISTEN:$port,reuseaddr,fork,ipv6only=1$*" "EXEC:$CONNINFO $name" &
}

# listening PORT COUNT [PID]: at least COUNT TCP sockets listen on PORT (in
# PID's network namespace). Connections wait for it, because one refused
# before its listener is up would leave a conntrack entry of its own.
listening() {
    local table
    if [ $# -gt 2 ]; then table=$(inns "$3" netstat -ltn); else table=$(netstat -ltn); fi
    [ "$(echo "$table" | grep -c ":$1 ")" -ge "$2" ]
}

connect() {  # connect KEY ADDRESS... : prints "KEY <what the server said>"
    local key=$1 reply
    shift
    reply=$(retry "$@")
    echo "$key $reply"
}

# The rules a service mesh's init container writes (NAT REDIRECT of inbound
# connections, TPROXY with the socket match and policy routing), plus
# MASQUERADE and conntrack/state matches, for IPv4 and IPv6, with
# iptables-legacy, iptables-nft or native nftables (inet family).
#
# The container's namespace (v0: 10.99.0.1, fd99::1) faces a peer namespace
# (p0: 10.99.0.2, fd99::2) that routes 10.98.0.0/24 and fd98::/64 to it; those
# exist nowhere, so only TPROXY can answer a connection to them.
netfilter() {
    front=$1
    peer=$(newns)
    ip link add v0 type veth peer name p0
    ip link set p0 netns "$peer"
    ip addr add 10.99.0.1/24 dev v0
    ip -6 addr add fd99::1/64 dev v0 nodad
    ip addr add 10.99.0.3/24 dev v0
    # Deprecated, so that source selection (and MASQUERADE) never picks it.
    ip -6 addr add fd99::3/64 dev v0 nodad preferred_lft 0
    ip link set v0 up
    inns "$peer" ip addr add 10.99.0.2/24 dev p0
    inns "$peer" ip -6 addr add fd99::2/64 dev p0 nodad
    inns "$peer" ip link set p0 up
    inns "$peer" ip route add 10.98.0.0/24 via 10.99.0.1
    inns "$peer" ip -6 route add fd98::/64 via fd99::1
    for family in -4 -6; do
        ip "$family" rule add fwmark 1 lookup 100
    done
    ip -4 route add local 0.0.0.0/0 dev lo table 100
    ip -6 route add local ::/0 dev lo table 100

    case $front in
    legacy | nft)
        for ipt in "iptables-$front" "ip6tables-$front"; do
            $ipt -t nat -A PREROUTING -i v0 -p tcp --dport 8080 -j REDIRECT --to-ports 9090
            $ipt -t mangle -N DIVERT
            $ipt -t mangle -A PREROUTING -p tcp -m socket --transparent -j DIVERT
            $ipt -t mangle -A DIVERT -j MARK --set-mark 1
            $ipt -t mangle -A DIVERT -j ACCEPT
            $ipt -t mangle -A PREROUTING -i v0 -p tcp --dport 80 \
                -j TPROXY --tproxy-mark 0x1/0x1 --on-port 9191
            $ipt -A INPUT -i v0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
            $ipt -A INPUT -i v0 -p tcp -m state --state NEW -j ACCEPT
        done
        iptables-$front -t nat -A POSTROUTING -o v0 -s 10.99.0.3 -j MASQUERADE
        ip6tables-$front -t nat -A POSTROUTING -o v0 -s fd99::3 -j MASQUERADE
        ;;
    nftables)
        nft -f - <<'EOF'
table inet mesh {
    chain prerouting_nat {
        type nat hook prerouting priority dstnat;
        iifname "v0" tcp dport 8080 redirect to :9090
    }
    chain postrouting_nat {
        type nat hook postrouting priority srcnat;
        oifname "v0" ip saddr 10.99.0.3 masquerade
        oifname "v0" ip6 saddr fd99::3 masquerade
    }
    chain divert {
        type filter hook prerouting priority mangle;
        meta l4proto tcp socket transparent 1 meta mark set 1 counter accept comment "socket"
        iifname "v0" tcp dport 80 tproxy to :9191 meta mark set 1 accept
    }
    chain input {
        type filter hook input priority filter;
        iifname "v0" ct state established,related counter accept comment "established"
        iifname "v0" ct state new counter accept comment "new"
    }
}
EOF
        ;;
    *)
        echo "unknown front end: $front" >&2
        return 2
        ;;
    esac

    listen redirect 9090
    listen tproxy 9191 ,ip-transparent
    inns "$peer" socat TCP4-LISTEN:7000,reuseaddr,fork "EXEC:$CONNINFO peer" &
    inns "$peer" socat TCP6-LISTEN:7000,reuseaddr,fork,ipv6only=1 "EXEC:$CONNINFO peer" &

    retry listening 9090 2
    retry listening 9191 2
    retry listening 7000 2 "$peer"
    # Nothing listens on 8080 or 80, and 10.98.0.7 is no one's address.
    connect redirect4 inns "$peer" socat -T 5 -u TCP4:10.99.0.1:8080,connect-timeout=2 -
    connect redirect6 inns "$peer" socat -T 5 -u TCP6:[fd99::1]:8080,connect-timeout=2 -
    connect tproxy4 inns "$peer" socat -T 5 -u TCP4:10.98.0.7:80,connect-timeout=2 -
    connect tproxy6 inns "$peer" socat -T 5 -u TCP6:[fd98::7]:80,connect-timeout=2 -
    connect masquerade4 socat -T 5 -u TCP4:10.99.0.2:7000,bind=10.99.0.3,connect-timeout=2 -
    connect masquerade6 socat -T 5 -u TCP6:[fd99::2]:7000,bind=[fd99::3],connect-timeout=2 -

    # The REDIRECTed connections as conntrack holds them: sent to 8080, answered from 9090.
    conntrack -L -f ipv4 -p tcp --dport 8080 2>/dev/null | sed 's/^/conntrack4 /'
    conntrack -L -f ipv6 -p tcp --dport 8080 2>/dev/null | sed 's/^/conntrack6 /'

    # Packets each match counted: -m socket (the TPROXYed connection's later
    # packets), the conntrack and state matches.
    case $front in
    legacy | nft)
        for ipt in "iptables-$front" "ip6tables-$front"; do
            fam=${ipt%%tables-*}
            echo "count $fam socket $($ipt -t mangle -L DIVERT -v -x -n | awk '$3 == "MARK" {print $1; exit}')"
            echo "count $fam established $($ipt -L INPUT -v -x -n | awk '/RELATED,ESTABLISHED/ {print $1; exit}')"
            echo "count $fam new $($ipt -L INPUT -v -x -n | awk '/NEW/ {print $1; exit}')"
        done
        ;;
    nftables)
        nft list table inet mesh | awk '/comment/ {
            for (i = 1; i <= NF; i++) if ($i == "packets") n = $(i + 1)
            name = $NF; gsub(/"/, "", name); print "count inet " name " " n }'
        ;;
    esac
    # Which kernel interface each front end used: nf_tables, or ip(6)_tables.
    echo "nft-tables $(nft list tables | tr '\n' ' ')"
    echo "legacy-tables $(cat /proc/net/ip_tables_names /proc/net/ip6_tables_names | sort -u | tr '\n' ' ')"
}

# Image layers stacked as a nested build or runtime stacks them: a lower layer
# from the container's own rootfs (9p) under one on tmpfs, a tmpfs upper.
overlay() {
    d=/tmp/ov
    mkdir -p $d/lower $d/upper $d/work $d/merged
    echo from-tmpfs-layer > $d/lower/a
    echo doomed > $d/lower/b
    mount -t overlay overlay -o "lowerdir=$d/lower:/layers/base,upperdir=$d/upper,workdir=$d/work" $d/merged
    echo appended >> $d/merged/a
    rm $d/merged/b
    echo new > $d/merged/c
    echo "merged $(ls $d/merged | tr '\n' ' ')"
    echo "merged/a $(cat $d/merged/a | tr '\n' ' ')"
    echo "merged/base-file $(cat $d/merged/base-file)"
    echo "lower/a $(cat $d/lower/a)"
    echo "upper $(ls $d/upper | tr '\n' ' ')"
    echo "whiteout $(stat -c '%F %t:%T' $d/upper/b)"
    echo "mounted $(grep " $d/merged " /proc/mounts | cut -d' ' -f1,3)"
}

# A FUSE filesystem from Debian: bindfs serves /tmp/src at /tmp/mnt with its
# own owner and mode, which only the daemon behind /dev/fuse can answer.
fuse() {
    mkdir -p /tmp/src /tmp/mnt
    echo hello-fuse > /tmp/src/f
    bindfs -u 4242 -g 4343 -p 0640 /tmp/src /tmp/mnt
    echo "mounted $(grep ' /tmp/mnt ' /proc/mounts | cut -d' ' -f1,3)"
    echo "stat $(stat -c '%u %g %a' /tmp/mnt/f) source $(stat -c '%u %g %a' /tmp/src/f)"
    echo "read $(cat /tmp/mnt/f)"
    echo written-through-fuse > /tmp/mnt/g
    echo "source/g $(cat /tmp/src/g)"
    umount /tmp/mnt
    echo "after-umount $(ls /tmp/mnt | wc -l)"
}

scenario=$1
shift
"$scenario" "$@"
