"""``python -m webhook``: the same as the ``webhook`` command."""

import sys

from webhook.commands.cli import main

sys.exit(main())
