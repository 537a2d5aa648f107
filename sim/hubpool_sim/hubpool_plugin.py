"""The simulator's hubpool plugin: it adds `hubpool demo` to the CLI."""

from __future__ import annotations

from typing import Any

from hubpool_core import hookimpl


@hookimpl
def hubpool_register_cli_commands(app: Any) -> None:
    """Add `hubpool demo`: three paired nodes with simulated engines on loopback."""
    import typer

    @app.command()
    def demo(
        port: int = typer.Option(5002, "--port", min=1, max=65535,
                                 help="Port on 127.0.0.1 for hub-a, the node the requests go to "
                                      "(hub-b and hub-c take free ports)."),
        no_wait: bool = typer.Option(False, "--no-wait",
                                     help="Stop everything after the scripted requests instead of waiting for "
                                          "Ctrl-C (for tests and CI; exits 1 if a step or request failed)."),
    ) -> None:
        """Try hubpool without GPUs or a tailnet: three paired nodes with simulated engines on loopback.

        Starts hub-a (a simulated Ollama), hub-b (vLLM) and hub-c (llama.cpp), each a `hubpool serve`
        process with its own temporary data directory, and pairs them through the operator API with PINs.
        Then it sends a few requests to hub-a, prints which node served each one, and prints what to try
        by hand. Ctrl-C stops the nodes and the engines; the data directories and node logs stay.
        """
        from hubpool_sim.demo import run_demo

        code = run_demo(port, wait=not no_wait)
        if code:
            raise typer.Exit(code)
