"""`hubpool --version`: the version of hubpool and of every distribution that plugs into it.

A node is hubpool plus a set of plugin distributions installed beside it, each with its own
version; a bug report needs all of them. The list comes from installed metadata only (the
``hubpool.plugins`` entry points' distributions), so it never imports a plugin and answers
even when one is broken.
"""

from __future__ import annotations

from importlib import metadata

#: the plugin entry-point group (hubpool_core.plugins.ENTRY_POINT_GROUP; repeated here so
#: `--version` does not import the plugin host and stevedore)
ENTRY_POINT_GROUP = "hubpool.plugins"
CORE_DISTRIBUTION = "hubpool"


def distribution_versions() -> list[tuple[str, str]]:
    """(distribution, version) for hubpool first, then each distribution that provides a
    ``hubpool.plugins`` entry point, by name, each once."""
    try:
        core = metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        core = "unknown (not installed)"
    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is not None and dist.name != CORE_DISTRIBUTION:
            found.setdefault(dist.name, dist.version)
    return [(CORE_DISTRIBUTION, core), *sorted(found.items())]


def version_text() -> str:
    """What `hubpool --version` prints: ``hubpool X`` on the first line, then one
    ``  distribution X`` line per plugin distribution."""
    (core, core_version), *rest = distribution_versions()
    width = max((len(name) for name, _ in rest), default=0)
    lines = [f"{core} {core_version}"] + [f"  {name.ljust(width)}  {version}" for name, version in rest]
    return "\n".join(lines)
