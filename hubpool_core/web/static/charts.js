// The Hub Pool page's traffic charts: the node folds its routing log into per-minute series
// (GET /routing-log/charts); this draws them with the vendored uPlot and writes each one as a
// table too. The canvas is hidden from screen readers: the caption says what it shows in words
// and the table (a <details>, so a keyboard opens it) holds every figure. Without uPlot (a
// script blocked or failed) the tables are open and carry the page alone.
"use strict";

(() => {
  const { api, h, fill } = HP;
  const $ = (id) => document.getElementById(id);
  const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];
  const hasPlot = typeof uPlot === "function";
  const plots = [];
  let lastKey = null;

  const nodeName = (n) => (n === "local" ? "this node" : n.split(".")[0]);
  const minute = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const sum = (xs) => xs.reduce((a, b) => a + (b || 0), 0);
  const fmtMs = (v) => (v === null || v === undefined ? "—" : Math.round(v) + " ms");

  // one chart: a caption sentence, the plot, and the table fallback
  function chart(id, title, caption, series, xs, table, opts) {
    const box = $(id);
    const plot = h("div", { class: "plot", "aria-hidden": "true" });
    const details = h("details", { class: "chart-table", open: !hasPlot },
      h("summary", {}, "Show as a table"), table);
    fill(box, h("h3", { id: id + "-h" }, title), h("p", { class: "chart-caption", id: id + "-caption" }, caption),
      plot, details);
    box.setAttribute("aria-labelledby", id + "-h");
    box.setAttribute("aria-describedby", id + "-caption");
    if (!hasPlot || !series.length) return;
    const width = Math.max(240, plot.clientWidth || box.clientWidth || 300);
    const u = new uPlot({
      width, height: 180, cursor: { drag: { x: false, y: false } },
      // the x axis runs to the end of the last minute, so its bar is not cut in half at the edge
      scales: { x: { time: true, range: () => [xs[0], xs[xs.length - 1] + opts.step] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi) * 1.1] } },
      axes: [{ stroke: "#6b7280" }, { stroke: "#6b7280", size: 48, label: opts.unit, labelSize: 16 }],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, fill: s.fill || null, width: 2,
        dash: s.dash || null, paths: s.paths || undefined, spanGaps: false,
        // a minute with traffic between quiet ones is a lone point: draw it, or it vanishes
        points: { show: !s.paths, size: 5, fill: s.color },
        value: (u, v) => (v === null || v === undefined ? "—" : opts.fmt(v)) }))],
    }, [xs, ...series.map((s) => s.data)], plot);
    plots.push({ u, plot });
  }

  function table(caption, head, rows, empty) {
    if (!rows.length) return h("p", { class: "muted" }, empty);
    return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
      h("table", { class: "data" }, h("caption", {}, caption),
        h("thead", {}, h("tr", {}, head.map((c, i) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => (i ? h("td", {}, c) : h("th", { scope: "row" }, c))))))));
  }

  // the minutes that have anything to say, as table rows
  function busyRows(xs, cols, fmt, keep) {
    const out = [];
    xs.forEach((t, i) => {
      const vals = cols.map((c) => c[i]);
      if (vals.some(keep)) out.push([minute(t), ...vals.map(fmt)]);
    });
    return out;
  }

  function render(d) {
    for (const p of plots.splice(0)) p.u.destroy();
    const xs = d.buckets, nodes = d.nodes;
    const color = (i) => COLORS[i % COLORS.length];
    const per = d.bucketSeconds === 60 ? "minute" : (d.bucketSeconds / 60) + " minutes";
    const span = d.window === "hour" ? "the last hour" : "the last day";
    const stepped = hasPlot ? uPlot.paths.stepped({ align: 1 }) : null;
    const bars = hasPlot ? uPlot.paths.bars({ size: [0.7, 40] }) : null;

    // requests
    const totals = nodes.map((n) => sum(d.requests[n]));
    chart("chart-requests", "Requests per " + per + ", by the node that served them",
      sum(totals) ? sum(totals) + " requests served in " + span + ": " + nodes.map((n, i) => nodeName(n) + " " + totals[i]).join(", ") + "."
                  : "No requests served in " + span + ".",
      nodes.map((n, i) => ({ label: nodeName(n), color: color(i), data: d.requests[n] })), xs,
      table("Requests per " + per + " by node", ["Minute", ...nodes.map(nodeName)],
        busyRows(xs, nodes.map((n) => d.requests[n]), String, (v) => v > 0), "No requests in " + span + "."),
      { unit: "requests", step: d.bucketSeconds, fmt: (v) => String(v) });

    // time to first byte
    const ttfbSeries = [];
    nodes.forEach((n, i) => {
      ttfbSeries.push({ label: nodeName(n) + " p50", color: color(i), data: d.ttfbP50[n] });
      ttfbSeries.push({ label: nodeName(n) + " p95", color: color(i), dash: [6, 4], data: d.ttfbP95[n] });
    });
    const medians = nodes.map((n) => { const v = d.ttfbP50[n].filter((x) => x !== null); return v.length ? v[v.length - 1] : null; });
    chart("chart-ttfb", "Time to first byte, p50 and p95 (dashed), by node",
      medians.some((v) => v !== null) ? "Median in the latest minute with answers: " + nodes.map((n, i) => nodeName(n) + " " + fmtMs(medians[i])).filter((_, i) => medians[i] !== null).join(", ") + "."
        : "No answers to time in " + span + ".",
      ttfbSeries, xs,
      table("Time to first byte per " + per + " (p50 / p95)", ["Minute", ...nodes.map(nodeName)],
        busyRows(xs, nodes.map((n) => d.ttfbP50[n].map((v, i) => (v === null ? null : [v, d.ttfbP95[n][i]]))),
          (v) => (v === null ? "—" : fmtMs(v[0]) + " / " + fmtMs(v[1])), (v) => v !== null),
        "No answers to time in " + span + "."),
      { unit: "ms", step: d.bucketSeconds, fmt: fmtMs });

    // queue depth
    const peaks = nodes.map((n) => Math.max(0, ...d.queueDepth[n]));
    chart("chart-queue", "Queue depth: this node's requests in flight at each node (peak per " + per + ")",
      nodes.length ? "Highest in " + span + ": " + nodes.map((n, i) => nodeName(n) + " " + peaks[i]).join(", ") + "." : "Nothing in flight in " + span + ".",
      nodes.map((n, i) => ({ label: nodeName(n), color: color(i), paths: stepped, data: d.queueDepth[n] })), xs,
      table("Peak requests in flight per " + per + " by node", ["Minute", ...nodes.map(nodeName)],
        busyRows(xs, nodes.map((n) => d.queueDepth[n]), String, (v) => v > 0), "Nothing in flight in " + span + "."),
      { unit: "in flight", step: d.bucketSeconds, fmt: (v) => String(v) });

    // failovers and failures
    const fo = sum(d.failovers), ff = sum(d.failures);
    chart("chart-failovers", "Failovers and failed requests per " + per,
      fo + ff ? fo + " request" + (fo === 1 ? "" : "s") + " failed over to another node and " + ff + " failed in " + span + "."
              : "No failovers or failures in " + span + ".",
      // a quiet minute has no bar at all (null), not a bar of height zero drawn along the axis
      [{ label: "failed over", color: "#d97706", fill: "rgba(217,119,6,.35)", paths: bars, data: d.failovers.map((v) => v || null) },
       { label: "failed", color: "#dc2626", fill: "rgba(220,38,38,.35)", paths: bars, data: d.failures.map((v) => v || null) }], xs,
      table("Failovers and failures per " + per, ["Minute", "Failed over", "Failed"],
        busyRows(xs, [d.failovers, d.failures], String, (v) => v > 0), "No failovers or failures in " + span + "."),
      { unit: "requests", step: d.bucketSeconds, fmt: (v) => String(v) });

    fill($("failover-reasons"), d.reasons.length
      ? table("Why nodes were passed over or requests failed, in " + span, ["Reason", "Times", "Nodes"],
          d.reasons.map((r) => [r.reason, String(r.count), r.nodes.map(nodeName).join(", ") || "—"]), "")
      : h("p", { class: "muted" }, "No node was passed over in " + span + "."));

    const note = [];
    if (!d.complete) note.push("The routing log holds the last " + d.capacity + " requests, which do not reach back the whole window; older minutes show less than happened.");
    if (!hasPlot) note.push("Charts could not be drawn here; every figure is in the tables.");
    $("traffic-note").textContent = note.join(" ");
    const day = $("traffic-window").querySelector('option[value="day"]');
    day.disabled = !d.historyAvailable;
    day.textContent = d.historyAvailable ? "the last day" : "the last day (needs routing history)";
  }

  async function refresh() {
    const win = $("traffic-window").value;
    try {
      const d = await api("GET", "/routing-log/charts?window=" + encodeURIComponent(win));
      const key = JSON.stringify([win, d.buckets[0], d.requests, d.queueDepth, d.failovers, d.failures, d.reasons, d.complete]);
      if (key === lastKey) return;  // unchanged: keep the plots (and the cursor) where they are
      lastKey = key;
      render(d);
      $("traffic").dataset.rendered = String(d.rows);
    } catch (e) {
      $("traffic-note").textContent = e.message;
    }
  }

  // keep each plot as wide as its box (phone rotation, a resized window)
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const p of plots) p.u.setSize({ width: Math.max(240, p.plot.clientWidth), height: 180 });
    }, 100);
  });
  $("traffic-window").addEventListener("change", () => { lastKey = null; refresh(); });
  document.addEventListener("hubpool:changed", refresh);
  HP.every(60000, refresh);
})();
