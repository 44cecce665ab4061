"""torch.nn.attention of the stub torch (see ../__init__.py): the backend names the
benchmark scripts list at import time, nothing that runs."""
import enum

from torch import _Placeholder


class SDPBackend(enum.Enum):
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3


def __getattr__(name):
    return _Placeholder
