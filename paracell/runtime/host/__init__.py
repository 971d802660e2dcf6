"""The host side of a container: its namespaces, cgroups and hooks."""
