"""The ``hubpool`` command line, on typer; it talks to its own node over HTTP.

- ``main.py``: the entry point; ``commands.py``: the app and its general commands.
- ``client.py``: how the CLI finds its node and operator key.
- ``status_commands.py``, ``pairing_commands.py``, ``pin_commands.py``,
  ``advice_commands.py``, ``log_commands.py``, ``bench_commands.py``: one group of verbs each.
- ``service_commands.py``: `hubpool service`; ``service_files.py``: the systemd unit, its
  environment file and the launchd plist it writes.
- ``version.py``: `hubpool --version`, every installed distribution's version.
- ``format.py``: the shared text formatting (times, tables, routing-log counts).
"""
