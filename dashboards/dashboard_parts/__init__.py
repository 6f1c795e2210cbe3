"""The parts of the "Block Stack Merges" dashboard, one module per role; blockstack_dashboard.py
assembles them into dashboards/block-stack-merges.json.

    common.py       the dashboard's identity (CONFIG), its datasource, selector and colours
    queries.py      the PromQL the panels share: the stack's layers, windows, quantiles
    widgets.py      panel kinds (time series, heatmap, stat) and field-config helpers
    panels.py       the panels of each row but the stack table
    stack_table.py  the stack table, one column per queue setting with a dashboard column
    variables.py    the template variables, the import input and the collapse annotation
"""
