// @ts-check
// The start page: the server's readiness from /healthz, in words.
//
// /healthz answers 503 while the models load or when nothing can serve, with the same JSON body as
// its 200, so the page reads the body whatever the status. While the server starts it asks again
// every second, so the page turns to "Ready" without a reload.
import { byId, errorText } from "./common.js";

/**
 * What /healthz says (docs/operations.md), as far as this page reads it.
 * @typedef {object} Engine
 * @property {string} [mode]  "embedded" or "redis"
 * @property {string} [state]
 * @property {string[]} [loading]
 * @property {Record<string, string | null>} [failed]  pipeline → why
 * @property {Record<string, { state: string }>} [pipelines]
 * @property {number} [workers_up]
 * @property {number} [workers_ready]
 * @property {number} [active]
 * @property {number} [queued]
 *
 * @typedef {object} Health
 * @property {string} status  "ready", "degraded", "starting" or "unavailable"
 * @property {Engine} [engine]
 * @property {{ reachable?: boolean }} [channel_layer]
 */

const RECHECK_MS = 1000;

const box = byId("health", HTMLElement);
const text = byId("health-text", HTMLElement);
const details = byId("health-details", HTMLDListElement);
const checks = {
  /** @type {ReturnType<typeof setTimeout> | undefined} the pending re-check while the server starts */
  recheck: undefined,
  latest: 0, // the newest check: an older answer arriving late is dropped
};

/**
 * @param {string} term
 * @param {string} value
 */
function fact(term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  return [dt, dd];
}

/**
 * "a (why), b (why)": each failed pipeline with the reason it gave.
 * @param {Record<string, string | null> | undefined} failed
 * @param {string} verb
 */
function failures(failed, verb) {
  return Object.entries(failed || {})
    .map(([name, reason]) => (reason ? `${name} ${verb} (${reason})` : `${name} ${verb}`))
    .join(", ");
}

/**
 * [pill state, sentence] for a /healthz body.
 * @param {Health} body
 * @returns {[string, string]}
 */
function describe(body) {
  const engine = body.engine || {};
  switch (body.status) {
    case "ready":
      return ["ok", "Ready: the server is up and can take work."];
    case "degraded":
      return ["degraded", `Degraded: ${failures(engine.failed, "is unavailable")}; the other endpoints serve.`];
    case "starting": {
      if (engine.state === "idle") {
        return ["starting", "Starting: the models load with the first request (OMNIWEB_ENGINE_PRELOAD is off)."];
      }
      const loading = engine.loading || [];
      const which = loading.length ? ` (${loading.join(", ")}…)` : "…";
      return ["starting", `Starting: loading models${which}`];
    }
    default:
      if (!body.channel_layer?.reachable) return ["down", "Not ready: the channel layer (Redis) does not answer."];
      if (engine.mode === "redis" && !engine.workers_up) return ["down", "Not ready: no engine worker is up."];
      if (Object.keys(engine.failed || {}).length) {
        return ["down", `Not ready: ${failures(engine.failed, "failed to load")}.`];
      }
      return ["down", "Not ready: the engine cannot serve."];
  }
}

/**
 * "4 of 5 loaded, 1 failed", or nothing before the engine lists its pipelines.
 * @param {Engine} engine
 */
function models(engine) {
  const states = Object.values(engine.pipelines || {}).map((p) => p.state);
  if (!states.length) return null;
  /** @param {string} state */
  const count = (state) => states.filter((s) => s === state).length;
  const failed = count("failed");
  return `${count("ready")} of ${states.length} loaded${failed ? `, ${failed} failed` : ""}`;
}

async function check({ quiet = false } = {}) {
  clearTimeout(checks.recheck);
  checks.recheck = undefined;
  const mine = ++checks.latest;
  if (!quiet) {
    box.dataset.state = "checking";
    text.textContent = "Checking…";
  }
  /** @type {Health} */
  let body;
  try {
    const response = await fetch("/healthz", { cache: "no-store" });
    body = await response.json();
  } catch (err) {
    if (mine !== checks.latest) return;
    box.dataset.state = "down";
    text.textContent = `The server did not answer (${errorText(err)}).`;
    details.hidden = true;
    return;
  }
  if (mine !== checks.latest) return;
  const engine = body.engine || {};
  const [state, sentence] = describe(body);
  box.dataset.state = state;
  text.textContent = sentence;
  const facts = fact("Engine", engine.mode === "redis" ? "workers over Redis" : "in this process");
  const loaded = models(engine);
  if (loaded) facts.push(...fact("Models", loaded));
  if (engine.mode === "redis") {
    facts.push(...fact("Workers up / ready", `${engine.workers_up ?? 0} / ${engine.workers_ready ?? 0}`));
  }
  facts.push(...fact("Requests active / queued", `${engine.active ?? 0} / ${engine.queued ?? 0}`));
  details.replaceChildren(...facts);
  details.hidden = false;
  if (state === "starting") checks.recheck = setTimeout(() => check({ quiet: true }), RECHECK_MS);
}

byId("health-refresh", HTMLButtonElement).addEventListener("click", () => check());
check();
