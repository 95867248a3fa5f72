"""The kernels, by family: ``triton/`` (portable, combine, shared jit math, the CPU interpreter) and
``gluon/`` (the sm90 warp-specialised kernels). Launched only by :mod:`mla_sink.paths.triton.launch`."""
