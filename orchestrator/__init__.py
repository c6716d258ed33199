"""openagents-sandbox: the host side. It holds the model credentials and never lets them cross into the sandbox."""

__version__ = "0.1.0"
