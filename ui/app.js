// The ad-ops page: one campaign's period from GET /v1/campaigns/{id}/timeline,
// drawn with uPlot. Every figure shown is also written into the DOM (the
// summary table, data-* attributes of each figure), so tests and screen
// readers read what the charts draw.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const REFRESH_MS = 10000;
  let charts = {};
  let token = sessionStorage.getItem("freqcap-token") || "";

  function status(text, error) {
    const s = $("status");
    s.textContent = text;
    s.className = error ? "error" : "";
  }

  async function api(path) {
    const headers = token ? { authorization: "Bearer " + token } : {};
    const r = await fetch(path, { headers });
    if (r.status === 401) {
      $("token-box").hidden = false;
      throw new Error("a decision token is needed");
    }
    if (!r.ok) {
      let msg = r.status + "";
      try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
      throw new Error(msg);
    }
    return r.json();
  }

  const secs = (rfc) => Date.parse(rfc) / 1000;
  const fmt = (n) => Number(n).toLocaleString("en-US");

  // Times on the axes in the campaign's zone.
  function tzDate(tz) {
    return (ts) => uPlot.tzDate(new Date(ts * 1000), tz);
  }

  function chart(id, opts, data) {
    const el = $(id);
    if (charts[id]) { charts[id].destroy(); }
    el.textContent = "";
    const width = Math.max(320, el.clientWidth || 900);
    charts[id] = new uPlot(Object.assign({ width, height: 280 }, opts), data, el);
  }

  function drawDelivery(t) {
    const start = secs(t.period_start), now = secs(t.now);
    // Cumulative spend over the current period, one point per minute with
    // activity (at its end, or now for the minute under way: drawn at its
    // end, after now, the current minute's spend was not drawn until the
    // minute ended), starting at 0 at the period's start and carried to now.
    const xs = [start], spend = [0];
    let total = 0;
    for (const m of t.minutes) {
      const x = secs(m.t);
      if (x < start) continue;
      total += m.spend;
      xs.push(Math.min(x + 60, now));
      spend.push(total);
    }
    if (xs[xs.length - 1] < now) { xs.push(now); spend.push(total); }
    // The pacing line at the same times (interpolated between its
    // quarter-hour points), and the budget.
    const line = t.pacing_line.map((p) => [secs(p.t), p.cap]);
    const at = (x) => {
      if (!line.length) return null;
      let i = line.findIndex((p) => p[0] >= x);
      if (i <= 0) return i === 0 ? line[0][1] : line[line.length - 1][1];
      const [x0, y0] = line[i - 1], [x1, y1] = line[i];
      return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    };
    // The whole line across the period, beside the spend points.
    const allX = Array.from(new Set(xs.concat(line.map((p) => p[0])))).sort((a, b) => a - b);
    const spendAt = (x) => { let v = null; for (let i = 0; i < xs.length; i++) { if (xs[i] <= x) v = spend[i]; } return x <= now ? v : null; };
    const data = [allX, allX.map(spendAt), allX.map(at), allX.map(() => t.amount)];
    const fig = $("delivery");
    fig.dataset.points = String(xs.length);
    fig.dataset.lastSpend = String(total);
    fig.dataset.pacingNow = line.length ? String(Math.round(at(now))) : "";
    fig.dataset.budget = t.amount == null ? "" : String(t.amount);
    // The last spend the chart itself draws (its series, not the total
    // computed beside it).
    const drawn = data[1].filter((v) => v != null);
    fig.dataset.drawnSpend = drawn.length ? String(drawn[drawn.length - 1]) : "";
    // Off-hours (a schedule of its chain) shaded, and the flight's start
    // and end drawn, under the series.
    const closed = t.closed.map((c) => [secs(c.start), secs(c.end)]);
    const flight = t.flight ? [secs(t.flight.start), secs(t.flight.end)] : [];
    fig.dataset.closedSpans = String(closed.length);
    fig.dataset.flight = flight.join(",");
    const shade = (u) => {
      const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
      const [lo, hi] = [u.scales.x.min, u.scales.x.max];
      ctx.save();
      ctx.fillStyle = "rgba(100,116,139,0.15)";
      for (const [a, b] of closed) {
        if (b <= lo || a >= hi) continue;
        const x0 = u.valToPos(Math.max(a, lo), "x", true), x1 = u.valToPos(Math.min(b, hi), "x", true);
        ctx.fillRect(x0, top, Math.max(1, x1 - x0), h);
      }
      ctx.strokeStyle = "#7c3aed";
      ctx.lineWidth = 2;
      for (const x of flight) {
        if (x < lo || x > hi) continue;
        const px = u.valToPos(x, "x", true);
        ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + h); ctx.stroke();
      }
      ctx.restore();
    };
    chart("delivery-chart", {
      hooks: { drawClear: [shade] },
      tzDate: tzDate(t.tz),
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
      axes: [
        { label: "time (" + t.tz + ")" },
        { label: "spend (budget units)", size: 70 },
      ],
      series: [
        {},
        { label: "spent", stroke: "#1f6feb", width: 2 },
        { label: "pacing line (" + (t.pacing || "no budget") + ")", stroke: "#d97706", width: 2, dash: [6, 4], points: { show: false } },
        { label: "budget", stroke: "#9aa3b2", width: 1, points: { show: false } },
      ],
    }, data);
  }

  function drawHourly(t) {
    const start = secs(t.period_start), end = secs(t.period_end);
    const hours = Math.max(1, Math.ceil((end - start) / 3600));
    const xs = [], spend = [], denied = [];
    for (let h = 0; h < hours; h++) { xs.push(start + h * 3600); spend.push(0); denied.push(0); }
    for (const m of t.minutes) {
      const h = Math.floor((secs(m.t) - start) / 3600);
      if (h < 0 || h >= hours) continue;
      spend[h] += m.spend;
      denied[h] += m.denied;
    }
    $("hourly").dataset.spend = spend.join(",");
    const bars = uPlot.paths.bars({ size: [0.6, 40] });
    chart("hourly-chart", {
      tzDate: tzDate(t.tz),
      scales: { x: { time: true } },
      axes: [
        { label: "hour (" + t.tz + ")" },
        { label: "spend per hour (budget units)", size: 70 },
        { side: 1, scale: "hits", label: "cap hits per hour", grid: { show: false } },
      ],
      series: [
        {},
        { label: "spend", fill: "rgba(31,111,235,0.35)", stroke: "#1f6feb", paths: bars },
        { label: "cap hits", scale: "hits", stroke: "#b00020", width: 2, points: { show: false } },
      ],
    }, [xs, spend, denied]);
  }

  function drawDenials(t) {
    const body = $("denials-table").tBodies[0];
    body.textContent = "";
    for (const d of t.denied_by_cap) {
      const tr = document.createElement("tr");
      tr.dataset.cap = d.cap;
      // Whom the cap counts for: user, campaign, or another identity kind
      // (household, device); the budget and max_in_flight have none.
      tr.dataset.scope = d.scope || "";
      const a = document.createElement("td"); a.textContent = d.cap;
      const s = document.createElement("td"); s.textContent = d.scope || "\u2014";
      const b = document.createElement("td"); b.textContent = fmt(d.denied);
      tr.append(a, s, b);
      body.append(tr);
    }
  }

  function drawPerUser(t) {
    const p = t.per_user;
    const fig = $("per-user");
    if (!p) {
      fig.dataset.cap = "";
      $("per-user-note").textContent = "This campaign has no user-scope cap.";
      if (charts["per-user-chart"]) { charts["per-user-chart"].destroy(); delete charts["per-user-chart"]; }
      return;
    }
    fig.dataset.cap = p.cap;
    fig.dataset.users = p.users.join(",");
    $("per-user-note").textContent = "Cap \u201c" + p.cap + "\u201d: " + fmt(p.limit) +
      " per user. The last bar counts users at the cap, who are denied until their window moves on.";
    const xs = p.users.map((_, k) => k);
    chart("per-user-chart", {
      scales: { x: { time: false, range: (u, min, max) => [min - 0.5, max + 0.5] } },
      axes: [
        { label: "impressions counted against the cap", values: (u, v) => v.map((k) => Number.isInteger(k) ? String(k) : "") },
        { label: "users", size: 60 },
      ],
      series: [
        {},
        { label: "users", fill: "rgba(22,163,74,0.35)", stroke: "#16a34a", paths: uPlot.paths.bars({ size: [0.7, 60] }) },
      ],
    }, [xs, p.users]);
  }

  function summary(t) {
    const start = secs(t.period_start), now = secs(t.now);
    let spent = 0, commits = 0;
    for (const m of t.minutes) {
      if (secs(m.t) >= start) { spent += m.spend; commits += m.commits; }
    }
    const line = t.pacing_line;
    let pacingNow = "no budget";
    if (line.length) {
      let i = line.findIndex((p) => secs(p.t) >= now);
      if (i <= 0) i = i === 0 ? 0 : line.length - 1;
      const [a, b] = [line[Math.max(0, i - 1)], line[i]];
      const x0 = secs(a.t), x1 = secs(b.t);
      pacingNow = fmt(Math.round(x1 === x0 ? b.cap : a.cap + (b.cap - a.cap) * (now - x0) / (x1 - x0)));
    }
    $("spent").textContent = fmt(spent);
    $("pacing-now").textContent = pacingNow;
    $("budget").textContent = t.amount == null ? "no budget" : fmt(t.amount) + " (" + t.pacing + ")";
    // The levers a screen would answer now (docs/pacing.md, "Levers"):
    // kept by throttle pacing, or by a campaign with pacing_levers.
    const lv = $("levers");
    if (t.levers) {
      lv.textContent = "pass " + (100 * t.levers.pass_probability).toFixed(1) + " %, bid × " +
        t.levers.bid_multiplier.toFixed(2);
      lv.dataset.pass = String(t.levers.pass_probability);
      lv.dataset.multiplier = String(t.levers.bid_multiplier);
    } else {
      lv.textContent = "not kept (pacing_levers off)";
      delete lv.dataset.pass;
      delete lv.dataset.multiplier;
    }
    $("commits").textContent = fmt(commits);
    $("open").textContent = fmt(t.reservations_open);
    $("period").textContent = t.period_start + " to " + t.period_end;
    $("flight").textContent = t.flight ? t.flight.start + " to " + t.flight.end : "none (always)";
    // Off-hours left in this period, as hours and minutes in all.
    const off = t.closed.reduce((n, c) => n + secs(c.end) - secs(c.start), 0);
    $("off-hours").textContent = t.closed.length
      ? t.closed.length + " spans, " + Math.floor(off / 3600) + " h " + String(Math.round(off % 3600 / 60)).padStart(2, "0") + " min"
      : "none";
    $("tz").textContent = t.tz;
  }

  async function refresh() {
    const id = $("campaign").value;
    if (!id) { status("no campaigns defined yet"); return; }
    try {
      const t = await api("/v1/campaigns/" + encodeURIComponent(id) + "/timeline");
      summary(t);
      drawDelivery(t);
      drawHourly(t);
      drawDenials(t);
      drawPerUser(t);
      document.body.dataset.campaign = t.campaign;
      status("updated " + new Date(secs(t.now) * 1000).toISOString().slice(11, 19) + " UTC");
    } catch (e) {
      status("cannot read " + id + ": " + e.message, true);
    }
  }

  async function load() {
    try {
      const list = (await api("/v1/campaigns")).campaigns;
      const sel = $("campaign");
      sel.textContent = "";
      for (const c of list) {
        const o = document.createElement("option");
        o.value = c.id;
        o.textContent = c.id + (c.budget ? "" : " (no budget)");
        sel.append(o);
      }
      const wanted = new URLSearchParams(location.search).get("campaign");
      const first = list.find((c) => c.id === wanted) || list.find((c) => c.budget) || list[0];
      if (first) sel.value = first.id;
      await refresh();
    } catch (e) {
      status("cannot list campaigns: " + e.message, true);
    }
  }

  $("campaign").addEventListener("change", () => {
    const u = new URL(location.href);
    u.searchParams.set("campaign", $("campaign").value);
    history.replaceState(null, "", u);
    refresh();
  });
  $("token-box").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    sessionStorage.setItem("freqcap-token", token);
    $("token-box").hidden = true;
    load();
  });
  load();
  setInterval(refresh, REFRESH_MS);
})();
