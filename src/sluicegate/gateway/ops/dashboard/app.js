// The dashboard: polls /admin/state and renders every model's lanes, tenants and backends.
// Every number sits in an element with data-model / data-lane / data-tenant / data-backend
// and data-field attributes (and its raw value in data-value) so tests can find it.

import { LANE_COLORS, lineChart } from "./charts.js";
import { History, HISTORY_S, ratesBetween, viewOf } from "./view.js";

const POLL_MS = 1500;
const STATE_URL = "admin/state"; // relative: works behind a path prefix too
const REJECTED = ["rejected_rate_limit", "rejected_queue_full", "rejected_unavailable"];
const RATE_COLUMNS = [
  ["completed", "done/s", ["completed"]],
  ["rejected", "rejected/s", REJECTED],
  ["shed", "shed/s", ["shed"]],
  ["expired", "expired/s", ["expired"]],
  ["preempted", "preempted/s", ["preempted"]],
  ["cancelled", "cancelled/s", ["cancelled"]],
  ["upstream_error", "errors/s", ["upstream_error"]],
];

window.sluicegateLastState = null;
window.sluicegateRenders = 0;

const history = new History();
let previousView = null;
let lastRendered = null;

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const fmtInt = (value) => (value === null || value === undefined ? "–" : integer.format(value));
const fmtRate = (value) => {
  if (value === null || value === undefined) return "–";
  return value < 10 ? value.toFixed(1) : integer.format(value);
};
const fmtWait = (seconds) => {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  return seconds < 10 ? `${seconds.toFixed(2)} s` : `${seconds.toFixed(1)} s`;
};
const fmtRoundTrip = (seconds) => {
  if (seconds === null || seconds === undefined) return "–";
  const ms = seconds * 1000;
  return ms < 10 ? `${ms.toFixed(2)} ms` : `${Math.round(ms)} ms`;
};
const fmtAge = (seconds) => {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)} min`;
  return `${Math.floor(seconds / 3600)} h`;
};
const fmtPercent = (fraction) => (fraction === null ? "–" : `${Math.round(fraction * 100)}%`);
const fmtClock = (unix) => new Date(unix * 1000).toLocaleTimeString("en-GB");

function el(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") element.className = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) element.append(child);
  }
  return element;
}

// A table cell holding one number: its text formatted, its raw value in data-value.
function cell(field, value, text, extra = {}) {
  return el("td", { class: "num", "data-field": field, "data-value": value ?? "", ...extra }, text);
}

function bar(fraction, warnAt) {
  const fill = el("span");
  fill.style.width = `${Math.max(0, Math.min(1, fraction ?? 0)) * 100}%`;
  return el("div", { class: fraction !== null && fraction >= warnAt ? "bar warn" : "bar" }, fill);
}

function pill(text, kind, field, title) {
  return el("span", { class: `pill ${kind}`, "data-field": field, title }, text);
}

function renderHeader(view, live) {
  const pills = [pill(live ? "live" : "stale", live ? "ok" : "bad", "status")];
  pills.push(el("span", { class: "muted", "data-field": "updated", "data-value": view.time },
    `updated ${fmtClock(view.time)}`));
  const store = view.store || { kind: "memory" };
  const storeText = store.kind === "redis"
    ? `store: redis, ${store.mode}, ${store.replicas ?? "?"} replicas` : "store: memory";
  const storeOk = store.kind !== "redis" || store.mode === "global";
  pills.push(pill(storeText, storeOk ? "plain" : "bad", "store", store.replica));
  if (view.draining) pills.push(pill("draining", "bad", "draining"));
  if (view.pressure) {
    const p = view.pressure;
    const text = p.up ? `pressure stage ${p.stage}` : "pressure: prometheus unavailable";
    pills.push(pill(text, !p.up ? "bad" : p.stage > 0 ? "warn" : "plain", "pressure", p.error));
    for (const signal of p.signals) {
      pills.push(pill(
        `${signal.name} ${signal.value === null ? "?" : fmtRate(signal.value)} / ${fmtRate(signal.threshold)}`,
        signal.above ? "warn" : "plain", "signal", null,
      ));
    }
  }
  if (view.workers) {
    const failed = view.workers.filter((w) => w.error);
    pills.push(pill(`${view.workers.length - failed.length}/${view.workers.length} workers`,
      failed.length ? "bad" : "plain", "workers"));
  }
  document.getElementById("status").replaceChildren(...pills);
  const errors = (view.workers || []).filter((w) => w.error)
    .map((w) => el("div", { "data-field": "worker-error", "data-worker": w.worker },
      `worker ${w.worker}: ${w.error}`));
  const box = document.getElementById("worker-errors");
  box.replaceChildren(...errors);
  box.hidden = errors.length === 0;
}

const MODE_KINDS = { global: "ok", rejoining: "warn", fail_open: "bad", fail_closed: "bad" };

// Each replica's (each worker's) view of the shared store: its mode and for how long, its
// last sync's round trip and age, its fallbacks so far.
function renderLinks(view) {
  const box = document.getElementById("links");
  if (view.links.length === 0) {
    box.replaceChildren();
    box.hidden = true;
    return;
  }
  const rows = view.links.map((link) => {
    const inMode = link.since === null ? null : Math.max(0, view.time - link.since);
    return el("tr", { "data-link": link.session ?? link.replica ?? "" },
      el("th", { scope: "row" }, link.worker === null ? "" : `worker ${link.worker} `,
        el("span", { "data-field": "session" }, link.session ?? link.replica ?? "?")),
      el("td", {}, pill(link.mode ?? "?", MODE_KINDS[link.mode] ?? "plain", "mode")),
      cell("in-mode", inMode, fmtAge(inMode)),
      cell("sync-rtt", link.rtt, fmtRoundTrip(link.rtt)),
      cell("sync-age", link.age, link.age === null ? "never" : `${fmtAge(link.age)} ago`,
        { class: link.age === null || link.age > 2 ? "num alert" : "num" }),
      cell("fallbacks", link.fallbacks, fmtInt(link.fallbacks),
        { class: link.fallbacks ? "num alert" : "num quiet" }),
      cell("replicas", link.replicas, fmtInt(link.replicas)));
  });
  box.replaceChildren(el("h3", {}, "store links"),
    table(["replica", "mode", "for", "sync round trip", "last sync", "fallbacks", "replicas"], rows, "links"));
  box.hidden = false;
}

function laneRow(model, lane, rates) {
  const perOutcome = rates.lanes[`${model.name}\u0000${lane.name}`] || null;
  const total = lane.outcomes ? Object.values(lane.outcomes).reduce((a, b) => a + b, 0) : null;
  const fraction = lane.limit ? (lane.running ?? 0) / lane.limit : null;
  const inflight = el("td", { class: "inflight" },
    el("div", { class: "inflight-text" },
      el("span", { "data-field": "running", "data-value": lane.running ?? "" }, fmtInt(lane.running)),
      " / ",
      el("span", { "data-field": "limit", "data-value": lane.limit ?? "" }, fmtInt(lane.limit)),
      lane.borrowed ? el("span", { class: "muted", "data-field": "borrowed" }, ` (${lane.borrowed} borrowed)`) : null),
    bar(fraction, 1));
  const rateCells = RATE_COLUMNS.map(([field, , outcomes]) => {
    if (!perOutcome) return cell(`rate-${field}`, null, "–");
    const parts = outcomes.map((o) => perOutcome[o]).filter((v) => v !== null && v !== undefined);
    const value = parts.length ? parts.reduce((a, b) => a + b, 0) : null;
    const title = outcomes.length > 1
      ? outcomes.map((o) => `${o}: ${fmtRate(perOutcome[o])}/s`).join("\n") : null;
    const quiet = value === 0 || value === null;
    return cell(`rate-${field}`, value, fmtRate(value),
      { class: quiet ? "num quiet" : field === "completed" ? "num" : "num alert", title });
  });
  return el("tr", { "data-model": model.name, "data-lane": lane.name },
    el("th", { scope: "row" }, lane.name, el("span", { class: "muted small" }, ` ${lane.policy ?? ""}`),
      lane.tightened ? pill("tightened", "warn", "tightened") : null),
    cell("queued", lane.queued, fmtInt(lane.queued)),
    cell("wait-p50", lane.wait.p50, fmtWait(lane.wait.p50)),
    cell("wait-p95", lane.wait.p95, fmtWait(lane.wait.p95)),
    cell("wait-p99", lane.wait.p99, fmtWait(lane.wait.p99)),
    inflight,
    ...rateCells,
    cell("finished", total, fmtInt(total)));
}

function table(headers, rows, className) {
  return el("table", { class: className },
    el("thead", {}, el("tr", {}, headers.map((h, i) => el("th", { class: i ? "num" : null }, h)))),
    el("tbody", {}, rows));
}

const byTenant = (rows) => new Map((rows || []).map((row) => [row.tenant, row]));
const laneTitle = (row) => (row ? Object.entries(row.lanes).map(([l, n]) => `${l}: ${n}`).join("\n") : null);

// A running count: the tenant's row of `rows` (0 when the list has none for it), or a dash
// when there is no list at all.
function runningCell(field, rows, tenant) {
  if (!rows) return cell(field, null, "–");
  const row = rows.get(tenant) || null;
  const value = row ? row.running : 0;
  return cell(field, value, fmtInt(value), { title: laneTitle(row), class: value ? "num" : "num quiet" });
}

// Usage and running requests per tenant. In distributed mode, "running" is every replica's
// (the store's, as last read) and "here" this gateway's; otherwise "running" is this one's.
function tenantRows(model, rates, distributed) {
  const usage = byTenant(model.tenants);
  const here = model.tenantRunning ? byTenant(model.tenantRunning) : null;
  const all = model.globalTenantRunning ? byTenant(model.globalTenantRunning) : null;
  const names = [...usage.keys()];
  const extra = new Set([...(here ? here.keys() : []), ...(all ? all.keys() : [])]);
  names.push(...[...extra].filter((name) => !usage.has(name)).sort());
  if (names.length === 0) {
    return [el("tr", {}, el("td", { class: "muted", colspan: distributed ? 9 : 8 }, "no requests yet"))];
  }
  return names.map((name) => {
    const tenant = usage.get(name) || { tenant: name, requests: null, prompt_tokens: null, completion_tokens: null };
    const rate = rates.tenants[`${model.name}\u0000${name}`] || {};
    const running = distributed
      ? [runningCell("running", all, name), runningCell("running-here", here, name)]
      : [runningCell("running", here, name)];
    return el("tr", { "data-model": model.name, "data-tenant": name },
      el("th", { scope: "row" }, name),
      ...running,
      cell("requests", tenant.requests, fmtInt(tenant.requests)),
      cell("rate-requests", rate.requests ?? null, fmtRate(rate.requests)),
      cell("rate-prompt", rate.prompt ?? null, fmtRate(rate.prompt)),
      cell("rate-completion", rate.completion ?? null, fmtRate(rate.completion)),
      cell("prompt_tokens", tenant.prompt_tokens, fmtInt(tenant.prompt_tokens)),
      cell("completion_tokens", tenant.completion_tokens, fmtInt(tenant.completion_tokens)));
  });
}

function backendRows(model) {
  return model.backends.map((backend) => {
    let health = backend.healthy ? "healthy" : "down";
    if (!backend.healthy && !backend.probe_healthy) health = "probe failing";
    else if (!backend.healthy && backend.circuit && backend.circuit !== "closed") {
      health = `circuit ${backend.circuit}`;
    }
    if (backend.workers > 1 && backend.healthyWorkers !== backend.workers) {
      health = `healthy in ${backend.healthyWorkers}/${backend.workers} workers`;
    }
    let tone = backend.healthy ? "ok" : "bad";
    if (backend.healthy && backend.stale) {
      // Its metrics stopped coming: it counts as full, so it gets no new request.
      health = `stale (metrics ${fmtInt(backend.metricsAge)} s old)`;
      tone = "warn";
    }
    return el("tr", { "data-model": model.name, "data-backend": backend.name },
      el("th", { scope: "row" }, backend.name),
      el("td", {}, pill(health, tone, "healthy")),
      cell("inflight", backend.inflight, fmtInt(backend.inflight)),
      cell("waiting", backend.waiting, fmtInt(backend.waiting)),
      el("td", { class: "kv" },
        el("span", { "data-field": "kv", "data-value": backend.kv ?? "" }, fmtPercent(backend.kv)),
        bar(backend.kv, 0.9)));
  });
}

function charts(model) {
  const samples = history.of(model.name);
  const now = samples.length ? samples[samples.length - 1].t : 0;
  // Until five minutes have been seen, the charts span what has been (at least 30 s).
  const spanS = Math.min(HISTORY_S, Math.max(30, samples.length ? now - samples[0].t : 0));
  const laneSeries = (pick) => model.lanes.map((lane, i) => ({
    name: lane.name, color: LANE_COLORS[i % LANE_COLORS.length],
    points: samples.map((s) => [s.t, s.lanes[lane.name] ? pick(s.lanes[lane.name]) : null]),
  }));
  const common = { now, spanS };
  const inflight = laneSeries((l) => l.running);
  inflight.push({ name: "cap", color: "#6b7280", dashed: true, points: samples.map((s) => [s.t, s.cap]) });
  return el("div", { class: "charts" },
    lineChart({ ...common, title: "queue depth", series: laneSeries((l) => l.queued),
      format: fmtInt, minMax: 2 }),
    lineChart({ ...common, title: "in flight (dashed: model cap)", series: inflight,
      format: fmtInt, minMax: 2 }),
    lineChart({ ...common, title: "queue wait p95", series: laneSeries((l) => l.p95),
      format: fmtWait, minMax: 0.1 }));
}

function renderModel(model, rates, distributed) {
  const capText = model.configured_cap !== null && model.configured_cap !== model.cap
    ? ` (configured ${fmtInt(model.configured_cap)})` : "";
  const facts = el("div", { class: "facts" },
    el("span", {}, "in flight ",
      el("b", { "data-field": "running", "data-value": model.running ?? "" }, fmtInt(model.running)),
      " / ", el("b", { "data-field": "cap", "data-value": model.cap ?? "" }, fmtInt(model.cap)), capText),
    model.floor !== null ? el("span", {}, "floor ", el("b", { "data-field": "floor" }, fmtInt(model.floor))) : null,
    el("span", {}, "queued ", el("b", { "data-field": "queued", "data-value": model.queued ?? "" }, fmtInt(model.queued))),
    model.max_inflight_tokens
      ? el("span", {}, "tokens in flight ", el("b", { "data-field": "inflight_tokens" }, fmtInt(model.inflight_tokens)),
        ` / ${fmtInt(model.max_inflight_tokens)}`) : null);
  const legend = el("div", { class: "legend" }, model.lanes.map((lane, i) =>
    el("span", {}, el("i", { class: `swatch c${i % LANE_COLORS.length}` }), lane.name)));
  const laneHeaders = ["lane", "queued", "wait p50", "wait p95", "wait p99", "in flight / limit",
    ...RATE_COLUMNS.map(([, label]) => label), "finished"];
  const runningHeaders = distributed ? ["running (all replicas)", "running here"] : ["running"];
  const noTenants = model.tenants === null && model.tenantRunning === null && model.globalTenantRunning === null;
  const tenants = noTenants ? el("p", { class: "muted" }, "no tenant counters in this gateway's state")
    : table(["tenant", ...runningHeaders, "requests", "req/s", "prompt tok/s", "completion tok/s",
      "prompt tokens", "completion tokens"], tenantRows(model, rates, distributed), "tenants");
  return el("section", { class: "model", "data-model": model.name },
    el("header", {}, el("h2", {}, model.name), facts, legend),
    charts(model),
    table(laneHeaders, model.lanes.map((lane) => laneRow(model, lane, rates)), "lanes"),
    el("div", { class: "pair" },
      el("div", {}, el("h3", {}, "tenants"), tenants),
      el("div", {}, el("h3", {}, "backends"),
        table(["backend", "health", "in flight", "engine queue", "KV cache"], backendRows(model), "backends"))));
}

function render(raw, view, rates, live) {
  renderHeader(view, live);
  renderLinks(view);
  const distributed = view.links.length > 0;
  document.getElementById("models").replaceChildren(
    ...view.models.map((m) => renderModel(m, rates, distributed)));
  lastRendered = { raw, view, rates };
  window.sluicegateLastState = raw;
  window.sluicegateRenders += 1;
}

function showMessage(text) {
  const box = document.getElementById("message");
  box.textContent = text ?? "";
  box.hidden = !text;
  document.body.classList.toggle("stale", Boolean(text));
}

async function poll() {
  let response;
  try {
    response = await fetch(STATE_URL, {
      credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" },
    });
  } catch (error) {
    return failed(`Cannot reach the gateway (${error.message}).`);
  }
  if (response.status === 401) {
    return failed("Not authorized (HTTP 401): /admin/state needs the admin key. Reload the page and "
      + "enter the admin key as the password (any user name).");
  }
  if (!response.ok) return failed(`/admin/state answered HTTP ${response.status}.`);
  let raw;
  try {
    raw = await response.json();
  } catch (error) {
    return failed(`/admin/state sent something that is not JSON (${error.message}).`);
  }
  const view = viewOf(raw, Date.now() / 1000);
  const rates = ratesBetween(previousView, view);
  previousView = view;
  history.add(view);
  showMessage(null);
  render(raw, view, rates, true);
}

function failed(text) {
  history.gap();
  previousView = null; // rates restart after the gap instead of averaging across it
  const since = lastRendered ? ` Showing the state of ${fmtClock(lastRendered.view.time)}.` : "";
  showMessage(`${text}${since} Retrying every ${POLL_MS / 1000} s.`);
  if (lastRendered) renderHeader(lastRendered.view, false);
}

async function loop() {
  try {
    await poll();
  } finally {
    setTimeout(loop, POLL_MS);
  }
}

loop();
