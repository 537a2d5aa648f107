// The client base URLs from the address this browser actually used (scheme, host and port),
// which the server can only guess at behind a TLS front such as `tailscale serve`.
"use strict";
(() => {
  const origin = window.location.origin;
  const openai = document.querySelector('[data-testid="openai-url"]');
  const native = document.querySelector('[data-testid="ollama-url"]');
  if (openai) openai.textContent = origin + "/v1";
  if (native) native.textContent = origin;
})();
