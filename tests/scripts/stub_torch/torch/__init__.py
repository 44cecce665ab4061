"""A stand-in for PyTorch, for CI (no PyTorch, no GPU): only what the benchmark scripts
touch when they are imported and on their flashgpt-only paths (--skip-torch), so that a
CTest can run a script against the real flashgpt binary and catch it misreading its
output. Any other attribute is a placeholder class; calling into it is a test failure."""
__version__ = "stub"


class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the stub torch cannot run PyTorch code")


class cuda:
    @staticmethod
    def get_device_name(*args):
        return "no GPU (stub torch)"

    @staticmethod
    def is_available():
        return False


def __getattr__(name):
    return _Placeholder
