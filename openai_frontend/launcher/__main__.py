"""``python -m openai_frontend.launcher serve ...``: the console script without an installed entry point."""

import sys

from openai_frontend.launcher.cli import main

sys.exit(main())
