"""Peer health: capability polls, strikes, probe-failure classification, and the
housekeeping that rides the same tick (pending expiry, PIN and nonce sweeps, renames,
the bearer→signed upgrade and its grace window).

spec: "Recovery", "A peer whose identity changed", "Upgrading an existing bearer pairing";
protocol.md §3 state machine and §8.9–8.10.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from time import perf_counter  # a hop's timer: the fault tests freeze this module's ``time``
from typing import Any

import httpx

from hubpool_core.config import env_int
from hubpool_core.engine import AGENT_DIALECTS, NATIVE, OPENAI
from hubpool_core.models_ids import fold_model_id
from hubpool_core.peering.client import PeerAuthError
from hubpool_core.peering.peers import aware, iso, utcnow
from hubpool_core.peering.signing import (
    PEER_SIGNATURE_SKEW_MS,
    REFUSAL_HEADER,
    REFUSAL_IDENTITY_MISMATCH,
    clock_ms,
)
from hubpool_core.periodic import Periodic
from hubpool_core.store import PoolPeer
from hubpool_core.store.db import UNREACHABLE as DB_UNREACHABLE

log = logging.getLogger("hubpool.health")

CAPABILITIES_PROBE_TIMEOUT_S = 15.0
UNREACHABLE_THRESHOLD = 3
#: the busy load poll (poolLoadPollMs): "busy" lasts this long after the last placement, and it
#: never asks more often than every LOAD_POLL_MIN_MS
LOAD_POLL_BUSY_S = 2.0
LOAD_POLL_MIN_MS = 100
MAX_BACKOFF_S = 15 * 60
P = "/api/inference/pool"
#: a node's own clock (unix ms) on every answer of /capabilities, refusals included, so the prober
#: can say whose clock is wrong when a signature is refused for its timestamp (additive)
CLOCK_HEADER = "X-Hub-Pool-Clock"
#: clocks this far apart are named in doctor and status before signatures start failing
CLOCK_WARN_MS = 240_000
#: a third clock within this of ours "agrees" with ours
CLOCK_AGREE_MS = 60_000

#: What the operator does about each kind. ``<peer>`` is the peer's name and ``<this node>`` this
#: node's, both filled in when the failure is recorded, so every reader (status, doctor, the web
#: UI) shows a command that can be pasted as it stands.
ACTIONS = {
    "unreachable": None,  # clears on its own
    # this node's own key cannot be used (its node.secret lost, say): nothing the peer does and no
    # waiting fixes it; rotation is the one recovery (spec "Failure modes")
    "own_identity": "This node's own pool key cannot be used, so no peer can be reached with it: run "
                    "`hubpool rotate-identity` here (it keeps the node UUID, seals a new key under the current "
                    "node.secret and unpairs every peer), then `hubpool unpair <this node>` on <peer> if it still "
                    "lists this node, and pair again with a PIN.",
    "unauthorized": "The peer refuses this node's credentials: run `hubpool status` on it. If this node is not "
                    "listed there, re-pair (`hubpool unpair <peer>`, then pair again with a PIN); if it is, "
                    "compare the two clocks (signed requests allow 5 minutes of skew).",
    "identity_changed": "The peer no longer holds the identity this node pinned: run `hubpool unpair <peer>` here, "
                        "`hubpool pairing-pin` there, `hubpool pair <peer> --pin <digits>` here, then approve "
                        "there after comparing fingerprints.",
    # a bearer-only pairing under poolRequireSignedPeers: neither side admits the other, and the
    # upgrade to signed requests is itself refused while the setting is on, so waiting never helps
    "signed_required": "poolRequireSignedPeers is on here and <peer> is paired with bearer tokens only (it has never "
                       "signed), so this node neither calls it nor admits it, and it cannot upgrade while the setting "
                       "is on: it does not come back by itself. Either turn the setting off (`hubpool settings "
                       "poolRequireSignedPeers=false`): <peer> then upgrades to signed requests at its next health "
                       "check, after which the setting can go back on. Or re-pair it with a PIN: `hubpool unpair "
                       "<peer>` here, `hubpool pairing-pin` there, `hubpool pair <peer> --pin <digits>` here, then "
                       "approve there.",
}


def action_for(kind: str, peer: str, this_node: str | None) -> str | None:
    """The ``action`` text for a probe failure of ``kind``, with the names filled in."""
    text = ACTIONS[kind]
    if text is None:
        return None
    return text.replace("<peer>", peer).replace("<this node>", this_node or "<this node's tailnet name>")


@dataclass
class ProbeFailure:
    kind: str  # unreachable | unauthorized | identity_changed | own_identity | signed_required
    http_status: int | None
    detail: str
    since: float
    last_attempt_at: float
    attempts: int
    next_probe_at: float | None
    action: str | None = None
    #: the peer's clock minus this node's when it refused, and whose clock is wrong: set when
    #: the refusal is explained by the two clocks being further apart than a signature allows
    clock_skew_ms: int | None = None
    clock_action: str | None = None

    def as_json(self) -> dict[str, Any]:
        def at(t: float | None) -> str | None:
            return iso(datetime.fromtimestamp(t, UTC)) if t else None

        return {"kind": self.kind, "httpStatus": self.http_status, "detail": self.detail, "since": at(self.since),
                "lastAttemptAt": at(self.last_attempt_at), "attempts": self.attempts,
                "nextProbeAt": at(self.next_probe_at), "clockSkewMs": self.clock_skew_ms,
                "action": self.clock_action or self.action}


def classify(status: int | None, refusal: str | None) -> str:
    if status == 401:
        return "identity_changed" if refusal == REFUSAL_IDENTITY_MISMATCH else "unauthorized"
    return "unreachable"  # no answer, a 5xx, or a 403


#: the dialects a peer may state an engine serves natively (anything else is dropped)
KNOWN_DIALECTS = frozenset({OPENAI, NATIVE, *AGENT_DIALECTS})


def valid_capabilities(data: Any) -> dict[str, Any] | None:
    """A peer's payload is validated wholesale before it is cached; a bad shape is no snapshot."""
    if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
        return None
    backends = []
    for b in data["backends"][:32]:
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            return None
        models = b.get("modelsLoaded")
        if not isinstance(models, list) or not all(isinstance(m, str) and len(m) <= 300 for m in models):
            return None
        entry = {"type": b["type"][:40], "healthy": b.get("healthy") is True, "modelsLoaded": models[:2000]}
        dialects = b.get("dialects")
        if isinstance(dialects, list):  # additive: absent is "unknown", never a reason to refuse
            entry["dialects"] = sorted({d for d in dialects[:16] if isinstance(d, str) and d in KNOWN_DIALECTS})
        backends.append(entry)
    out = {k: v for k, v in data.items() if k in ("hardwareTier", "acceptingWork", "nodeUuid", "inFlightRequests",
                                                   "updatedAt", "maxPromptTokens", "maxNumCtx", "ollamaSlots",
                                                   "gpuPressure", "gpuPressureSource", "containers",
                                                   "throughput")}
    # hubpool's additive fields (predicted time to first token): lists of objects, clamped here,
    # every value validated where it is read; anything else is dropped as not said
    for key in ("engineSlots", "resident", "speed", "slotsFree"):
        value = data.get(key)
        if isinstance(value, list):
            out[key] = [e for e in value[:32] if isinstance(e, dict)]
    out["backends"] = backends
    return out


class HealthPoller:
    def __init__(self, node: Any):
        self.node = node
        self.failures: dict[str, ProbeFailure] = {}
        #: peer id -> the peer's clock minus this node's (ms), from the last probe it answered
        self.clocks: dict[str, int] = {}
        self._loop = Periodic("health tick", self.tick, lambda: self.poll_s)
        #: the busy load poll (poolLoadPollMs): sub-second in-flight counts while this node is busy
        self._load_loop = Periodic("load poll", self.load_tick, lambda: self.load_poll_s or 1.0)
        #: each peer's probe in flight: a tick starts one per peer and never waits for it
        self._probes: dict[str, asyncio.Task] = {}
        #: peer id -> the last name it signed as that was refused (warned once, then debug)
        self._refused_renames: dict[str, str] = {}

    @property
    def probe_timeout_s(self) -> float:
        """A probe's whole budget: 15 s (the spec's), but never more than two polls, so a peer
        that silently drops packets costs a strike every two polls at most, and a probe left
        hanging by a partition is gone soon after the partition heals."""
        return min(CAPABILITIES_PROBE_TIMEOUT_S, 2.0 * self.poll_s)

    @property
    def poll_s(self) -> int:
        # HUB_POOL_DEV_HEALTH_POLL_SECONDS (1-300) wins: test rigs poll every second, which the
        # persisted setting's 10 s floor refuses
        override = env_int(getattr(self.node.env, "dev_health_poll_seconds", None), minimum=1, maximum=300)
        return override or self.node.settings.current.poolHealthPollSeconds

    @property
    def load_poll_s(self) -> float:
        """The busy load poll's interval in seconds, 0 when off: HUB_POOL_DEV_LOAD_POLL_MS
        (50-10000, for rigs whose clock runs faster) wins over poolLoadPollMs (at least 100)."""
        override = env_int(getattr(self.node.env, "dev_load_poll_ms", None), minimum=50, maximum=10_000)
        if override:
            return override / 1000
        ms = self.node.settings.current.poolLoadPollMs
        return max(LOAD_POLL_MIN_MS, ms) / 1000 if ms else 0.0

    async def load_tick(self) -> None:
        """While this node is busy (work in flight, or placed within LOAD_POLL_BUSY_S), ask every
        connected peer its in-flight count: two entry nodes then stop sending to the same peer's
        last free slot a whole poll long. A peer that does not answer is the health poll's
        business: nothing is struck here."""
        interval = self.load_poll_s
        if not interval or not self.node.load.busy(LOAD_POLL_BUSY_S):
            return
        rows = [r for r in self.node.peers.all() if r.status == "connected" and r.enabled]
        if rows:
            await asyncio.gather(*(self._load_probe(r, max(1.0, 4 * interval)) for r in rows),
                                 return_exceptions=True)

    async def _load_probe(self, row: PoolPeer, budget: float) -> None:
        try:
            started = perf_counter()
            async with asyncio.timeout(budget):
                answer = await self.node.peer_client.get_fast(row, P + "/capabilities", timeout=budget)
            self._note_hop(row.id, answer.status_code, started)
            data = answer.json() if answer.status_code == 200 else None
        except (PeerAuthError, httpx.HTTPError, httpx.InvalidURL, TimeoutError, ValueError, RecursionError):
            return
        count = data.get("inFlightRequests") if isinstance(data, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 1_000_000:
            self.node.load.note_fresh(row.id, count)
            self.node.peer_slots.note_capabilities(row.id, data)

    def start(self) -> None:
        self._loop.start()
        self._load_loop.start()

    async def stop(self) -> None:
        await self._load_loop.stop()
        await self._loop.stop()
        probes = list(self._probes.values())
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        self._probes.clear()

    async def poll_once(self) -> None:
        """One tick, then wait for its probes: a poll whose result the caller reads at once."""
        await self.tick()
        await self.wait_probes()

    async def tick(self) -> None:
        """The loop's step: housekeeping, then one probe per peer started, none awaited."""
        await self.vet_renames()
        try:
            await asyncio.to_thread(self.node.housekeeping)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the probes
            log.warning("housekeeping failed this tick (%s: %s); probing the peers anyway", type(exc).__name__, exc)
        await self._release_resident()
        rows = [r for r in self.node.peers.all() if r.status in ("connected", "unreachable")]
        # every peer's probe is its own task: one peer that hangs (a partition drops its packets
        # silently, so nothing fails until the timeout) must not hold back the others' polls,
        # nor the next tick. A peer whose probe is still in flight is not probed twice.
        for row in rows:
            running = self._probes.get(row.id)
            if running is not None and not running.done():
                continue
            task = asyncio.ensure_future(self.probe(row))
            self._probes[row.id] = task
            task.add_done_callback(functools.partial(self._probe_done, row.id, row.node_fqdn))

    async def vet_renames(self) -> None:
        """Check every name a peer signed as since the last tick before housekeeping renames
        the row: under this tailnet's MagicDNS suffix and, with an Admin API credential, one of
        its devices (issue 26). A signature says who sent the name, not that it is safe to dial:
        a paired peer claiming ``evil.example.com`` used to be renamed to it, and this node then
        sent it every forward and control call. A refused name is said once per peer and name."""
        for peer_id, name in self.node.identity.take_unvetted_peer_fqdns().items():
            refused = await self.node.tailnet.name_refusal(name, unknown_suffix_ok=False)
            if refused is None:
                self.node.identity.vet_observed_peer_fqdn(peer_id, name)
                self._refused_renames.pop(peer_id, None)
                continue
            level = logging.WARNING if self._refused_renames.get(peer_id) != name else logging.DEBUG
            was = next((r.node_fqdn for r in self.node.peers.all() if r.id == peer_id), peer_id)
            log.log(level, "%s signs its requests as %s; not renaming it: %s", was, name, refused)
            if len(self._refused_renames) < 1024:  # peers are few; the bound is only a bound
                self._refused_renames[peer_id] = name

    def _probe_done(self, peer_id: str, fqdn: str, task: asyncio.Task) -> None:
        if self._probes.get(peer_id) is task:
            del self._probes[peer_id]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # one peer's probe failing to be recorded (a full disk refuses the row's update) is
            # said for that peer; the others' probes run on their own
            log.warning("the probe of %s could not be recorded: %s: %s", fqdn, type(exc).__name__, exc)
        self.refresh_clock_actions()

    async def wait_probes(self) -> None:
        """Until every probe in flight has ended."""
        await asyncio.gather(*list(self._probes.values()), return_exceptions=True)

    def refresh_clock_actions(self) -> None:
        """Whose clock is wrong depends on every peer's reading: said again as each probe ends."""
        for peer_id, failure in self.failures.items():
            if failure.clock_action is not None:
                failure.clock_action = self.clock_verdict(peer_id) or failure.clock_action

    async def _release_resident(self) -> None:
        """A withheld model the engine reports resident is proof it serves: clear it. Residency
        is read only while something is withheld, so an untroubled tick costs nothing."""
        for engine in self.node.local.engines:
            withheld = self.node.unservable.withheld_models("local", engine.kind)
            if not withheld or not engine.has_residency:
                continue
            try:
                resident = await asyncio.wait_for(engine.residency(self.node.local.http), timeout=5)
            except Exception:  # noqa: BLE001 - no answer proves nothing
                continue
            for model in resident or []:
                folded = fold_model_id(model.id)
                if folded in withheld and self.node.unservable.clear(("local", engine.kind, folded)):
                    self.node.local.invalidate(engine)
                    log.info("%s is resident on the local %s again: no longer withheld", model.id, engine.kind)

    async def probe(self, row: PoolPeer) -> None:
        now = time.time()
        failure = self.failures.get(row.id)
        if failure and failure.next_probe_at and now < failure.next_probe_at:
            return
        status, refusal, data, detail, engine_marked = None, None, None, "", False
        budget = self.probe_timeout_s
        offset = getattr(self.node, "clock_offset_ms", 0)
        no_credential = False
        try:
            sent, started = clock_ms(offset), perf_counter()
            # httpx's timeout is per phase; the budget is for the whole probe
            async with asyncio.timeout(budget):
                answer = await self.node.peer_client.call(row, "GET", P + "/capabilities", timeout=budget)
            self._note_hop(row.id, answer.status_code, started)
            self._note_clock(row.id, answer.headers.get(CLOCK_HEADER), sent, clock_ms(offset))
            status, refusal = answer.status_code, answer.headers.get(REFUSAL_HEADER)
            engine_marked = "x-hub-pool-backend" in answer.headers
            data = answer.json() if status == 200 else None
            detail = f"HTTP {status}"
        except PeerAuthError as exc:
            detail, no_credential = str(exc), True
        except httpx.HTTPError as exc:
            detail = f"fetch failed ({type(exc).__name__})"
        except TimeoutError:
            detail = f"no answer within {budget:g}s"
        except (ValueError, RecursionError):  # a peer's nesting bomb is "not JSON", not a dead tick
            detail = "answered something that is not JSON"
        caps = valid_capabilities(data) if status == 200 else None
        try:
            if caps is not None:
                await self._succeeded(row, caps)
                return
            kind = classify(status, refusal)
            identity = self.node.identity.get()
            if (no_credential or status in (401, 403)) and identity is not None and identity.signing_key is None:
                # nothing could be presented, or what was presented was refused, while this node's own
                # key is unusable: the fault is here, and only rotation clears it
                kind = "own_identity"
                detail = f"{detail}; this node cannot sign: {self.node.identity.error or 'no pool identity'}"
            elif no_credential and self.node.settings.current.poolRequireSignedPeers and not row.peer_public_key:
                kind = "signed_required"  # its own action: only the operator brings this pairing back
            self._failed(row, status, kind, detail if status != 200 else "invalid capabilities payload",
                         engine_marked, action_for(kind, row.node_fqdn, await self.node.tailnet.self_fqdn()))
        except DB_UNREACHABLE:
            # the database is down (the repo marked it; /status says so): the probe's answer
            # is not recorded, and routing keeps the row it holds in memory until it is back
            log.debug("probe of %s not recorded: the database is unreachable", row.node_fqdn)

    def _note_hop(self, peer_id: str, status: int, started: float) -> None:
        """An answered signed call's round trip: the hop a forward to this peer pays."""
        hops = getattr(self.node, "hops", None)
        if status == 200 and hops is not None:
            hops.record(peer_id, (perf_counter() - started) * 1000)

    def _note_clock(self, peer_id: str, stated: str | None, sent_ms: int, received_ms: int) -> None:
        """The peer's clock against this node's, from the time it stated mid-answer."""
        try:
            theirs = int(stated) if stated is not None else None
        except ValueError:
            theirs = None
        if theirs is None or not 0 < theirs < 10**14:
            return
        self.clocks[peer_id] = theirs - (sent_ms + received_ms) // 2

    def clock_verdict(self, peer_id: str) -> str | None:
        """Whose clock is wrong when this node and a peer disagree by more than
        :data:`CLOCK_WARN_MS`, in a sentence for the operator; None when they agree.

        Two clocks cannot say which of them is wrong; a third can. The peer's clock is wrong
        when another peer's agrees with this node's; this node's is wrong when every peer's
        clock is off from it the same way; otherwise it names both."""
        skew = self.clocks.get(peer_id)
        if skew is None or abs(skew) <= CLOCK_WARN_MS:
            return None
        names = {r.id: r.node_fqdn for r in self.node.peers.all()}
        peer = names.get(peer_id, "the peer")
        way = "ahead of" if skew > 0 else "behind"
        apart = f"{peer}'s clock is {abs(skew) / 1000:.0f} s {way} this node's (signed requests allow " \
                f"{PEER_SIGNATURE_SKEW_MS // 1000} s)"
        others = {pid: s for pid, s in self.clocks.items() if pid != peer_id and pid in names}
        agreeing = sorted(names[pid] for pid, s in others.items() if abs(s) <= CLOCK_AGREE_MS)
        if agreeing:
            return f"{apart}; {agreeing[0]} agrees with this node, so {peer}'s clock is wrong: enable NTP " \
                   f"there (timedatectl set-ntp true) and check its time zone setting"
        same_way = [s for s in others.values() if abs(s) > CLOCK_WARN_MS and (s > 0) == (skew > 0)]
        if others and len(same_way) == len(others):
            mine = "behind" if skew > 0 else "ahead of"  # the peer's lead is this node's lag
            return f"this node's clock is {abs(skew) / 1000:.0f} s {mine} {peer}'s, and off the same way " \
                   f"from all {len(others) + 1} peers it reads, so this node's clock is wrong: enable NTP here " \
                   f"(timedatectl set-ntp true)"
        return f"{apart}; no third node can say which is right: compare both with a time server " \
               f"(timedatectl status on each) and enable NTP on the wrong one"

    async def _succeeded(self, row: PoolPeer, caps: dict[str, Any]) -> None:
        if row.id in self.failures:
            log.info("%s answers its health probe again", row.node_fqdn)
        self.failures.pop(row.id, None)
        self.node.load.note_report(row.id)
        self.node.peer_slots.note_capabilities(row.id, caps)
        row = self.node.peers.update(row.id, status="connected", consecutive_failures=0, last_seen_at=utcnow(),
                                     last_capabilities=caps)
        if row is not None:
            await self.reconcile(row, caps)

    def _failed(self, row: PoolPeer, status: int | None, kind: str, detail: str,
                engine_marked: bool, action: str | None) -> None:
        now = time.time()
        prev = self.failures.get(row.id)
        attempts = (prev.attempts + 1) if prev and prev.kind == kind else 1
        next_at = None
        if kind in ("unauthorized", "identity_changed"):  # refusals back off from two polls to at most 15 minutes
            next_at = now + min(MAX_BACKOFF_S, self.poll_s * 2 ** min(attempts, 20))
        skew = self.clocks.get(row.id)
        clock_action = None
        if kind == "unauthorized" and skew is not None and abs(skew) > PEER_SIGNATURE_SKEW_MS:
            # refused for its timestamp: the operator is told whose clock to fix, not to re-pair
            clock_action = self.clock_verdict(row.id)
            detail = f"{detail}: the clocks are {abs(skew) / 1000:.0f} s apart"
        self.failures[row.id] = ProbeFailure(kind, status, detail[:300], prev.since if prev and prev.kind == kind
                                             else now, now, attempts, next_at, action,
                                             skew if clock_action else None, clock_action)
        strikes = row.consecutive_failures + 1
        changes: dict[str, Any] = {"consecutive_failures": strikes}
        if strikes >= UNREACHABLE_THRESHOLD or kind == "identity_changed":
            changes["status"] = "unreachable"
        if status in (401, 403) and not engine_marked:
            changes["last_capabilities"] = None  # it stopped honouring the pairing: drop what it offered
        self.node.peers.update(row.id, **changes)
        log.warning("capabilities probe of %s failed (%s, strike %d): %s", row.node_fqdn, kind, strikes, detail)

    async def reconcile(self, row: PoolPeer, caps: dict[str, Any]) -> None:
        """The upgrade's crossover: trigger, retire tokens on evidence, roll back on silence."""
        now = utcnow()
        if row.peer_public_key and row.signed_seen_at:
            if row.verify_token_hash or row.present_token_encrypted or row.bearer_grace_until:
                self.node.peers.update(row.id, verify_token_hash=None, present_token_encrypted=None,
                                       bearer_grace_until=None)
                log.info("%s signs its requests: retiring both bearer tokens", row.node_fqdn)
            return
        grace = aware(row.bearer_grace_until)
        if row.peer_public_key and grace is not None and grace <= now:
            self.node.peers.update(row.id, peer_node_uuid=None, peer_public_key=None, bearer_grace_until=None)
            log.warning("%s never signed within the grace window: rolling back its pinned key; the exchange is "
                        "retried on a later tick", row.node_fqdn)
            return
        if not row.peer_public_key and isinstance(caps.get("nodeUuid"), str):
            try:
                await self.upgrade(row, expected_uuid=caps["nodeUuid"])
            except (PeerAuthError, httpx.HTTPError) as exc:
                # the peer answered its probe, so it stays connected on bearer tokens; the exchange
                # is retried on the next tick instead of failing this tick for every peer
                log.warning("the identity exchange with %s did not complete: %s", row.node_fqdn,
                            str(exc) or type(exc).__name__)

    async def upgrade(self, row: PoolPeer, expected_uuid: str | None = None) -> PoolPeer:
        """POST /pair/upgrade with the bearer it retires; the answer's key is pinned (learned
        from a response: this side signs at once)."""
        identity = self.node.identity.get()
        if identity is None or identity.signing_key is None:
            raise PeerAuthError(503, "This node has no usable pool identity to upgrade with")
        body = {"nodeUuid": identity.node_uuid, "publicKey": identity.public_key}
        answer = await self.node.peer_client.call(row, "POST", P + "/pair/upgrade", body)
        try:
            data = answer.json() if answer.status_code == 200 else None
        except (ValueError, RecursionError):  # not JSON: the exchange did not complete, said below
            data = None
        claim = None
        if isinstance(data, dict):
            from hubpool_core.peering.pairing import _valid_claim

            claim = _valid_claim(data.get("nodeUuid"), data.get("publicKey"))
        if claim is None or (expected_uuid and claim[0] != expected_uuid):
            raise PeerAuthError(503, f"{row.node_fqdn} did not complete the identity exchange")
        self.node.pairing._pin_claim(row.id, claim, grace=False)  # noqa: SLF001 - one pinning rule
        log.info("%s upgraded from bearer tokens to signed requests", row.node_fqdn)
        return self.node.peers.by_id(row.id)
