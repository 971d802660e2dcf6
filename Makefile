# Two entry points for a fresh Debian 12 machine (run as root):
#   make demo   installs everything, builds the guest, runs the example container
#   make test   installs everything, builds the guest, runs the whole test suite
PYTHON ?= python3
VENV := .venv
PARACELL := $(VENV)/bin/paracell
STAMP := $(VENV)/.installed

.PHONY: deps venv guest demo test lint bench clean

deps:
	./scripts/install-deps.sh

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.c csrc/*.h csrc/*.py proto/*.h paracell/cri/api.proto) \
		$(shell find paracell/shimv2/proto -name '*.proto')
	$(MAKE) deps
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	$(VENV)/bin/python -m paracell.cri.generate
	$(VENV)/bin/python -m paracell.shimv2.generate
	touch $(STAMP)

# Byte-compiled ahead: an editable install leaves that to each process,
# and where PYTHONDONTWRITEBYTECODE is set (this project's machines) every
# paracell process would compile its modules from source again, which
# doubled the CLI's start-up (docs/benchmarks.md, "bench start").
venv: deps $(STAMP)
	$(VENV)/bin/python -m compileall -q paracell

guest: venv
	$(PARACELL) guest build

demo: guest
	$(PARACELL) demo

test: guest
	$(VENV)/bin/ruff check paracell tests csrc
	$(VENV)/bin/pytest -ra

bench: guest
	$(PARACELL) bench start
	$(PARACELL) bench cli

clean:
	rm -rf $(VENV) build *.egg-info paracell/_native*.so paracell/_seccomp*.so paracell/_linux*.so paracell/_qemu_ram_plugin.so paracell/paracell-relay paracell/paracell-vmshim
