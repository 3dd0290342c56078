// The console's live parts: countdowns, and fragments swapped in when the ledger changes.
// Nothing here decides anything: the server checks every decision.
"use strict";

(function () {
  const serverNow = Number(document.body.dataset.serverNow || "0");
  const skew = serverNow ? serverNow * 1000 - Date.now() : 0;

  function pad(n) { return String(n).padStart(2, "0"); }

  function tick() {
    const now = (Date.now() + skew) / 1000;
    for (const el of document.querySelectorAll(".countdown[data-expires-at]")) {
      const at = Number(el.dataset.expiresAt);
      if (!at) { continue; }
      const left = Math.floor(at - now);
      const card = el.closest(".approval");
      if (left <= 0) {
        el.textContent = "expired";
        el.classList.add("expired");
        if (card) { card.classList.add("expired"); }
      } else {
        const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
        el.textContent = "in " + (h ? h + ":" + pad(m) : m) + ":" + pad(s);
        el.classList.toggle("soon", left < 60);
      }
    }
  }

  // Replace a fragment's content, keeping each keyed element that is still there unchanged
  // (an operator's half-typed reason survives an update).
  function merge(target, html) {
    const fresh = document.createElement("div");
    fresh.innerHTML = html;
    const kept = new Map();
    for (const el of target.querySelectorAll("[data-key]")) { kept.set(el.dataset.key, el); }
    for (const el of fresh.querySelectorAll("[data-key]")) {
      const old = kept.get(el.dataset.key);
      if (old) { el.replaceWith(old); }
    }
    target.replaceChildren(...fresh.childNodes);
  }

  async function refresh() {
    for (const target of document.querySelectorAll("[data-fragment]")) {
      const response = await fetch("/fragments/" + target.dataset.fragment,
                                   { credentials: "same-origin", cache: "no-store" });
      if (response.status === 401) { window.location.assign("/login"); return; }
      if (response.ok) { merge(target, await response.text()); }
    }
    tick();
  }

  function listen() {
    const live = document.getElementById("live");
    if (!live || !window.EventSource) { return; }
    const source = new EventSource("/events");
    source.onopen = function () { live.textContent = "Live updates: on"; live.dataset.state = "on"; };
    source.onerror = function () { live.textContent = "Live updates: reconnecting…"; live.dataset.state = "off"; };
    source.addEventListener("changed", function () {
      refresh().catch(function () { live.textContent = "Live updates: a refresh failed"; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
    listen();
  });
})();
