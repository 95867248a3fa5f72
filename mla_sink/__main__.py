"""``python -m mla_sink``: the ``mla-sink`` command line (:mod:`mla_sink.tools.cli`)."""

import sys

from mla_sink.tools.cli import main

sys.exit(main())
