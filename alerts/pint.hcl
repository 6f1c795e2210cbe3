// cloudflare/pint's configuration for the generated rules (alerts/*.rules.yml): `make lint`, and
// alerts/tests/test_pint.py in `make test`. pint runs offline (no Prometheus to ask) and every
// report counts, information included. Each exception below is one rule block: the rule it
// matches, the check it disables, and a `// reason:` line saying why the report is wrong for this
// rule (alerts/tests/test_pint.py fails on an exception without one).

rule {
  match {
    kind = "alerting"
    name = "BlockStackMergeCollapse"
  }
  // reason: "always firing alert": pint looks for a comparison in the alert's own expression. The
  // conditions are in the two recording rules it reads (host_device_operation:blockstack_collapse_
  // refused:rate and _split:rate in recording.rules.yml), each absent unless its evidence holds
  // against the knobs of alerts/config.yml; the alert fires only when one is present.
  disable = ["alerts/comparison"]
}

rule {
  match {
    kind = "alerting"
    name = "BlockStackWatchdog"
  }
  // reason: "always firing alert" is its purpose: the dead man's switch (alerts/alertmanager.yml's
  // deadmansswitch receiver) pages when it stops hearing it (docs/deploy.md).
  disable = ["alerts/comparison"]
}

rule {
  match {
    kind = "alerting"
    name = "BlockStackWatchdog|BlockStackNotificationsFailing|BlockStackRuleEvaluationFailing|BlockStackReceiverWriteFailing|BlockStackHeartbeatStale|BlockStackPrometheusTSDBFailing"
  }
  // reason: "redundant field with default value": their `for:` is a knob of alerts/config.yml
  // (watchdog_for, pager_failing_for) whose value is 0s; the line stays so that an operator who
  // raises the knob changes config.yml only.
  disable = ["alerts/for"]
}

rule {
  match {
    kind = "recording"
    name = "host_device_operation:blockstack_collapse_evidence:info|host_device_operation_fact:blockstack_collapse_evidence:value"
  }
  // reason: they read blockstack-layers' sizes, rates, upper device, stack, settings and snapshot
  // from blockstack-ebpf, where the evidence they describe is recorded; groups run on their own
  // schedules, so those facts and numbers may be one evaluation (5 s) old. Only the collapse
  // page's annotations read them (never an alert's condition), and the settings they show are
  // already "as of the last scrape".
  disable = ["rule/dependency"]
}
