// The pdbus dashboard: one EventSource on /dashboard/events, each `snapshot` event redraws the page
// (the format: docs/API.md, "Dashboard"). Everything a node or client could influence is written
// with textContent, never as HTML. Charts are uPlot (vendored, static/uPlot.LICENSE).
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const key = params.get("api_key");
  if (key) {
    // The key leaves the address bar (history, screenshots); the stream still needs it.
    history.replaceState(null, "", location.pathname);
  }
  const base = location.pathname.replace(/\/+$/, "");
  const eventsUrl = base + "/events" + (key ? "?api_key=" + encodeURIComponent(key) : "");

  const ms = (s) => (s == null ? null : s * 1000);
  const fmtMs = (s) => (s == null ? "–" : s < 0.01 ? (s * 1000).toFixed(2) : s < 1 ? (s * 1000).toFixed(1) : (s * 1000).toFixed(0));
  const fmtBytes = (b) => {
    if (b == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(1)) + " " + units[i];
  };
  const fmtTime = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  const pct = (x) => (x == null ? "–" : (x * 100).toFixed(0) + "%");

  function cell(row, text, title) {
    const td = row.insertCell();
    td.textContent = text;
    if (title) td.title = title;
    return td;
  }

  function badge(td, text, attr, value) {
    td.textContent = "";
    const span = document.createElement("span");
    span.className = "badge";
    span.dataset[attr] = value;
    span.textContent = text;
    td.appendChild(span);
  }

  // -- charts --------------------------------------------------------------------------------
  const COLORS = ["#58a6ff", "#f78166", "#3fb950", "#d29922", "#a371f7", "#ff7b72"];
  // Only the options given: uPlot merges its defaults with Object.assign, so an explicit
  // `undefined` would replace a default (an axis with side undefined lands on top).
  const axis = (label, values, scale, size) => {
    const opts = { stroke: "#8a96a3", grid: { stroke: "#232a33", width: 1 }, ticks: { stroke: "#2a323c", width: 1 },
                   size: size || 60 };
    if (label) opts.label = label;
    if (values) opts.values = values;
    if (scale) Object.assign(opts, { scale, side: 1, grid: { show: false } });
    return opts;
  };
  const clock = (u, splits) => splits.map((t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false }));
  const xAxis = { stroke: "#8a96a3", grid: { stroke: "#232a33", width: 1 }, ticks: { stroke: "#2a323c", width: 1 },
                  values: clock, space: 70 };
  const line = (label, i, scale, dash) => ({
    label, scale: scale || "y", stroke: COLORS[i], width: 1.5, spanGaps: true, dash, points: { show: false },
  });
  const msAxis = (u, v) => v.map((x) => (x == null ? "" : x >= 1000 ? +(x / 1000).toFixed(2) + " s" : +x.toFixed(2) + " ms"));
  const bytesAxis = (u, v) => v.map((x) => fmtBytes(x) + "/s");

  // Red vertical lines at the seconds a failover happened (read from the snapshot's series).
  let failoverTimes = [];
  const failoverMarks = {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        ctx.strokeStyle = "#f85149";
        ctx.lineWidth = 2 * devicePixelRatio;
        for (const t of failoverTimes) {
          const x = u.valToPos(t, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };

  const CHARTS = {
    throughput: {
      series: [line("tokens/s", 0), line("requests/s", 2, "req"), line("failed/s", 5, "req")],
      axes: [axis("tokens/s"), axis("req/s", null, "req")],
      scales: { req: { range: (u, min, max) => [0, Math.max(1, max)] } },
      data: (s) => [s.tokens_per_s, s.requests_per_s, s.errors_per_s],
    },
    ttft: {
      series: [line("p50", 0), line("p99", 1)],
      axes: [axis("", msAxis)],
      data: (s) => [s.ttft_p50.map(ms), s.ttft_p99.map(ms)],
    },
    tpot: {
      series: [line("TPOT p50", 0), line("TPOT p99", 1), line("ITL p50", 2, "y", [4, 3]), line("ITL p99", 3, "y", [4, 3])],
      axes: [axis("", msAxis)],
      data: (s) => [s.tpot_p50.map(ms), s.tpot_p99.map(ms), s.itl_p50.map(ms), s.itl_p99.map(ms)],
    },
    kv: {
      series: [line("on the wire", 0), line("raw (before quantization)", 4, "y", [4, 3])],
      axes: [axis("", bytesAxis, null, 84)],
      data: (s) => [s.kv_wire_bytes_per_s, s.kv_raw_bytes_per_s],
    },
    load: {
      series: [line("running streams", 0), line("queued in the broker", 1)],
      axes: [axis("requests")],
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      data: (s) => [s.running, s.queued],
    },
    kvuse: {
      series: [line("decode KV used", 3)],
      axes: [axis("", (u, v) => v.map((x) => x + "%"))],
      scales: { y: { range: [0, 100] } },
      data: (s) => [s.kv_used.map((x) => (x == null ? null : x * 100))],
    },
  };
  const charts = {};

  function chartSize(el) {
    return { width: Math.max(300, el.clientWidth), height: 190 };
  }

  function drawCharts(series) {
    failoverTimes = series.time.filter((t, i) => series.failovers[i] > 0);
    for (const [name, spec] of Object.entries(CHARTS)) {
      const el = $("chart-" + name);
      const data = [series.time, ...spec.data(series)];
      if (!charts[name]) {
        const opts = {
          ...chartSize(el), series: [{}, ...spec.series], axes: [xAxis, ...spec.axes],
          scales: { x: { time: true }, ...(spec.scales || {}) },
          legend: { live: false }, cursor: { drag: { x: false, y: false } },
          plugins: name === "throughput" || name === "ttft" ? [failoverMarks] : [],
        };
        charts[name] = new uPlot(opts, data, el);
      } else {
        charts[name].setData(data);
      }
      // For tests and curious eyes: how many seconds of the chart hold a value, and a non-zero one.
      const values = data.slice(1).flat();
      el.dataset.points = String(values.filter((v) => v != null).length);
      el.dataset.nonzero = String(values.filter((v) => v != null && v > 0).length);
    }
  }

  window.addEventListener("resize", () => {
    for (const [name, chart] of Object.entries(charts)) chart.setSize(chartSize($("chart-" + name)));
  });

  // -- tables and cards ----------------------------------------------------------------------
  function drawSummary(snap) {
    const s = snap.summary;
    const failed = Object.entries(s.requests).filter(([o]) => o !== "ok").reduce((n, [, c]) => n + c, 0);
    $("sum-tokens").textContent = s.tokens_per_s.toFixed(1);
    $("sum-requests").textContent = (s.requests.ok || 0) + " / " + failed;
    $("sum-in-flight").textContent = snap.gateway ? String(snap.gateway.in_flight) : "–";
    for (const name of ["ttft", "tpot", "itl"]) {
      $("sum-" + name).textContent = fmtMs(s[name].p50) + " / " + fmtMs(s[name].p99) + " ms";
    }
    $("sum-failovers").textContent = String(s.num_failovers);
    const ratio = s.kv_wire_bytes ? (s.kv_raw_bytes / s.kv_wire_bytes).toFixed(1) + "x" : "–";
    $("sum-kv").textContent = fmtBytes(s.kv_wire_bytes) + ", " + ratio;
  }

  function drawNodes(nodes) {
    const body = $("nodes").tBodies[0];
    body.textContent = "";
    let role = null;
    for (const node of nodes) {
      if (node.role !== role) {
        role = node.role;
        const group = body.insertRow();
        group.className = "group";
        const td = cell(group, role + " (" + nodes.filter((n) => n.role === role && n.state !== "lost").length + " live)");
        td.colSpan = 8;
      }
      const row = body.insertRow();
      row.dataset.node = node.id;
      row.dataset.role = node.role;
      row.dataset.state = node.state;
      cell(row, node.id);
      cell(row, node.role);
      badge(cell(row, ""), node.state, "state", node.state);
      const kv = cell(row, "");
      const lost = node.state === "lost";   // its last report no longer holds
      if (node.kv_used != null && !lost) {
        const bar = document.createElement("span");
        bar.className = "bar" + (node.kv_used > 0.85 ? " high" : "");
        const fill = document.createElement("span");
        fill.style.width = Math.min(100, node.kv_used * 100).toFixed(1) + "%";
        bar.appendChild(fill);
        kv.appendChild(bar);
        kv.appendChild(document.createTextNode(pct(node.kv_used) + " of " + node.kv_blocks_total + " blocks"));
      } else {
        kv.textContent = "–";
      }
      cell(row, node.num_running != null && !lost ? node.num_running + " / " + (node.max_running ?? "?") : "–");
      cell(row, node.queued_tokens != null && !lost ? String(node.queued_tokens) : "–");
      cell(row, node.prefix_hit != null ? pct(node.prefix_hit) : "–");
      cell(row, node.state === "lost" ? "lost " + node.seen_ago_s.toFixed(0) + " s ago" : node.seen_ago_s.toFixed(0) + " s ago");
    }
  }

  function drawBroker(broker) {
    const dl = $("broker");
    dl.textContent = "";
    const pair = (k, v) => {
      const dt = document.createElement("dt"); dt.textContent = k; dl.appendChild(dt);
      const dd = document.createElement("dd"); dd.textContent = v; dl.appendChild(dd);
    };
    pair("answers", broker.ok ? "yes" : "no");
    for (const [role, n] of Object.entries(broker.nodes_by_role)) pair(role + " nodes", String(n));
    for (const [service, n] of Object.entries(broker.queued_by_service)) pair("queued for " + service, String(n));
    if (broker.num_routes != null) pair("streams routed", String(broker.num_routes));
  }

  function empty(body, text, span) {
    const td = cell(body.insertRow(), text);
    td.colSpan = span;
    td.className = "muted";
  }

  function drawEvents(snap) {
    const incidents = $("incidents").tBodies[0];
    incidents.textContent = "";
    if (!snap.incidents.length) empty(incidents, "none seen by this gateway", 4);
    for (const e of snap.incidents) {
      const row = incidents.insertRow();
      row.dataset.kind = e.kind;
      cell(row, fmtTime(e.time));
      badge(cell(row, ""), e.kind.replace("_", " "), "kind", e.kind);
      cell(row, e.node + (e.role ? " (" + e.role + ")" : ""));
      const detail = [e.code, e.decode_nodes && e.decode_nodes.length > 1 ? e.decode_nodes.join(" → ") : "", e.request_id]
        .filter(Boolean).join("  ");
      cell(row, detail, e.request_id);
    }
    const transfers = $("transfers").tBodies[0];
    transfers.textContent = "";
    if (!snap.transfers.length) empty(transfers, "none yet", 6);
    for (const t of snap.transfers) {
      const row = transfers.insertRow();
      row.dataset.transfer = t.mode || "?";
      cell(row, fmtTime(t.time));
      cell(row, (t.prefill_node || "?") + " → " + (t.decode_node || "?"), t.request_id);
      cell(row, fmtBytes(t.raw_bytes));
      cell(row, fmtBytes(t.wire_bytes));
      cell(row, t.seconds == null ? "–" : (t.seconds * 1000).toFixed(1));
      cell(row, t.compression && t.compression !== "none" ? t.mode + "+" + t.compression : t.mode);
    }
  }

  function render(snap) {
    $("model").textContent = snap.gateway ? snap.gateway.model : "";
    $("gateway").textContent = snap.gateway && snap.gateway.node_id ? "gateway " + snap.gateway.node_id : "";
    $("updated").textContent = "updated " + fmtTime(snap.time);
    drawSummary(snap);
    drawNodes(snap.nodes);
    drawBroker(snap.broker);
    drawEvents(snap);
    drawCharts(snap.series);
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  }

  function setStatus(state) {
    const el = $("status");
    el.dataset.state = state;
    el.textContent = state;
  }

  const source = new EventSource(eventsUrl);
  source.addEventListener("open", () => setStatus("connected"));
  source.addEventListener("error", () => setStatus(source.readyState === EventSource.CLOSED ? "disconnected" : "connecting"));
  source.addEventListener("snapshot", (event) => {
    setStatus("connected");
    render(JSON.parse(event.data));
  });
})();
