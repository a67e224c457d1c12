"""The serving layer: starting a server on a host and following it.

``launch`` (run dirs, ports, the launch script on a host, ``ServerHandle``), ``watch`` (the readiness
verdict from the log, liveness and ``/health``), ``gpumem`` (GPU memory sampled over one SSH channel),
``hostmem`` (the host's memory and model for the vLLM preflight), ``profiling`` (``/start_profile`` and
kernel-time breakdowns). Below it: the twin, the model, hosts, logs,
config; beside it, and independent of it, the benchmark client (:mod:`dsv4lab.bench`, which needs only a
URL); above both: the charts and the notebook layer.
"""
