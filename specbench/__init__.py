"""specbench: a research testbed for speculative decoding."""

__version__ = "0.1.0"
