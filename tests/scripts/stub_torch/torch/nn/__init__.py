"""torch.nn of the stub torch (see ../__init__.py): classes to subclass, nothing that runs."""
from torch import _Placeholder


class Module:
    pass


def __getattr__(name):
    return _Placeholder
