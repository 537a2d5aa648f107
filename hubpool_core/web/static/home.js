// Home: the "Pool your Hubs" card and the review card, from the pool status every 30 s.
"use strict";

(() => {
  const { api } = HP;
  const DISMISS_KEY = "hubpool.poolYourHubs.dismissed";  // per browser and per address, as the spec says
  const $ = (id) => document.getElementById(id);
  let lastKey = null;

  function render(s) {
    const peers = s.peers || [];
    const n = s.localNode || {};
    let dismissed = false;
    try { dismissed = localStorage.getItem(DISMISS_KEY) === "1"; } catch (e) { dismissed = false; }
    $("card-setup").hidden = !(n.tailscaleConnected && s.enabled && peers.length === 0 && !dismissed);
    const incoming = peers.filter((p) => p.status === "pending" && p.direction === "inbound").length;
    const card = $("card-requests");
    card.hidden = incoming === 0;
    $("card-requests-h").textContent = incoming === 1 ? "1 Hub wants to join your pool" : incoming + " Hubs want to join your pool";
    $("review-requests").textContent = incoming === 1 ? "Review request" : "Review requests";
    const line = HP.routingSentence(s);
    $("home-routing").textContent = line.text;
    $("home-routing").className = "state " + (line.ok ? "ok-text" : "warn-text");
  }

  async function refresh() {
    try {
      const s = await api("GET", "/status");
      const key = JSON.stringify([s.peers.map((p) => [p.id, p.status, p.direction]), s.enabled, s.routingActive, s.directions, s.localNode.tailscaleConnected]);
      if (key !== lastKey) { lastKey = key; render(s); }
    } catch (e) {
      $("home-routing").textContent = e.message;
    }
  }

  $("dismiss-setup").addEventListener("click", () => {
    try { localStorage.setItem(DISMISS_KEY, "1"); } catch (e) { /* private mode: hide for this view only */ }
    $("card-setup").hidden = true;
  });
  HP.every(30000, () => (HP.guideOpen() ? null : refresh()));
  document.addEventListener("hubpool:changed", () => { lastKey = null; refresh(); });
  document.addEventListener("hubpool:status", (ev) => { lastKey = null; render(ev.detail); });
})();
