"""``python -m webhook``: the same as the ``webhook`` command."""

import sys

from webhook.cli import main

sys.exit(main())
