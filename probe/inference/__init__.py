"""Inference dumping: token layouts of generation steps, the HF ``generate`` hook, the vLLM plugin.

A step of an inference run is one forward of the model (HF) or one ``execute_model`` of a
worker (vLLM). Its batch mixes requests, padding and prefill chunks differently from run to
run, so each step's dump carries a ``token_layout.json`` that says which request and token
position every row of the step's token dimension is; the compare gathers a request's rows
from every step by it (``probe.compare`` never pairs inference steps by number).
"""
