"""What every part of the dashboard shares: its identity, its datasource and selector, its colours.

Its thresholds and selectors are knobs of alerts/config.yml (blockstack_rules.knobs), not here.
"""

from grafana_foundation_sdk.models import dashboard as dm

CONFIG = {
    # Stable identity: links, provisioning and alert runbooks point at this uid. Never change it.
    "uid": "blockstack-merges",
    "title": "Block Stack Merges",
    # uid and name of the provisioned Prometheus datasource
    # (deploy/grafana/provisioning/datasources/).
    # The $datasource variable starts on the datasource of this name in a provisioned copy, and on
    # the one chosen for the DS_PROMETHEUS input in an imported copy; any Prometheus can be picked.
    "datasource_uid": "blockstack-prometheus",
    "datasource_name": "Prometheus (Block Stack Merges)",
    # Alert names whose firing draws an annotation on the lineup panels (a regex): the merge
    # collapse page of alerts/alerts.rules.yml. Change it with it.
    "collapse_alerts": "BlockStackMergeCollapse.*",
    # Time range and refresh the dashboard opens with.
    "time_from": "now-1h",
    "refresh": "30s",
}

# The colour of a finding's severity (blockstack_finding, blockstack-doctor, the alerts' severity
# label); a setting no check finds anything in is green. Every panel that colours a setting
# colours it as the check of checks.py judges it at the knobs' thresholds, so the dashboard, the
# doctor and the settings alerts never disagree; red is for what pages (critical) only
# (dashboards/tests/test_dashboard_structure.py: test_settings_take_their_findings_colours).
SEVERITY_COLOURS = {"critical": "red", "warning": "orange", "info": "blue"}
HEALTHY = "green"
INFO, WARNING = SEVERITY_COLOURS["info"], SEVERITY_COLOURS["warning"]
# Series colours. Red is the alarm's (the collapse pages' bands, the pages' floors, a critical
# finding), so no ordinary series may take it, as Grafana's classic palette gives the fifth one: a
# series is a shade of blue, and on the lineup each layer keeps one colour in every panel (by the
# L<depth> of queries.LAYER_LEGEND; writes dashed).
SERIES_COLOURS = {"mode": "shades", "fixedColor": "blue"}
LAYER_COLOURS = ["blue", "purple", "yellow", "green", "super-light-blue", "super-light-purple"]

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'host="$host", device=~"$device"'
