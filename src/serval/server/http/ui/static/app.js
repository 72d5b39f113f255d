// The Serval status page: polls the JSON status endpoints once a second and renders them.
"use strict";

const POLL_MS = 1000;
const view = {
  search: "", state: "", sort: "name", page: 1, perPage: 50,
  selected: decodeURIComponent((location.hash.match(/^#model=(.+)$/) || [])[1] || ""),
  token: sessionStorage.getItem("serval-token") || "",
  updatedAt: 0, pages: 1,
};
const $ = (id) => document.getElementById(id);

function fmtBytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}
const fmtNum = (v, digits = 1) => (v == null ? "–" : Number(v).toFixed(digits));
const fmtMs = (v) => (v == null ? "–" : v < 1 ? v.toFixed(3) : v < 100 ? v.toFixed(2) : v.toFixed(0));
function fmtDuration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : m ? `${m}m ${Math.floor(s % 60)}s` : `${Math.floor(s)}s`;
}
const fmtTime = (t) => new Date(t * 1000).toLocaleTimeString();

async function getJson(path) {
  const headers = view.token ? { Authorization: `Bearer ${view.token}` } : {};
  const reply = await fetch(path, { headers, cache: "no-store" });
  if (reply.status === 401 || reply.status === 403) {
    const body = await reply.json().catch(() => ({}));
    const err = new Error(body.error || `HTTP ${reply.status}`);
    err.auth = true;
    throw err;
  }
  if (!reply.ok) throw new Error(`${path}: HTTP ${reply.status}`);
  return reply.json();
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

// what an empty chart says: nothing ever, or nothing inside the charts' window
const quiet = (total) => (total ? "no traffic in the last 2 minutes" : "no traffic yet");

function renderSummary(s) {
  $("server-version").textContent = `v${s.server.version} · pid ${s.server.pid} · ${s.server.model_control}`;
  $("uptime").textContent = `up ${fmtDuration(s.server.uptime_s)}`;
  $("s-rps").textContent = fmtNum(s.recent.requests_per_s);
  $("s-total").textContent = `${s.requests_total.toLocaleString()} requests`;
  $("s-latency").textContent = `${fmtMs(s.recent.p50_ms)} / ${fmtMs(s.recent.p99_ms)} ms`;
  $("s-errors").textContent = s.errors_total.toLocaleString();
  $("s-eps").textContent = `${fmtNum(s.recent.errors_per_s, 2)}/s now`;
  const budget = s.memory_budget_bytes;
  $("s-memory").textContent = budget ? `${fmtBytes(s.resident_bytes)} / ${fmtBytes(budget)}` : fmtBytes(s.resident_bytes);
  const share = budget ? Math.min(1, s.resident_bytes / budget) : 0;
  $("s-memory-bar").style.width = `${(share * 100).toFixed(1)}%`;
  $("s-memory-bar").className = share > 0.9 ? "full" : "";
  $("s-rss").textContent = `process RSS ${fmtBytes(s.process_resident_bytes)}${budget ? "" : " · no budget"}`;
  $("s-loads").textContent = `${s.loads} / ${s.evictions}`;
  const lookups = s.cache_hits + s.cache_misses;
  $("s-hits").textContent = lookups ? `${(100 * s.cache_hits / lookups).toFixed(1)}% hits` : "no requests yet";
  $("s-models").textContent = s.models.names.toLocaleString();
  const states = Object.entries(s.models.by_state).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(" · ");
  $("s-states").textContent = `${s.models.versions.toLocaleString()} version${s.models.versions === 1 ? "" : "s"}` +
    (states ? `: ${states}` : "");
  const now = Date.now() / 1000;
  const empty = quiet(s.requests_total);
  ServalCharts.lineChart($("server-rps-chart"), [
    { label: "req/s", points: s.series.map((p) => ({ t: p.t, v: p.requests_per_s })) },
    { label: "errors/s", color: "#dc2626", points: s.series.map((p) => ({ t: p.t, v: p.errors_per_s })) },
  ], { now, empty });
  ServalCharts.lineChart($("server-latency-chart"), [
    { label: "p50", points: s.series.map((p) => ({ t: p.t, v: p.p50_ms })) },
    { label: "p99", color: "#dc2626", points: s.series.map((p) => ({ t: p.t, v: p.p99_ms })) },
    { label: "queue", color: "#9ca3af", dashed: true, points: s.series.map((p) => ({ t: p.t, v: p.queue_ms })) },
  ], { now, empty });
  renderEvents($("events"), s.events, true);
}

function renderEvents(list, events, withModel) {
  list.replaceChildren(...events.map((e) => {
    const li = document.createElement("li");
    const what = withModel ? `${e.model} v${e.version}` : `v${e.version}`;
    li.textContent = `${fmtTime(e.t)} ${what} → ${e.state}${e.reason ? ` (${e.reason})` : ""}`;
    return li;
  }));
  if (!events.length) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = "nothing yet";
    list.appendChild(li);
  }
}

function renderTable(page) {
  const body = $("models").querySelector("tbody");
  body.replaceChildren(...page.models.map((m) => {
    const row = document.createElement("tr");
    row.dataset.model = m.name;
    if (m.name === view.selected) row.className = "selected";
    cell(row, m.name, "name");
    cell(row, m.serving_version == null ? "–" : `v${m.serving_version}`, "version");
    const state = cell(row, m.state, `state state-${m.state}`);
    if (m.reason) {
      const reason = document.createElement("span");
      reason.className = "reason";
      reason.textContent = m.reason;
      state.appendChild(reason);
    }
    cell(row, fmtBytes(m.resident_bytes), "num");
    cell(row, fmtNum(m.requests_per_s), "num rps");
    cell(row, fmtMs(m.p99_ms), "num p99");
    cell(row, fmtNum(m.batch_mean), "num");
    row.addEventListener("click", () => select(m.name));
    return row;
  }));
  view.pages = page.pages;
  $("page-info").textContent = `page ${page.page} of ${page.pages} · ${page.total.toLocaleString()} models`;
  $("prev").disabled = page.page <= 1;
  $("next").disabled = page.page >= page.pages;
}

function renderDetail(d) {
  $("detail").hidden = false;
  $("d-name").textContent = d.name;
  $("d-summary").textContent = `serving ${d.serving_version == null ? "nothing" : "v" + d.serving_version} · ${d.state}` +
    `${d.reason ? " (" + d.reason + ")" : ""} · ${fmtNum(d.requests_per_s)} req/s · ${d.requests_total.toLocaleString()} requests`;
  $("d-versions").querySelector("tbody").replaceChildren(...d.versions.map((v) => {
    const row = document.createElement("tr");
    row.dataset.version = v.version;
    cell(row, `v${v.version}${v.version === d.serving_version ? " ★" : ""}`);
    cell(row, v.state, `state state-${v.state}`);
    cell(row, fmtBytes(v.resident_bytes), "num");
    cell(row, fmtNum(v.recent.requests_per_s), "num");
    cell(row, fmtMs(v.recent.p99_ms), "num");
    cell(row, v.published_at ? `${v.published_at.replace("T", " ").slice(0, 16)} UTC` : "–");
    cell(row, v.note || "");
    return row;
  }));
  const now = Date.now() / 1000;
  const latency = [], rps = [];
  for (const s of d.series) {
    latency.push({ label: `v${s.version} p50`, points: s.points.map((p) => ({ t: p.t, v: p.p50_ms })), dashed: true });
    latency.push({ label: `v${s.version} p99`, points: s.points.map((p) => ({ t: p.t, v: p.p99_ms })) });
    rps.push({ label: `v${s.version}`, points: s.points.map((p) => ({ t: p.t, v: p.requests_per_s })) });
  }
  const empty = quiet(d.requests_total);
  ServalCharts.lineChart($("latency-chart"), latency, { now, empty });
  ServalCharts.lineChart($("rps-chart"), rps, { now, empty });
  ServalCharts.barChart($("batch-chart"), d.batch_sizes.map((b) => ({ label: String(b.batch_size), value: b.executions })));
  renderEvents($("d-events"), d.events, false);
}

function select(name) {
  view.selected = name;
  history.replaceState(null, "", name ? `#model=${encodeURIComponent(name)}` : "#");
  if (!name) $("detail").hidden = true;
  refresh();
}

function tableQuery() {
  const q = new URLSearchParams({ page: view.page, per_page: view.perPage, sort: view.sort });
  if (view.search) q.set("q", view.search);
  if (view.state) q.set("state", view.state);
  return `/status/models?${q}`;
}

let inFlight = null;
let again = false;
async function refresh() {
  if (inFlight) { again = true; return inFlight; }
  inFlight = (async () => {
    try {
      const [summary, page] = await Promise.all([getJson("/status"), getJson(tableQuery())]);
      if (page.page > page.pages && view.page > 1) { view.page = page.pages; again = true; }
      renderSummary(summary);
      renderTable(page);
      if (view.selected) {
        try {
          renderDetail(await getJson(`/status/models/${encodeURIComponent(view.selected)}`));
        } catch (err) {
          if (err.auth) throw err;
          view.selected = "";
          $("detail").hidden = true;
        }
      }
      $("auth").hidden = true;
      view.updatedAt = Date.now();
    } catch (err) {
      if (err.auth) {
        $("auth").hidden = false;
        $("auth-error").textContent = view.token ? err.message : "";
      } else {
        $("live").textContent = `update failed: ${err.message}`;
      }
    } finally {
      inFlight = null;
    }
  })();
  await inFlight;
  if (again) { again = false; return refresh(); }
}

function tick() {
  const age = view.updatedAt ? (Date.now() - view.updatedAt) / 1000 : null;
  if (age != null) {
    $("live").textContent = age < 3 ? "● live" : `stale: last update ${age.toFixed(0)} s ago`;
    $("live").className = age < 3 ? "live" : "live stale";
  }
}

let searchTimer = null;
function wire() {
  $("search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { view.search = $("search").value.trim(); view.page = 1; refresh(); }, 200);
  });
  $("state").addEventListener("change", () => { view.state = $("state").value; view.page = 1; refresh(); });
  $("sort").addEventListener("change", () => { view.sort = $("sort").value; view.page = 1; refresh(); });
  $("prev").addEventListener("click", () => { if (view.page > 1) { view.page--; refresh(); } });
  $("next").addEventListener("click", () => { if (view.page < view.pages) { view.page++; refresh(); } });
  $("d-close").addEventListener("click", () => select(""));
  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    view.token = $("token").value.trim();
    sessionStorage.setItem("serval-token", view.token);
    refresh();
  });
  refresh();
  setInterval(refresh, POLL_MS);
  setInterval(tick, 500);
}

document.addEventListener("DOMContentLoaded", wire);
