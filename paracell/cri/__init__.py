"""A small CRI v1 client: the test suite's kubelet, and `paracell cri` for people."""
