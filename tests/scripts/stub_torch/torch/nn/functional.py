"""torch.nn.functional of the stub torch (see ../__init__.py)."""
from torch import _Placeholder


def __getattr__(name):
    return _Placeholder
