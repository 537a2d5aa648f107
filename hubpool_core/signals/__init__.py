"""What the node measures about itself, off the request path, for placement to read.

- ``local_engines.py``: this node's own engines — instances, the probe snapshot with its
  TTL, and the merged listing.
- ``pressure_bands.py``: GPU pressure as a band (EWMA and a deadband quantiser).
- ``pressure_sampler.py``: one pressure reading every 10 s from the registered sources.
- ``containers.py``: container counts from whichever plugin reports them.
- ``residency.py``: which models this node's engines hold in memory (predicted TTFT).
"""
