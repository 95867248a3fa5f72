"""The ``triton`` path: ``plan`` (the tuning table -> a :class:`TritonLaunch`) and ``launch`` (execute it)."""
