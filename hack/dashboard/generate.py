#!/usr/bin/env python3
"""Build the memfit Grafana dashboard JSON from spec.py with grafana-foundation-sdk (dashboards as code).

    python hack/dashboard/generate.py           # write charts/memfit/files/dashboards/memfit.json
    python hack/dashboard/generate.py --check   # exit 1 if the committed JSON differs (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prom_models

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec import ROWS, VARIABLES, Panel, Target

OUT = Path(__file__).resolve().parents[2] / "charts" / "memfit" / "files" / "dashboards" / "memfit.json"
UID = "memfit-overview"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
REF_IDS = "ABCDEFGHIJ"


def build_target(target: Target, ref_id: str) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(target.expr).ref_id(ref_id).datasource(DS)
    if target.legend:
        query = query.legend_format(target.legend)
    if target.instant:
        query = query.instant()
    if target.table:
        query = query.format(prom_models.PromQueryFormat.TABLE)
    return query


def build_panel(spec: Panel, panel_id: int, x: int, y: int) -> Any:
    builders = {"timeseries": timeseries.Panel, "stat": stat.Panel, "table": table.Panel}
    panel = builders[spec.kind]().id(panel_id).title(spec.title).datasource(DS).unit(spec.unit)
    panel = panel.grid_pos(dm.GridPos(h=spec.height, w=spec.width, x=x, y=y))
    if spec.description:
        panel = panel.description(spec.description)
    if spec.min_value is not None:
        panel = panel.min(spec.min_value)
    if spec.max_value is not None:
        panel = panel.max(spec.max_value)
    steps = [dm.Threshold(value=None, color=spec.base_color)]
    steps += [dm.Threshold(value=value, color=color) for value, color in spec.thresholds]
    panel = panel.thresholds(dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    if spec.kind == "stat":
        reduce = common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
        panel = panel.reduce_options(reduce).graph_mode(common.BigValueGraphMode.AREA)
        panel = panel.color_mode(common.BigValueColorMode.VALUE)
    if spec.kind == "table":
        panel = panel.show_header(True)
    if spec.kind == "timeseries":
        legend = common_b.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
        panel = panel.legend(legend.placement(common.LegendPlacement.BOTTOM))
        if spec.stacked:
            panel = panel.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    for i, target in enumerate(spec.targets):
        panel = panel.with_target(build_target(target, REF_IDS[i]))
    return panel


def build_dashboard() -> dict[str, Any]:
    """The dashboard as the JSON-ready dict Grafana imports."""
    board = (
        dashboard.Dashboard("memfit: memory, cost and re-plans")
        .uid(UID)
        .description("Per-job predicted vs measured GPU memory, headroom, throughput, cost and savings.")
        .tags(["memfit", "gpu", "training"])
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for var in VARIABLES:
        board = board.with_variable(
            dashboard.QueryVariable(var.name)
            .label(var.label)
            .datasource(DS)
            .query(var.query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    panel_id, y = 1, 0
    for row in ROWS:
        board = board.with_row(dashboard.Row(row.title).id(panel_id).grid_pos(dm.GridPos(h=1, w=24, x=0, y=y)))
        panel_id, y, x, row_height = panel_id + 1, y + 1, 0, 0
        for spec in row.panels:
            if x + spec.width > 24:
                x, y, row_height = 0, y + row_height, 0
            board = board.with_panel(build_panel(spec, panel_id, x, y))
            panel_id, x, row_height = panel_id + 1, x + spec.width, max(row_height, spec.height)
        y += row_height
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python hack/dashboard/generate.py", file=sys.stderr)
            return 1
        print(f"{args.out} matches hack/dashboard/spec.py")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
