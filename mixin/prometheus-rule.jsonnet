// The mixin's rules and alerts as one PrometheusRule for the Prometheus Operator
// (prometheus-rule.yaml is this with the default `_config`):
//   jsonnet -J vendor -e '(import "prometheus-rule.jsonnet")(import "mixin.libsonnet")'
// The labels are those kube-prometheus's Prometheus selects (prometheus: k8s, role: alert-rules).
local rule(mixin) = {
  apiVersion: 'monitoring.coreos.com/v1',
  kind: 'PrometheusRule',
  metadata: {
    name: 'blockstack-merges',
    labels: {
      'app.kubernetes.io/name': 'blockstack-merges',
      'app.kubernetes.io/part-of': 'blockstack-merges',
      prometheus: 'k8s',
      role: 'alert-rules',
    },
  },
  spec: {
    groups: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups,
  },
};

rule
