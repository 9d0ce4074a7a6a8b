"""The notebooks domain: options, records, the life of a notebook (start, stop, delete), its
data, its container, the spawn form, the reconciliation, and JupyterHub's spawner on top."""
