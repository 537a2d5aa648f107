"""``python -m fuzz <target> [--seconds N]``: see fuzz/run.py."""

from fuzz.run import main

raise SystemExit(main())
