// Shared helpers of the hubpool pages: the operator API with the session's CSRF token,
// a DOM builder that only ever sets text (peer-supplied names never become markup), and
// the words the pages use for the node's JSON values.
"use strict";

const HP = (() => {
  const P = "/api/inference/pool";
  const meta = document.querySelector('meta[name="csrf-token"]');
  const csrf = meta ? meta.content : "";

  class ApiError extends Error {
    constructor(status, message, data) { super(message); this.status = status; this.data = data; }
  }

  async function api(method, path, body) {
    const opts = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method !== "GET") opts.headers["X-CSRF-Token"] = csrf;
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(path.startsWith("/api/") ? path : P + path, opts);
    } catch (e) {
      throw new ApiError(0, "This node did not answer. Is it still running?");
    }
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (r.status === 401 && data && data.code === "AUTH_ERROR_MISSING_CREDENTIAL") {
      location.assign("/ui/signin");  // the session ended (sign-out elsewhere, or a restart)
    }
    if (!r.ok) {
      let msg = data && (typeof data.error === "string" ? data.error : data.error && data.error.message);
      throw new ApiError(r.status, msg || ("The node answered HTTP " + r.status), data);
    }
    return data;
  }

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function fill(el, ...kids) { el.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false)); }

  function ago(iso) {
    if (!iso) return "never";
    const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
    if (!isFinite(s)) return iso;
    if (s < 5) return "just now";
    if (s < 90) return s + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 129600) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }

  const TIERS = { high: "High-end", medium: "Mid-range", low: "Entry-level", "cpu-only": "CPU only",
                  insufficient: "Insufficient", unknown: "Tier unknown" };
  function tier(t) { return TIERS[t] || (t ? t : "Tier unknown"); }

  const STATUS_WORDS = { connected: "Connected", pending: "Pending", unreachable: "Unreachable",
                         identity_changed: "Identity changed", unauthorized: "Credentials refused",
                         own_identity: "This Hub cannot sign", signed_required: "Unsigned, refused" };

  // a request shows the requester's tailnet name (spec); a display name is only its own claim
  function peerName(p) { return p.displayName && p.displayName !== p.nodeFqdn && p.displayName !== shortName(p.nodeFqdn)
    ? p.nodeFqdn + " (“" + p.displayName + "”)" : p.nodeFqdn; }
  function shortName(fqdn) { return (fqdn || "").split(".")[0]; }

  function peerEngines(p) {
    const caps = p.lastCapabilities || {};
    return (caps.backends || []).filter((b) => b.healthy).map((b) => b.type);
  }
  function peerModels(p) {
    const caps = p.lastCapabilities || {};
    const out = new Set();
    for (const b of caps.backends || []) if (b.healthy) for (const m of b.modelsLoaded || []) out.add(m);
    return [...out];
  }

  /** The pool's models and the nodes holding each: this node's healthy engines plus connected peers. */
  function mergedModels(status) {
    const holders = new Map();
    const add = (model, who) => { if (!holders.has(model)) holders.set(model, new Set()); holders.get(model).add(who); };
    const me = (status.localNode && status.localNode.nodeFqdn) || "this node";
    for (const b of (status.localNode && status.localNode.backends) || []) {
      if (b.healthy) for (const m of b.modelsLoaded || []) add(m, "this node (" + shortName(me) + ")");
    }
    for (const p of status.peers || []) {
      if (p.status !== "connected" || !p.enabled) continue;
      for (const m of peerModels(p)) add(m, shortName(p.nodeFqdn));
    }
    return [...holders.entries()].sort((a, b) => a[0].localeCompare(b[0]))
      .map(([model, who]) => ({ model, nodes: [...who].sort() }));
  }

  /** Why pooling is or is not routing, naming the switch responsible (spec: Operator workflow, 5). */
  function routingSentence(s) {
    const connected = (s.peerCounts && s.peerCounts.connected) || 0;
    if (!s.enabled) {
      return s.disabledBy === "env"
        ? { ok: false, text: "Pooling is off: HUB_POOL_USER_DISABLED=true is set in this node's environment. " +
            "The setting cannot override it; remove that line and restart the node." }
        : { ok: false, text: "Pooling is off: the Hub Pool switch (poolEnabled) is off on this node." };
    }
    const out = s.directions.outbound, inn = s.directions.inbound;
    const switchName = (d, dir) => d.disabledBy === "env"
      ? "HUB_POOL_" + dir.toUpperCase() + "_DISABLED=true in this node's environment"
      : "the " + dir + " switch (pool" + dir[0].toUpperCase() + dir.slice(1) + "Enabled)";
    if (!out.enabled) {
      return { ok: false, text: "Not routing: requests here stay on this node because " + switchName(out, "outbound") +
        " is off." + (inn.enabled ? " Peers can still send work here." : "") };
    }
    if (!s.routingActive) {
      if (connected) return { ok: false, text: "Not routing: every connected Hub is disabled here." };
      return { ok: false, text: "Not routing yet: no Hub is connected. Pair one to start pooling." };
    }
    let text = "Pooling is routing: requests here can run on this node or on " + connected +
      (connected === 1 ? " connected Hub." : " connected Hubs.");
    if (!inn.enabled) text += " This node takes no work from peers, because " + switchName(inn, "inbound") + " is off.";
    return { ok: true, text };
  }

  /** Run fn now and then every ms milliseconds after each run ends; returns a stopper. */
  function every(ms, fn) {
    let timer = null, stopped = false;
    const tick = async () => {
      try { await fn(); } catch (e) { /* the page shows its own error */ }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    tick();
    return () => { stopped = true; clearTimeout(timer); };
  }

  function guideOpen() { const d = document.getElementById("guide"); return !!(d && d.open); }

  function chip(text, kind) { return h("span", { class: "chip" + (kind ? " " + kind : "") }, text); }

  return { api, ApiError, h, fill, ago, tier, STATUS_WORDS, peerName, shortName, peerEngines, peerModels,
           mergedModels, routingSentence, every, chip, guideOpen, csrf };
})();
