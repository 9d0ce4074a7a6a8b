"""``gpulab doctor``: what a real deployment needs of this host, checked before the first start.

Run on the hub's host with the hub's configuration file; it reads the same settings the hub and
its service read and checks, each as ``ok``, ``warning`` or ``error`` with what to do: the
container engine and its runtimes against ``gpu_mode``, NVML and the driver, each GPU, each
image the configuration names (present, its flavour, the CUDA version it needs against the
driver's), each object store with its credentials, the engine's address pools against the
users' networks, the database's schema and the proxy's binary.

:mod:`.gather` reads the host (I/O); :mod:`.checks` judges what it read (pure, tested as data);
``python -m gpulab.doctor`` (and ``gpulab doctor``, which runs it) prints the findings. Exit
status 0 without an error, 1 with one, 2 for a usage error. See docs/doctor.md.
"""
