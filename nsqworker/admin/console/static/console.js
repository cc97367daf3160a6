// nsqworker console: live refresh of the page's fragment, the token form, and the
// dead-letter actions. Plain JS, no build step; served under a CSP allowing only itself.
"use strict";

const ACTION_HEADERS = { "Content-Type": "application/json", "X-Nsqworker-Console": "1" };

async function post(url, body, method = "POST") {
  const response = await fetch(url, {
    method, headers: ACTION_HEADERS, body: JSON.stringify(body), credentials: "same-origin",
  });
  let doc = {};
  try { doc = await response.json(); } catch (e) { doc = { error: response.statusText }; }
  return { ok: response.ok, status: response.status, doc };
}

// The fragment (?partial=1) of the page, every data-refresh seconds. The server escapes
// everything it renders, so the fragment is inserted as the server's HTML.
function startRefresh() {
  const live = document.getElementById("live");
  if (!live) return;
  const seconds = Math.max(0.5, parseFloat(live.dataset.refresh || "2"));
  async function tick() {
    const url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.ok) live.innerHTML = await response.text();
    } catch (e) { /* the console restarted or the network blinked: try again */ }
    setTimeout(tick, seconds * 1000);
  }
  setTimeout(tick, seconds * 1000);
}

function startTokenForm() {
  const form = document.getElementById("token-form");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = document.getElementById("token");
      const result = await post("/api/session", { token: input.value });
      input.value = "";
      if (result.ok) window.location.reload();
      else document.getElementById("token-problem").textContent = result.doc.error || "refused";
    });
  }
  const out = document.getElementById("sign-out");
  if (out) {
    out.addEventListener("click", async () => {
      await post("/api/session", {}, "DELETE");
      window.location.reload();
    });
  }
}

function picked() {
  return Array.from(document.querySelectorAll("input.pick:checked")).map((box) => box.value);
}

function startActions() {
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", () => {
      document.querySelectorAll("input.pick").forEach((box) => { box.checked = all.checked; });
    });
  }
  const letters = document.getElementById("letters");
  const result = document.getElementById("result");
  document.querySelectorAll("button[data-action]").forEach((button) => {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      const scope = button.dataset.scope;
      const topic = letters ? letters.dataset.topic : "";
      const body = { topic };
      let what;
      if (scope === "all") {
        body.all = true;
        what = `every dead letter on ${topic}`;
        if (button.dataset.plan) what += ` (${button.dataset.plan})`;
      }
      else if (scope === "one") { body.ids = [button.dataset.id]; what = button.dataset.id; }
      else {
        body.ids = picked();
        if (body.ids.length === 0) { result.textContent = "Select dead letters first."; return; }
        what = `${body.ids.length} dead letter(s)`;
      }
      if (!window.confirm(`${action} ${what}?`)) return;
      result.textContent = `${action}ing ${what}...`;
      const answer = await post(`/api/dead-letters/${action}`, body);
      if (!answer.ok) { result.textContent = `${action} refused: ${answer.doc.error}`; return; }
      const counts = Object.entries(answer.doc)
        .filter(([key, value]) => typeof value === "number")
        .map(([key, value]) => `${value} ${key}`).join(", ");
      const details = Object.entries(answer.doc.details || {})
        .map(([id, why]) => `${id}: ${why}`).join("; ");
      const notes = (answer.doc.notes || []).join(" ");
      sessionStorage.setItem(
        "nsqworker-console-result",
        `${action}: ${counts}` + (details ? ` (${details})` : "") + (notes ? ` ${notes}` : ""));
      const url = new URL(window.location.href);
      url.searchParams.delete("id");
      window.location.assign(url);
    });
  });
  const last = sessionStorage.getItem("nsqworker-console-result");
  if (last && result) { result.textContent = last; sessionStorage.removeItem("nsqworker-console-result"); }
}

document.addEventListener("DOMContentLoaded", () => {
  startRefresh();
  startTokenForm();
  startActions();
});
