// The data side of the dashboard: one view of /admin/state (summed over the workers of
// `serve --workers N`), rates between two polls, and the last five minutes of history.
// Pure functions and plain objects; nothing here touches the DOM.

export const OUTCOMES = [
  "completed", "rejected_rate_limit", "rejected_queue_full", "rejected_unavailable",
  "expired", "shed", "cancelled", "preempted", "upstream_error",
];
export const HISTORY_S = 300;

const num = (value) => (typeof value === "number" && Number.isFinite(value) ? value : null);
const add = (a, b) => (a === null ? b : b === null ? a : a + b);
const max = (a, b) => (a === null ? b : b === null ? a : Math.max(a, b));

function laneOf(raw) {
  const wait = raw.queue_wait_s || {};
  const outcomes = {};
  for (const [name, count] of Object.entries(raw.outcomes || {})) outcomes[name] = num(count) ?? 0;
  return {
    name: String(raw.name),
    policy: raw.policy ?? null,
    queued: num(raw.queued),
    running: num(raw.running),
    borrowed: num(raw.borrowed),
    cap: num(raw.cap),
    limit: num(raw.limit) ?? num(raw.cap),
    tightened: raw.pressure_tightened === true,
    outcomes: raw.outcomes ? outcomes : null,
    wait: { count: num(wait.count), p50: num(wait.p50), p95: num(wait.p95), p99: num(wait.p99) },
  };
}

function tenantOf(raw) {
  return {
    tenant: String(raw.tenant),
    requests: num(raw.requests),
    prompt_tokens: num(raw.prompt_tokens),
    completion_tokens: num(raw.completion_tokens),
  };
}

// Running requests of one tenant: in all, and per lane.
function runningOf(raw) {
  const lanes = {};
  for (const [name, count] of Object.entries(raw.lanes || {})) lanes[name] = num(count) ?? 0;
  return { tenant: String(raw.tenant), running: num(raw.running) ?? 0, lanes };
}

function runningRows(raw) {
  return Array.isArray(raw) ? raw.map(runningOf) : null;
}

function backendOf(raw) {
  return {
    name: String(raw.name),
    inflight: num(raw.inflight),
    healthy: raw.healthy === true,
    probe_healthy: raw.probe_healthy !== false,
    circuit: raw.circuit ?? null,
    kv: num(raw.kv_cache_usage),
    waiting: num(raw.num_requests_waiting),
    stale: raw.metrics_stale === true,
    metricsAge: num(raw.metrics_age_s),
    workers: 1,
    healthyWorkers: raw.healthy === true ? 1 : 0,
  };
}

function modelOf(raw) {
  return {
    name: String(raw.name),
    running: num(raw.running),
    queued: num(raw.queued),
    cap: num(raw.cap),
    configured_cap: num(raw.configured_cap),
    floor: num(raw.floor),
    inflight_tokens: num(raw.inflight_tokens),
    max_inflight_tokens: num(raw.max_inflight_tokens),
    lanes: (raw.lanes || []).map(laneOf),
    tenants: Array.isArray(raw.tenants) ? raw.tenants.map(tenantOf) : null,
    tenantRunning: runningRows(raw.tenants_running), // this gateway's, per tenant
    globalTenantRunning: null, // every replica's, per tenant, from the store (distributed mode)
    backends: (raw.backends || []).map(backendOf),
  };
}

// One replica's store link (a worker's under `serve --workers N`).
function linkOf(store, worker) {
  const sync = store.last_sync || null;
  return {
    worker: worker ?? null,
    replica: store.replica ?? null,
    session: store.session ?? null,
    mode: store.mode ?? null,
    since: num(store.mode_since),
    fallbacks: num(store.fallbacks),
    rtt: sync ? num(sync.round_trip_s) : null,
    age: sync ? num(sync.age_s) : null,
    replicas: num(store.replicas),
  };
}

// Counts add up over workers; limits are shared through the store, so each worker
// reports the same global one and the view keeps the largest; wait quantiles cannot be
// merged exactly, so the view shows the worst worker's.
function mergeByName(into, from, key, merge) {
  for (const item of from) {
    const found = into.find((other) => other[key] === item[key]);
    if (found) merge(found, item);
    else into.push(item);
  }
}

function mergeLane(a, b) {
  for (const field of ["queued", "running", "borrowed"]) a[field] = add(a[field], b[field]);
  a.cap = max(a.cap, b.cap);
  a.limit = max(a.limit, b.limit);
  a.tightened = a.tightened || b.tightened;
  if (b.outcomes) {
    a.outcomes = a.outcomes || {};
    for (const [name, count] of Object.entries(b.outcomes)) {
      a.outcomes[name] = (a.outcomes[name] ?? 0) + count;
    }
  }
  a.wait = {
    count: add(a.wait.count, b.wait.count),
    p50: max(a.wait.p50, b.wait.p50),
    p95: max(a.wait.p95, b.wait.p95),
    p99: max(a.wait.p99, b.wait.p99),
  };
}

function mergeRunning(a, b) {
  a.running += b.running;
  for (const [lane, count] of Object.entries(b.lanes)) a.lanes[lane] = (a.lanes[lane] ?? 0) + count;
}

function mergeTenant(a, b) {
  for (const field of ["requests", "prompt_tokens", "completion_tokens"]) {
    a[field] = add(a[field], b[field]);
  }
}

function mergeBackend(a, b) {
  a.inflight = add(a.inflight, b.inflight);
  a.healthy = a.healthy && b.healthy;
  a.probe_healthy = a.probe_healthy && b.probe_healthy;
  if (a.circuit === "closed" || a.circuit === null) a.circuit = b.circuit;
  a.kv = max(a.kv, b.kv);
  a.waiting = max(a.waiting, b.waiting);
  a.stale = a.stale || b.stale;
  a.metricsAge = max(a.metricsAge, b.metricsAge);
  a.workers += b.workers;
  a.healthyWorkers += b.healthyWorkers;
}

function mergeModel(a, b) {
  for (const field of ["running", "queued", "inflight_tokens"]) a[field] = add(a[field], b[field]);
  for (const field of ["cap", "configured_cap", "floor", "max_inflight_tokens"]) {
    a[field] = max(a[field], b[field]);
  }
  mergeByName(a.lanes, b.lanes, "name", mergeLane);
  if (b.tenants) {
    a.tenants = a.tenants || [];
    mergeByName(a.tenants, b.tenants, "tenant", mergeTenant);
  }
  if (b.tenantRunning) {
    a.tenantRunning = a.tenantRunning || [];
    mergeByName(a.tenantRunning, b.tenantRunning, "tenant", mergeRunning);
  }
  mergeByName(a.backends, b.backends, "name", mergeBackend);
}

function pressureOf(raw) {
  if (!raw || typeof raw !== "object") return null;
  return {
    stage: num(raw.stage) ?? 0,
    up: raw.up !== false,
    status: raw.status ?? (raw.up === false ? "prometheus_unavailable" : "ok"),
    error: raw.error ?? null,
    signals: (raw.signals || []).map((s) => ({
      name: String(s.name), value: num(s.value), threshold: num(s.threshold), above: s.above === true,
    })),
  };
}

// One view of an /admin/state answer, in either shape: a single process's object, or
// {"workers": [...]} under `serve --workers N`. `receivedAt` (unix seconds) stands in for
// the answer's `time` when it has none.
export function viewOf(state, receivedAt) {
  const parts = Array.isArray(state.workers) ? state.workers : [state];
  const view = {
    time: null, draining: false, store: null, pressure: null, models: [], links: [],
    workers: Array.isArray(state.workers) ? [] : null,
  };
  let tenantsRead = null; // the freshest read of the store's running requests per tenant
  for (const part of parts) {
    if (view.workers) {
      view.workers.push({ worker: part.worker, pid: part.pid ?? null, error: part.error ?? null });
    }
    if (part.error !== undefined && !part.models) continue;
    view.time = max(view.time, num(part.time));
    view.draining = view.draining || part.draining === true;
    view.store = view.store || part.store || null;
    if (part.store && part.store.kind === "redis") {
      view.links.push(linkOf(part.store, part.worker));
      const read = part.store.global_tenants;
      // Every worker reads the same global counts: show the freshest read, not a sum.
      if (read && read.models && num(read.age_s) !== null
        && (!tenantsRead || read.age_s < tenantsRead.age_s)) tenantsRead = read;
    }
    const pressure = pressureOf(part.pressure);
    if (pressure && (!view.pressure || pressure.stage > view.pressure.stage || !pressure.up)) {
      view.pressure = pressure;
    }
    mergeByName(view.models, (part.models || []).map(modelOf), "name", mergeModel);
  }
  if (view.time === null) view.time = receivedAt;
  for (const model of view.models) {
    const rows = tenantsRead ? tenantsRead.models[model.name] : null;
    model.globalTenantRunning = Array.isArray(rows) ? rows.map(runningOf) : null;
  }
  return view;
}

function perSecond(now, before, dt) {
  if (now === null || before === null || before === undefined) return null;
  // A worker restart resets its counters: show nothing rather than a negative rate.
  return now >= before ? (now - before) / dt : null;
}

// Rates of the cumulative counters between two views (null where a view lacks them):
// per lane and outcome, and per tenant requests, prompt and completion tokens.
export function ratesBetween(previous, current) {
  const rates = { lanes: {}, tenants: {} };
  const dt = previous ? current.time - previous.time : 0;
  if (!previous || !(dt > 0.05)) return rates;
  for (const model of current.models) {
    const old = previous.models.find((m) => m.name === model.name);
    if (!old) continue;
    for (const lane of model.lanes) {
      const before = old.lanes.find((l) => l.name === lane.name);
      if (!lane.outcomes || !before || !before.outcomes) continue;
      const perOutcome = {};
      for (const outcome of new Set([...OUTCOMES, ...Object.keys(lane.outcomes)])) {
        perOutcome[outcome] = perSecond(lane.outcomes[outcome] ?? 0, before.outcomes[outcome] ?? 0, dt);
      }
      rates.lanes[`${model.name}\u0000${lane.name}`] = perOutcome;
    }
    for (const tenant of model.tenants || []) {
      const before = (old.tenants || []).find((t) => t.tenant === tenant.tenant);
      if (!before) continue;
      rates.tenants[`${model.name}\u0000${tenant.tenant}`] = {
        requests: perSecond(tenant.requests, before.requests, dt),
        prompt: perSecond(tenant.prompt_tokens, before.prompt_tokens, dt),
        completion: perSecond(tenant.completion_tokens, before.completion_tokens, dt),
      };
    }
  }
  return rates;
}

// The last HISTORY_S seconds of the charted numbers, per model.
export class History {
  constructor() {
    this.samples = new Map();
  }

  add(view) {
    for (const model of view.models) {
      const list = this.samples.get(model.name) || [];
      const lanes = {};
      for (const lane of model.lanes) {
        lanes[lane.name] = { queued: lane.queued, running: lane.running, p95: lane.wait.p95 };
      }
      list.push({ t: view.time, cap: model.cap, running: model.running, lanes });
      while (list.length && list[0].t < view.time - HISTORY_S) list.shift();
      this.samples.set(model.name, list);
    }
  }

  // A failed poll: the charts break their lines here instead of joining across it.
  gap() {
    for (const list of this.samples.values()) {
      const last = list[list.length - 1];
      if (last && !last.gap) list.push({ t: last.t, gap: true, cap: null, running: null, lanes: {} });
    }
  }

  of(model) {
    return this.samples.get(model) || [];
  }
}
