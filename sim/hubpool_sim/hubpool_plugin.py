"""The simulator's hubpool plugin: it adds `hubpool demo` to the CLI."""

from __future__ import annotations

from typing import Any

from hubpool_core import hookimpl


@hookimpl
def hubpool_register_cli_commands(app: Any) -> None:
    """Add `hubpool demo`: a node with two simulated engines on embedded defaults."""
    import typer

    @app.command()
    def demo(port: int = typer.Option(5002, "--port", help="Port for the node.")) -> None:
        """Run a node with two simulated engines on embedded defaults, to try hubpool without GPUs.

        Starts an Ollama-style and a vLLM-style simulated engine on free loopback ports, a
        node in a temporary data directory pointed at them, and prints what to try.
        """
        from hubpool_sim.demo import run_demo

        run_demo(port)
