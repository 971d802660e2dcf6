"""The interfaces as launch-spec records for the agent (docs/agent-protocol.md).

    net.if=NAME\\x1fMAC\\x1fMTU[\\x1fDEVICE_MAC]          one per interface, in order
    net.addr=N\\x1fADDRESS/PREFIX                      N: the interface's place, from 0
    net.route=N\\x1fDST/PREFIX\\x1fGATEWAY\\x1fMETRIC\\x1fONLINK

The agent finds each virtio-net device by its MAC (by DEVICE_MAC when the
interface takes over a spare device, whose MAC it then sets), renames it,
sets its MTU, brings it up, then adds the addresses and the routes in the
order given.
"""

from __future__ import annotations

from paracell import speckeys as K
from paracell.net.discover import Interface

SEP = "\x1f"


def records(interfaces: list[Interface], device_macs: list[str] | None = None
            ) -> list[tuple[str, str]]:
    out = [(K.NET_IF, SEP.join([i.name, i.mac, str(i.mtu),
                                *([device_macs[n]] if device_macs else [])]))
           for n, i in enumerate(interfaces)]
    for n, iface in enumerate(interfaces):
        out += [(K.NET_ADDR, f"{n}{SEP}{a.address}/{a.prefixlen}") for a in iface.addresses]
    for n, iface in enumerate(interfaces):
        out += [(K.NET_ROUTE, SEP.join([str(n), f"{r.dst}/{r.dst_len}", r.gateway,
                                        str(r.metric), "1" if r.onlink else "0"]))
                for r in iface.routes]
    return out
