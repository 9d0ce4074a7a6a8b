"""Prometheus metrics of gpulab (``prometheus-client``, as JupyterHub's own /hub/metrics).

Counters and histograms are observed where things happen, in the process they happen in: the
gpulab service (jobs, their syncs, its API) serves them at ``/services/gpulab/metrics``; the
hub process (notebook starts and their syncs) adds them to the hub's own ``/hub/metrics``
(the same default registry). The service also reports, at each scrape, what its database says
now (:class:`StateCollector`): jobs and notebooks by state, the queue, GPUs held per device;
and what its host's GPUs are doing (:class:`GpuUsageCollector`, read with NVML at each scrape):
each device's utilization and memory use, and the same per workload that holds a device.

Label values are bounded sets (states, directions, handler classes, devices): never a path.
Only the per-workload GPU series name a user and a workload (a job or a notebook), and only
while it holds a GPU: at most one series per booked device (or share), on the admin-only
endpoint (scope ``custom:gpulab:metrics``), as the admin pages show them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

#: seconds: from a few tens of milliseconds (an API read) to an hour (a big pull)
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

SYNC_BYTES = Counter(
    "gpulab_sync_bytes", "Bytes moved by the sync helper, by direction", ["direction"]
)
SYNC_OBJECTS = Counter(
    "gpulab_sync_objects",
    "Objects transferred (or deleted, for a purge) by the sync helper, by direction",
    ["direction"],
)
SYNC_FAILURES = Counter(
    "gpulab_sync_failures", "Sync operations that failed, by direction", ["direction"]
)
JOB_QUEUE_WAIT = Histogram(
    "gpulab_job_queue_wait_seconds",
    "Time a job waited in the queue before it was placed on GPUs",
    buckets=_SECONDS,
)
JOB_START = Histogram(
    "gpulab_job_start_duration_seconds",
    "From a job's placement to its command running (data pulled, container started)",
    buckets=_SECONDS,
)
NOTEBOOK_START = Histogram(
    "gpulab_notebook_start_duration_seconds",
    "From a notebook's spawn to its editor answering (data pulled included)",
    buckets=_SECONDS,
)
API_REQUESTS = Histogram(
    "gpulab_api_request_duration_seconds",
    "Requests answered by the gpulab service",
    ["method", "handler", "code"],
    buckets=_SECONDS,
)


def observe_sync(operation: str, ok: bool, report: dict) -> None:
    """One sync helper run's outcome (``report``: the helper's final JSON report)."""
    SYNC_BYTES.labels(operation).inc(int(report.get("bytes_transferred") or 0))
    moved = int(report.get("completed") or 0) + int(report.get("deleted") or 0)
    SYNC_OBJECTS.labels(operation).inc(moved)
    if not ok:
        SYNC_FAILURES.labels(operation).inc()


class StateCollector(Collector):
    """What the database says at scrape time. ``read`` returns (jobs by state, notebooks by
    state, GPU allocations as dicts with ``device`` and ``kind``, configured device ids)."""

    def __init__(self, read: Callable[[], tuple[dict, dict, list[dict], list[str]]]):
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs, notebooks, allocations, devices = self.read()
        by_state = GaugeMetricFamily("gpulab_jobs", "Jobs by state", labels=["state"])
        for state, n in sorted(jobs.items()):
            by_state.add_metric([state], n)
        yield by_state
        yield GaugeMetricFamily(
            "gpulab_job_queue_length", "Jobs waiting in the queue", value=jobs.get("QUEUED", 0)
        )
        nbs = GaugeMetricFamily("gpulab_notebooks", "Notebooks by state", labels=["state"])
        for state, n in sorted(notebooks.items()):
            nbs.add_metric([state], n)
        yield nbs
        held = GaugeMetricFamily(
            "gpulab_gpus_held",
            "GPUs held, per device and by notebooks or jobs (shares of a shared GPU as fractions)",
            labels=["device", "kind"],
        )
        counts: dict[tuple[str, str], float] = {}
        for a in allocations:
            key = (a["device"], a["kind"])
            counts[key] = counts.get(key, 0) + a.get("gpus", 1)
        for device in devices:
            for kind in ("notebook", "job"):
                held.add_metric([device, kind], counts.pop((device, kind), 0))
        for (device, kind), n in sorted(counts.items()):  # devices no longer configured
            held.add_metric([device, kind], n)
        yield held
        yield GaugeMetricFamily("gpulab_gpus", "GPUs configured", value=len(devices))


class GpuUsageCollector(Collector):
    """What this host's GPUs do at scrape time. ``read_usage`` returns the devices' readings
    (:class:`gpulab.gpus.usage.DeviceUsage`; [] when NVML cannot be read: then no series),
    ``read_allocations`` the ledger's bookings (dicts with ``device``, ``kind``, ``owner``,
    ``workload``), ``devices`` the ledger's device names (an index or a UUID: a device is
    labelled as the ledger names it, as in ``gpulab_gpus_held``).

    A workload's series repeat its device's figures: NVML reads a device, not a container, so
    the sharers of a shared GPU each show the whole device's use."""

    def __init__(
        self,
        read_usage: Callable[[], list],
        read_allocations: Callable[[], list[dict]],
        devices: Sequence[str],
    ):
        self.read_usage, self.read_allocations, self.devices = read_usage, read_allocations, devices

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        """Its series, empty: per device (utilization, memory used, memory total), then per
        workload that holds a device (utilization, memory used)."""
        util = GaugeMetricFamily(
            "gpulab_gpu_utilization_percent",
            "Percent of NVML's last sample period during which a kernel ran, per device "
            "(absent for a MIG device: NVML has none)",
            labels=["device"],
        )
        used = GaugeMetricFamily(
            "gpulab_gpu_memory_used_bytes", "GPU memory in use, per device", labels=["device"]
        )
        total = GaugeMetricFamily(
            "gpulab_gpu_memory_total_bytes", "GPU memory, per device", labels=["device"]
        )
        labels = ["kind", "user", "workload", "device"]
        w_util = GaugeMetricFamily(
            "gpulab_workload_gpu_utilization_percent",
            "Utilization of each device a workload (job or notebook) holds: the device's",
            labels=labels,
        )
        w_used = GaugeMetricFamily(
            "gpulab_workload_gpu_memory_used_bytes",
            "Memory in use on each device a workload (job or notebook) holds: the device's",
            labels=labels,
        )
        return util, used, total, w_util, w_used

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The series' names, for the registry, without reading anything: registering
        calls this, on the service's event loop, where ``read_usage`` (which waits for that
        loop) would stall the start-up until its time-out."""
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usages = self.read_usage()
        if not usages:
            return
        known = set(self.devices)
        by_name: dict[str, tuple[str, object]] = {}  # any name of a device -> (label, usage)
        for u in usages:
            label = next((n for n in u.names() if n in known), u.id)
            for n in u.names():
                by_name[n] = (label, u)
        util, used, total, w_util, w_used = self._families()
        for label, u in sorted(dict(by_name.values()).items()):
            if u.utilization is not None:
                util.add_metric([label], u.utilization)
            used.add_metric([label], u.memory_used)
            total.add_metric([label], u.memory_total)
        yield util
        yield used
        yield total
        seen = set()
        for a in self.read_allocations():
            found = by_name.get(a["device"])
            key = (a["kind"], a["owner"], a["workload"], a["device"])
            if found is None or key in seen:
                continue
            seen.add(key)
            label, u = found
            names = [a["kind"], a["owner"], a["workload"], label]
            if u.utilization is not None:
                w_util.add_metric(names, u.utilization)
            w_used.add_metric(names, u.memory_used)
        yield w_util
        yield w_used
