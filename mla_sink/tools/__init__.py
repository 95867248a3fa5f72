"""The command-line tools (``mla-sink``: explain, info, demo, bench) apart from the library."""
