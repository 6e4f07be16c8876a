// The start page: the server's health from /healthz, in words.

const box = document.getElementById("health");
const text = document.getElementById("health-text");
const details = document.getElementById("health-details");

function fact(term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  return [dt, dd];
}

async function check() {
  box.dataset.state = "checking";
  text.textContent = "Checking…";
  let body;
  try {
    const response = await fetch("/healthz", { cache: "no-store" });
    body = await response.json();
  } catch (err) {
    box.dataset.state = "down";
    text.textContent = `The server did not answer (${err.message}).`;
    details.hidden = true;
    return;
  }
  const engine = body.engine || {};
  box.dataset.state = body.ok ? "ok" : "down";
  if (body.ok) {
    text.textContent = "Ready: the server is up and can take work.";
  } else if (!body.channel_layer?.reachable) {
    text.textContent = "Not ready: the channel layer (Redis) does not answer.";
  } else {
    text.textContent = "Not ready: no engine worker is up.";
  }
  const mode = engine.mode === "redis" ? "workers over Redis" : "in this process";
  const started = engine.mode === "redis" || engine.local_started ? "" : " (starts with the first request)";
  details.replaceChildren(
    ...fact("Engine", `${mode}${started}`),
    ...fact("Workers up", String(engine.workers_up ?? 0)),
    ...fact("Requests active / queued", `${engine.active ?? 0} / ${engine.queued ?? 0}`),
  );
  details.hidden = false;
}

document.getElementById("health-refresh").addEventListener("click", check);
check();
