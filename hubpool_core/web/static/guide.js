// The setup guide (spec: "Set up with the guide"): Check, Find, Connect, Approve.
// It reads its state from the node every time it opens, scans the tailnet only when Find
// opens or on Rescan, and never sends a request by itself.
"use strict";

const Guide = (() => {
  const { api, h, fill, tier, peerName, shortName, peerEngines, peerModels } = HP;
  const STEPS = ["check", "find", "connect", "approve"];
  const LABELS = { check: "Check", find: "Find", connect: "Connect", approve: "Approve" };
  const POLL_MS = 3000, POLL_FOR_MS = 10 * 60 * 1000;
  const dialog = document.getElementById("guide");
  const body = document.getElementById("guide-body");
  const actions = document.getElementById("guide-actions");
  let g = null;  // the state of one opening of the guide

  function fresh() {
    return { step: null, checks: null, found: null, selected: new Set(), pin: "", results: new Map(),
             sent: new Set(), cancelled: new Set(), status: null, pollTimer: null, pollStarted: 0,
             timedOut: false, scanning: false };
  }

  function setStep(step) {
    g.step = step;
    const i = STEPS.indexOf(step);
    for (const li of dialog.querySelectorAll(".steps li")) {
      const at = STEPS.indexOf(li.dataset.step);
      li.classList.toggle("done", at < i);
      if (at === i) li.setAttribute("aria-current", "step"); else li.removeAttribute("aria-current");
    }
    document.getElementById("guide-step-label").textContent = "Step " + (i + 1) + " of 4 · " + LABELS[step];
    document.getElementById("guide-progress").value = i + 1;
    dialog.dataset.step = step;
    if (step !== "approve") stopPolling();
    ({ check: showCheck, find: showFind, connect: showConnect, approve: showApprove })[step]();
    body.focus({ preventScroll: true });
  }

  function busy(text) { fill(body, h("p", { class: "muted", role: "status" }, text)); fill(actions); }
  function errorBox(e) { return h("p", { class: "error", role: "alert" }, e.message || String(e)); }
  function button(text, onclick, cls, attrs) {
    return h("button", Object.assign({ type: "button", class: "btn " + (cls || ""), onclick }, attrs || {}), text);
  }

  // -- 1. Check ---------------------------------------------------------------------

  function capital(text) { return text ? text[0].toUpperCase() + text.slice(1) : text; }

  async function runChecks() {
    const [status, doctor] = await Promise.all([api("GET", "/status"), api("GET", "/doctor")]);
    g.status = status;
    const byId = Object.fromEntries(doctor.checks.map((c) => [c.id, c]));
    const n = status.localNode, c1 = byId.C1 || {}, c2 = byId.C2 || {};
    const V = { READY: "ready", WARN: "warning", ACTION: "needs action" };
    const checks = [];
    checks.push(status.enabled
      ? { title: "Hub Pool is on", verdict: V.READY, detail: "Pooling is on." }
      : { title: "Hub Pool is on", verdict: V.ACTION,
          detail: status.disabledBy === "env"
            ? "HUB_POOL_USER_DISABLED=true is in this Hub's environment. The setting cannot override it: remove that line and restart the Hub."
            : "Hub Pool is turned off on this Hub.",
          fix: status.disabledBy === "env" ? null
            : { label: "Turn on Hub Pool", run: () => api("PATCH", "/settings", { poolEnabled: true }) } });
    if (!n.tailscaleConnected) {
      checks.push({ title: "Tailscale is connected", verdict: V.ACTION, detail: c1.detail || "This Hub is not on a tailnet.",
        fix: { label: "Connect Tailscale", href: "https://tailscale.com/download", note: "Run `tailscale up` on the machine that runs this Hub, then check again." } });
    } else if (!n.nodeFqdn) {
      checks.push({ title: "Tailscale is connected", verdict: V.ACTION, detail: "Tailscale is connected but this Hub has no tailnet name. Turn on MagicDNS for the tailnet.",
        fix: { label: "Open Tailscale DNS settings", href: "https://login.tailscale.com/admin/dns" } });
    } else if (c1.verdict === "warning") {  // named, but the coordination server sees it offline
      checks.push({ title: "Tailscale is connected", verdict: V.WARN, detail: "Tailnet name " + c1.detail + "." });
    } else {
      checks.push({ title: "Tailscale is connected", verdict: V.READY, detail: "Tailnet name " + n.nodeFqdn });
    }
    // doctor's C3 reads the daemon's CertDomains: ready, needs action (HTTPS off), or a warning
    // only when the daemon cannot say
    const c3 = byId.C3 || {};
    checks.push(c3.verdict === "ready"
      ? { title: "HTTPS certificates", verdict: V.READY, detail: capital(c3.detail) + "." }
      : { title: "HTTPS certificates", verdict: c3.verdict === "needs action" || !n.nodeFqdn ? V.ACTION : V.WARN,
          detail: capital(c3.detail || "cannot tell whether HTTPS certificates are on for the tailnet") +
            ". Hubs reach each other at https://<name>; HTTPS is turned on in the Tailscale admin console (DNS).",
          fix: { label: "Open Tailscale DNS settings", href: "https://login.tailscale.com/admin/dns" } });
    checks.push(c2.verdict === "ready"
      ? { title: "Tailscale publishes this Hub", verdict: V.READY, detail: c2.detail }
      : { title: "Tailscale publishes this Hub", verdict: c2.verdict === "needs action" ? V.ACTION : V.WARN,
          detail: capital(c2.detail || "cannot tell") + ". If Tailscale refused to publish this Hub, run this once on the machine that runs it:",
          command: c2.fix });
    const out = status.directions.outbound;
    checks.push(out.enabled
      ? { title: "This Hub sends work to paired Hubs", verdict: V.READY, detail: "Outbound pooling is on." }
      : { title: "This Hub sends work to paired Hubs", verdict: status.enabled ? V.ACTION : V.WARN,
          detail: out.disabledBy === "env" ? "HUB_POOL_OUTBOUND_DISABLED=true is in this Hub's environment; remove it and restart."
                                          : "Outbound pooling (poolOutboundEnabled) is off.",
          fix: out.disabledBy === "setting" && status.enabled
            ? { label: "Turn on sending work", run: () => api("PATCH", "/settings", { poolOutboundEnabled: true }) } : null });
    return checks;
  }

  async function showCheck() {
    busy("Checking this Hub…");
    let checks;
    try { checks = await runChecks(); } catch (e) {
      fill(body, errorBox(e)); fill(actions, button("Check again", () => setStep("check"))); return;
    }
    g.checks = checks;
    const action = checks.some((c) => c.verdict === "needs action");
    const warn = checks.some((c) => c.verdict === "warning");
    if (!action && !warn && !g.checkShown) { setStep("find"); return; }  // every check is ready: skip
    g.checkShown = true;
    const cls = { ready: "ok", warning: "warn", "needs action": "bad" };
    const word = { ready: "Ready", warning: "Warning", "needs action": "Needs action" };
    fill(body, h("h3", {}, "Check this Hub"),
      h("ul", { class: "plain checks" }, checks.map((c) => h("li", { class: "check " + cls[c.verdict] },
        h("div", { class: "check-head" }, HP.chip(word[c.verdict], cls[c.verdict]), " ", h("strong", {}, c.title)),
        h("p", {}, c.detail),
        c.command ? h("pre", {}, h("code", {}, c.command)) : null,
        c.fix && c.fix.note ? h("p", { class: "small" }, c.fix.note) : null,
        c.fix && c.fix.run ? button(c.fix.label, async (ev) => {
          ev.target.disabled = true;
          try { await c.fix.run(); } catch (e) { ev.target.after(errorBox(e)); return; }
          setStep("check");
        }, "small") : null,
        c.fix && c.fix.href ? h("a", { class: "btn small", href: c.fix.href, target: "_blank", rel: "noopener noreferrer" }, c.fix.label) : null))));
    const cont = button(action ? "Continue" : (warn ? "Continue anyway" : "Continue"), () => setStep("find"), "primary",
                        { disabled: action, "aria-describedby": action ? "check-blocked" : null });
    fill(actions, button("Check again", () => setStep("check")),
      action ? h("span", { id: "check-blocked", class: "small" }, "Fix the checks that need action to continue.") : null, cont);
  }

  // -- 2. Find ----------------------------------------------------------------------

  async function scan() {
    g.scanning = true;
    g.selected.clear();  // nothing is ever preselected
    busy("Looking for Hubs on your tailnet…");
    try { g.found = await api("GET", "/peers/discoverable/full"); g.findError = null; }
    catch (e) { g.found = null; g.findError = e; }
    g.scanning = false;
    renderFind();
  }

  function showFind() { scan(); }

  function renderFind() {
    if (g.findError) {
      fill(body, errorBox(g.findError));
      fill(actions, button("Rescan", scan));
      return;
    }
    const hubs = [...(g.found.peers || [])].sort((a, b) => (a.hostname || a.nodeFqdn).localeCompare(b.hostname || b.nodeFqdn));
    if (!hubs.length) {
      const un = g.found.unanswered || [];
      fill(body, h("h3", {}, "No Hubs found"),
        h("p", {}, "That is not an error: no unpaired Hub on your tailnet answered. Check these in order:"),
        h("ol", {}, h("li", {}, "The other Hub is installed, running and signed in to this tailnet, and its machine is awake."),
          h("li", {}, "MagicDNS and HTTPS certificates are on for the tailnet."),
          h("li", {}, "The other Hub is published over Tailscale: run hubpool doctor on it (checks C1 and C2).")),
        un.length ? [h("h4", {}, "Devices that did not answer as a Hub"),
          h("ul", { class: "plain" }, un.map((d) => h("li", {}, d.nodeFqdn, " ",
            d.os ? HP.chip(d.os) : null, d.online === true ? HP.chip("Online", "ok") : d.online === false ? HP.chip("Offline") : null)))] : null);
      fill(actions, toApprove(), button("Rescan", scan));
      return;
    }
    const pinInput = h("input", { id: "guide-pin", inputmode: "numeric", pattern: "[0-9]{6}", maxlength: 6,
      autocomplete: "one-time-code", "aria-describedby": "guide-pin-help", value: g.pin,
      oninput: (ev) => { g.pin = ev.target.value.replace(/\D/g, "").slice(0, 6); ev.target.value = g.pin; } });
    const send = button("", () => { g.results = new Map(); setStep("connect"); }, "primary", { id: "guide-send" });
    const update = () => {
      const n = g.selected.size;
      send.textContent = n === 0 ? "Choose Hubs" : (n === 1 ? "Send 1 request" : "Send " + n + " requests");
      send.disabled = n === 0;
      pinInput.disabled = n !== 1;  // a PIN belongs to one Hub
      if (n !== 1) { pinInput.value = ""; g.pin = ""; }
      for (const cb of body.querySelectorAll(".hubcard input")) cb.checked = g.selected.has(cb.value);
    };
    const cards = hubs.map((hub) => {
      const id = "hub-" + hub.nodeFqdn.replace(/[^a-z0-9]/gi, "-");
      return h("li", {}, h("label", { class: "hubcard", for: id },
        h("input", { type: "checkbox", id, value: hub.nodeFqdn,
          onchange: (ev) => { if (ev.target.checked) g.selected.add(hub.nodeFqdn); else g.selected.delete(hub.nodeFqdn); update(); } }),
        h("span", { class: "hubname" }, h("strong", {}, hub.hostname || shortName(hub.nodeFqdn)), h("span", { class: "small muted" }, hub.nodeFqdn)),
        h("span", { class: "chips" }, hub.os ? HP.chip(hub.os) : null,
          hub.online === true ? HP.chip("Online", "ok") : hub.online === false ? HP.chip("Offline") : null)));
    });
    fill(body, h("h3", {}, "Choose the Hubs to pair with"),
      h("p", {}, "Choose only Hubs you operate. Each one has to approve its request."),
      h("div", { class: "row" }, button("Select all", () => { hubs.forEach((x) => g.selected.add(x.nodeFqdn)); update(); }, "small"),
        button("Rescan", scan, "small ghost")),
      h("ul", { class: "plain hubgrid", "aria-label": "Hubs found" }, cards),
      h("details", { class: "havepin" }, h("summary", {}, "Have a PIN?"),
        h("label", { for: "guide-pin" }, "PIN from the other Hub"), pinInput,
        h("p", { id: "guide-pin-help", class: "small" }, "Generate the PIN on the other Hub under Hub Pool → Pairing PIN. A PIN works for one Hub at a time, so choose exactly one Hub to type it.")));
    fill(actions, toApprove(), send);
    update();
  }

  function toApprove() {
    const any = g.status && (g.status.peers || []).length > 0;
    return any ? button("Your Hubs", () => setStep("approve"), "ghost") : null;
  }

  // -- 3. Connect -------------------------------------------------------------------

  async function sendOne(name) {
    g.results.set(name, { state: "sending" });
    renderConnect();
    const bodyJson = { nodeFqdn: name };
    const pin = g.selected.size === 1 && g.pin.length === 6 ? g.pin : null;
    if (pin) bodyJson.pin = pin;
    try {
      await api("POST", "/peers/pair", bodyJson);
      g.sent.add(name);
      g.cancelled.delete(name);
      g.results.set(name, { state: "sent" });
    } catch (e) {
      g.results.set(name, { state: "failed", error: e, pin: !!pin });
    }
    renderConnect();
  }

  function notSentText(r) {
    const msg = (r.error && r.error.message) || "";
    if (/PIN/i.test(msg) && r.pin) return "The other Hub refused the PIN. Generate a fresh one there: a PIN works once and lasts 10 minutes.";
    if (/already paired/i.test(msg)) return "This Hub already has a row for it. See Hub Pool → Paired Hubs and Pending requests.";
    if (r.error && (r.error.status === 0 || r.error.status >= 500)) return "Could not reach the Hub.";
    return "The Hub could not be reached or declined the request.";
  }

  function showConnect() {
    for (const name of g.selected) if (!g.results.has(name)) sendOne(name);
    renderConnect();
  }

  function renderConnect() {
    if (g.step !== "connect") return;
    const rows = [...g.results.entries()];
    fill(body, h("h3", {}, "Sending requests"),
      h("ul", { class: "plain rows results" }, rows.map(([name, r]) => h("li", { "data-result": name },
        h("div", {}, h("strong", {}, shortName(name)), " ",
          r.state === "sending" ? HP.chip("Sending…") : r.state === "sent" ? HP.chip("Request sent", "ok") : HP.chip("Not sent", "bad"),
          r.state === "failed" ? h("div", { class: "small" }, notSentText(r),
            h("ul", {}, h("li", {}, "Check that the other Hub is online and has Hub Pool turned on."),
              h("li", {}, "If you typed a PIN, generate a fresh one on the other Hub."),
              h("li", {}, "If the other Hub connected to Tailscale a moment ago, wait a minute and try again.")),
            h("details", {}, h("summary", {}, "What it said"), h("p", {}, r.error.message))) : null),
        r.state === "failed" ? button("Retry", () => sendOne(name), "small", { "aria-label": "Retry " + shortName(name) }) : null))));
    const failed = rows.filter(([, r]) => r.state === "failed").map(([n]) => n);
    const sending = rows.some(([, r]) => r.state === "sending");
    fill(actions,
      failed.length > 0 ? button("Retry failed requests", () => failed.forEach(sendOne)) : null,
      button("Continue", () => setStep("approve"), "primary", { disabled: sending }));
  }

  // -- 4. Approve -------------------------------------------------------------------

  function stopPolling() { clearTimeout(g && g.pollTimer); if (g) g.pollTimer = null; }

  function startPolling() {
    stopPolling();
    g.pollStarted = Date.now();
    g.timedOut = false;
    const tick = async () => {
      if (!g || g.step !== "approve" || !dialog.open) return;
      try {
        g.status = await api("GET", "/status"); g.approveError = null;
        document.dispatchEvent(new CustomEvent("hubpool:status", { detail: g.status }));  // the page behind stays current
      } catch (e) { g.approveError = e; }
      if (!g || g.step !== "approve") return;
      renderApprove();
      if (Date.now() - g.pollStarted >= POLL_FOR_MS) { g.timedOut = true; renderApprove(); return; }
      g.pollTimer = setTimeout(tick, POLL_MS);  // keeps reading while open: approvals can arrive any time
    };
    tick();
  }

  function showApprove() { g.renderedKey = null; busy("Reading this Hub's pool status…"); startPolling(); }

  function readyPeers() {
    return ((g.status && g.status.peers) || []).filter((p) => p.status === "connected" && p.lastCapabilities && !p.probeFailure);
  }

  function needsYou(p) {
    const f = p.probeFailure;
    if (f && f.kind === "identity_changed") return "It no longer recognizes this Hub's identity. Unpair it, then pair again with a PIN.";
    if (f && f.kind === "unauthorized") return "It refuses this Hub's credentials. Unpair it, then pair again with a PIN.";
    if (f && f.kind === "own_identity") return "This Hub's own pool key cannot be used. Run hubpool rotate-identity here, then pair again with a PIN.";
    if (f && f.kind === "signed_required") return "It has never signed its requests and poolRequireSignedPeers is on, so it cannot come back by itself: turn that setting off (it then upgrades on its next health check), or unpair it and pair again with a PIN.";
    if (p.direction === "inbound" && p.status === "unreachable" && !p.lastSeenAt)
      return "It never received your approval. Make sure each Hub reaches the other over HTTPS, then unpair and pair again.";
    return null;
  }

  async function approveAct(ev, fn) {
    ev.target.disabled = true;
    try { await fn(); } catch (e) { ev.target.after(errorBox(e)); }
    startPolling();
  }

  function renderApprove() {
    if (g.step !== "approve") return;
    const s = g.status;
    if (!s) { fill(body, g.approveError ? errorBox(g.approveError) : h("p", {}, "Reading…")); return; }
    const peers = s.peers || [];
    const names = new Set(peers.map((p) => p.nodeFqdn));
    const gone = [...g.sent].filter((n) => !names.has(n) && !g.cancelled.has(n));
    // re-render only on a change, so a keyboard user's focus is not thrown away every 3 s
    const key = JSON.stringify([peers.map((p) => [p.id, p.status, p.direction, !!p.lastCapabilities, p.probeFailure && p.probeFailure.kind,
      peerModels(p), peerEngines(p)]), gone, g.timedOut, !!g.approveError, HP.mergedModels(s)]);
    if (key === g.renderedKey && body.childElementCount) return;
    g.renderedKey = key;
    const waiting = peers.filter((p) => p.status === "pending" && p.direction === "outbound");
    const incoming = peers.filter((p) => p.status === "pending" && p.direction === "inbound");
    const connected = peers.filter((p) => p.status !== "pending");
    const ready = readyPeers();
    const section = (title, items, empty) => h("section", { class: "approve-list", "aria-label": title },
      h("h3", {}, title), items.length ? h("ul", { class: "plain rows" }, items) : h("p", { class: "muted small" }, empty));
    const parts = [];
    if (ready.length) {
      const models = HP.mergedModels(s);
      parts.push(h("section", { class: "ready", "aria-live": "polite" }, h("h3", {}, "Your pool is ready"),
        h("p", {}, "Connected: " + ready.map((p) => shortName(p.nodeFqdn)).join(", ") + "."),
        h("p", {}, models.length ? "Models in the pool: " + models.map((m) => m.model).join(", ") + "." : "No models are served yet.")));
    }
    for (const name of gone) {
      parts.push(h("div", { class: "gone", role: "alert" }, h("p", {}, "The request to " + shortName(name) + " is gone"),
        h("p", { class: "small" }, "The other Hub rejected it, an operator removed it there, or it expired after 24 hours."),
        button("Pair again", async (ev) => {
          ev.target.disabled = true;
          try { await api("POST", "/peers/pair", { nodeFqdn: name }); }
          catch (e) { ev.target.disabled = false; ev.target.after(errorBox(e)); return; }
          startPolling();
        }, "small primary", { "aria-label": "Pair again with " + shortName(name) })));
    }
    parts.push(section("Waiting for approval", waiting.map((p) => h("li", { "data-waiting": p.nodeFqdn },
      h("span", {}, h("strong", {}, shortName(p.nodeFqdn)), " has not answered yet. Approve the request on that Hub."),
      button("Cancel request", (ev) => approveAct(ev, async () => { g.cancelled.add(p.nodeFqdn); await api("DELETE", "/peers/" + p.id); }),
             "small", { "aria-label": "Cancel the request to " + shortName(p.nodeFqdn) }))), "No request of this Hub is waiting."));
    parts.push(section("Requests from other Hubs", incoming.map((p) => h("li", { "data-incoming": p.nodeFqdn },
      h("div", {}, h("strong", {}, peerName(p)),
        h("div", { class: "small" }, p.peerKeyFingerprint ? ["Key fingerprint ", h("code", {}, p.peerKeyFingerprint)]
          : "No PIN was used, so this name is only a claim.")),
      h("div", { class: "row" },
        button("Approve", (ev) => approveAct(ev, () => api("POST", "/peers/" + p.id + "/approve")), "small primary", { "aria-label": "Approve " + peerName(p) }),
        button("Reject", (ev) => approveAct(ev, () => api("POST", "/peers/" + p.id + "/reject")), "small", { "aria-label": "Reject " + peerName(p) })))),
      "No other Hub has asked to join."));
    parts.push(section("Connected Hubs", connected.map((p) => {
      const need = needsYou(p);
      const models = peerModels(p);
      return h("li", { class: "conn", "data-connected": p.nodeFqdn },
        h("div", {}, h("strong", {}, shortName(p.nodeFqdn)), " ",
          HP.chip(tier((p.lastCapabilities || {}).hardwareTier)), " ",
          need ? HP.chip("Needs you", "bad")
            : p.status === "unreachable" ? HP.chip("Unreachable", "warn")
            : p.probeFailure ? HP.chip("Not answering", "warn")
            : p.lastCapabilities ? HP.chip("Verified", "ok") : HP.chip("Waiting for its first health check"),
          h("div", { class: "small" }, (peerEngines(p).join(", ") || "no engine running") + " · " + models.length + (models.length === 1 ? " model" : " models")),
          need ? h("p", { class: "needs" }, need) : (p.status === "unreachable" || p.probeFailure
            ? h("p", { class: "small muted" }, "It is not answering. It rejoins by itself on the next health check that works.") : null)),
        // unpairing one Hub does not help a Hub whose own key is unusable: rotation (named in the text) does
        need && !(p.probeFailure && p.probeFailure.kind === "own_identity")
          ? button("Unpair", (ev) => approveAct(ev, () => api("DELETE", "/peers/" + p.id)), "small danger", { "aria-label": "Unpair " + shortName(p.nodeFqdn) }) : null);
    }), "No Hub is connected yet."));
    if (g.timedOut) parts.push(h("p", { class: "warn-text" }, "Stopped reading after 10 minutes."));
    if (g.approveError) parts.push(errorBox(g.approveError));
    fill(body, parts);
    fill(actions,
      g.timedOut ? button("Check again", () => startPolling()) : null,
      button("Add another Hub", () => setStep("find")),
      button("Done", close, "primary"));
  }

  // -- opening and closing ----------------------------------------------------------

  async function open(hint) {
    if (!dialog.open) dialog.showModal();
    g = fresh();
    busy("Reading this Hub's pool status…");
    fill(actions, button("Close", close));
    let status;
    try { status = await api("GET", "/status"); } catch (e) { fill(body, errorBox(e)); return; }
    g.status = status;
    const any = (status.peers || []).length > 0;
    if (hint === "find" && any && (status.peers || []).some((p) => p.status !== "pending")) setStep("find");
    else if (hint === "approve" || any) setStep("approve");  // never re-sends anything by itself
    else setStep("check");
  }

  function close() {
    stopPolling();
    if (dialog.open) dialog.close();
  }

  dialog.addEventListener("close", () => {
    stopPolling();
    document.dispatchEvent(new CustomEvent("hubpool:changed"));
  });
  dialog.querySelector("[data-guide-close]").addEventListener("click", close);
  document.addEventListener("click", (ev) => {
    const opener = ev.target.closest("[data-open-guide]");
    if (opener) { ev.preventDefault(); open(opener.dataset.openGuide || ""); }
  });

  return { open, close };
})();
