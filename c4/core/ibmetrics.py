"""RDMA port counters as Prometheus families under node_exporter's names (c4/core/catalog.py),
built once here for the agent's exporter and the aggregator's optional re-export."""
from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from . import catalog


def port_counter_families(rows: Iterable[tuple[list[str], dict[str, int]]],
                          labels: list[str]) -> Iterator[Metric]:
    """One family per counter name; `rows` are (label values, sysfs counters) per port. Data
    counters in bytes; counters node_exporter does not name go to one family keyed by the
    sysfs name."""
    named: dict[str, CounterMetricFamily] = {}
    other = CounterMetricFamily(catalog.OTHER_COUNTER_METRIC.removesuffix("_total"),
                                "RDMA port counters node_exporter has no name for, by sysfs name",
                                labels=[*labels, "counter"])
    for where, counters in rows:
        for name, value in counters.items():
            metric = catalog.NODE_EXPORTER_METRICS.get(name)
            if metric is None:
                other.add_metric([*where, name], value)
                continue
            fam = named.get(metric)
            if fam is None:
                fam = named[metric] = CounterMetricFamily(metric.removesuffix("_total"),
                                                          f"sysfs {name}", labels=labels)
            fam.add_metric(where, value * catalog.COUNTER_SCALE.get(name, 1))
    yield from named.values()
    yield other
