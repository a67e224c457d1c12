"""The model layer: what the memory model and the log reading predict and explain, before and after a launch.

``memory`` (SGLang's memory split: ``preflight``, ``suggest``), ``vllm_memory`` (vLLM's: ``vllm_preflight``),
``budget`` (what the log says each GPU's memory went to), ``calibration`` (graph-memory coefficients from
real capture lines), ``roofline`` (the bandwidth bound of decode), ``diagnosis`` (the log's diagnosis
checked by the memory model). It imports the config layer, the log reader and the base modules, never a
host or a server.
"""
