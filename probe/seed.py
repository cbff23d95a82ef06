"""seed_all: fix every random number generator a training job uses."""
import os
import random

from probe.errors import ConfigError


def seed_all(seed=1234, mode=False, rm_dropout=False):
    """Seed Python, numpy and torch (CPU, CUDA, NPU); ``mode=True`` also asks for
    deterministic algorithms, so two runs of the same job give the same bits.

    ``rm_dropout`` is accepted for msprobe compatibility and ignored (dropout is left as is).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ConfigError(f"seed_all: seed must be an int in [0, 2**32), got {seed!r}")
    import numpy as np
    import torch

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    npu = getattr(torch, "npu", None)
    if npu is not None and hasattr(npu, "manual_seed_all"):
        npu.manual_seed_all(seed)
    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ["HCCL_DETERMINISTIC"] = "true"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
