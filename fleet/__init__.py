"""Block Stack Merges across a fleet: agent and central roles on Thanos and an Alertmanager cluster."""
