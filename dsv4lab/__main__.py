"""``python -m dsv4lab`` is the ``dsv4lab`` command."""

import sys

from dsv4lab.cli.main import main

sys.exit(main())
