"""`paracell bench suite`: real applications from Debian's packages under runc
and ParaCell's memory managers, side by side, with a report that sets the
measured ratios beside the paper's headline figures.

- runtimes.py: the runtimes and how each is invoked;
- workloads.py: the workloads, their host-side clients and result parsers;
- network.py: the suite's bridge and per-container network namespaces;
- run.py: the interleaved rounds, progress and cleanup;
- report.py: suite.json, the PNGs and report.md.
"""
