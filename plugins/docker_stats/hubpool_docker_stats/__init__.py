"""hubpool container-stats source: Docker's Engine API over its Unix socket."""

from hubpool_core import hookimpl
from hubpool_docker_stats.source import DockerStats


@hookimpl
def hubpool_register_container_stats(register):
    """Register the Docker source (a class: the node builds it with its environment)."""
    register(DockerStats)
