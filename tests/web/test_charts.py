"""The Hub Pool page's traffic charts and the settings form's words, in Chromium, on a two-node
pool that has served on both nodes and failed over once (issue 19, item 5). Screenshots at
desktop and phone widths land in build/screenshots/pool-charts-*.png."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool, pair, poll_until_offered
from web.ui_helpers import DESKTOP, PHONE, SHOTS, new_page, sign_in

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "llama3.2:3b"


def chat(node):
    r = httpx.post(node.url + "/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "hello"}]}, timeout=60)
    assert r.status_code == 200, r.text
    return r


@pytest.fixture
def served_and_failed_over(tmp_path):
    """hub-a and hub-b paired, one simulated engine each with the same model. hub-a served some
    requests itself, some on hub-b (pinned there), and one failed over from hub-b (its engine
    answered 503) back to itself."""
    with ExitStack() as stack:
        sims = {name: stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)])))
                for name in ("hub-a", "hub-b")}
        nodes = make_pool(tmp_path, list(sims), per_node={n: {"OLLAMA_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair(a, b)
        poll_until_offered(a, [b], MODEL)
        for _ in range(3):
            assert chat(a).headers["x-hub-pool-served-by"] == "local"
        with a.client(headers=a.headers()) as c:
            peer_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
            r = c.post(P + "/pins", json={"scope": "model", "model": MODEL, "targetKind": "peer",
                                          "targetPeerId": peer_id})
            assert r.status_code == 200, r.text
        for _ in range(2):
            assert chat(a).headers["x-hub-pool-served-by"] == fqdn("hub-b")
        sims["hub-b"].add_fault("error:503", count=1)
        assert chat(a).headers["x-hub-pool-served-by"] == "local"  # failed over from hub-b
        yield a, b


def test_charts_show_the_pool_that_served_and_failed_over(browser, served_and_failed_over):
    a, _ = served_and_failed_over
    page = new_page(browser)
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    traffic = page.locator("#traffic[data-rendered]")
    traffic.wait_for()
    # uPlot drew all four (its canvas is hidden from screen readers: the caption speaks for it)
    assert page.locator(".chart .uplot canvas").count() == 4
    assert page.locator(".chart .plot[aria-hidden=true]").count() == 4
    requests = page.locator("#chart-requests-caption").inner_text()
    assert "6 requests served in the last hour" in requests
    assert "this node 4" in requests and "hub-b 2" in requests
    assert "1 request failed over" in page.locator("#chart-failovers-caption").inner_text()
    reasons = page.locator("#failover-reasons table")
    assert "HTTP 503" in reasons.inner_text() and "hub-b" in reasons.inner_text()

    # the table fallback, by keyboard: focus the summary, Enter opens it, its cells hold the figures
    summary = page.locator("#chart-requests summary")
    summary.focus()
    page.keyboard.press("Enter")
    table = page.get_by_role("table", name="Requests per minute by node")
    table.wait_for()
    assert table.locator("caption").inner_text() == "Requests per minute by node"
    headers = [h.inner_text() for h in table.locator("thead th").all()]
    assert headers == ["Minute", "this node", "hub-b"]
    cells = table.locator("tbody tr").all()
    assert sum(int(r.locator("td").nth(0).inner_text()) for r in cells) == 4
    assert sum(int(r.locator("td").nth(1).inner_text()) for r in cells) == 2
    assert page.locator("#chart-ttfb-caption").inner_text().startswith("Median in the latest minute with answers:")
    assert "this node" in page.locator("#chart-queue-caption").inner_text()

    # the last day needs the routing history, which this node does not keep
    assert page.locator('#traffic-window option[value="day"]').is_disabled()

    # settings are labelled in words, with their help, not the key
    assert page.get_by_label("Head start for this node (queued requests)").count() == 1
    assert page.get_by_text("How often this node asks each paired Hub").count() == 1
    assert page.get_by_label("poolLocalAffinity").count() == 0

    SHOTS.mkdir(parents=True, exist_ok=True)
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)
        page.wait_for_timeout(400)  # the plots follow the width after a 100 ms debounce
        widths = page.evaluate("[...document.querySelectorAll('.chart .uplot')].map((u) => u.getBoundingClientRect().right)")
        assert widths and max(widths) <= viewport["width"], f"a chart overflows the {label} width: {widths}"
        page.locator("#traffic").screenshot(path=str(SHOTS / f"pool-charts-{label}.png"), animations="disabled")


def test_without_the_chart_library_the_tables_carry_the_figures(browser, served_and_failed_over):
    """A blocked or failed uPlot leaves no empty boxes: every table is open and the page says why."""
    a, _ = served_and_failed_over
    page = new_page(browser)
    page.route("**/vendor/uplot/uPlot.iife.min.js", lambda route: route.abort())
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    page.locator("#traffic[data-rendered]").wait_for()
    assert page.locator(".chart .uplot").count() == 0
    assert page.locator(".chart details[open]").count() == 4
    assert "every figure is in the tables" in page.locator("#traffic-note").inner_text()
    table = page.get_by_role("table", name="Failovers and failures per minute")
    assert [c.inner_text() for c in table.locator("tbody tr").first.locator("td").all()] == ["1", "0"]
