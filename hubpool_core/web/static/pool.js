// The Hub Pool page: status every 15 s and the routing log every 15 s (the spec's dashboard
// cadence); every write goes through the node's operator routes with the CSRF token.
"use strict";

(() => {
  const { api, h, fill, ago, tier, STATUS_WORDS, peerName, shortName, peerEngines, peerModels } = HP;
  const $ = (id) => document.getElementById(id);
  const schema = JSON.parse($("settings-schema").textContent);
  let last = null;

  function showError(e) {
    const box = $("page-error");
    if (!e) { box.hidden = true; return; }
    box.hidden = false;
    box.textContent = e.message || String(e);
  }

  // what an action did but could not finish on the other Hub (not told, half paired): it stays
  // until the next action, unlike an error, which the next status read clears
  function showNotice(text) {
    const box = $("page-notice");
    box.hidden = !text;
    box.textContent = text || "";
  }

  async function act(button, fn, after) {
    if (button) button.disabled = true;
    try {
      const r = await fn();
      showError(null);
      showNotice(r && (r.told === false || r.callbackDelivered === false) ? r.message : null);
    } catch (e) { showError(e); }
    finally { if (button) button.disabled = false; }
    await (after || refreshStatus)();
  }

  function speed(list) {
    if (!list || !list.length) return "not measured yet";
    return list.map((t) => {
      const pre = (t.prefill || []).map((b) => b.tokensPerSec);
      const parts = [];
      if (pre.length) parts.push("prefill " + Math.max(...pre) + " tok/s");
      if (t.decode) parts.push("decode " + t.decode.tokensPerSec + " tok/s");
      return t.model + " (" + t.backend + "): " + parts.join(", ");
    }).join("; ");
  }

  // GPU pressure band 0-3 and the container rollup; absent reads "not reported", never idle or zero
  const BAND_WORDS = ["Idle", "Moderate", "Busy", "Saturated"];
  function gpuBand(band) {
    return Number.isInteger(band) && band >= 0 && band <= 3 ? BAND_WORDS[band] + " (band " + band + " of 3)" : "Not reported";
  }
  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(Math.round(n))) + " " + units[i];
  }
  function containers(c) {
    if (!c) return "Not reported";
    return c.running + " running, " + c.stopped + " stopped · CPU " + Math.round(c.cpuPercent) + "% · memory " + bytes(c.memoryBytes);
  }

  function renderNode(s) {
    const n = s.localNode, id = n.identity || {};
    const rows = [
      ["Tailnet name", n.nodeFqdn || "none: Tailscale has not given this node a name"],
      ["Key fingerprint", id.publicKeyFingerprint || ("unavailable: " + (id.identityError || "no identity"))],
      ["Node ID", id.nodeUuid || "—"],
      ["Hardware tier", tier(n.hardwareTier)],
      ["Queue depth", String(n.inFlightRequests) + " in flight"],
      ["Prompt ceiling", n.maxPromptTokens ? n.maxPromptTokens + " tokens (set by " + n.maxPromptTokensSetBy + ")" : "none"],
      ["Context cap", n.maxNumCtx ? n.maxNumCtx + " tokens" : "not stated"],
      ["Slots", n.ollamaSlots ? String(n.ollamaSlots) : "not stated"],
      ["Measured speed", speed(n.throughput)],
      ["GPU pressure", gpuBand(n.gpuPressure)],
      ["Containers", containers(n.containers)],
    ];
    if (id.publicKeyFingerprint && id.identityError) {
      // a key that cannot be opened never recovers by waiting; rotation is the one way back (spec)
      rows.splice(2, 0, ["Pool key", h("span", { class: "needs", "data-testid": "identity-error" },
        "This Hub cannot sign: " + id.identityError + ". Run ", h("code", {}, "hubpool rotate-identity"),
        " here (it keeps the node ID and unpairs every Hub), remove this Hub on each paired Hub, then pair again with a PIN.")]);
    }
    fill($("node-kv"), rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const all = n.backends || [];
    const up = all.filter((b) => b.healthy), down = all.filter((b) => !b.healthy);
    fill($("node-engines"),
      up.map((b) => h("li", {}, HP.chip("Running", "ok"), " ", h("strong", {}, b.type), " ",
        b.modelsLoaded.length + " model" + (b.modelsLoaded.length === 1 ? "" : "s") + ": " + b.modelsLoaded.join(", "))),
      up.length ? null : h("li", {}, "No engine answers on this node; it can only forward work."),
      // engines at an address where nothing answers are usually just not installed here: one quiet line
      down.length ? h("li", {}, h("details", {}, h("summary", {}, "Not answering: " + down.map((b) => b.type).join(", ")),
        h("ul", { class: "plain small" }, down.map((b) => h("li", {}, h("strong", {}, b.type), " ", b.error || "not healthy"))))) : null);
  }

  function failureNote(p) {
    const f = p.probeFailure;
    if (f && f.action) return { text: f.action, unpair: true };
    if (p.direction === "inbound" && p.status === "unreachable" && !p.lastSeenAt) {
      return { text: "This Hub never received your approval (half paired). Make sure each Hub reaches the " +
                     "other over HTTPS, unpair it here, cancel the request there, and pair again.", unpair: true };
    }
    if (f) return { text: "Unreachable since " + ago(f.since) + " (" + (f.detail || f.kind) + "). It rejoins by itself on the next health check that works.", unpair: false };
    return null;
  }

  function renderPeers(s) {
    const rows = (s.peers || []).filter((p) => p.status !== "pending");
    if (!rows.length) { fill($("peer-list"), h("p", { class: "muted" }, "No Hub is paired yet.")); return; }
    const table = h("table", { class: "table stacked" },
      h("thead", {}, h("tr", {}, ["Hub", "Status", "Last seen", "Queue", "GPU", "Containers", "Tier", "Engines", "Models", ""].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((p) => {
        const kind = p.probeFailure ? p.probeFailure.kind : p.status;
        const note = failureNote(p);
        const unpair = h("button", { class: "btn danger small", type: "button",
          "aria-label": "Unpair " + peerName(p),
          onclick: (ev) => { if (confirm("Unpair " + peerName(p) + "? It leaves the pool on both Hubs.")) act(ev.target, () => api("DELETE", "/peers/" + p.id)); } }, "Unpair");
        const toggle = h("button", { class: "btn small", type: "button",
          onclick: (ev) => act(ev.target, () => api("POST", "/peers/" + p.id + (p.enabled ? "/disable" : "/enable"))) },
          p.enabled ? "Disable" : "Enable");
        const models = peerModels(p);
        return [
          h("tr", { "data-peer": p.nodeFqdn },
            h("th", { scope: "row" }, peerName(p), h("div", { class: "muted small" }, p.peerKeyFingerprint ? "key " + p.peerKeyFingerprint : "")),
            h("td", { "data-label": "Status" }, HP.chip(STATUS_WORDS[kind] || kind, p.status === "connected" ? "ok" : "bad"),
              p.enabled ? null : HP.chip("Disabled", "warn")),
            h("td", { "data-label": "Last seen" }, ago(p.lastSeenAt)),
            h("td", { "data-label": "Queue" }, String(p.inFlightRequests || 0)),
            h("td", { "data-label": "GPU" }, gpuBand(p.gpuPressure)),
            h("td", { "data-label": "Containers" }, containers(p.containers)),
            h("td", { "data-label": "Tier" }, tier((p.lastCapabilities || {}).hardwareTier)),
            h("td", { "data-label": "Engines" }, peerEngines(p).join(", ") || "none running"),
            h("td", { "data-label": "Models" }, models.length ? models.join(", ") : "none"),
            h("td", { class: "actions" }, toggle, " ", unpair)),
          note ? h("tr", { class: "note-row" }, h("td", { colspan: 10 },
            h("span", { class: note.unpair ? "needs" : "muted" }, "↳ " + note.text))) : null,
        ];
      }).flat()));
    fill($("peer-list"), h("div", { class: "scroll" }, table));
  }

  function renderPending(s) {
    const pend = (s.peers || []).filter((p) => p.status === "pending");
    if (!pend.length) { fill($("pending-list"), h("p", { class: "muted" }, "No requests are waiting.")); return; }
    fill($("pending-list"), h("ul", { class: "plain rows" }, pend.map((p) => {
      if (p.direction === "inbound") {
        return h("li", { "data-pending": p.nodeFqdn },
          h("div", {}, h("strong", {}, peerName(p)), " wants to join your pool",
            h("div", { class: "small" }, p.peerKeyFingerprint ? "Key fingerprint " : "No PIN was used, so the name is only a claim",
              p.peerKeyFingerprint ? h("code", {}, p.peerKeyFingerprint) : null,
              p.peerKeyFingerprint ? ": compare it with the Pairing PIN card on " + shortName(p.nodeFqdn) + " before approving" : null)),
          h("div", { class: "row" },
            h("button", { class: "btn primary small", type: "button", "aria-label": "Approve " + peerName(p),
              onclick: (ev) => act(ev.target, () => api("POST", "/peers/" + p.id + "/approve")) }, "Approve"),
            h("button", { class: "btn small", type: "button", "aria-label": "Reject " + peerName(p),
              onclick: (ev) => act(ev.target, () => api("POST", "/peers/" + p.id + "/reject")) }, "Reject")));
      }
      return h("li", { "data-pending": p.nodeFqdn },
        h("div", {}, "Request sent to ", h("strong", {}, peerName(p)), ", waiting for its approval (sent " + ago(p.createdAt) + ")"),
        h("button", { class: "btn small", type: "button", "aria-label": "Cancel the request to " + peerName(p),
          onclick: (ev) => act(ev.target, () => api("DELETE", "/peers/" + p.id)) }, "Cancel request"));
    })));
  }

  let pinTimer = null;
  function renderPin(s) {
    const id = s.localNode.identity || {};
    $("pin-fingerprint").textContent = id.publicKeyFingerprint || "unavailable";
    const pin = s.pairingPin || {};
    $("cancel-pin").hidden = !pin.active;
    if (!pin.active && !pinTimer) $("pin-state").textContent = "No PIN is active.";
    if (pin.active && !pinTimer) $("pin-state").textContent = "A PIN is active until " + new Date(pin.expiresAt).toLocaleTimeString() + ". It is shown only once, when generated.";
  }

  function renderModels(s) {
    const models = HP.mergedModels(s);
    if (!models.length) { fill($("model-list"), h("p", { class: "muted" }, "No model is available: no engine answers here and no connected Hub lists one.")); return; }
    fill($("model-list"), h("table", { class: "table" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Model"), h("th", { scope: "col" }, "Held by"))),
      h("tbody", {}, models.map((m) => h("tr", {}, h("td", {}, h("code", {}, m.model)), h("td", {}, m.nodes.join(", ")))))));
  }

  function renderPins(s) {
    const pins = s.pins || [];
    fill($("pin-list"), pins.length ? h("ul", { class: "plain rows" }, pins.map((p) => h("li", {},
      h("span", {}, (p.scope === "model" ? p.model : "Every model") + " → " +
        (p.targetKind === "local" ? "this node" : (p.nodeFqdn || "a Hub no longer paired")) + " ",
        HP.chip(p.targetAvailable ? "Available" : "Not available now", p.targetAvailable ? "ok" : "warn")),
      h("button", { class: "btn small", type: "button", "aria-label": "Remove the pin for " + (p.model || "every model"),
        onclick: (ev) => act(ev.target, () => api("DELETE", "/pins?scope=" + p.scope + (p.model ? "&model=" + encodeURIComponent(p.model) : ""))) }, "Remove"))))
      : h("p", { class: "muted" }, "No pins."));
    const sel = $("pin-target"), keep = sel.value;
    fill(sel, h("option", { value: "local" }, "this node"),
      (s.peers || []).filter((p) => p.status !== "pending").map((p) => h("option", { value: p.id }, peerName(p))));
    if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  }

  function buildSettings() {
    const form = $("settings-form");
    fill(form, schema.filter((f) => f.patchable).map((f) => {
      // labelled in words, with the help under it; the key (what `hubpool settings` and the API
      // take) stays in the range line for whoever scripts it
      const id = "set-" + f.key;
      const words = h("span", { class: "words", id: id + "-words" }, f.words);
      const hint = h("span", { class: "range", id: id + "-range" },
        (f.kind === "bool" ? "" : "Range: " + f.range + " · ") + "setting ", h("code", {}, f.key));
      const described = id + "-words " + id + "-range";
      if (f.kind === "bool") {
        return h("div", { class: "field check" },
          h("input", { type: "checkbox", id, name: f.key, "aria-describedby": described }),
          h("label", { for: id }, f.label), words, hint);
      }
      if (f.kind === "list" || f.kind === "map") {
        // one entry a line: a list's items, or a map's "name = value" pairs (model aliases)
        return h("div", { class: "field" }, h("label", { for: id }, f.label), words,
          h("textarea", { id, name: f.key, rows: 3, spellcheck: "false", "aria-describedby": described,
            placeholder: f.kind === "map" ? "claude-* = auto" : null }), hint);
      }
      return h("div", { class: "field" }, h("label", { for: id }, f.label), words,
        h("input", { id, name: f.key, type: f.kind === "int" ? "number" : "text", min: f.min, max: f.max,
          inputmode: f.kind === "int" ? "numeric" : null, placeholder: f.nullable ? "not set" : null,
          "aria-describedby": described }), hint);
    }), h("div", { class: "row" }, h("button", { type: "submit", class: "btn primary" }, "Save settings")));
    form.addEventListener("input", () => { form.dataset.dirty = "1"; });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const settings = {}, prefs = {};
      for (const f of schema.filter((x) => x.patchable)) {
        const el = form.elements[f.key];
        let v;
        if (f.kind === "bool") v = el.checked;
        else if (f.kind === "list") v = lines(el.value);
        else if (f.kind === "map") {
          v = {};
          for (const line of lines(el.value)) {
            const at = line.indexOf("=");
            if (at < 1) {
              const out = $("settings-result");
              out.className = "error";
              out.textContent = f.label + ": write each entry as name = value (got \u201c" + line + "\u201d).";
              return;
            }
            v[line.slice(0, at).trim()] = line.slice(at + 1).trim();
          }
        }
        else if (el.value.trim() === "") v = f.nullable ? null : undefined;
        else v = f.kind === "int" ? Number(el.value) : el.value.trim();
        if (v === undefined) continue;
        if (last && JSON.stringify(last.settings[f.key]) === JSON.stringify(v)) continue;
        (f.via === "preferences" ? prefs : settings)[f.key] = v;
      }
      const out = $("settings-result");
      try {
        if (Object.keys(settings).length) await api("PATCH", "/settings", settings);
        if (Object.keys(prefs).length) await api("PATCH", "/api/inference/preferences", prefs);
        out.className = "ok-text";
        out.textContent = Object.keys(settings).length + Object.keys(prefs).length ? "Saved." : "Nothing changed.";
        delete form.dataset.dirty;
      } catch (e) {
        out.className = "error";
        out.textContent = e.message;
      }
      await refreshStatus();
    });
  }

  function renderSettings(s) {
    const form = $("settings-form");
    if (form.dataset.dirty || form.contains(document.activeElement)) return;  // never overwrite typing
    for (const f of schema.filter((x) => x.patchable)) {
      const el = form.elements[f.key], v = s.settings[f.key];
      if (f.kind === "bool") el.checked = !!v;
      else if (f.kind === "list") el.value = (v || []).join("\n");
      else if (f.kind === "map") el.value = Object.entries(v || {}).map(([k, t]) => k + " = " + t).join("\n");
      else el.value = v === null || v === undefined ? "" : v;
    }
  }

  function lines(text) {
    return text.split("\n").map((l) => l.trim()).filter((l) => l);
  }

  const seen = {};
  function changed(section, data, fn) {
    const key = JSON.stringify(data);
    if (seen[section] === key) return;
    seen[section] = key;
    fn();
  }

  function render(s) {
    last = s;
    const line = HP.routingSentence(s);
    const el = $("routing-line");
    el.textContent = line.text;
    el.className = "state " + (line.ok ? "ok-text" : "warn-text");
    const sw = [];
    if (!s.enabled && s.disabledBy === "setting") {
      sw.push(h("button", { class: "btn primary", type: "button", onclick: (ev) => act(ev.target, () => api("PATCH", "/settings", { poolEnabled: true })) }, "Turn on Hub Pool"));
    }
    fill($("switches"), sw);
    const paired = (s.peers || []).some((p) => p.status !== "pending");
    const btn = $("setup-button");
    btn.hidden = s.disabledBy === "env";
    btn.textContent = paired ? "Add Hubs" : "Set up Hub Pool";
    btn.dataset.openGuide = paired ? "find" : "";
    // each section is rebuilt only when its own data changed, so polling does not take the
    // keyboard focus away from a button the operator is on
    changed("node", s.localNode, () => renderNode(s));
    changed("pin", [s.pairingPin, s.localNode.identity], () => renderPin(s));
    changed("pending", s.peers.filter((p) => p.status === "pending"), () => renderPending(s));
    changed("peers", s.peers.filter((p) => p.status !== "pending").map((p) => ({ ...p, lastSeen: HP.ago(p.lastSeenAt) })),
            () => renderPeers(s));
    changed("models", HP.mergedModels(s), () => renderModels(s));
    changed("pins", [s.pins, s.peers.map((p) => [p.id, p.nodeFqdn, p.status])], () => renderPins(s));
    renderSettings(s);
    $("updated").textContent = "Updated " + new Date().toLocaleTimeString();
  }

  async function refreshStatus() {
    try { render(await api("GET", "/status")); showError(null); }
    catch (e) { showError(e); }
  }

  function renderLog(data) {
    const sum = data.summary || {};
    $("log-summary").textContent = (sum.recorded || 0) + " recorded · " + (sum.served || 0) + " served · " +
      (sum.failed || 0) + " failed · " + (sum.failovers || 0) + " failed over" +
      (sum.lastAt ? " · last " + ago(sum.lastAt) : "");
    const entries = data.entries || [];
    if (!entries.length) { fill($("log-list"), h("p", { class: "muted" }, "No routing decisions recorded since this node started.")); return; }
    fill($("log-list"), h("ol", { class: "plain log-rows" }, entries.map((e) => {
      const failed = e.outcome === "failed", pending = e.outcome === "pending";
      const refused = e.requestError ? true : false;
      // the chain: each node passed over, with what it answered, then the one that served
      const tried = (e.failedOverFrom || []).map((n, i) => {
        const a = (e.attempts || [])[i];
        return "✗ " + n + (a && a.reason ? " (" + a.reason + ")" : "");
      });
      const chain = tried.concat(e.outcome === "served" ? ["✓ " + (e.node === "local" ? "this node" : e.node)] : []);
      return h("li", { class: "log-row" + (failed ? " failed" : "") + ((e.failedOverFrom || []).length ? " failover" : ""), "data-request-id": e.id },
        h("div", { class: "log-main" },
          h("span", { class: "when", title: e.at }, new Date(e.at).toLocaleTimeString()),
          h("span", { class: "dir" }, e.direction === "inbound" ? "in" : "out"),
          h("code", { class: "model" }, e.model || "—"),
          h("span", { class: "node" }, e.node === "local" ? "this node" : (e.node || "—")),
          h("span", { class: "ms" }, e.durationMs !== null && e.durationMs !== undefined ? e.durationMs + " ms" : ""),
          HP.chip(pending ? "Pending" : failed ? (refused ? "Refused " : "Failed ") + (e.status || "") : "Served " + (e.status || ""),
                  pending ? "" : failed ? "bad" : "ok"),
          (e.failedOverFrom || []).length ? HP.chip("Failed over", "warn") : null),
        (e.failedOverFrom || []).length ? h("div", { class: "chain", "aria-label": "Failover chain" }, chain.map((n, i) => [i ? h("span", { class: "arrow" }, " → ") : null, h("span", { class: i < tried.length ? "passed-over" : "served-by" }, n)])) : null,
        (e.notes || []).map((n) => h("div", { class: "note" }, "↳ " + n)));
    })));
  }

  async function refreshLog() {
    try {
      const data = await api("GET", "/routing-log/annotated?limit=50");
      changed("log", [data.summary && data.summary.totalRecorded, data.entries.map((e) => [e.id, e.updatedAt])], () => renderLog(data));
    }
    catch (e) { showError(e); }
  }

  $("mint-pin").addEventListener("click", async (ev) => {
    ev.target.disabled = true;
    try {
      const r = await api("POST", "/pairing-pin");
      clearTimeout(pinTimer);
      $("pin-state").replaceChildren("PIN ", h("strong", { class: "pin", "data-testid": "pin" }, r.pin),
        " — type it on the other Hub before " + new Date(r.expiresAt).toLocaleTimeString() + ".");
      pinTimer = setTimeout(() => { pinTimer = null; refreshStatus(); }, Math.max(0, Date.parse(r.expiresAt) - Date.now()));
      showError(null);
    } catch (e) { showError(e); }
    ev.target.disabled = false;
    refreshStatus();
  });
  $("cancel-pin").addEventListener("click", (ev) => act(ev.target, async () => {
    await api("DELETE", "/pairing-pin"); clearTimeout(pinTimer); pinTimer = null;
    $("pin-state").textContent = "No PIN is active.";
  }));
  $("pin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const model = $("pin-model").value.trim(), target = $("pin-target").value;
    const body = { scope: model ? "model" : "default", targetKind: target === "local" ? "local" : "peer" };
    if (model) body.model = model;
    if (target !== "local") body.targetPeerId = target;
    act(ev.submitter, () => api("POST", "/pins", body));
  });

  async function discover(ev) {
    const out = $("discover-list");
    ev.target.disabled = true;
    fill(out, h("p", { class: "muted", role: "status" }, "Looking…"));
    let found;
    try { found = await api("GET", "/peers/discoverable/full"); }
    catch (e) { fill(out, h("p", { class: "error" }, e.message)); ev.target.disabled = false; return; }
    ev.target.disabled = false;
    const hubs = (found.peers || []).slice().sort((x, y) => x.nodeFqdn.localeCompare(y.nodeFqdn));
    if (!hubs.length) {
      const hint = last && !last.tailscaleAdminApiConfigured
        ? "No unpaired Hub answered. To list every device on the tailnet, not only the ones this machine's Tailscale sees, set TAILSCALE_OAUTH_CLIENT_ID and TAILSCALE_OAUTH_CLIENT_SECRET (devices:core:read) for the node."
        : "No unpaired Hub answered.";
      fill(out, h("p", {}, hint));
      return;
    }
    fill(out, h("ul", { class: "plain rows" }, hubs.map((hub) => {
      const result = h("span", { class: "small", role: "status" });
      return h("li", { "data-discovered": hub.nodeFqdn },
        h("span", {}, h("strong", {}, hub.nodeFqdn), " ", hub.os ? HP.chip(hub.os) : null,
          hub.online === true ? HP.chip("Online", "ok") : hub.online === false ? HP.chip("Offline") : null),
        h("span", { class: "row" }, result, h("button", { type: "button", class: "btn small", "aria-label": "Pair with " + hub.nodeFqdn,
          onclick: async (e2) => {
            e2.target.disabled = true;
            try { await api("POST", "/peers/pair", { nodeFqdn: hub.nodeFqdn }); result.textContent = "Request sent";
                  result.className = "small ok-text"; }
            catch (err) { result.textContent = "Not sent: " + err.message; result.className = "small error"; e2.target.disabled = false; }
            refreshStatus();
          } }, "Pair")));
    })));
  }

  $("discover-button").addEventListener("click", discover);
  buildSettings();
  // while the guide is open it reads the status itself (every 3 s) and hands it to this page
  HP.every(15000, () => (HP.guideOpen() ? null : refreshStatus()));
  HP.every(15000, refreshLog);
  document.addEventListener("hubpool:changed", () => { refreshStatus(); refreshLog(); });
  document.addEventListener("hubpool:status", (ev) => { try { render(ev.detail); } catch (e) { showError(e); } });
})();
