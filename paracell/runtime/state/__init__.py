"""Container state under --root: the store, the status machine, IDs."""
