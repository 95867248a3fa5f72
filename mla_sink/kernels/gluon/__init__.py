"""sm90 kernels in Triton's Gluon dialect: ``gluon_ws`` (bf16/fp16, 64-head blocks) and ``gluon_fp8``
(e4m3fn KV, few heads); ``math`` holds their shared jit helpers. GPU only."""
