"""This process's rank: the one lookup the dump folders, crash dumps and reports share."""


def current_rank():
    """``torch.distributed``'s rank once a process group exists, else None."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None
