// The Block Stack Merges monitoring mixin: the rules and alerts of a host's Prometheus and the
// "Block Stack Merges" dashboard (README.md in this directory). Override `_config` to fit a scrape
// config: (import 'mixin.libsonnet') + { _config+:: { node_selector: 'job="node-exporter"' } }.
(import 'config.libsonnet') +
(import 'rules.libsonnet') +
(import 'alerts.libsonnet') +
(import 'dashboards.libsonnet')
