"""Everything between this node and the other nodes of its pool.

- ``identity.py``: this node's UUID and Ed25519 keypair, sealed at rest.
- ``signing.py``: the signed-request format, verification and the nonce cache.
- ``nonce_file.py``: the nonce cache across restarts (what one process hands the next).
- ``pairing.py``: the handshake (request, confirm, reject, unpair, upgrade) and rotation.
- ``pairing_pin.py``: the pairing PIN and the per-source cooldown in front of it.
- ``guard.py``: admitting a peer's request (signature preferred, legacy bearer).
- ``client.py``: dialling a peer and signing what goes to it.
- ``peers.py``: the peer rows, their public shape, and tokens sealed at rest.
- ``health.py``: capability polls, strikes and probe-failure classification.
- ``discovery.py``: unpaired candidates from the directories, asked for ``/identify``.
- ``addresses.py``: which operator-named addresses a probe or pairing may reach.
- ``tailnet.py``: this node's own place on the tailnet, and the FQDN→URL override.
"""
