"""The panel kinds the dashboard is built of (time series, heatmap, stat) and the helpers of a
panel's field config: queries, thresholds, value mappings, table transformations."""

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from .common import DS, LAYER_COLOURS, SERIES_COLOURS


def q(expr, legend="", ref="A", fmt=None, instant=False):
    t = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        t = t.legend_format(legend)
    if fmt:
        t = t.format(fmt)
    return t.instant() if instant else t.range()


def table_q(expr, ref="A"):
    """An instant query whose result a table panel shows."""
    return q(expr, ref=ref, fmt=pm.PromQueryFormat.TABLE, instant=True)


def steps(*pairs):
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in pairs])
    )


def legend_table(calcs=("mean", "max", "lastNotNull"), placement=cm.LegendPlacement.RIGHT):
    return (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(placement)
        .show_legend(True)
        .calcs(list(calcs))
    )


def ts(title, description, targets, unit, w=12, h=9, no_value="No data in this time range", **kw):
    """A time series panel with its legend as a table on the right, where every series has a row
    (a legend beneath a graph gets at most a third of the panel's height: 2 or 3 rows)."""
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .line_width(2)
        .fill_opacity(10)
        .no_value(no_value)
        .color_scheme(
            db.FieldColor().mode(SERIES_COLOURS["mode"]).fixed_color(SERIES_COLOURS["fixedColor"])
        )
        .legend(legend_table())
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    for t in targets:
        p = p.with_target(t)
    if "min" in kw:
        p = p.min(kw["min"])
    if "max" in kw:
        p = p.max(kw["max"])
    if "interval" in kw:  # the minimum $__interval (a peak_quantile's step)
        p = p.interval(kw["interval"])
    if "log" in kw:
        p = p.scale_distribution(
            cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(kw["log"])
        )
    if "thresholds" in kw:
        p = p.thresholds(kw["thresholds"]).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)
        )
    return p


def layer_colours(p):
    """Each layer's colour (LAYER_COLOURS) on a panel whose legends carry L<depth>; writes
    dashed."""
    for depth, colour in enumerate(LAYER_COLOURS):
        p = p.override_by_regexp(
            f".*\\bL{depth} .*", [prop("color", {"mode": "fixed", "fixedColor": colour})]
        )
    return p.override_by_regexp(
        ".* write$", [prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]
    )


def heat(title, description, target, unit, w=8, h=8, repeat=True, cell_unit="reqps"):
    """A heatmap of histogram buckets, `target` only where there were observations
    (queries.observed()): an empty one says "No data" (Grafana 12's heatmap shows its own words,
    not a noValue), where buckets of zeros drew an empty colour scale, "∞undefined req/s ...
    -∞undefined req/s"."""
    p = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(w)
        .height(h)
        .with_target(target)
        .calculate(False)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap.YAxisConfig().unit(unit).decimals(0))
        .cell_values(heatmap.CellValues().unit(cell_unit))
        .show_legend()
        .show_tooltip()
        .show_y_histogram()
        .max_data_points(120)
    )
    if repeat:
        p = p.repeat("device").repeat_direction("h")
    return p


def stat_panel(title, description, targets, unit, w=6, h=4, thresholds=None, no_value="No data"):
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .no_value(no_value)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for t in targets:
        p = p.with_target(t)
    if thresholds:
        p = p.thresholds(thresholds)
    return p


def prop(id_, value):
    return dm.DynamicConfigValue(id_val=id_, value=value)


def color_cells():
    return prop("custom.cellOptions", {"type": "color-background", "mode": "basic"})


def value_map(mapping):
    """{value: (text, color)} -> a Grafana value mapping."""
    return [
        dm.ValueMap(
            options={
                str(k): dm.ValueMappingResult(text=t, color=c, index=i)
                for i, (k, (t, c)) in enumerate(mapping.items())
            }
        )
    ]


def mappings(mapping):
    """The `mappings` property of a field override: value_map(mapping)."""
    return prop("mappings", [m.to_json() for m in value_map(mapping)])


def organize(exclude=(), rename=None, order=None):
    return dm.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {k: True for k in exclude},
            "renameByName": rename or {},
            "indexByName": {k: i for i, k in enumerate(order or [])},
        },
    )


def merge():
    return dm.DataTransformerConfig(id_val="merge", options={})


def sort_by(field):
    return dm.DataTransformerConfig(
        id_val="sortBy", options={"fields": {}, "sort": [{"field": field}]}
    )
