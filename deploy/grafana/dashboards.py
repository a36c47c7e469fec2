#!/usr/bin/env python3
"""The Grafana dashboards of `dnspath agent`, built with the Grafana Foundation SDK.

    python3 deploy/grafana/dashboards.py [DIR]   # writes the three JSON files (default: here)

The JSON files beside this script are its output, committed; tests/tests/lab/dashboards.rs
checks they are what it writes now (edit this file, never the JSON) and runs every query of
every panel against a real Prometheus scraping two agents in the lab.

Every query uses only what the agent exports (docs/metrics.md) and the `node` label that
deploy/podmonitor.yaml gives each target; the datasource is a variable (no uid is written
down). A series that appears only once something happens (a drop reason, a race) is joined
with a 0 per node (`or on (node) 0 * ...`), so a panel reads 0, not "No data", on a
healthy node.
"""

import json
import os
import re
import sys

from grafana_foundation_sdk.builders import (
    common as common_b,
    dashboard as dash_b,
    heatmap,
    prometheus,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard as dash_m, prometheus as prom_m

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Where the panels' links point: the repository's docs/metrics.md, each metric's row by
# its anchor (the `docs` variable: set it to where your copy of the docs is served).
DOCS = "docs/metrics.md"
RATE = "$__rate_interval"
NODE = 'node=~"$node"'
NS = 'node=~"$node",namespace=~"$namespace"'
TX = "dnspath_dns_transactions_total"
RESP = "dnspath_dns_responses_total"
LEG = "dnspath_dns_leg_duration_seconds_bucket"
FAILED = 'outcome=~"unanswered|dropped|late"'
DECIDED = 'outcome!="pending"'
# Legs on which a client gets its answer: the Service, a server asked directly, a stub.
CLIENT_LEGS = 'leg=~"service|client|stub"'
LEGS = ["client", "service", "upstream", "stub", "served"]
# DnspathUnansweredRatioHigh's threshold (deploy/alerts.yaml).
UNANSWERED_ALERT_RATIO = 0.05

METRIC = re.compile(r"\b((?:dnspath|process)_[a-z_]+)")


def zero():
    """0 for every node with an agent: what `or on (node)` falls back to."""
    return f"0 * sum by (node) (dnspath_build_info{{{NODE}}})"


def rate(metric, sel, by):
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{RATE}]))"


def or_zero(expr):
    return f"{expr} or on (node) {zero()}"


def metrics_of(exprs):
    """The families the expressions read, as docs/metrics.md names them (the 0 fallback's
    `dnspath_build_info` aside: it is not what the panel shows)."""
    out = []
    for e in exprs:
        for m in METRIC.findall(e.replace(zero(), "")):
            m = re.sub(r"_(bucket|count|sum)$", "", m)
            if m not in out:
                out.append(m)
    return out


def target(expr, legend, ref, fmt=None, instant=False):
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if fmt is not None:
        q = q.format(fmt)
    if instant:
        q = q.instant()
    return q


def finish(panel, title, description, queries, unit, span, height=8, fmt=None, instant=False):
    """Title, description, datasource, links to each metric's docs, and the queries."""
    exprs = [q[0] for q in queries]
    panel = (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(span)
        .height(height)
        .links(
            [
                dash_b.DashboardLink(f"{m} (docs)")
                .url(f"${{docs}}#{m}")
                .target_blank(True)
                for m in metrics_of(exprs)
            ]
        )
    )
    if unit:
        panel = panel.unit(unit)
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(target(expr, legend, chr(ord("A") + i), fmt, instant))
    return panel


def graph(title, description, queries, unit="short", span=12, threshold=None, stack=False):
    p = timeseries.Panel().fill_opacity(10).legend(
        common_b.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
    )
    if stack:
        p = p.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    if threshold is not None:
        p = p.thresholds(
            dash_b.ThresholdsConfig()
            .mode(dash_m.ThresholdsMode.ABSOLUTE)
            .steps(
                [
                    dash_m.Threshold(value=None, color="green"),
                    dash_m.Threshold(value=threshold, color="red"),
                ]
            )
        ).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    return finish(p, title, description, queries, unit, span)


def heat(title, description, expr, span=12, repeat=None):
    p = (
        heatmap.Panel()
        .calculate(False)
        .color(heatmap.HeatmapColorOptions().mode("scheme").scheme("Oranges"))
        .y_axis(heatmap.YAxisConfig().unit("s"))
    )
    if repeat:
        p = p.repeat(repeat).repeat_direction("h").max_per_row(3)
    return finish(p, title, description, [(expr, "{{le}}")], "s", span, fmt=prom_m.PromQueryFormat.HEATMAP)


def tabular(title, description, queries, span=12, height=8):
    return finish(
        table.Panel(), title, description, queries, "", span, height,
        fmt=prom_m.PromQueryFormat.TABLE, instant=True,
    )


def variables(namespace=False, leg=False):
    v = [
        dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dash_b.QueryVariable("node")
        .label("Node")
        .datasource(DATASOURCE)
        .query("label_values(dnspath_build_info, node)")
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dash_m.VariableOption(selected=True, text="All", value="$__all")),
    ]
    if namespace:
        v.append(
            dash_b.QueryVariable("namespace")
            .label("Namespace")
            .description("The client pod's namespace: only with `dnspath agent --namespace-label`")
            .datasource(DATASOURCE)
            .query(f"label_values({TX}{{{NODE}}}, namespace)")
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dash_m.VariableOption(selected=True, text="All", value="$__all"))
        )
    if leg:
        v.append(
            dash_b.CustomVariable("leg")
            .label("Leg")
            .description("Where a leg's query went (docs/metrics.md, labels): stub is a node-local cache")
            .values(",".join(LEGS))
            .multi(True)
            .include_all(True)
            .current(dash_m.VariableOption(selected=True, text=["service", "upstream"], value=["service", "upstream"]))
        )
    v.append(
        dash_b.TextBoxVariable("docs")
        .label("Docs")
        .description("Where docs/metrics.md is served: the panels' links go to its anchors")
        .default_value(DOCS)
        .hide(dash_m.VariableHide.HIDE_VARIABLE)
    )
    return v


def board(uid, title, description, panels, **vars_):
    d = (
        dash_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["dnspath", "dns"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .variables(variables(**vars_))
        .annotation(
            dash_b.AnnotationQuery()
            .name("dnspath alerts")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("red")
            .expr('ALERTS{alertname=~"Dnspath.*"}')
        )
        .link(
            dash_b.DashboardLink("dnspath dashboards")
            .type(dash_m.DashboardLinkType.DASHBOARDS)
            .tags(["dnspath"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for p in panels:
        d = d.with_row(p) if isinstance(p, dash_b.Row) else d.with_panel(p)
    return d.build()


def cluster():
    fail_share = (
        f"({rate(TX, NODE + ',' + FAILED, 'node')} or 0 * {rate(TX, NODE + ',' + DECIDED, 'node')})"
        f" / {rate(TX, NODE + ',' + DECIDED, 'node')}"
    )
    servfail = NODE + "," + CLIENT_LEGS + ',rcode="SERVFAIL"'
    servfail_share = (
        f"({rate(RESP, servfail, 'node')}"
        f" or 0 * {rate(RESP, NODE + ',' + CLIENT_LEGS, 'node')})"
        f" / {rate(RESP, NODE + ',' + CLIENT_LEGS, 'node')}"
    )
    # `>= 0` leaves out a leg without answers in the window (NaN), rather than draw it.
    leg_q = lambda q: (  # noqa: E731
        f"histogram_quantile({q}, sum by (le, leg) (rate({LEG}{{{NODE}}}[{RATE}]))) >= 0",
        f"{{{{leg}}}} p{int(q * 100)}",
    )
    return board(
        "dnspath-cluster",
        "dnspath / Cluster DNS",
        "Client questions, failures, latency per leg and what went wrong, from every node's dnspath agent",
        [
            dash_b.Row("Client questions"),
            graph(
                "Client questions by outcome",
                "Client questions of the selected nodes' clients by how they ended; each question is counted once, on its client's node.",
                [(rate(TX, NODE, "outcome"), "{{outcome}}")],
                "reqps", 12, stack=True,
            ),
            graph(
                "Failed share of client questions",
                "Per node: unanswered, dropped or late questions over those decided (the expression of DnspathUnansweredRatioHigh, whose 5 % threshold is the red line), and SERVFAIL answers over the answers clients got.",
                [(fail_share, "{{node}} unanswered, dropped or late"), (servfail_share, "{{node}} SERVFAIL")],
                "percentunit", 12, threshold=UNANSWERED_ALERT_RATIO,
            ),
            graph(
                "Client question latency",
                "The client's first query to the answer it got, retries included: above 4.5 s a lookup waited out a resolver timeout.",
                [
                    (f"histogram_quantile({q}, sum by (le) (rate(dnspath_dns_transaction_duration_seconds_bucket{{{NODE}}}[{RATE}]))) >= 0", f"p{int(q * 100)}")
                    for q in (0.5, 0.9, 0.99)
                ],
                "s", 8,
            ),
            graph(
                "Answers by response code",
                "Responses on the legs clients get their answers on (the Service, a server asked directly, a stub).",
                [(rate(RESP, NODE + "," + CLIENT_LEGS, "rcode"), "{{rcode}}")],
                "reqps", 8,
            ),
            graph(
                "Retries by cause",
                "Queries clients sent again: after a timeout, a truncated answer (TCP), the conntrack race, another kernel drop.",
                [(or_zero(rate("dnspath_dns_retries_total", NODE, "node, cause")), "{{node}} {{cause}}")],
                "reqps", 8,
            ),
            dash_b.Row("Latency by leg"),
            graph(
                "Leg latency percentiles",
                "Query to response of each leg at its first hop: client, service (through the DNAT), upstream (a server's own query), stub (a node-local cache), served (another node's client).",
                [leg_q(q) for q in (0.5, 0.9, 0.99)],
                "s", 24,
            ),
            heat(
                "Leg latency: $leg",
                "Distribution of one leg's latency over time (one panel per leg chosen above).",
                "sum by (le) (rate(" + LEG + "{" + NODE + ',leg=~"$leg"}[' + RATE + "]))",
                8, repeat="leg",
            ),
            dash_b.Row("What went wrong"),
            graph(
                "NXDOMAIN from search-list expansion",
                "Search-list steps answered NXDOMAIN before the client asked the next name (ndots:5 at work): lookups of outside names cost several queries each.",
                [(or_zero(rate("dnspath_dns_search_nxdomain_total", NODE, "node")), "{{node}}")],
                "reqps", 8,
            ),
            graph(
                "Conntrack race",
                "Queries dropped by the conntrack insert race after DNAT (each costs its client a 5 s retry), suspected ones, and clashes the kernel resolved.",
                [
                    (or_zero(rate("dnspath_conntrack_race_drops_total", NODE, "node")), "{{node}} dropped"),
                    (or_zero(rate("dnspath_conntrack_race_suspected_total", NODE, "node")), "{{node}} suspected"),
                    (rate("dnspath_conntrack_clashes_resolved_total", NODE, "node"), "{{node}} resolved"),
                ],
                "reqps", 8,
            ),
            graph(
                "Active forwarding loops",
                "Forwarding loops going on now (DnspathForwardingLoopActive fires after a minute of it), and loops detected.",
                [
                    (f"sum by (node) (dnspath_forwarding_loops_active{{{NODE}}})", "{{node}} active"),
                    (or_zero(f"sum by (node, kind) (increase(dnspath_forwarding_loops_detected_total{{{NODE}}}[{RATE}]))"), "{{node}} detected {{kind}}"),
                ],
                "short", 8, threshold=1,
            ),
            graph(
                "Detections",
                "Detections reported, by detection (a record's type: loop, race, ...): what a person acts on, counted once each.",
                [(or_zero(f"sum by (node, detection) (increase(dnspath_detections_total{{{NODE}}}[{RATE}]))"), "{{node}} {{detection}}")],
                "short", 8,
            ),
            graph(
                "Kernel drops by reason",
                "DNS packets the kernel dropped, by skb drop reason; benign ones (normal socket life) summed apart.",
                [
                    (or_zero(rate("dnspath_kernel_drops_total", NODE + ',benign="false"', "node, reason")), "{{node}} {{reason}}"),
                    (or_zero(rate("dnspath_kernel_drops_total", NODE + ',benign="true"', "node")), "{{node}} benign"),
                ],
                "pps", 8,
            ),
            graph(
                "IP fragment losses",
                "DNS datagrams whose IP fragments never all reached a hop: large answers lost on the way.",
                [(rate("dnspath_ip_fragment_losses_total", NODE, "node"), "{{node}}")],
                "pps", 8,
            ),
            tabular(
                "Current findings",
                "dnspath doctor's traffic findings in the last closed findings window, by kind and severity (every kind is there, 0 when none).",
                [(f"sum by (kind, severity) (dnspath_findings{{{NODE}}})", "{{kind}}")],
                8,
            ),
        ],
        leg=True,
    )


def drilldown():
    decided = lambda by: rate(TX, NS + "," + DECIDED, by)  # noqa: E731
    return board(
        "dnspath-drilldown",
        "dnspath / Node and namespace",
        "One node's or one namespace's DNS: the namespace is the client pod's (dnspath agent --namespace-label)",
        [
            dash_b.Row("By client namespace"),
            graph(
                "Client questions by namespace and outcome",
                "Questions of the chosen namespaces' pods; namespace \"\" is a client in no known pod (the node, hostNetwork).",
                [(rate(TX, NS, "namespace, outcome"), "{{namespace}} {{outcome}}")],
                "reqps", 12,
            ),
            graph(
                "Failed share by namespace",
                "Unanswered, dropped or late questions over those decided, per client namespace.",
                [(f"({rate(TX, NS + ',' + FAILED, 'namespace')} or 0 * {decided('namespace')}) / {decided('namespace')}", "{{namespace}}")],
                "percentunit", 12, threshold=UNANSWERED_ALERT_RATIO,
            ),
            graph(
                "Queries by leg",
                "Queries of the chosen namespaces' questions, per leg: the upstream legs they caused count under the client's namespace too.",
                [(rate("dnspath_dns_queries_total", NS, "leg"), "{{leg}}")],
                "reqps", 8,
            ),
            graph(
                "Unanswered queries by leg",
                "Legs that got no response: timed out, or the kernel dropped the query or its answer.",
                [(or_zero(rate("dnspath_dns_unanswered_queries_total", NS, "node, leg")), "{{node}} {{leg}}")],
                "reqps", 8,
            ),
            graph(
                "Answers by namespace and response code",
                "Responses clients got, per client namespace and response code.",
                [(rate(RESP, NS + "," + CLIENT_LEGS, "namespace, rcode"), "{{namespace}} {{rcode}}")],
                "reqps", 8,
            ),
            graph(
                "Search-list NXDOMAIN by namespace",
                "Search-list steps answered NXDOMAIN, per client namespace: which teams' lookups pay for ndots:5.",
                [(or_zero(rate("dnspath_dns_search_nxdomain_total", NS, "node, namespace")), "{{node}} {{namespace}}")],
                "reqps", 12,
            ),
            dash_b.Row("By node"),
            graph(
                "Client questions by node",
                "All client questions of each node (every namespace).",
                [(rate(TX, NODE, "node"), "{{node}}")],
                "reqps", 12,
            ),
            graph(
                "Leg latency p99 by node",
                "99th percentile of each leg's latency, per node (the histograms have no namespace label).",
                [(f"histogram_quantile(0.99, sum by (node, leg, le) (rate({LEG}{{{NODE}}}[{RATE}]))) >= 0", "{{node}} {{leg}}")],
                "s", 12,
            ),
        ],
        namespace=True,
    )


def agent_health():
    job = 'job="dnspath",' + NODE
    return board(
        "dnspath-agent",
        "dnspath / Agent health",
        "Is every node's dnspath agent up, keeping up, and within its limits",
        [
            tabular(
                "Agents",
                "Every agent's version, and whether its last scrape succeeded (up).",
                [
                    (f"sum by (node, instance, version) (dnspath_build_info{{{NODE}}})", "{{node}}"),
                    (f"up{{{job}}}", "{{node}}"),
                ],
                12,
            ),
            graph(
                "Agent uptime",
                "Seconds since each agent started: a drop is a restart.",
                [(f"time() - process_start_time_seconds{{{job}}}", "{{node}}")],
                "s", 12,
            ),
            graph(
                "CPU against the limit",
                "Cores the agent uses, and its cgroup's CPU limit (the DaemonSet's limits.cpu); at the limit it loses events rather than slow the node.",
                [
                    (f"sum by (node) (rate(process_cpu_seconds_total{{{job}}}[{RATE}]))", "{{node}} used"),
                    (f"max by (node) (dnspath_cgroup_cpu_limit_cores{{{NODE}}})", "{{node}} limit"),
                ],
                "short", 12,
            ),
            graph(
                "Memory against the limit",
                "What the kernel charges the agent's cgroup (BPF maps included), its resident memory, and the cgroup's limit (limits.memory).",
                [
                    (f"max by (node) (dnspath_cgroup_memory_bytes{{{NODE}}})", "{{node}} charged"),
                    (f"max by (node) (process_resident_memory_bytes{{{job}}})", "{{node}} resident"),
                    (f"max by (node) (dnspath_cgroup_memory_limit_bytes{{{NODE}}})", "{{node}} limit"),
                ],
                "bytes", 12,
            ),
            graph(
                "Events lost",
                "Packets and drops the kernel matched that never reached the agent (ring buffer full): its counts are low while this is above 0.",
                [(or_zero(rate("dnspath_events_lost_total", NODE, "node, event")), "{{node}} {{event}}")],
                "pps", 8,
            ),
            graph(
                "Event lines dropped",
                "Lines of the event stream (stdout) dropped because the log reader did not keep up.",
                [(or_zero(rate("dnspath_sink_dropped_total", NODE, "node, sink")), "{{node}} {{sink}}")],
                "short", 8,
            ),
            graph(
                "Packets read and summarised",
                "Packet events read from the kernel, and packets of a looping question only counted (storm shedding).",
                [
                    (rate("dnspath_packets_total", NODE, "node"), "{{node}} read"),
                    (rate("dnspath_summarised_packets_total", NODE, "node"), "{{node}} summarised"),
                ],
                "pps", 8,
            ),
            graph(
                "Malformed messages",
                "Messages that could not be decoded, by reason.",
                [(or_zero(rate("dnspath_malformed_messages_total", NODE, "node, reason")), "{{node}} {{reason}}")],
                "pps", 8,
            ),
            graph(
                "Table fill",
                "Entries the agent's own tables hold over their caps.",
                [(f"max by (node, table) (dnspath_table_entries{{{NODE}}}) / max by (node, table) (dnspath_table_capacity{{{NODE}}} > 0)", "{{node}} {{table}}")],
                "percentunit", 8,
            ),
            graph(
                "Table evictions",
                "Entries forgotten to keep memory bounded, by table (docs/metrics.md, tables and their caps).",
                [(or_zero(rate("dnspath_table_evictions_total", NODE, "node, table")), "{{node}} {{table}}")],
                "short", 8,
            ),
            graph(
                "OTLP export",
                "Spans and transactions the OTLP backend accepted (--otlp), transactions not exported or sampled out, and export requests by result.",
                [
                    (rate("dnspath_otlp_spans_exported_total", NODE, "node"), "{{node}} spans exported"),
                    (rate("dnspath_otlp_transactions_exported_total", NODE, "node"), "{{node}} transactions exported"),
                    (or_zero(rate("dnspath_otlp_transactions_dropped_total", NODE, "node, reason")), "{{node}} dropped {{reason}}"),
                    (rate("dnspath_otlp_transactions_sampled_out_total", NODE, "node"), "{{node}} sampled out"),
                    (or_zero(rate("dnspath_otlp_export_requests_total", NODE, "node, result")), "{{node}} requests {{result}}"),
                ],
                "short", 12,
            ),
            graph(
                "Conntrack events",
                "Conntrack events the watchers read, those lost (hops then joined by the fallback method), and resyncs after an overrun.",
                [
                    (rate("dnspath_conntrack_events_total", NODE, "node"), "{{node}} read"),
                    (or_zero(rate("dnspath_conntrack_events_lost_total", NODE, "node, reason")), "{{node}} lost {{reason}}"),
                    (rate("dnspath_conntrack_resyncs_total", NODE, "node"), "{{node}} resyncs"),
                ],
                "short", 12,
            ),
            graph(
                "Unreadable namespaces",
                "Processes whose network namespace the agent could not read (CAP_SYS_PTRACE missing): their pods are not traced.",
                [(f"max by (node) (dnspath_netns_unreadable_processes{{{NODE}}})", "{{node}}")],
                "short", 12,
            ),
            graph(
                "Conntrack namespaces",
                "Namespaces since the agent started whose conntrack is not followed (over the cap of 1,024, or their appearance lost on a full queue: races there judged without the counters), and those read without the kernel's port filter (a CPU cost, nothing lost).",
                [
                    (f"max by (node) (dnspath_conntrack_netns_capped_total{{{NODE}}})", "{{node}} over the cap"),
                    (f"max by (node) (dnspath_conntrack_netns_changes_lost_total{{{NODE}}})", "{{node}} changes lost"),
                    (f"max by (node) (dnspath_conntrack_netns_unfiltered_total{{{NODE}}})", "{{node}} unfiltered"),
                ],
                "short", 12,
            ),
        ],
    )


DASHBOARDS = {
    "cluster-dns.json": cluster,
    "drilldown.json": drilldown,
    "agent-health.json": agent_health,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, build in DASHBOARDS.items():
        text = json.dumps(json.loads(JSONEncoder(sort_keys=True).encode(build())), indent=2, sort_keys=True)
        with open(os.path.join(out, name), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
