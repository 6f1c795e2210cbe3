"""The dashboard's template variables ($datasource, $host, $stack, $device), the import input
$datasource starts on, and the annotation of the collapse pages."""

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from .common import CONFIG, DS
from .queries import DEVICE_QUERY, STACK_QUERY


def variables():
    ds = (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        # value: the import input, replaced by the uid chosen on import (see INPUTS) and, in the
        # provisioned copy, by the provisioned datasource's (blockstack_deploy/grafana.py); left as
        # is, it matches no datasource and Grafana would query its default one
        .current(
            dm.VariableOption(
                selected=True, text=CONFIG["datasource_name"], value="${DS_PROMETHEUS}"
            )
        )
    )

    def query_variable(name, label, query, description):
        """Re-queried when the time range changes, options sorted."""
        return (
            db.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query({"query": query, "refId": name})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .description(description)
        )

    host = query_variable(
        "host",
        "Host",
        "label_values(blockstack_device_info, host)",
        "The `host` label every scrape target carries.",
    )
    stack = query_variable(
        "stack",
        "Stack (top device)",
        one_line(STACK_QUERY),
        "A device with nothing above it (blockstack_device_holders == 0), by its dm/LVM name (the "
        "kernel name for other devices). Unattached loop devices are left out.",
    ).regex('/name="([^"]+)"/')
    device = (
        query_variable(
            "device",
            "Device (layer)",
            one_line(DEVICE_QUERY),
            "The kernel names of the stack's layers: the top and everything beneath it.",
        )
        .regex('/device="([^"]+)"/')
        .multi(True)
        .include_all(True)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )
    return [ds, host, stack, device]


def one_line(query):
    """A variable query on one line. Grafana's Prometheus datasource recognises query_result(...)
    and label_values(...) with regexes whose `.` stops at a newline; a multi-line query falls
    through to /api/v1/series as a series matcher, which Prometheus refuses (HTTP 400), and the
    variable is empty."""
    return " ".join(query.split())


def collapse_annotation(panel_ids):
    expr = (
        f'ALERTS{{alertname=~"{CONFIG["collapse_alerts"]}", alertstate="firing", host="$host", '
        f'device=~"$device"}}'
    )
    a = (
        db.AnnotationQuery()
        .name("Merge collapse pages")
        .datasource(DS)
        .enable(True)
        .icon_color("red")
        .filter(db.AnnotationPanelFilter().exclude(False).ids(panel_ids))
        .expr(expr)
        .build()
    )
    # Prometheus annotation options Grafana reads from the annotation object itself.
    extra = {
        "step": "15s",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{device}} {{operation}} on {{host}}: merge collapse paged (the alert's "
        "annotations name the cause and the settings)",
        "tagKeys": "alertname,severity,device",
        "useValueForTime": False,
    }
    return a, extra


# The datasource input of an import (Dashboards > New > Import, or POST /api/dashboards/import), as
# dashboards shared on grafana.com declare it: Grafana asks for a Prometheus datasource and writes
# its uid wherever ${DS_PROMETHEUS} stands. File provisioning ignores both fields.
INPUTS = [
    {
        "name": "DS_PROMETHEUS",
        "label": "Prometheus",
        "type": "datasource",
        "pluginId": "prometheus",
        "pluginName": "Prometheus",
        "description": "The Prometheus that scrapes node_exporter, blockstack-exporter and "
        "ebpf_exporter and evaluates alerts/recording.rules.yml",
    }
]
