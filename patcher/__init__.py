"""patcher: rebuild legacy PyTorch releases from source with reviewed patches."""

__version__ = "0.1.0"
