"""Pairing PIN and per-source cooldown (protocol.md §2f; spec "The PIN, and what it actually buys")."""

from __future__ import annotations

import hashlib
import re
import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.peering import pairing_pin as pp
from hubpool_core.peering.pairing_pin import (
    COOLDOWN_MAX_MS,
    PAIRING_PIN_MAX_ATTEMPTS,
    PAIRING_PIN_TTL_MS,
    PairingPin,
    SourceCooldown,
    check_pairing_pin,
    iso_from_ms,
    source_keys,
)

NOW = 1_700_000_000_000
SOURCE = source_keys("hub-b.example-tailnet.ts.net", "100.64.0.2")


def wrong(pin: str) -> str:
    return f"{(int(pin) + 1) % 1_000_000:06d}"


# ── Minting ──────────────────────────────────────────────────────────────────


def test_mint_gives_six_digits_and_the_ttl():
    digits, expires_at = PairingPin().mint(NOW)
    assert re.fullmatch(r"\d{6}", digits)
    assert expires_at == NOW + PAIRING_PIN_TTL_MS == NOW + 600_000


def test_mint_draws_from_randbelow_and_zero_pads(monkeypatch):
    calls = []

    def fake_randbelow(n: int) -> int:
        calls.append(n)
        return 42

    monkeypatch.setattr(secrets, "randbelow", fake_randbelow)
    assert PairingPin().mint(NOW)[0] == "000042"
    assert calls == [1_000_000]  # uniform over 10^6, not token_bytes % 10^6


def test_digits_are_never_stored():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    active = pin._active
    assert digits not in repr(vars(active))
    assert re.fullmatch(r"[0-9a-f]{32}", active.salt)
    assert active.digest == hashlib.sha256(f"{active.salt}:{digits}".encode()).hexdigest()


def test_only_one_pin_is_live():
    pin = PairingPin()
    first, _ = pin.mint(NOW)
    second, _ = pin.mint(NOW)
    if first != second:
        assert not pin.consume(first, NOW)
    assert pin.consume(second, NOW)


def test_status_never_shows_the_digits():
    pin = PairingPin()
    assert pin.status(NOW) == {"active": False, "expiresAt": None}
    digits, expires_at = pin.mint(NOW)
    status = pin.status(NOW)
    assert status == {"active": True, "expiresAt": iso_from_ms(expires_at)}
    assert status["expiresAt"] == "2023-11-14T22:23:20.000Z"
    assert digits not in str(status)
    assert pin.status(expires_at) == {"active": False, "expiresAt": None}


def test_iso_matches_javascript_to_iso_string():
    assert iso_from_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_from_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


def test_cancel():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    assert pin.cancel()
    assert not pin.cancel()
    assert pin.status(NOW)["active"] is False
    assert not pin.consume(digits, NOW)


# ── Consuming ────────────────────────────────────────────────────────────────


def test_single_use():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    assert pin.consume(digits, NOW)
    assert not pin.consume(digits, NOW)


def test_expiry_is_enforced_in_consume_at_now_equal_expires_at():
    pin = PairingPin()
    digits, expires_at = pin.mint(NOW)
    assert not pin.consume(digits, expires_at)  # no sweep ran: consume enforces it itself
    other = PairingPin()
    digits, expires_at = other.mint(NOW)
    assert other.consume(digits, expires_at - 1)


def test_sweep_drops_only_an_expired_pin():
    pin = PairingPin()
    _, expires_at = pin.mint(NOW)
    assert not pin.sweep(expires_at - 1)
    assert pin.status(expires_at - 1)["active"]
    assert pin.sweep(expires_at)
    assert not pin.sweep(expires_at)


def test_fifth_wrong_attempt_destroys_the_pin():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    for _ in range(PAIRING_PIN_MAX_ATTEMPTS - 1):
        assert not pin.consume(wrong(digits), NOW)
    assert pin.status(NOW)["active"]  # four wrong: still alive
    assert not pin.consume(wrong(digits), NOW)  # the 5th
    assert pin.status(NOW)["active"] is False
    assert not pin.consume(digits, NOW)  # even the right digits are now worthless


def test_fourth_wrong_then_right_still_works():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    for _ in range(PAIRING_PIN_MAX_ATTEMPTS - 1):
        pin.consume(wrong(digits), NOW)
    assert pin.consume(digits, NOW)


def test_the_fifth_attempt_is_counted_even_when_it_is_right():
    # Counted before the comparison: a right guess as attempt 5 succeeds, but it is attempt 5.
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    for _ in range(4):
        pin.consume(wrong(digits), NOW)
    assert pin._active.attempts == 4
    assert pin.consume(digits, NOW)


@given(candidate=st.text(max_size=8))
def test_wrong_expired_used_and_none_are_all_the_same_false(candidate):
    outcomes = []
    none = PairingPin()
    outcomes.append(none.consume(candidate, NOW))

    wrong_pin = PairingPin()
    digits, _ = wrong_pin.mint(NOW)
    outcomes.append(wrong_pin.consume(wrong(digits), NOW))

    expired = PairingPin()
    digits, expires_at = expired.mint(NOW)
    outcomes.append(expired.consume(digits, expires_at))

    used = PairingPin()
    digits, _ = used.mint(NOW)
    used.consume(digits, NOW)
    outcomes.append(used.consume(digits, NOW))

    assert outcomes == [False, False, False, False]
    assert all(type(o) is bool for o in outcomes)


def test_non_string_candidates_are_just_wrong():
    pin = PairingPin()
    digits, _ = pin.mint(NOW)
    assert not pin.consume(int(digits), NOW)  # type: ignore[arg-type]
    assert not pin.consume(None, NOW)  # type: ignore[arg-type]
    assert pin._active.attempts == 2


# ── Per-source cooldown ──────────────────────────────────────────────────────


def test_source_keys():
    assert source_keys("hub.ts.net", "100.64.0.2") == ["fqdn:hub.ts.net", "ip:100.64.0.2"]
    assert source_keys("hub.ts.net") == ["fqdn:hub.ts.net"]  # behind a proxy: no honest IP
    assert source_keys(None, None) == []


def test_two_strikes_then_blocked_and_60_001_clears():
    cooldown = SourceCooldown()
    assert cooldown.strike("k", NOW) == 0
    assert not cooldown.blocked("k", NOW)
    assert cooldown.strike("k", NOW) == 60_000
    assert cooldown.blocked("k", NOW)
    assert cooldown.blocked("k", NOW + 59_999)
    assert not cooldown.blocked("k", NOW + 60_000)
    assert not cooldown.blocked("k", NOW + 60_001)


def test_the_third_wrong_guess_from_one_source_is_429_and_60_001_clears_it():
    pin, cooldown = PairingPin(), SourceCooldown()
    digits, _ = pin.mint(NOW)
    assert check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE) == "refused"
    assert check_pairing_pin(pin, cooldown, wrong(wrong(digits)), NOW, SOURCE) == "refused"
    assert check_pairing_pin(pin, cooldown, digits, NOW, SOURCE) == "cooling"
    assert pin._active.attempts == 2  # a cooling source does not burn PIN attempts

    later = NOW + 60_001
    fresh, _ = pin.mint(later)
    assert check_pairing_pin(pin, cooldown, fresh, later, SOURCE) == "ok"


def test_either_key_cools_the_caller():
    pin, cooldown = PairingPin(), SourceCooldown()
    digits, _ = pin.mint(NOW)
    check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE)
    check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE)
    renamed = source_keys("someone-else.example-tailnet.ts.net", "100.64.0.2")
    assert check_pairing_pin(pin, cooldown, digits, NOW, renamed) == "cooling"


def test_an_unrelated_source_is_not_locked_out():
    pin, cooldown = PairingPin(), SourceCooldown()
    digits, _ = pin.mint(NOW)
    check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE)
    check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE)
    other = source_keys("hub-c.example-tailnet.ts.net", "100.64.0.3")
    assert check_pairing_pin(pin, cooldown, digits, NOW, other) == "ok"


def test_no_pin_outstanding_still_strikes():
    pin, cooldown = PairingPin(), SourceCooldown()
    assert check_pairing_pin(pin, cooldown, "123456", NOW, SOURCE) == "refused"
    assert check_pairing_pin(pin, cooldown, "123456", NOW, SOURCE) == "refused"
    assert check_pairing_pin(pin, cooldown, "123456", NOW, SOURCE) == "cooling"


def test_success_clears_the_sources_strikes():
    pin, cooldown = PairingPin(), SourceCooldown()
    digits, _ = pin.mint(NOW)
    check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE)
    digits, _ = pin.mint(NOW)
    assert check_pairing_pin(pin, cooldown, digits, NOW, SOURCE) == "ok"
    digits, _ = pin.mint(NOW)
    assert check_pairing_pin(pin, cooldown, wrong(digits), NOW, SOURCE) == "refused"
    assert check_pairing_pin(pin, cooldown, digits, NOW, SOURCE) == "ok"  # one strike only


def test_backoff_doubles_to_a_15_minute_ceiling():
    cooldown = SourceCooldown()
    now = NOW
    cooldown.strike("k", now)
    periods = [cooldown.strike("k", now)]
    for _ in range(6):
        now += periods[-1]  # the withholding just ended (exclusive)
        assert not cooldown.blocked("k", now)
        # Once withheld, one strike is enough to be withheld again, for twice as long.
        periods.append(cooldown.strike("k", now))
        assert cooldown.blocked("k", now + periods[-1] - 1)
    assert periods == [60_000, 120_000, 240_000, 480_000, 900_000, 900_000, 900_000]
    assert COOLDOWN_MAX_MS == 15 * 60_000


def test_strikes_while_blocked_do_not_extend_it():
    cooldown = SourceCooldown()
    cooldown.strike("k", NOW)
    cooldown.strike("k", NOW)
    assert cooldown.strike("k", NOW + 30_000) == 0
    assert not cooldown.blocked("k", NOW + 60_000)


def test_old_strikes_are_forgotten_after_the_window():
    cooldown = SourceCooldown()
    cooldown.strike("k", NOW)
    assert cooldown.strike("k", NOW + pp.COOLDOWN_STRIKE_WINDOW_MS + 1) == 0  # a blip, not a pattern
    assert not cooldown.blocked("k", NOW + pp.COOLDOWN_STRIKE_WINDOW_MS + 1)


def test_a_source_that_returns_within_the_window_after_a_long_cooldown_keeps_its_backoff():
    # The reference counts idleness from the last strike, which forgets an 8-minute withholding
    # the moment it ends; counted from the end of the withholding, the doubling continues.
    cooldown = SourceCooldown()
    cooldown.strike("k", NOW)
    now = NOW
    for expected in (60_000, 120_000, 240_000, 480_000):
        assert cooldown.strike("k", now) == expected
        now += expected + pp.COOLDOWN_STRIKE_WINDOW_MS  # comes back at the very edge of the window
        assert not cooldown.blocked("k", now)
    assert cooldown.strike("k", now) == 900_000


def test_idle_keys_are_pruned_and_backoff_resets():
    cooldown = SourceCooldown()
    cooldown.strike("k", NOW)
    cooldown.strike("k", NOW)  # withheld until NOW + 60 s, round 1
    for i in range(50):
        cooldown.strike(f"attacker-{i}", NOW)
    later = NOW + 60_000 + pp.COOLDOWN_STRIKE_WINDOW_MS + 1
    assert not cooldown.blocked("k", later)
    assert len(cooldown) == 0
    assert cooldown.strike("k", later) == 0  # back to needing two strikes


def test_clear():
    cooldown = SourceCooldown()
    cooldown.strike("k", NOW)
    cooldown.strike("k", NOW)
    assert cooldown.clear("k")
    assert not cooldown.blocked("k", NOW)
    assert not cooldown.clear("k")


@pytest.mark.parametrize("attempts", range(1, 8))
def test_total_exposure_is_bounded_by_the_attempt_ceiling(attempts):
    # Many sources, one guess each: the per-PIN ceiling is source-independent.
    pin, cooldown = PairingPin(), SourceCooldown()
    digits, _ = pin.mint(NOW)
    for i in range(attempts):
        check_pairing_pin(pin, cooldown, wrong(digits), NOW, source_keys(f"h{i}.ts.net"))
    assert pin.status(NOW)["active"] is (attempts < PAIRING_PIN_MAX_ATTEMPTS)
