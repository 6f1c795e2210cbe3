// Every output of the mixin as files, for `jsonnet -S -m DIR render.jsonnet` (`make mixin`):
// the rules files a plain Prometheus loads, the PrometheusRule and the dashboard. With the default
// `_config` these equal out/*.yml, prometheus-rule.yaml and dashboards/block-stack-merges.json.
// Overrides: --tla-code 'mixin=(import "mixin.libsonnet") + { _config+:: { rate_window: "40s" } }'
local yaml(x) = std.manifestYamlDoc(x, indent_array_in_object=false, quote_keys=false);

function(mixin=(import 'mixin.libsonnet')) {
  'recording.rules.yml': yaml(mixin.prometheusRules),
  'alerts.rules.yml': yaml(mixin.prometheusAlerts),
  'prometheus-rule.yaml': yaml((import 'prometheus-rule.jsonnet')(mixin)),
  'block-stack-merges.json': std.manifestJsonEx(mixin.grafanaDashboards['block-stack-merges.json'], '  ') + '\n',
}
