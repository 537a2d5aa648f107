"""Signed peer requests: wire bytes pinned against the reference (protocol.md §2e, §8.1–8.3).

The known-answer values (body hash, signature, fingerprint) were produced by Node's own
``crypto`` and ``JSON.stringify`` from the reference canonicalizer, not by this module. When
``node`` is on PATH, the interop tests below re-derive them live.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from hubpool_core.peering.signing import (
    NODE_HEADER,
    NONCE_HEADER,
    PEER_HEADER,
    PEER_NONCE_BUDGET,
    PEER_SIGNATURE_SKEW_MS,
    POOL_MESSAGE_PREAMBLE,
    RECIPIENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    UNSIGNED_BODY_MARKER,
    NonceCache,
    Verdict,
    body_hash,
    build_message,
    canonical_json,
    js_number_to_string,
    new_nonce,
    normalize_path,
    normalize_peer_fqdn,
    pkcs8_from_signing_key,
    public_key_fingerprint,
    recipient_mismatch,
    sign_headers,
    signing_key_from_pkcs8,
    spki_from_verify_key,
    verify_headers,
    verify_key_from_spki,
)

SEED = bytes(range(32))
KEY = SigningKey(SEED)
SPKI = "MCowBQYDK2VwAyEAA6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
PKCS8 = "MC4CAQAwBQYDK2VwBCIEIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f"
SENDER = "11111111-2222-4333-8444-555555555555"
RECIPIENT = "66666666-7777-4888-9999-aaaaaaaaaaaa"
FQDN = "hub-a.example-tailnet.ts.net"
TS = 1_700_000_000_000
NONCE = "AAECAwQFBgcICQoLDA0ODw"  # bytes 0..15, base64url
BODY = {"token": "t0k3n", "fromNodeFqdn": FQDN, "z": [1.0, {"b": 2, "a": "é"}]}
BODY_HASH = "b2222d4b6fd43c64ca16c9c21331b835ad5d530fd92204ba80679572be7a69c3"
SIGNATURE = "lO4LEEt9cbTbguWF_EebsOz4WOqdeAFzMEEdRvLgbP5GDwFeN32vMupZXPgEaJ0gegclNWz6Qo063vvnz1DKCQ"
CONFIRM = "/api/inference/pool/pair/confirm"
LOCAL = "/api/inference/pool/local/v1/chat/completions"

NODE_JS = shutil.which("node")
needs_node = pytest.mark.skipif(NODE_JS is None, reason="node is not installed")


def signed(method="POST", path=CONFIRM, body=None, *, now=TS, nonce=None, sender=SENDER, fqdn=FQDN,
           recipient=RECIPIENT, key=KEY):
    return sign_headers(key, method, path, sender, fqdn, recipient, body, now_ms=now, nonce=nonce)


def verify(headers, method="POST", path=CONFIRM, body=None, *, now=TS, nonces=None, spki=None,
           recipient=RECIPIENT) -> Verdict:
    return verify_headers(headers, method, path, body, sender_public_key_b64=spki or spki_from_verify_key(KEY.verify_key),
                          recipient_uuid=recipient, nonces=nonces if nonces is not None else NonceCache(), now_ms=now)


# ── Known answers ────────────────────────────────────────────────────────────


def test_known_answer_message_is_nine_exact_lines():
    message = build_message("post", CONFIRM + "?x=1#frag", SENDER, FQDN, RECIPIENT, TS, NONCE, BODY)
    assert message == (
        "ci-hub-pool-v1\n"
        "POST\n"
        "/api/inference/pool/pair/confirm\n"
        "11111111-2222-4333-8444-555555555555\n"
        "hub-a.example-tailnet.ts.net\n"
        "66666666-7777-4888-9999-aaaaaaaaaaaa\n"
        "1700000000000\n"
        "AAECAwQFBgcICQoLDA0ODw\n"
        "b2222d4b6fd43c64ca16c9c21331b835ad5d530fd92204ba80679572be7a69c3"
    ).encode()
    assert not message.endswith(b"\n")


def test_known_answer_body_hash_and_canonical_form():
    assert canonical_json(BODY) == '{"fromNodeFqdn":"hub-a.example-tailnet.ts.net","token":"t0k3n","z":[1,{"a":"é","b":2}]}'
    assert body_hash(CONFIRM, BODY) == BODY_HASH
    # undefined and null bodies both hash as {} (a bodyless GET matches on both sides).
    empty = hashlib.sha256(b"{}").hexdigest()
    assert empty == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    assert body_hash("/api/inference/pool/capabilities", None) == empty
    assert body_hash("/api/inference/pool/capabilities", {}) == empty


def test_known_answer_signature_and_headers_match_node():
    headers = signed(body=BODY, nonce=NONCE)
    assert headers == {
        "X-Hub-Pool-Node": SENDER,
        "X-Hub-Pool-Peer": FQDN,
        "X-Hub-Pool-Timestamp": "1700000000000",
        "X-Hub-Pool-Nonce": NONCE,
        "X-Hub-Pool-Signature": "v1.ed25519." + SIGNATURE,
        "X-Hub-Pool-Recipient": RECIPIENT,
    }
    assert list(headers) == [NODE_HEADER, PEER_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER, RECIPIENT_HEADER]
    assert "Authorization" not in headers
    assert verify(headers, body=BODY).ok


def test_known_answer_keys():
    # 44 bytes of DER, so 60 base64 characters (protocol.md's "44 chars" counts the DER bytes).
    assert spki_from_verify_key(KEY.verify_key) == SPKI and len(SPKI) == 60
    assert len(base64.b64decode(SPKI)) == 44
    assert pkcs8_from_signing_key(KEY) == PKCS8
    assert bytes(signing_key_from_pkcs8(PKCS8)) == SEED
    assert bytes(verify_key_from_spki(SPKI)) == bytes(KEY.verify_key)
    assert public_key_fingerprint(SPKI) == "a0:50:83:7d:85:07:05:82"


def test_local_routes_sign_the_marker_not_the_body():
    message = build_message("POST", LOCAL, SENDER, FQDN, RECIPIENT, TS, NONCE, {"huge": "x" * 1000})
    assert message.endswith(b"\n" + UNSIGNED_BODY_MARKER.encode())
    assert body_hash(LOCAL, {"a": 1}) == body_hash(LOCAL, None) == "-"
    # The substring decides, after normalisation; capabilities (a GET) does sign {}.
    assert body_hash("/api/inference/pool/capabilities?/inference/pool/local/", None) != "-"


# ── Paths and names ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("raw, expected", [
    ("/api/inference/pool/capabilities", "/api/inference/pool/capabilities"),
    ("/a?b=1#c", "/a"),
    ("/a#frag?notquery", "/a"),
    ("?only=query", "/"),
    ("", "/"),
    ("/a%20b/", "/a%20b/"),
])
def test_normalize_path(raw, expected):
    assert normalize_path(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("hub-a.example-tailnet.ts.net", "hub-a.example-tailnet.ts.net"),
    ("  Hub-A.Example-Tailnet.TS.NET.  ", "hub-a.example-tailnet.ts.net"),
    ("\ufeffhub.ts.net\u00a0", "hub.ts.net"),  # JavaScript's trim() set
    ("a.b", "a.b"),
    ("hub.ts.net..", None),  # only one trailing dot is removed
    ("localhost", None),
    ("https://hub.ts.net", None),
    ("hub.ts.net:443", None),
    ("user@hub.ts.net", None),
    ("hub.ts.net/path", None),
    ("100.64.0.1", None),
    ("12345.67890", None),
    ("-hub.ts.net", None),
    ("hub-.ts.net", None),
    ("hub..ts.net", None),
    ("a" * 63 + ".ts.net", "a" * 63 + ".ts.net"),
    ("a" * 64 + ".ts.net", None),
    (".".join(["a" * 50] * 5) + ".abc", None),  # 258 > 253
    ("hub.ts.net\n", "hub.ts.net"),  # trim() strips line terminators too
    ("hub.ts.net\x1c", None),  # ...but not \x1c, which Python's str.strip() would
    ("hüb.ts.net", None),
    ("", None),
    (None, None),
])
def test_normalize_peer_fqdn(raw, expected):
    assert normalize_peer_fqdn(raw) == expected


def test_normalize_peer_fqdn_length_limit_is_253():
    name = ".".join(["a" * 61] * 4) + ".b"  # 4*61 + 3 dots + 2 = 249
    assert normalize_peer_fqdn(name) == name
    longest = name + "bbbb"  # 253
    assert len(longest) == 253 and normalize_peer_fqdn(longest) == longest
    assert normalize_peer_fqdn(longest + "b") is None
    assert normalize_peer_fqdn(longest + ".") == longest  # the trailing dot does not count


# ── Canonical JSON ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("value, expected", [
    (1.0, "1"), (1e21, "1e+21"), (1e20, "100000000000000000000"), (1e-7, "1e-7"), (1e-6, "0.000001"),
    (0.1, "0.1"), (-0.0, "0"), (0, "0"), (-1.5e-10, "-1.5e-10"), (123.456, "123.456"),
    (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"), (2.5e25, "2.5e+25"),
    (0.000001234, "0.000001234"), (1.2345e-7, "1.2345e-7"), (100.0, "100"), (123456789.125, "123456789.125"),
    (2**53, "9007199254740992"), (2**53 + 1, "9007199254740992"), (2**64, "18446744073709552000"),
    (10**21, "1e+21"), (-(10**22), "-1e+22"), (float("nan"), "NaN"), (float("-inf"), "-Infinity"),
])
def test_js_number_to_string(value, expected):
    assert js_number_to_string(value) == expected


def test_canonical_json_scalars_and_nonfinite():
    assert canonical_json(None) == "null"
    assert canonical_json([True, False, None]) == "[true,false,null]"
    assert canonical_json([float("nan"), float("inf"), float("-inf"), 10**400]) == "[null,null,null,null]"
    assert canonical_json({"x": [1.0, -0.0, 1e21, 1e-7, 0.1]}) == '{"x":[1,0,1e+21,1e-7,0.1]}'


def test_canonical_json_sorts_nested_keys_by_utf16_code_units():
    # U+1F600 is D83D DE00 in UTF-16, so it sorts BEFORE U+FFFD (and U+E000) although its code
    # point is larger; Python's own str order would put it last.
    value = {"z": 1, "\ufffd": 2, "\U0001f600": 3, "é": 4, "A": 5, "a": {"b": [{"d": 1, "c": 2}], "a": None}}
    assert canonical_json(value) == '{"A":5,"a":{"a":null,"b":[{"c":2,"d":1}]},"z":1,"é":4,"😀":3,"\ufffd":2}'
    assert sorted(["\ufffd", "\U0001f600"]) == ["\ufffd", "\U0001f600"]  # the order we must NOT use


def test_canonical_json_puts_array_index_keys_first_like_javascript():
    value = {"b": 1, "10": 2, "2": 3, "a": 4, "4294967295": 5, "4294967294": 6, "01": 7, "-1": 8}
    assert canonical_json(value) == '{"2":3,"10":2,"4294967294":6,"-1":8,"01":7,"4294967295":5,"a":4,"b":1}'


def test_canonical_json_strings_are_escaped_as_json_stringify_does():
    text = "\u2028\u2029\ud800x\udc00\x7f\x01\b\f\n\r\t\"\\/ \U0001f600"
    assert canonical_json(text) == '"\u2028\u2029\\ud800x\\udc00\x7f\\u0001\\b\\f\\n\\r\\t\\"\\\\/ \U0001f600"'
    # A surrogate pair held as two Python code points is one character in JavaScript.
    assert canonical_json("\ud83d\ude00") == canonical_json("\U0001f600") == '"😀"'
    assert canonical_json({"ü": "日本"}) == '{"ü":"日本"}'
    canonical_json("\ud800").encode("utf-8")  # always encodable


def test_canonical_json_drops_proto_keys_like_the_reference():
    assert canonical_json({"__proto__": {"x": 1}, "a": 1, "b": {"__proto__": 5}}) == '{"a":1,"b":{}}'


def test_canonical_json_cycles_become_null_but_shared_subtrees_do_not():
    shared = {"k": 1}
    assert canonical_json({"a": shared, "b": shared}) == '{"a":{"k":1},"b":{"k":1}}'
    loop: dict = {"x": 1}
    loop["self"] = loop
    assert canonical_json(loop) == '{"self":null,"x":1}'


def test_canonical_json_refuses_non_json():
    with pytest.raises(TypeError):
        canonical_json({1: "int key"})
    with pytest.raises(TypeError):
        canonical_json({"x": object()})


# ── Round trip and tampering ─────────────────────────────────────────────────

json_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) \
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)
paths = st.builds(
    lambda prefix, tail, query: prefix + tail + query,
    st.sampled_from(["/api/inference/pool/", "/api/inference/pool/local/", "/api/inference/pool/pair/", "/"]),
    st.text(alphabet="abcxyz019-_/.%", max_size=20),
    st.sampled_from(["", "?a=1", "#f", "?a=1#f"]),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_values, path=paths, method=st.sampled_from(["GET", "POST", "delete", "Patch"]))
def test_sign_then_verify_round_trips(body, path, method):
    headers = signed(method, path, body, nonce=None)
    verdict = verify(headers, method, path, body)
    assert verdict == Verdict(True, None, sender_uuid=SENDER, sender_fqdn=FQDN)
    # The receiver's parser sees the JSON text the sender wrote: key order and spacing do not matter.
    reparsed = json.loads(json.dumps(body, sort_keys=False, indent=1))
    assert verify(signed(method, path, body), method, path, reparsed).ok


@settings(max_examples=60)
@given(body=json_values, other=json_values)
def test_a_different_body_breaks_a_control_route_signature(body, other):
    if canonical_json(body if body is not None else {}) == canonical_json(other if other is not None else {}):
        return
    assert verify(signed(body=body), body=other).reason == "bad_signature"


@settings(max_examples=40)
@given(body=json_values, other=json_values)
def test_local_routes_ignore_the_body(body, other):
    assert verify(signed("POST", LOCAL, body), "POST", LOCAL, other).ok


@pytest.mark.parametrize("field", ["method", "path", "sender", "fqdn", "recipient", "timestamp", "nonce", "body"])
def test_changing_any_signed_field_breaks_the_signature(field):
    headers = signed(body=BODY, nonce=NONCE)
    kwargs = {"method": "POST", "path": CONFIRM, "body": BODY, "recipient": RECIPIENT}
    if field == "method":
        kwargs["method"] = "PUT"
    elif field == "path":
        kwargs["path"] = "/api/inference/pool/pair/request"
    elif field == "sender":
        headers[NODE_HEADER] = "11111111-2222-4333-8444-555555555556"
    elif field == "fqdn":
        headers[PEER_HEADER] = "hub-b.example-tailnet.ts.net"
    elif field == "recipient":
        kwargs["recipient"] = "66666666-7777-4888-9999-aaaaaaaaaaab"
    elif field == "timestamp":
        headers[TIMESTAMP_HEADER] = str(TS + 1)
    elif field == "nonce":
        headers[NONCE_HEADER] = "AAECAwQFBgcICQoLDA0OEA"
    elif field == "body":
        kwargs["body"] = {**BODY, "token": "t0k3m"}
    assert verify(headers, **kwargs).reason == "bad_signature"


def test_a_recipient_mismatch_fails_and_the_clear_header_is_checkable_early():
    headers = signed(body=BODY)
    assert verify(headers, body=BODY, recipient="someone-else").reason == "bad_signature"
    assert recipient_mismatch(headers, "someone-else")
    assert not recipient_mismatch(headers, RECIPIENT)
    del headers[RECIPIENT_HEADER]  # an older sender: skipped, never a mismatch
    assert not recipient_mismatch(headers, "someone-else")
    assert verify(headers, body=BODY).ok


def test_another_key_fails():
    assert verify(signed(), spki=spki_from_verify_key(SigningKey.generate().verify_key)).reason == "bad_signature"


def test_sender_signs_its_normalised_name():
    headers = signed(fqdn="  HUB-A.Example-Tailnet.TS.NET. ")
    assert headers[PEER_HEADER] == FQDN
    assert verify(headers).ok


def test_header_lookup_is_case_insensitive():
    headers = {k.lower(): v for k, v in signed(body=BODY).items()}
    assert verify(headers, body=BODY).ok
    headers = {k.upper(): v for k, v in signed(body=BODY).items()}
    assert verify(headers, body=BODY).ok


def test_nonce_shape():
    nonce = new_nonce()
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", nonce)
    assert len(base64.urlsafe_b64decode(nonce + "==")) == 16
    assert signed()[NONCE_HEADER] != signed()[NONCE_HEADER]


def test_sign_headers_refuses_without_a_private_key():
    class Sealed:
        signing_key = None

    with pytest.raises(ValueError):
        sign_headers(Sealed(), "GET", CONFIRM, SENDER, FQDN, RECIPIENT, None)


# ── Verification order and reasons ───────────────────────────────────────────


@pytest.mark.parametrize("offset", [-PEER_SIGNATURE_SKEW_MS, 0, PEER_SIGNATURE_SKEW_MS])
def test_skew_is_inclusive_at_300000(offset):
    assert verify(signed(now=TS), now=TS + offset).ok


@pytest.mark.parametrize("offset", [-PEER_SIGNATURE_SKEW_MS - 1, PEER_SIGNATURE_SKEW_MS + 1])
def test_one_ms_past_the_window_is_expired(offset):
    assert verify(signed(now=TS), now=TS + offset).reason == "expired"


def test_replay_is_refused_per_sender():
    nonces = NonceCache()
    headers = signed(nonce=NONCE)
    assert verify(headers, nonces=nonces).ok
    assert verify(headers, nonces=nonces, now=TS + 1000).reason == "replayed"
    # Another sender's use of the same nonce string is its own key (no cross-sender spending).
    other = SigningKey(bytes(32))
    theirs = signed(nonce=NONCE, sender="99999999-2222-4333-8444-555555555555", key=other)
    assert verify(theirs, nonces=nonces, spki=spki_from_verify_key(other.verify_key)).ok


def test_a_nonce_is_spent_only_after_the_curve_check():
    # issue 16 item 14: the reference spends the nonce first, so a forgery under a known UUID
    # burned a genuine nonce (and a flood of them filled the one cache for every peer)
    nonces = NonceCache()
    headers = signed(nonce=NONCE)
    forged = {**headers, SIGNATURE_HEADER: "v1.ed25519." + "A" * 86}
    assert verify(forged, nonces=nonces).reason == "bad_signature"
    assert len(nonces) == 0
    assert verify(headers, nonces=nonces).ok
    assert verify(headers, nonces=nonces).reason == "replayed"
    assert len(nonces) == 1


def test_nonce_key_and_expiry():
    nonces = NonceCache()
    assert verify(signed(nonce=NONCE), nonces=nonces, now=TS + 5).ok
    # + 1: the window admits ts + 300 000 itself, so the nonce must outlive that ms (issue 9)
    assert nonces.entries(TS) == {SENDER: {NONCE: TS + PEER_SIGNATURE_SKEW_MS + 1}}


def test_a_full_budget_fails_closed_prunes_expired_first_and_is_per_sender():
    nonces = NonceCache(budget=3)
    for i in range(3):
        assert nonces.remember(SENDER, f"n{i}", expires_at_ms=TS + 100 * (i + 1), now_ms=TS) is None
    # Full of live entries: refuse, never evict.
    assert nonces.remember(SENDER, "new", TS + 1000, now_ms=TS) == "nonce_cache_full"
    assert verify(signed(), nonces=nonces).reason == "nonce_cache_full"
    assert set(nonces.entries(TS)[SENDER]) == {"n0", "n1", "n2"}
    # another sender's budget is its own
    assert nonces.remember("another-sender", "n0", TS + 1000, now_ms=TS) is None
    # At now == expiresAt an entry is expired (<=), so exactly one slot frees up.
    assert nonces.remember(SENDER, "new", TS + 1000, now_ms=TS + 100) is None
    assert set(nonces.entries(TS)[SENDER]) == {"n1", "n2", "new"}
    assert nonces.remember(SENDER, "n1", TS + 1000, now_ms=TS + 100) == "replayed"


def test_an_empty_cache_is_still_truthy():
    assert NonceCache()  # so `cache or NonceCache()` can never replace a live cache


def test_sweep_drops_expired_entries():
    ticks = [TS]
    nonces = NonceCache(clock=lambda: ticks[0])
    nonces.remember(SENDER, "a", TS + 10)
    nonces.remember(SENDER, "b", TS + 20)
    assert nonces.sweep(TS + 9) == 0
    assert nonces.sweep(TS + 10) == 1 and len(nonces) == 1
    ticks[0] = TS + 20
    assert nonces.sweep() == 1 and len(nonces) == 0
    # 500 signed requests a second from one sender, for the longest a nonce can live
    assert PEER_NONCE_BUDGET == NonceCache().budget == 500 * 602


@pytest.mark.parametrize("drop", [NODE_HEADER, PEER_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_missing_headers(drop):
    headers = signed()
    del headers[drop]
    assert verify(headers).reason == "missing_headers"
    headers[drop] = ""
    assert verify(headers).reason == "missing_headers"


def test_reason_order_and_codes():
    good = signed(nonce=NONCE)
    assert verify({**good, PEER_HEADER: "100.64.0.1"}).reason == "bad_peer_fqdn"
    assert verify({**good, SIGNATURE_HEADER: "ed25519." + SIGNATURE}).reason == "bad_signature_encoding"
    # The prefix is checked before the timestamp, the timestamp before the signature.
    assert verify({**good, SIGNATURE_HEADER: "x", TIMESTAMP_HEADER: "soon"}).reason == "bad_signature_encoding"
    for bad in ["soon", "1.5", "NaN", "Infinity", "0x", "1_700_000_000_000", "--1"]:
        assert verify({**good, TIMESTAMP_HEADER: bad}).reason == "bad_timestamp", bad
    nonces = NonceCache()
    assert verify({**good, TIMESTAMP_HEADER: "0"}, nonces=nonces).reason == "expired"
    assert len(nonces) == 0  # expired requests never reach the cache
    assert verify(good, spki="not-a-key").reason == "bad_signature_encoding"
    assert verify(good, spki=base64.b64encode(b"\x30" * 44).decode()).reason == "bad_signature_encoding"
    assert verify({**good, SIGNATURE_HEADER: "v1.ed25519.!!!"}).reason == "bad_signature_encoding"
    assert verify({**good, SIGNATURE_HEADER: "v1.ed25519.AAAA"}).reason == "bad_signature"  # wrong length


def test_timestamp_is_read_the_way_javascript_number_reads_it():
    # Line 7 is String(Number(header)), so these spellings sign the same line as "1700000000000".
    headers = signed(nonce=NONCE)
    for spelling in ["1.7e12", "1700000000000.0", " 1700000000000 ", "+1700000000000", "0x18BCFE56800"]:
        assert verify({**headers, TIMESTAMP_HEADER: spelling}).ok, spelling


# ── Fingerprints and keys ────────────────────────────────────────────────────


@settings(max_examples=25)
@given(seed=st.binary(min_size=32, max_size=32))
def test_fingerprint_format(seed):
    fingerprint = public_key_fingerprint(spki_from_verify_key(SigningKey(seed).verify_key))
    assert re.fullmatch(r"([0-9a-f]{2}:){7}[0-9a-f]{2}", fingerprint)


@pytest.mark.parametrize("junk", [None, "", "not base64!", "AAAA", SPKI[:-4], PKCS8, base64.b64encode(b"\0" * 44).decode()])
def test_fingerprint_of_unparseable_material_is_none(junk):
    assert public_key_fingerprint(junk) is None


@pytest.mark.parametrize("junk", ["", "AAAA", PKCS8, SPKI + "AAAA"])
def test_verify_key_from_spki_raises_value_error(junk):
    with pytest.raises(ValueError):
        verify_key_from_spki(junk)


# ── Interop with Node (the reference's runtime) ──────────────────────────────

_NODE_CANON = r"""
const canon = (body) => { const seen = new WeakSet(); const walk = (v) => {
  if (v === null || typeof v !== 'object') return v; if (seen.has(v)) return null; seen.add(v); let r;
  if (Array.isArray(v)) r = v.map(walk); else { const o = {}; for (const k of Object.keys(v).sort()) o[k] = walk(v[k]); r = o; }
  seen.delete(v); return r; }; return JSON.stringify(walk(body ?? {})); };
"""


def _node(script: str, stdin: str) -> str:
    done = subprocess.run([NODE_JS, "-e", script], input=stdin.encode(), capture_output=True, timeout=60, check=True)
    return done.stdout.decode()


@needs_node
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(
    st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(alphabet=st.characters(exclude_categories=()), max_size=10),
        lambda c: st.lists(c, max_size=4)
        | st.dictionaries(st.text(alphabet=st.characters(exclude_categories=()), max_size=5), c, max_size=5),
        max_leaves=25,
    ),
    min_size=40, max_size=40,
))
def test_canonical_json_matches_node_byte_for_byte(values):
    # json.dumps escapes everything to ASCII (lone surrogates too), so JSON.parse sees exactly
    # these values; Node answers with canonicalize()+JSON.stringify, hex-encoded UTF-8 (lone
    # surrogates would not survive the pipe otherwise).
    script = _NODE_CANON + r"""
const lines = require('fs').readFileSync(0, 'utf8').split('\n').filter(Boolean);
for (const line of lines) { const s = canon(JSON.parse(line));
  let hex = ''; for (let i = 0; i < s.length; i++) hex += s.charCodeAt(i).toString(16).padStart(4, '0');
  console.log(hex); }
"""
    out = _node(script, "\n".join(json.dumps(v) for v in values) + "\n").split()
    for value, units in zip(values, out, strict=True):
        js = bytes.fromhex(units).decode("utf-16-be", "surrogatepass")
        ours = canonical_json({} if value is None else value)
        assert ours.encode("utf-16-be", "surrogatepass") == js.encode("utf-16-be", "surrogatepass"), value


@needs_node
def test_node_verifies_our_signature_and_we_verify_node():
    body = {"fromNodeFqdn": FQDN, "token": "x" * 64, "n": [1.5, 1e21, -0.0], "ü": {"\U0001f600": 1, "\ufffd": 2}}
    ours = signed(body=body, nonce=NONCE)
    script = _NODE_CANON + r"""
const crypto = require('node:crypto');
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const bodyHash = crypto.createHash('sha256').update(canon(input.body)).digest('hex');
const msg = (ts, nonce) => ['ci-hub-pool-v1', 'POST', input.path, input.sender, input.fqdn, input.recipient, String(ts), nonce, bodyHash].join('\n');
const pub = crypto.createPublicKey({ key: Buffer.from(input.spki, 'base64'), format: 'der', type: 'spki' });
const sig = Buffer.from(input.signature.slice('v1.ed25519.'.length), 'base64url');
const ok = crypto.verify(null, Buffer.from(msg(input.ts, input.nonce), 'utf8'), pub, sig);
const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519');
const nonce = crypto.randomBytes(16).toString('base64url');
const theirs = crypto.sign(null, Buffer.from(msg(input.ts, nonce), 'utf8'), privateKey).toString('base64url');
console.log(JSON.stringify({ ok, nonce, signature: 'v1.ed25519.' + theirs,
  spki: publicKey.export({ type: 'spki', format: 'der' }).toString('base64') }));
"""
    answer = json.loads(_node(script, json.dumps({
        "body": body, "path": CONFIRM, "sender": SENDER, "fqdn": FQDN, "recipient": RECIPIENT, "ts": TS,
        "nonce": NONCE, "signature": ours[SIGNATURE_HEADER], "spki": SPKI,
    })))
    assert answer["ok"] is True
    theirs = {**ours, NONCE_HEADER: answer["nonce"], SIGNATURE_HEADER: answer["signature"]}
    assert verify(theirs, body=body, spki=answer["spki"]).ok
    assert verify(theirs, body={**body, "token": "y" * 64}, spki=answer["spki"]).reason == "bad_signature"
    assert public_key_fingerprint(answer["spki"]) is not None


def test_preamble_constant():
    assert POOL_MESSAGE_PREAMBLE == "ci-hub-pool-v1"
