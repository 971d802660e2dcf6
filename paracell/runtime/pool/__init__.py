"""The warm pool: VMs restored and attached ahead of the creates that take
them (docs/pool.md). `daemon.py` keeps them; `runtime/pod/pooled.py` is how a
container takes one; `runtime/poolwire.py` is what they say to each other."""
