"""The notebook layer: what a notebook cell calls, and what runs notebooks.

``lab`` and ``server`` (the session and the servers it launched), ``experiment`` (a notebook's checked
parameters and results), ``findings`` and ``measurements`` (the figures each step reports), ``nbrun``,
``nbkernel`` and ``report`` (headless runs into offline reports), ``campaign``, ``campaignlock`` and
``sweeps``, ``labserver`` (JupyterLab on loopback), ``widgets`` (the config panel). Only the CLI is above it.
"""
